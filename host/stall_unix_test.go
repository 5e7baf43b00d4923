//go:build unix

package host_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/host"
	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// The stall tests give the host a 2 s health timeout: a stuck broker is
// found about 4 s after it stops (a call waits 2 s, then the health call
// 2 s).
const testHealthTimeout = 2 * time.Second

// longStall is how long the stall tests stop a process: as long as a
// laptop lid or a debugger might. Its length is the point: it outlasts
// every timer the stopped process or its peer runs on (the host's 5 s
// health timeout, and natsbus's 10 s client ping interval, which no test
// can shorten), so that at the continue they all fire late at once. The
// tests that sleep it run in parallel.
const longStall = 15 * time.Second

// waitingScenario: two sessions' delegates share a task and the
// requester waits on it; stall stops the broker and returns once the host
// is served again (it replaced or rejoined the broker). Then the assignee
// completes the task, and the requester must wake.
func waitingScenario(t *testing.T, h *host.Host, stall func(pid int)) {
	chat1, chat2 := session(t, h, "chat-1"), session(t, h, "chat-2")
	// Settled while a broker still serves them.
	defer chat1.Close()
	defer chat2.Close()
	asker, worker := spawn(t, chat1, "asker"), spawn(t, chat2, "worker")
	task, err := asker.Send(ctxT(t), worker.ID(), say("work across a stuck broker"), nil)
	require.NoError(t, err)
	require.NotNil(t, wait(t, worker).Task, "the worker has its task")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	woke := make(chan error, 1)
	go func() { woke <- waitCompleted(ctx, asker, task.ID) }()
	defer func() { cancel(); <-woke }()

	stall(h.BrokerPID())
	_, err = worker.Update(ctxT(t), task.ID, wire.StateCompleted, &wire.Message{Parts: []wire.Part{wire.TextPart("done")}})
	require.NoError(t, err, "the assignee's update goes through")
	select {
	case err := <-woke:
		woke <- err // for the deferred receive
		require.NoError(t, err, "the requester hears the task completed")
	case <-time.After(30 * time.Second):
		t.Fatal("the requester never woke")
	}
}

// signal sends a signal to a process.
func signal(t *testing.T, pid int, sig syscall.Signal) {
	t.Helper()
	// 0 (no broker at that moment) or less would signal a whole process
	// group, this test's among it.
	require.Positive(t, pid, "a broker's pid to signal %v", sig)
	require.NoError(t, syscall.Kill(pid, sig), "signal %v to %d", sig, pid)
	if sig == syscall.SIGSTOP {
		stopped(t, pid)
	}
}

// stopped waits until the process is stopped: kill returns before every
// thread of it has stopped, and on a loaded machine a request sent at
// once may still be answered (a call on the "stopped" sidecar came back
// with no error). Where /proc cannot tell (not Linux), it returns.
func stopped(t *testing.T, pid int) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		// pid (comm) state ...: the state follows the last ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i >= 0 && i+2 < len(stat) && (stat[i+2] == 'T' || stat[i+2] == 't') {
			return
		}
		require.True(t, time.Now().Before(end), "process %d never stopped", pid)
	}
}

// untilServed waits until the host talks to a broker that is not old
// (again: a broker is up, other than old, and it rejoined at least once
// more than before), and returns when.
func untilServed(t *testing.T, h *host.Host, ok func(pid int) bool) time.Time {
	t.Helper()
	var at time.Time
	require.Eventually(t, func() bool {
		pid := h.BrokerPID()
		at = time.Now()
		return pid != 0 && ok(pid)
	}, 60*time.Second, 5*time.Millisecond, "the host is served again")
	return at
}

// TestAStoppedPipeChildIsReplaced: the broker child stops (SIGSTOP)
// while a delegate waits on a task. The host finds it does not answer,
// kills it and starts another on the same data dir; the waiting delegate
// hears the task completed.
func TestAStoppedPipeChildIsReplaced(t *testing.T) {
	t.Parallel()
	cfg := host.Config{Bus: host.Pipe, HealthTimeout: testHealthTimeout,
		BrokerCommand: []string{testbin.A2ABus(t), "serve", "--bus=pipe", "--data-dir", t.TempDir(), "--log-level=warn"}}
	cfg.Runtime.Feed.CheckInterval = 100 * time.Millisecond
	h, err := host.Open(ctxT(t), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() })
	waitingScenario(t, h, func(old int) {
		signal(t, old, syscall.SIGSTOP)
		stopped := time.Now()
		at := untilServed(t, h, func(pid int) bool { return pid != old })
		t.Logf("a new child serves %v after the old one stopped", at.Sub(stopped).Round(time.Millisecond))
	})
	assert.GreaterOrEqual(t, h.Rejoins(), 1)
}

