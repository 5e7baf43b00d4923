package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/wire"
)

// proxy forwards TCP connections to a target and can cut them all.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) url() string { return "nats://" + p.ln.Addr().String() }

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Go(func() { io.Copy(u, c); u.Close() })
		p.wg.Go(func() { io.Copy(c, u); c.Close() })
	}
}

// cut closes every connection through the proxy; new ones may come.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func waitFinal(t *testing.T, d *runtime.Delegate, taskID string) wire.State {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		ev, err := d.Wait(ctx)
		require.NoError(t, err, "the waiting delegate never woke")
		if ev.Task != nil && ev.Task.TaskID == taskID && ev.Task.Final {
			return ev.Task.Task.Status.State
		}
		if ev.Resync != nil {
			for _, task := range ev.Resync.Changed {
				if task.ID == taskID && task.Status.State.Terminal() {
					return task.Status.State
				}
			}
		}
	}
}

// TestRuntimeReconnectsMidTask cuts a runtime's TCP connection to NATS
// while its delegate waits for a task, and the task completes during the
// outage: the client reconnects, the runtime replays, and the delegate
// wakes with the outcome.
func TestRuntimeReconnectsMidTask(t *testing.T) {
	bus, err := natsbus.New(natsbus.Config{})
	require.NoError(t, err)
	b, err := broker.New(context.Background(), bus, broker.Config{})
	require.NoError(t, err)
	defer func() { bus.Close(); b.Close() }()
	p := newProxy(t, strings.TrimPrefix(bus.URL(), "nats://"))

	ctx := context.Background()
	far, err := natsbus.Dial(natsbus.ClientConfig{URL: p.url(), Token: bus.Server().Token()})
	require.NoError(t, err)
	defer far.Close()
	near, err := bus.Connect(natsbus.ClientConfig{})
	require.NoError(t, err)
	s1, err := far.Session(ctx, "far")
	require.NoError(t, err)
	rt1, err := runtime.New(ctx, s1, runtime.Config{Feed: runtime.FeedConfig{CheckInterval: 100 * time.Millisecond}})
	require.NoError(t, err)
	defer rt1.Close()
	s2, err := near.Session(ctx, "near")
	require.NoError(t, err)
	rt2, err := runtime.New(ctx, s2, runtime.Config{})
	require.NoError(t, err)
	defer rt2.Close()
	asker, err := rt1.Spawn(ctx, wire.AgentCard{Name: "asker"})
	require.NoError(t, err)
	worker, err := rt2.Spawn(ctx, wire.AgentCard{Name: "worker"})
	require.NoError(t, err)
	task, err := asker.Send(ctx, "worker", wire.Message{Parts: []wire.Part{wire.TextPart("job")}}, nil)
	require.NoError(t, err)
	_, err = worker.Wait(ctx)
	require.NoError(t, err)

	p.cut()
	_, err = worker.Update(ctx, task.ID, wire.StateCompleted, nil)
	require.NoError(t, err)
	assert.Equal(t, wire.StateCompleted, waitFinal(t, asker, task.ID))
}

