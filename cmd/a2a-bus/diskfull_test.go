package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/pipebus"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// Bounds of the full-disk test (docs/PROTOCOL.md §9).
const (
	fullDiskAnswer = 2 * time.Second // a change is answered within
	fullDiskExit   = 5 * time.Second // SIGTERM ends serve within
	// fullDiskLines bounds serve's stderr over the test: its start, a
	// few lines per failure and recovery, and summaries, never a line
	// per retry.
	fullDiskLines = 40
)

// mountTmpfs mounts a tmpfs of size (as mount's size= option) on a new
// folder, unmounted at the test's end. It skips the test, naming why,
// where it cannot mount one.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skipf("a small filesystem is a tmpfs, which %s has not", runtime.GOOS)
	}
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v: %s", err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fill writes path until the filesystem has no room left, and returns
// how much it wrote.
func fill(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	require.NoError(t, err)
	defer f.Close()
	var n int64
	for _, chunk := range []int{1 << 20, 4 << 10, 512} {
		buf := make([]byte, chunk)
		for {
			m, err := f.Write(buf)
			n += int64(m)
			if err != nil {
				require.ErrorIs(t, err, syscall.ENOSPC)
				break
			}
		}
	}
	return n
}

// lineCounter counts the lines written to it, and keeps the first
// bytes of them to show when a test fails.
type lineCounter struct {
	mu    sync.Mutex
	lines int
	kept  bytes.Buffer
}

func (c *lineCounter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lines += bytes.Count(p, []byte("\n"))
	if room := 64<<10 - c.kept.Len(); room > 0 {
		c.kept.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (c *lineCounter) count() (int, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lines, c.kept.String()
}

// fullDiskBroker is a2a-bus serve on the pipe, its data dir on a small
// tmpfs, with a requester and an assignee registered.
type fullDiskBroker struct {
	mnt      string
	cmd      *exec.Cmd
	child    *pipebus.Child
	stderr   *lineCounter
	req, asg *member
	rs       transport.Session
}

func startFullDiskBroker(t *testing.T) *fullDiskBroker {
	t.Helper()
	mnt := mountTmpfs(t, "20m")
	b := &fullDiskBroker{mnt: mnt, stderr: &lineCounter{}}
	// The default log level: what a user's broker writes.
	b.cmd = exec.Command(testbin.A2ABus(t), "serve", "--bus=pipe", "--data-dir", filepath.Join(mnt, "data"), "--max-tasks-per-context=100000")
	b.cmd.Env = testEnv(t)
	b.cmd.Stderr = b.stderr
	child, err := pipebus.Start(b.cmd, pipebus.ClientConfig{})
	require.NoError(t, err)
	b.child = child
	t.Cleanup(func() {
		b.cmd.Process.Signal(syscall.SIGKILL)
		child.Close()
	})
	b.req = &member{session: "asker", name: "asker", instance: "asker-1"}
	b.asg = &member{session: "worker", name: "worker", instance: "worker-1"}
	b.rs = b.req.register(t, child)
	b.asg.register(t, child)
	t.Cleanup(func() {
		if t.Failed() {
			n, text := b.stderr.count()
			t.Logf("serve's stderr (%d lines):\n%s", n, text)
		}
	})
	return b
}

// send sends text to the assignee as a new task, waiting at most
// fullDiskAnswer for the answer: it returns the task, or the broker's
// error, and fails the test when there is no answer in time.
func (b *fullDiskBroker) send(t *testing.T, text string) (*wire.Task, *wire.Error) {
	t.Helper()
	start := time.Now()
	task, werr, err := b.trySend(text)
	require.NoError(t, err, "a send is answered within %v, with a result or an error: after %v", fullDiskAnswer, time.Since(start))
	return task, werr
}

// trySend is send that reports no answer in time as err.
func (b *fullDiskBroker) trySend(text string) (*wire.Task, *wire.Error, error) {
	ctx, cancel := context.WithTimeout(context.Background(), fullDiskAnswer)
	defer cancel()
	res, err := b.rs.Call(ctx, wire.MethodSend, wire.SendParams{Token: b.req.token, To: b.asg.id, Message: &wire.Message{Parts: []wire.Part{wire.TextPart(text)}}})
	if err != nil {
		var we *wire.Error
		if errors.As(err, &we) {
			return nil, we, nil
		}
		return nil, nil, err
	}
	var r wire.TaskResult
	if err := json.Unmarshal(res, &r); err != nil {
		return nil, nil, err
	}
	return r.Task, nil, nil
}

// read reads a task and lists the agents, each answered.
func (b *fullDiskBroker) read(t *testing.T, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), fullDiskAnswer)
	defer cancel()
	res, err := b.rs.Call(ctx, wire.MethodGetTask, wire.TaskParams{Token: b.req.token, TaskID: id})
	require.NoError(t, err, "tasks.get answers")
	var r wire.TaskResult
	require.NoError(t, json.Unmarshal(res, &r))
	assert.Equal(t, id, r.Task.ID)
	_, err = b.rs.Call(ctx, wire.MethodListAgents, map[string]any{"token": b.req.token})
	require.NoError(t, err, "agents.list answers")
}