// TestAPipeChildThatGoesBadIsReplaced: a child that answers no more
// (silent, garbage on its stdout, a line that never ends) though it runs:
// the call waiting on it fails with ErrUnavailable once the host takes it
// for dead, and the next is answered by a new child (here the real broker).
func TestAPipeChildThatGoesBadIsReplaced(t *testing.T) {
	for _, role := range []string{silentRole, garbageRole, endlessRole} {
		t.Run(role, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			marker, data := filepath.Join(dir, "started"), filepath.Join(dir, "data")
			// The first start is the fake broker (exec: the child is the
			// fake itself), every later one the real broker.
			script := `if [ -e "$1" ]; then exec "$2" serve --bus=pipe --data-dir "$3" --log-level=warn; fi; : > "$1"; exec env "$4=$5" "$6"`
			fake := childCommand(role)
			argv := []string{"sh", "-c", script, "sh", marker, testbin.A2ABus(t), data, childRole, role, fake.Path}
			h, err := host.Open(ctxT(t), host.Config{Bus: host.Pipe, BrokerCommand: argv, HealthTimeout: testHealthTimeout})
			require.NoError(t, err)
			t.Cleanup(func() { h.Close() })
			first := h.BrokerPID()
			hc := h.Client().(transport.HostCaller)

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			_, err = hc.CallHost(ctx, wire.MethodAdminInfo, nil)
			require.ErrorIs(t, err, transport.ErrUnavailable, "the call fails once the host takes its broker for dead")
			t.Logf("the call on the bad child failed after %v", time.Since(start).Round(time.Millisecond))
			raw, err := hc.CallHost(ctxT(t), wire.MethodAdminInfo, nil)
			require.NoError(t, err, "the next call is answered")
			var info wire.AdminInfo
			require.NoError(t, json.Unmarshal(raw, &info))
			assert.Equal(t, "pipe", info.Bus, "by the real broker")
			assert.NotEqual(t, first, h.BrokerPID())
			assert.Equal(t, 1, h.Rejoins())
		})
	}
}

// TestAStoppedSidecarIsRejoined: the joined sidecar stops (SIGSTOP)
// while a delegate waits. The host notices within its health timeout: a
// call waiting on the stopped broker fails with ErrUnavailable instead of
// hanging. Then either the desktop app's supervisor kills the stopped
// sidecar and starts another on the same data dir, or the sidecar is
// continued after 15 s; either way the host rejoins it and the waiting
// delegate hears the task completed.
func TestAStoppedSidecarIsRejoined(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		long bool
		// recover brings a broker back, and returns when it is ready;
		// exited closes once the old one exited.
		recover func(t *testing.T, old int, exited <-chan struct{}, stopped time.Time, path, data string) time.Time
		same    bool // the same broker serves again
	}{
		{name: "killed and restarted by its supervisor", recover: func(t *testing.T, old int, exited <-chan struct{}, _ time.Time, path, data string) time.Time {
			signal(t, old, syscall.SIGKILL)
			return restartSidecar(t, exited, path, data)
		}},
		{name: "continued after 15 s", long: true, same: true, recover: func(t *testing.T, old int, _ <-chan struct{}, stopped time.Time, _, _ string) time.Time {
			time.Sleep(time.Until(stopped.Add(longStall))) // the stop's length is the point
			signal(t, old, syscall.SIGCONT)
			return time.Now()
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.long && testing.Short() {
				t.Skip("stops a process for 15 s")
			}
			t.Parallel()
			dir := t.TempDir()
			path, data := filepath.Join(dir, "run", "connection.json"), filepath.Join(dir, "data")
			exited, _ := sidecar(t, path, data)
			cfg := host.Config{Bus: host.NATS, ConnectionFile: path, HealthTimeout: testHealthTimeout}
			cfg.Runtime.Feed.CheckInterval = 100 * time.Millisecond
			h, err := host.Open(ctxT(t), cfg)
			require.NoError(t, err)
			t.Cleanup(func() { h.Close() })
			hc := h.Client().(transport.HostCaller)
			waitingScenario(t, h, func(old int) {
				signal(t, old, syscall.SIGSTOP)
				stopped := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_, err := hc.CallHost(ctx, wire.MethodAdminInfo, nil)
				require.ErrorIs(t, err, transport.ErrUnavailable, "a call on the stopped broker fails, not hangs")
				t.Logf("the host noticed %v after the stop", time.Since(stopped).Round(time.Millisecond))
				ready := c.recover(t, old, exited, stopped, path, data)
				at := untilServed(t, h, func(pid int) bool { return h.Rejoins() >= 1 && (pid == old) == c.same })
				t.Logf("the host rejoined %v after the broker was back", at.Sub(ready).Round(time.Millisecond))
			})
		})
	}
}