// freePort returns a TCP port free at the moment.
func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestExternalNATSServerRestart restarts the external nats-server under a
// broker started with --nats-url while a delegate waits: broker and
// clients reconnect, and the delegate wakes with the outcome of its task,
// completed after the restart.
func TestExternalNATSServerRestart(t *testing.T) {
	t.Parallel()
	bin := testbin.Build(t, "github.com/nats-io/nats-server/v2")
	port := freePort(t)
	token := "0123456789abcdef0123456789abcdef"
	runServer := func() *exec.Cmd {
		cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", fmt.Sprint(port), "--auth", token)
		ready := newLineSignal("Server is ready")
		cmd.Stdout, cmd.Stderr = io.Discard, ready
		require.NoError(t, cmd.Start())
		ready.wait(t, 10*time.Second, "nats-server is ready")
		return cmd
	}
	srv := runServer()
	defer func() { srv.Process.Kill(); srv.Wait() }()
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)

	// The broker: a2a-bus serve --nats-url, a real process.
	dir := t.TempDir()
	serve := exec.Command(testbin.A2ABus(t), "serve", "--nats-url", fmt.Sprintf("nats://%s@127.0.0.1:%d", token, port),
		"--connection-file", filepath.Join(dir, "c.json"), "--data-dir", filepath.Join(dir, "data"), "--log-level=warn")
	serve.Env = append(os.Environ(), "HOME="+dir)
	// It serves once it prints the connection file's path (the file is
	// written before).
	ready := newLineSignal(filepath.Join(dir, "c.json"))
	serve.Stderr = ready
	require.NoError(t, serve.Start())
	defer func() { serve.Process.Signal(os.Interrupt); serve.Wait() }()
	ready.wait(t, 20*time.Second, "serve is ready")
	var info struct{ URL string }
	data, err := os.ReadFile(filepath.Join(dir, "c.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &info))
	assert.Equal(t, url, info.URL, "the connection file holds the URL without credentials")

	ctx := context.Background()
	dial := func() *natsbus.Client {
		c, err := natsbus.Dial(natsbus.ClientConfig{URL: url, Token: token})
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	mk := func(c *natsbus.Client, session string) *runtime.Runtime {
		s, err := c.Session(ctx, session)
		require.NoError(t, err)
		rt, err := runtime.New(ctx, s, runtime.Config{Feed: runtime.FeedConfig{CheckInterval: 100 * time.Millisecond}})
		require.NoError(t, err)
		t.Cleanup(func() { rt.Close() })
		return rt
	}
	asker, err := mk(dial(), "s1").Spawn(ctx, wire.AgentCard{Name: "asker"})
	require.NoError(t, err)
	worker, err := mk(dial(), "s2").Spawn(ctx, wire.AgentCard{Name: "worker"})
	require.NoError(t, err)
	task, err := asker.Send(ctx, "worker", wire.Message{Parts: []wire.Part{wire.TextPart("job")}}, nil)
	require.NoError(t, err)
	_, err = worker.Wait(ctx)
	require.NoError(t, err)

	// Restart the server on the same port.
	require.NoError(t, srv.Process.Kill())
	srv.Wait()
	srv = runServer()

	// The worker retries its update until it is acknowledged, or until
	// the broker says the task is already completed (an attempt went
	// through but its answer was lost in the outage: at most once).
	require.Eventually(t, func() bool {
		c, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := worker.Update(c, task.ID, wire.StateCompleted, nil)
		return err == nil || errors.Is(err, wire.ErrInvalidTransition)
	}, 30*time.Second, 50*time.Millisecond)
	assert.Equal(t, wire.StateCompleted, waitFinal(t, asker, task.ID))
}

// lineSignal is a process's output, discarded but for a line that
// contains want: at its end ready closes.
type lineSignal struct {
	want  string
	ready chan struct{}
	mu    sync.Mutex
	line  []byte // the line being written
	seen  bool
}

func newLineSignal(want string) *lineSignal {
	return &lineSignal{want: want, ready: make(chan struct{})}
}

func (l *lineSignal) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for rest := p; len(rest) > 0 && !l.seen; {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			l.line = append(l.line, rest...)
			break
		}
		l.line = append(l.line, rest[:i]...)
		if bytes.Contains(l.line, []byte(l.want)) {
			l.seen = true
			close(l.ready)
		}
		l.line, rest = l.line[:0], rest[i+1:]
	}
	return len(p), nil
}

// wait waits for the line.
func (l *lineSignal) wait(t *testing.T, within time.Duration, what string) {
	t.Helper()
	select {
	case <-l.ready:
	case <-time.After(within):
		t.Fatalf("%s: no line with %q within %v", what, l.want, within)
	}
}