// fillUntilRefused fills the disk with a ballast file, then sends tasks
// until one is refused: each is answered within fullDiskAnswer, and the
// refusal is -32603 naming the full disk. Big messages make the store
// write (its log and its tables) soon. It returns the ballast's path
// and the tasks taken.
func (b *fullDiskBroker) fillUntilRefused(t *testing.T) (ballast string, taken []string) {
	t.Helper()
	ballast = filepath.Join(b.mnt, "ballast")
	t.Logf("ballast: %d bytes", fill(t, ballast))
	big := strings.Repeat("x", 200<<10)
	for range 200 {
		task, werr := b.send(t, big)
		if werr != nil {
			t.Logf("refused after %d sends of %d bytes: %s", len(taken), len(big), werr.Message)
			assert.Equal(t, wire.ErrInternal.Code, werr.Code, "%v", werr)
			assert.Contains(t, werr.Message, "disk is full", "the error names the cause")
			return ballast, taken
		}
		taken = append(taken, task.ID)
	}
	t.Fatal("200 sends of 200 KiB were all taken on a full 20 MiB disk")
	return "", nil
}

// warmUp sends n tasks of 100 KiB: the store's log has moved on to files
// it reuses, whose room is taken already, so that it is a flush of the
// memory table, not the log, that finds the disk full.
func (b *fullDiskBroker) warmUp(t *testing.T, n int) (taken []string) {
	t.Helper()
	text := strings.Repeat("w", 100<<10)
	for range n {
		task, werr := b.send(t, text)
		require.Nil(t, werr)
		taken = append(taken, task.ID)
	}
	return taken
}

// sigterm signals serve and checks that it exits, within fullDiskExit.
func (b *fullDiskBroker) sigterm(t *testing.T) {
	t.Helper()
	start := time.Now()
	require.NoError(t, b.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-b.child.Exited():
		t.Logf("exited %v after SIGTERM", time.Since(start).Round(time.Millisecond))
	case <-time.After(fullDiskExit):
		t.Fatalf("serve still runs %v after SIGTERM", fullDiskExit)
	}
}

// restartAndRead starts a broker again on the data dir, the members
// register again, and each acknowledged task is read.
func (b *fullDiskBroker) restartAndRead(t *testing.T, acked []string) {
	t.Helper()
	again := startPipeBroker(t, filepath.Join(b.mnt, "data"))
	b.req.register(t, again)
	b.asg.register(t, again)
	s, err := again.Session(context.Background(), b.req.session)
	require.NoError(t, err)
	b.rs = s
	for _, id := range acked {
		b.read(t, id)
	}
}

func (b *fullDiskBroker) checkLines(t *testing.T) {
	t.Helper()
	n, text := b.stderr.count()
	t.Logf("serve wrote %d lines on stderr:\n%s", n, text)
	assert.LessOrEqual(t, n, fullDiskLines, "a repeated warning is summarized, not logged per retry:\n%s", text)
}

