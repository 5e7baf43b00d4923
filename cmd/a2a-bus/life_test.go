//go:build unix

package main_test

// The sidecar's life against the built binary: what kills it, what does
// not, and what it answers on its way out.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/wire"
)

// TestServeOutlivesItsStderrReader: the host that read the broker's
// stderr crashed. The broker's next log line must not kill it (SIGPIPE):
// it goes on serving, and SIGTERM is still a clean exit that removes the
// connection file.
func TestServeOutlivesItsStderrReader(t *testing.T) {
	path := filepath.Join(t.TempDir(), "conn.json")
	cmd := exec.Command(testbin.A2ABus(t), "serve", "--connection-file", path, "--data-dir", "", "--log-level", "debug")
	cmd.Env = testEnv(t)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	exited := false
	t.Cleanup(func() {
		if !exited {
			cmd.Process.Kill()
			<-done
		}
	})
	_, err = bufio.NewReader(stderr).ReadString('\n')
	require.NoError(t, err)
	require.NoError(t, stderr.Close()) // the reader is gone

	conn := readConnection(t, path)
	host, err := nats.Connect(conn.URL, nats.Token(conn.Token))
	require.NoError(t, err)
	defer host.Close()
	for range 3 { // debug logs a line per request: each is a write to a broken pipe
		body, _ := wire.EncodeRequest(1, wire.MethodAdminInfo, nil)
		_, err = host.Request(natsbus.HostRPC, body, 5*time.Second)
		require.NoError(t, err, "still serving")
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-done:
		exited = true
		require.NoError(t, err, "a clean exit, not a death by SIGPIPE")
	case <-time.After(20 * time.Second):
		t.Fatal("the broker did not exit")
	}
	_, err = os.Stat(path)
	assert.ErrorIs(t, err, os.ErrNotExist, "the connection file is removed")
}

func TestServeSIGHUPIsACleanShutdown(t *testing.T) {
	b := startServe(t)
	require.NoError(t, b.stop(t, syscall.SIGHUP), "exit status 0")
	_, err := os.Stat(b.path)
	assert.ErrorIs(t, err, os.ErrNotExist, "the connection file is removed")
}

// TestServeExitsWithItsParent: a sidecar whose host died has no one to
// talk to: it shuts down cleanly (--exit-with-parent, the default).
func TestServeExitsWithItsParent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "conn.json")
	// The parent: a shell that starts serve, says its pid, and waits for
	// its stdin to close.
	parent := exec.Command("sh", "-c", `"$0" serve --connection-file "$1" --data-dir "" & echo $!; read x || true`, testbin.A2ABus(t), path)
	parent.Env = testEnv(t)
	stdin, err := parent.StdinPipe()
	require.NoError(t, err)
	stdout, err := parent.StdoutPipe()
	require.NoError(t, err)
	stderr, err := parent.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, parent.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	require.NoError(t, err)
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	first, err := bufio.NewReader(stderr).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, path, strings.TrimSpace(first), "serving")

	require.NoError(t, stdin.Close()) // the host goes
	require.NoError(t, parent.Wait())
	require.Eventually(t, func() bool { return !running(pid) }, 10*time.Second, 50*time.Millisecond, "serve outlived its parent")
	_, err = os.Stat(path)
	assert.ErrorIs(t, err, os.ErrNotExist, "a clean shutdown: the connection file is removed")
}

// running reports whether pid is a live process (not gone, not a zombie
// waiting for a parent that does not reap).
func running(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}

// TestServeAnswersWhatItTookAtSIGTERM: under load, SIGTERM. Every request
// sent before the signal gets an answer (its result, or -32603 "shutting
// down"), or was never taken (no responders): none is left to a closed
// connection or a timeout.
func TestServeAnswersWhatItTookAtSIGTERM(t *testing.T) {
	b := startServe(t, "--data-dir", t.TempDir())
	var signalled time.Time
	type outcome struct {
		at     time.Time
		err    error
		method string
	}
	var mu sync.Mutex
	var outcomes []outcome
	// The load is under way once this many calls were answered.
	const underWay = 500
	answeredSoFar, loaded := 0, make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		session := fmt.Sprint("load-", w)
		nc, err := nats.Connect(b.conn.URL, nats.Token(b.conn.Token), nats.CustomInboxPrefix(natsbus.SessionInbox(session)))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		call := func(method string, params any) ([]byte, error) {
			body, _ := wire.EncodeRequest(1, method, params)
			start := time.Now()
			msg, err := nc.Request(natsbus.RPCSubject(session), body, 10*time.Second)
			var res []byte
			if err == nil {
				res, err = wire.DecodeResult(msg.Data)
			}
			mu.Lock()
			outcomes = append(outcomes, outcome{start, err, method})
			if err == nil {
				if answeredSoFar++; answeredSoFar == underWay {
					close(loaded)
				}
			}
			mu.Unlock()
			return res, err
		}
		reg := func(name string) string {
			res, err := call(wire.MethodRegister, wire.RegisterParams{ContextID: session, Card: &wire.AgentCard{Name: name}})
			require.NoError(t, err)
			return stringField(t, res, "token")
		}
		asker, worker := reg(session+"-asker"), reg(session+"-worker")
		wg.Go(func() {
			for {
				res, err := call(wire.MethodSend, wire.SendParams{Token: asker, To: session + "-worker", Message: &wire.Message{Parts: []wire.Part{wire.TextPart("go")}}})
				if err != nil {
					return
				}
				var r wire.TaskResult
				if json.Unmarshal(res, &r) != nil || r.Task == nil {
					return
				}
				if _, err := call(wire.MethodUpdateTask, wire.UpdateParams{Token: worker, TaskID: r.Task.ID, State: wire.StateCompleted}); err != nil {
					return
				}
			}
		})
	}
	select {
	case <-loaded:
	case <-time.After(20 * time.Second):
		t.Fatal("the load never got under way")
	}
	mu.Lock()
	signalled = time.Now()
	mu.Unlock()
	require.NoError(t, b.stop(t, syscall.SIGTERM))
	wg.Wait()
	answered, shuttingDown, notTaken := 0, 0, 0
	for _, o := range outcomes {
		if !o.at.Before(signalled) {
			continue
		}
		var we *wire.Error
		switch {
		case o.err == nil:
			answered++
		case errors.As(o.err, &we) && errors.Is(o.err, wire.ErrInternal) && strings.Contains(we.Message, "shutting down"):
			shuttingDown++
		case errors.Is(o.err, nats.ErrNoResponders):
			notTaken++
		default:
			t.Errorf("a request sent before SIGTERM got %v (sent %v before the signal, method %s)", o.err, signalled.Sub(o.at), o.method)
		}
	}
	t.Logf("before SIGTERM: %d answered, %d answered 'shutting down', %d not taken", answered, shuttingDown, notTaken)
	assert.Greater(t, answered, 100)
}