// TestAStoppedHostGoesOn: the host process itself is stopped for 15 s
// (SIGSTOP, then SIGCONT, as a laptop lid or a debugger does) while a
// delegate waits. At the continue every timer it has fires late, at once;
// it must still find its broker answering, keep it, and go on: the task
// completed after the continue reaches the waiting delegate. On the pipe
// the host is stopped while calls wait (a health call among them, or
// not), and the broker's answers come only after the continue: their
// deadlines passed while the host stood still, which says nothing of the
// broker.
func TestAStoppedHostGoesOn(t *testing.T) {
	if testing.Short() {
		t.Skip("stops a process for 15 s")
	}
	t.Parallel()
	for _, c := range []struct {
		name, bus string
		hold      string // on the pipe, the answer the relay holds across the stop
	}{
		{"pipe, stopped while a health call waits", "pipe", holdHealth},
		{"pipe, stopped while calls wait", "pipe", holdCall},
		{"nats", "nats", ""},
	} {
		bus := c.bus
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			var args string
			var arm, seen, release *os.File // the relay's FIFOs, on the pipe
			switch bus {
			case "pipe":
				arm, seen, release = fifo(t, filepath.Join(dir, "arm")), fifo(t, filepath.Join(dir, "seen")), fifo(t, filepath.Join(dir, "release"))
				b, err := json.Marshal([]string{"env", childRole + "=" + relayRole, relayDirEnv + "=" + dir, relayHoldEnv + "=" + c.hold, os.Args[0],
					testbin.A2ABus(t), "serve", "--bus=pipe", "--data-dir", filepath.Join(dir, "data"), "--log-level=warn"})
				require.NoError(t, err)
				args = string(b)
			case "nats":
				args = filepath.Join(dir, "run", "connection.json")
				sidecar(t, args, filepath.Join(dir, "data"))
			}
			cmd := childCommand(hostRole, hostBusEnv+"="+bus, hostArgsEnv+"="+args)
			stdin, err := cmd.StdinPipe()
			require.NoError(t, err)
			stdout, err := cmd.StdoutPipe()
			require.NoError(t, err)
			cmd.Stderr = testWriter{t}
			require.NoError(t, cmd.Start())
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			lines := make(chan string, 2)
			go func() {
				defer close(lines)
				sc := bufio.NewScanner(stdout)
				for sc.Scan() {
					lines <- sc.Text()
				}
			}()
			next := func(what string) string {
				select {
				case l, ok := <-lines:
					require.True(t, ok, "the host child ended before it was %s", what)
					return l
				case <-time.After(60 * time.Second):
					t.Fatalf("the host child was never %s", what)
				}
				return ""
			}
			var broker int
			_, err = fmt.Sscanf(next("ready"), "ready %d", &broker)
			require.NoError(t, err)
			if seen != nil {
				// Ready: the relay holds the answer to the next health
				// check (within a second: hostChild), or to the poll after
				// it; then a call waits for it.
				_, err := arm.WriteString("armed\n")
				require.NoError(t, err)
				require.NoError(t, seen.SetReadDeadline(time.Now().Add(60*time.Second)))
				_, err = bufio.NewReader(seen).ReadString('\n')
				require.NoError(t, err, "the host checks its broker while idle")
			}

			signal(t, cmd.Process.Pid, syscall.SIGSTOP)
			time.Sleep(longStall) // the stop's length is the point
			signal(t, cmd.Process.Pid, syscall.SIGCONT)
			if release != nil {
				_, err = release.WriteString("go\n")
				require.NoError(t, err)
			}
			_, err = stdin.Write([]byte("complete\n"))
			require.NoError(t, err)
			var after, rejoins int
			_, err = fmt.Sscanf(next("told the task completed"), "completed %d %d", &after, &rejoins)
			require.NoError(t, err)
			assert.Equal(t, broker, after, "the same broker serves")
			if bus == "pipe" {
				assert.Zero(t, rejoins, "the child was never replaced")
			} else {
				// The server may cut a connection that was silent that long;
				// the host then rejoins the same sidecar.
				t.Logf("%d rejoins", rejoins)
			}
			require.NoError(t, cmd.Wait())
		})
	}
}

// fifo makes a FIFO and opens it both ways: neither side's open waits,
// and what is written stays until read.
func fifo(t *testing.T, path string) *os.File {
	t.Helper()
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return f
}

// testWriter logs a child's stderr through the test.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", p)
	return len(p), nil
}