// TestFullDisk runs serve with its data dir on a 20 MiB tmpfs, and fills
// the disk under it: a change is answered with an error naming the full
// disk within fullDiskAnswer, reads are answered, stderr stays short;
// once there is room again the same process takes changes, and the
// acknowledged ones are all there, also after a restart; SIGTERM ends it
// within fullDiskExit, whether the disk is full or not. The store meets
// the full disk in its log's writes, or (after a warm-up) in a flush.
func TestFullDisk(t *testing.T) {
	for _, tc := range []struct {
		name string
		warm int // sends of 100 KiB before the disk fills
	}{
		{"the log finds the disk full", 0},
		{"a flush finds the disk full", 40},
	} {
		t.Run(tc.name+": changes fail and reads answer; changes are taken again once there is room", func(t *testing.T) {
			b := startFullDiskBroker(t)
			acked := b.warmUp(t, tc.warm)
			ballast, taken := b.fillUntilRefused(t)
			acked = append(acked, taken...)
			for range 5 {
				start := time.Now()
				_, werr := b.send(t, "a small one")
				require.NotNil(t, werr, "refused while the disk is full")
				assert.Equal(t, wire.ErrInternal.Code, werr.Code)
				t.Logf("refused in %v: %s", time.Since(start).Round(time.Microsecond), werr.Message)
				start = time.Now()
				b.read(t, acked[0])
				t.Logf("read in %v", time.Since(start).Round(time.Microsecond))
			}

			require.NoError(t, os.Remove(ballast))
			start := time.Now()
			after, werr := b.send(t, "after there is room again")
			require.Nil(t, werr, "the next send once there is room is taken, in the same process")
			t.Logf("taken %v after the ballast went", time.Since(start).Round(time.Millisecond))
			acked = append(acked, after.ID)
			for _, id := range acked {
				b.read(t, id)
			}
			b.sigterm(t)
			b.checkLines(t)

			// Nothing acknowledged is lost: a broker started again on the
			// data dir has it all.
			b.restartAndRead(t, acked)
		})
		// A broker killed on the full disk: its store's log holds changes
		// not yet in a table, which a start writes to one before it takes
		// anything. On the disk still full the start stops, in one line
		// naming it (Pebble alone would try the table again, at once, for
		// ever); once there is room the next start has every change.
		t.Run(tc.name+": a start after SIGKILL on the full disk stops, naming it", func(t *testing.T) {
			t.Parallel()
			b := startFullDiskBroker(t)
			acked := b.warmUp(t, tc.warm)
			ballast, taken := b.fillUntilRefused(t)
			acked = append(acked, taken...)
			require.NoError(t, b.cmd.Process.Signal(syscall.SIGKILL))
			<-b.child.Exited()

			// A bound on the start's end, far beyond it (tens of ms).
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, testbin.A2ABus(t), "serve", "--bus=pipe", "--data-dir", filepath.Join(b.mnt, "data"))
			cmd.Env = testEnv(t)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			require.NoError(t, ctx.Err(), "the start on the full disk never ended; stderr:\n%s", &stderr)
			require.Error(t, err, "the start on the full disk fails")
			t.Logf("stderr: %s", &stderr)
			msg := strings.TrimSpace(stderr.String())
			assert.NotContains(t, msg, "\n", "one line")
			assert.Contains(t, msg, "the disk is full")
			assert.Contains(t, msg, "free room on the disk")

			require.NoError(t, os.Remove(ballast))
			b.restartAndRead(t, acked)
		})
		// Whatever the changes meet (the test above says what they
		// should), SIGTERM ends serve. Most of it is serve's wait for the
		// full disk at its exit (pebblestore's CloseTimeout): the two
		// cases wait side by side.
		t.Run(tc.name+": SIGTERM while the disk is full", func(t *testing.T) {
			t.Parallel()
			b := startFullDiskBroker(t)
			b.warmUp(t, tc.warm)
			t.Logf("ballast: %d bytes", fill(t, filepath.Join(b.mnt, "ballast")))
			big := strings.Repeat("x", 200<<10)
			for i := range 200 {
				if _, werr, err := b.trySend(big); werr != nil || err != nil {
					t.Logf("send %d: %v %v", i, werr, err)
					break
				}
			}
			b.sigterm(t)
			b.checkLines(t)
		})
	}
}