func readConnection(t *testing.T, path string) connection {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var c connection
	require.NoError(t, json.Unmarshal(data, &c))
	return c
}

func stringField(t *testing.T, raw []byte, name string) string {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m))
	s, _ := m[name].(string)
	return s
}

// TestServeExitsWithTheHostItIsToldOf: a host that starts serve through
// a launcher (here a shell that leaves at once) passes its own pid; serve
// goes when that process goes, though its parent was gone before it
// could look.
func TestServeExitsWithTheHostItIsToldOf(t *testing.T) {
	path := filepath.Join(t.TempDir(), "conn.json")
	host := exec.Command("sleep", "60") // the host
	require.NoError(t, host.Start())
	launcher := exec.Command("sh", "-c", `"$0" serve --connection-file "$1" --data-dir "" --parent-pid "$2" >/dev/null 2>&1 & echo $!`,
		testbin.A2ABus(t), path, strconv.Itoa(host.Process.Pid))
	launcher.Env = testEnv(t)
	out, err := launcher.Output()
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	require.NoError(t, err)
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	require.Eventually(t, func() bool { _, err := os.Stat(path); return err == nil }, 10*time.Second, 10*time.Millisecond, "serving")
	require.True(t, running(pid), "the launcher's leaving is not the host's")
	require.NoError(t, host.Process.Kill())
	host.Wait()
	require.Eventually(t, func() bool { return !running(pid) }, 10*time.Second, 50*time.Millisecond, "serve outlived the host")
	_, err = os.Stat(path)
	assert.ErrorIs(t, err, os.ErrNotExist, "a clean shutdown")
}

// TestServeOnAPipeAnswersWhatItReadAtSIGTERM: a host pipelines requests
// to a broker child and stops it: every request the broker read (any
// below the last one answered) gets its answer before the pipe closes.
func TestServeOnAPipeAnswersWhatItReadAtSIGTERM(t *testing.T) {
	cmd := exec.Command(testbin.A2ABus(t), "serve", "--bus=pipe", "--data-dir", "", "--log-level=error")
	cmd.Env = testEnv(t)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	out := bufio.NewReader(stdout)
	register := func(id int, session, name string) string {
		fmt.Fprintf(stdin, `{"jsonrpc":"2.0","id":%d,"method":"a2a.agents.register","params":{"contextId":%q,"card":{"name":%q}}}`+"\n", id, session, name)
		line, err := out.ReadBytes('\n')
		require.NoError(t, err)
		var r struct{ Result wire.RegisterResult }
		require.NoError(t, json.Unmarshal(line, &r))
		return r.Result.Token
	}
	token := register(1, "a", "pusher")
	register(2, "b", "sink")
	const n = 20000
	go func() {
		w := bufio.NewWriter(stdin)
		for id := 3; id < n; id++ {
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%d,"method":"a2a.message.send","params":{"token":%q,"to":"sink","oneway":true,"message":{"parts":[{"kind":"text","text":"x"}]}}}`+"\n", id, token)
		}
		w.Flush()
	}()
	answered := map[int]bool{}
	last := 0
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	signalled := false
	for sc.Scan() {
		var r struct {
			ID *int `json:"id"`
		}
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.ID != nil {
			answered[*r.ID] = true
			last = max(last, *r.ID)
		}
		// Under way: stop it. The count below is what matters.
		if !signalled && len(answered) >= 500 {
			require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
			signalled = true
		}
	}
	require.True(t, signalled, "the broker closed its pipe before it was stopped")
	missing := 0
	for id := 3; id < last; id++ {
		if !answered[id] {
			missing++
		}
	}
	t.Logf("%d requests answered before the pipe closed; the last id %d", len(answered), last)
	assert.Zero(t, missing, "requests read before SIGTERM but never answered")
	assert.Greater(t, last, 3)
}
