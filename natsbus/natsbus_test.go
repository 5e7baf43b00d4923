package natsbus_test

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/a2a-bus/a2a-bus/broker/brokertest"
	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/transport/bustest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(testbin.Exit))
}

const (
	testBuffer = 64
	testLimit  = 8192
	// testGrace keeps Close quick where a handler never returns by itself.
	testGrace = 50 * time.Millisecond
)

var features = bustest.Features{BoundSessions: true, HostScope: transport.ScopeHost, Buffer: testBuffer, MaxMessageBytes: testLimit}

func newBus(t *testing.T) *natsbus.Bus {
	t.Helper()
	b, err := natsbus.New(natsbus.Config{MaxMessageBytes: testLimit, CloseGrace: testGrace})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return b
}

// conformance runs both halves of a bus's conformance: the transport
// contract and the broker over the bus.
func conformance(t *testing.T, newHarness func(t *testing.T) bustest.Harness) {
	bustest.Run(t, features, newHarness)
	brokertest.Run(t, features, newHarness)
}

func TestConformanceInProcess(t *testing.T) {
	conformance(t, func(t *testing.T) bustest.Harness {
		b := newBus(t)
		c, err := b.Connect(natsbus.ClientConfig{Buffer: testBuffer})
		require.NoError(t, err)
		return bustest.Harness{Bus: b, Client: c}
	})
}

func TestConformanceTCPLoopback(t *testing.T) {
	conformance(t, func(t *testing.T) bustest.Harness {
		b := newBus(t)
		c, err := natsbus.Dial(natsbus.ClientConfig{URL: b.URL(), Token: b.Server().Token(), Buffer: testBuffer, MaxMessageBytes: testLimit})
		require.NoError(t, err)
		return bustest.Harness{Bus: b, Client: c}
	})
}

// externalServer runs a real nats-server process, built from the module,
// with token authentication, and returns its URL and token once it says
// it is ready.
func externalServer(t *testing.T) (url, token string) {
	t.Helper()
	bin := testbin.Build(t, "github.com/nats-io/nats-server/v2")
	token = "0123456789abcdef0123456789abcdef"
	log := &serverLog{ready: make(chan struct{})}
	cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", "-1", "--auth", token)
	cmd.Stdout, cmd.Stderr = io.Discard, log
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	})
	select {
	case <-log.ready:
	case <-time.After(10 * time.Second):
		t.Fatalf("nats-server did not start: %s", log.lines())
	}
	url = log.clientURL()
	require.NotEmpty(t, url, "nats-server logged no client address: %s", log.lines())
	return url, token
}

// serverLog reads a nats-server's log as it writes it: its client
// address, and when it is ready.
type serverLog struct {
	mu    sync.Mutex
	all   []byte
	line  []byte
	url   string
	ready chan struct{}
	once  sync.Once
}

func (l *serverLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = append(l.all, p...)
	l.line = append(l.line, p...)
	for {
		i := bytes.IndexByte(l.line, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(l.line[:i])
		l.line = l.line[i+1:]
		if _, addr, ok := strings.Cut(line, "Listening for client connections on "); ok {
			l.url = "nats://" + strings.TrimSpace(addr)
		}
		if strings.Contains(line, "Server is ready") {
			l.once.Do(func() { close(l.ready) })
		}
	}
}

func (l *serverLog) clientURL() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.url
}

func (l *serverLog) lines() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.all)
}

func TestConformanceExternalServer(t *testing.T) {
	conformance(t, func(t *testing.T) bustest.Harness {
		url, token := externalServer(t)
		withToken := strings.Replace(url, "nats://", fmt.Sprintf("nats://%s@", token), 1)
		b, err := natsbus.New(natsbus.Config{URL: withToken, MaxMessageBytes: testLimit, CloseGrace: testGrace})
		require.NoError(t, err)
		t.Cleanup(func() { b.Close() })
		c, err := natsbus.Dial(natsbus.ClientConfig{URL: url, Token: token, Buffer: testBuffer, MaxMessageBytes: testLimit})
		require.NoError(t, err)
		return bustest.Harness{Bus: b, Client: c}
	})
}
