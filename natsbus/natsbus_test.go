package natsbus_test

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { testbin.Cleanup() }))
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
// with token authentication, and returns its URL and token.
func externalServer(t *testing.T) (url, token string) {
	t.Helper()
	bin := testbin.Build(t, "github.com/nats-io/nats-server/v2")
	dir := t.TempDir()
	token = "0123456789abcdef0123456789abcdef"
	cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", "-1", "--auth", token, "--ports_file_dir", dir)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		files, _ := filepath.Glob(filepath.Join(dir, "*.ports"))
		if len(files) > 0 {
			data, err := os.ReadFile(files[0])
			var ports struct{ Nats []string }
			if err == nil && json.Unmarshal(data, &ports) == nil && len(ports.Nats) > 0 {
				return ports.Nats[0], token
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("nats-server did not start")
	return "", ""
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
