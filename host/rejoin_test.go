package host_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/host"
	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/wire"
)

// sidecar runs `a2a-bus serve` as a desktop host runs its sidecar, and
// returns once it is ready (its connection file's path on stderr), with
// when, and a channel closed once it has exited.
func sidecar(t *testing.T, path, dataDir string) (exited <-chan struct{}, ready time.Time) {
	t.Helper()
	cmd := exec.Command(testbin.A2ABus(t), "serve", "--connection-file", path, "--data-dir", dataDir, "--log-level=warn")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	r := bufio.NewReader(stderr)
	first, err := r.ReadString('\n')
	go func() {
		io.Copy(io.Discard, r)
		cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	require.NoError(t, err, "the sidecar is ready")
	require.Equal(t, path, strings.TrimSpace(first), "the sidecar is ready")
	return done, time.Now()
}

// restartSidecar starts a sidecar on the data dir once the one before
// exited, as a supervisor does, and returns when it is ready.
func restartSidecar(t *testing.T, before <-chan struct{}, path, dataDir string) time.Time {
	t.Helper()
	select {
	case <-before:
	case <-time.After(10 * time.Second):
		t.Fatal("the sidecar before never exited")
	}
	_, ready := sidecar(t, path, dataDir)
	return ready
}

// untilCompleted waits until the delegate hears that the task completed:
// its event, or a Resync that shows it.
func untilCompleted(t *testing.T, d *runtime.Delegate, taskID string) {
	t.Helper()
	for {
		ev, err := d.Wait(ctxT(t))
		require.NoError(t, err)
		if ev.Task != nil && ev.Task.TaskID == taskID && ev.Task.Final {
			assert.Equal(t, wire.StateCompleted, ev.Task.Task.Status.State)
			return
		}
		if ev.Resync != nil {
			for _, task := range ev.Resync.Changed {
				if task.ID == taskID && task.Status.State == wire.StateCompleted {
					return
				}
			}
		}
	}
}

// rejoinScenario: two sessions' delegates share a task; the broker is
// killed while the requester waits; once a broker is back (restart does
// that), the assignee's update goes through and the requester wakes.
func rejoinScenario(t *testing.T, h *host.Host, restart func() time.Time) {
	chat1, chat2 := session(t, h, "chat-1"), session(t, h, "chat-2")
	// Settled while a broker still serves them: a cleanup after the
	// restarted broker's would wait for one in vain.
	defer chat1.Close()
	defer chat2.Close()
	asker, worker := spawn(t, chat1, "asker"), spawn(t, chat2, "worker")
	task, err := asker.Send(ctxT(t), worker.ID(), say("work across a crash"), nil)
	require.NoError(t, err)
	require.NotNil(t, wait(t, worker).Task, "the worker has its task")
	woke := make(chan time.Time, 1)
	go func() {
		untilCompleted(t, asker, task.ID)
		woke <- time.Now()
	}()
	old := h.BrokerPID()
	require.NoError(t, kill(old))
	ready := restart()
	_, err = worker.Update(ctxT(t), task.ID, wire.StateCompleted, &wire.Message{Parts: []wire.Part{wire.TextPart("done")}})
	require.NoError(t, err, "the assignee's update goes through")
	select {
	case at := <-woke:
		t.Logf("the requester woke %v after the new broker was ready", at.Sub(ready).Round(time.Millisecond))
		assert.Less(t, at.Sub(ready), 5*time.Second)
	case <-time.After(20 * time.Second):
		t.Fatal("the requester never woke")
	}
	assert.NotEqual(t, old, h.BrokerPID())
	assert.GreaterOrEqual(t, h.Rejoins(), 1)
}

func TestAHostRejoinsARestartedSidecar(t *testing.T) {
	dir := t.TempDir()
	path, data := filepath.Join(dir, "run", "connection.json"), filepath.Join(dir, "data")
	first, _ := sidecar(t, path, data)
	cfg := host.Config{Bus: host.NATS, ConnectionFile: path}
	cfg.Runtime.Feed.CheckInterval = 100 * time.Millisecond
	h, err := host.Open(ctxT(t), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() })
	rejoinScenario(t, h, func() time.Time {
		// The desktop host restarts its sidecar on the same data dir.
		return restartSidecar(t, first, path, data)
	})
}

func TestAPipeHostRestartsItsBroker(t *testing.T) {
	data := t.TempDir()
	cfg := host.Config{Bus: host.Pipe,
		BrokerCommand: []string{testbin.A2ABus(t), "serve", "--bus=pipe", "--data-dir", data, "--log-level=warn"}}
	cfg.Runtime.Feed.CheckInterval = 100 * time.Millisecond
	h, err := host.Open(ctxT(t), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() })
	first := h.BrokerPID()
	rejoinScenario(t, h, func() time.Time {
		// The host restarts the child itself.
		var ready time.Time
		require.Eventually(t, func() bool {
			pid := h.BrokerPID()
			ready = time.Now()
			return pid != 0 && pid != first
		}, 10*time.Second, 5*time.Millisecond, "a new child")
		return ready
	})
}

// kill kills a process at once (SIGKILL on Unix, TerminateProcess on
// Windows), as a crash would.
func kill(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Kill()
}

// TestConcurrentCallsAfterARestartRegisterOnce: after a restart every
// token is unknown; a delegate's concurrent calls register it again once,
// and none fails unauthorized.
func TestConcurrentCallsAfterARestartRegisterOnce(t *testing.T) {
	h, err := host.OpenFake(ctxT(t), host.Config{Memory: true})
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() })
	d := spawn(t, session(t, h, "chat-1"), "worker")
	spawn(t, session(t, h, "chat-2"), "peer")
	raw, err := h.Client().Session(ctxT(t), "chat-1")
	require.NoError(t, err)
	defer raw.Close()
	failed := 0
	for range 20 {
		// What a restart does to the delegate's token: the broker no
		// longer accepts it (here the same instance registers again behind
		// the runtime's back).
		_, err = raw.Call(ctxT(t), wire.MethodRegister, wire.RegisterParams{ContextID: "chat-1", Card: &wire.AgentCard{Name: "worker"}, InstanceID: d.InstanceID()})
		require.NoError(t, err)
		var wg sync.WaitGroup
		var mu sync.Mutex
		for range 8 {
			wg.Go(func() {
				_, err := d.Peers(context.Background())
				mu.Lock()
				defer mu.Unlock()
				if errors.Is(err, wire.ErrUnauthorized) {
					failed++
				}
			})
		}
		wg.Wait()
	}
	assert.Zero(t, failed)
}
