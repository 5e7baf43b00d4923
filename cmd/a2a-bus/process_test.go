package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/wire"
)

// broker is a running `a2a-bus serve` child.
type broker struct {
	cmd      *exec.Cmd
	path     string // the connection file, from stderr's first line
	stderr   *bufio.Reader
	conn     connection
	waitDone chan error
}

type connection struct {
	URL   string `json:"url"`
	Token string `json:"token"`
	PID   int    `json:"pid"`
	WSURL string `json:"wsUrl"`
}

func startServe(t *testing.T, args ...string) *broker {
	t.Helper()
	cmd := exec.Command(testbin.A2ABus(t), append([]string{"serve"}, args...)...)
	cmd.Env = testEnv(t)
	errPipe, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	b := &broker{cmd: cmd, stderr: bufio.NewReader(errPipe), waitDone: make(chan error, 1)}
	first, err := b.stderr.ReadString('\n')
	require.NoError(t, err, "the first line on stderr")
	b.path = strings.TrimSpace(first)
	require.True(t, filepath.IsAbs(b.path), "the first line is the connection file's path alone: %q", first)
	data, err := os.ReadFile(b.path)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &b.conn))
	// Keep reading stderr so the child never blocks on it.
	go io.Copy(io.Discard, b.stderr)
	go func() { b.waitDone <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGKILL)
		<-b.waitDone
	})
	return b
}

// testEnv keeps a child's files (connection file, data dir) in the
// test's own folders, never the user's.
func testEnv(t *testing.T) []string {
	return append(os.Environ(), "XDG_RUNTIME_DIR="+t.TempDir(), "XDG_STATE_HOME="+t.TempDir(), "HOME="+t.TempDir())
}

func (b *broker) stop(t *testing.T, sig syscall.Signal) error {
	t.Helper()
	require.NoError(t, b.cmd.Process.Signal(sig))
	select {
	case err := <-b.waitDone:
		b.waitDone <- err
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("the broker did not exit")
		return nil
	}
}

func TestServeNATSConnectionFileAndCleanExit(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			b := startServe(t)
			st, err := os.Stat(b.path)
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
			dir, err := os.Stat(filepath.Dir(b.path))
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o700), dir.Mode().Perm())
			assert.Equal(t, b.cmd.Process.Pid, b.conn.PID)
			assert.Regexp(t, `^nats://127\.0\.0\.1:\d+$`, b.conn.URL)
			assert.Regexp(t, `^[0-9a-f]{64}$`, b.conn.Token)

			require.NoError(t, b.stop(t, sig), "exit status 0")
			_, err = os.Stat(b.path)
			assert.ErrorIs(t, err, os.ErrNotExist, "the connection file is removed")
		})
	}
}

func TestSecondBrokerRefusesToStart(t *testing.T) {
	b := startServe(t)
	cmd := exec.Command(testbin.A2ABus(t), "serve", "--connection-file", b.path)
	cmd.Env = testEnv(t)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	assert.Equal(t, 1, exit.ExitCode())
	assert.Contains(t, string(out), "already running")
	assert.Equal(t, 1, strings.Count(string(out), "\n"), "one line: %q", out)
	// The first broker's file is untouched.
	data, err := os.ReadFile(b.path)
	require.NoError(t, err)
	assert.Contains(t, string(data), b.conn.Token)
}

func TestStaleConnectionFileIsReplaced(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "conn.json")
	// A broker that died without cleaning up: no process, no listener.
	require.NoError(t, os.WriteFile(path, []byte(`{"url":"nats://127.0.0.1:1","token":"00","pid":999999999}`), 0o600))
	b := startServe(t, "--connection-file", path)
	assert.Equal(t, path, b.path)
	assert.NotEqual(t, "00", b.conn.Token)
	require.NoError(t, b.stop(t, syscall.SIGTERM))
}

func TestNonLoopbackListenIsRefused(t *testing.T) {
	cmd := exec.Command(testbin.A2ABus(t), "serve", "--listen", "0.0.0.0:0", "--connection-file", filepath.Join(t.TempDir(), "c.json"))
	cmd.Env = testEnv(t)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	assert.Equal(t, 2, exit.ExitCode(), "a bad setting")
	assert.Contains(t, string(out), "not loopback")
}

// refusedSettings runs serve with each case's args: each must exit 2
// (a bad setting), saying want.
func refusedSettings(t *testing.T, cases []refusedSetting) {
	t.Helper()
	for _, tc := range cases {
		cmd := exec.Command(testbin.A2ABus(t), append([]string{"serve"}, tc.args...)...)
		cmd.Env = testEnv(t)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "%v", tc.args)
		assert.Equal(t, 2, exit.ExitCode(), "%v: a bad setting", tc.args)
		assert.Contains(t, string(out), tc.want, "%v", tc.args)
	}
}

type refusedSetting struct {
	args []string
	want string
}

func TestTheA2AGatewayFlagsAreChecked(t *testing.T) {
	refusedSettings(t, []refusedSetting{
		{[]string{"--a2a-listen", "0.0.0.0:0", "--connection-file", filepath.Join(t.TempDir(), "c.json")}, "not loopback"},
		{[]string{"--bus=pipe", "--a2a-listen", "127.0.0.1:0"}, "--a2a-listen is for the NATS bus"},
		{[]string{"--nats-url", "nats://127.0.0.1:1", "--a2a-listen", "127.0.0.1:0", "--connection-file", filepath.Join(t.TempDir(), "c.json")}, "needs the embedded NATS server"},
	})
}

func TestTheWebSocketFlagsAreChecked(t *testing.T) {
	refusedSettings(t, []refusedSetting{
		{[]string{"--ws-listen", "0.0.0.0:0", "--connection-file", filepath.Join(t.TempDir(), "c.json")}, "--ws-listen: natsbus: listen address is not loopback"},
		{[]string{"--ws-listen", "127.0.0.1:0", "--ws-origins", "https://*.example.com", "--connection-file", filepath.Join(t.TempDir(), "c.json")}, "--ws-origins: natsbus: bad allowed origin"},
		{[]string{"--bus=pipe", "--ws-listen", "127.0.0.1:0"}, "--ws-listen is for the NATS bus"},
		{[]string{"--ws-origins", "app://*", "--connection-file", filepath.Join(t.TempDir(), "c.json")}, "--ws-origins: for --ws-listen"},
		{[]string{"--ws-listen", "127.0.0.1:0", "--ws-origins", "http://*", "--connection-file", filepath.Join(t.TempDir(), "c.json")}, "every web site"},
		{[]string{"--nats-url", "nats://127.0.0.1:1", "--ws-listen", "127.0.0.1:0", "--connection-file", filepath.Join(t.TempDir(), "c.json")}, "configure that server's websocket block"},
	})
}

// TestServeOverWebSocket: serve --ws-listen names its listener in the
// connection file and in each session credential, and a session
// credential calls over it.
func TestServeOverWebSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "connection.json")
	b := startServe(t, "--connection-file", path, "--ws-listen", "127.0.0.1:0", "--data-dir", "")
	require.Regexp(t, `^ws://127\.0\.0\.1:\d+$`, b.conn.WSURL)
	host, err := natsbus.Dial(natsbus.ClientConfig{URL: b.conn.URL, Token: b.conn.Token, NoReconnect: true})
	require.NoError(t, err)
	defer host.Close()
	res, err := host.CallHost(context.Background(), wire.MethodSessionOpen, wire.SessionParams{ContextID: "chat-1"})
	require.NoError(t, err)
	var creds wire.SessionCredentials
	require.NoError(t, json.Unmarshal(res, &creds))
	assert.Equal(t, b.conn.WSURL, creds.WSURL)
	c, err := natsbus.Dial(natsbus.ClientConfig{URL: creds.WSURL, User: creds.User, Password: creds.Password, Session: "chat-1", NoReconnect: true})
	require.NoError(t, err)
	defer c.Close()
	s, err := c.Session(context.Background(), "chat-1")
	require.NoError(t, err)
	res, err = s.Call(context.Background(), wire.MethodRegister, wire.RegisterParams{ContextID: "chat-1", Card: &wire.AgentCard{Name: "renderer"}})
	require.NoError(t, err)
	var reg wire.RegisterResult
	require.NoError(t, json.Unmarshal(res, &reg))
	assert.Equal(t, "renderer", reg.AgentID)
	c.Close()
	require.NoError(t, b.stop(t, syscall.SIGTERM))
}

func TestDemo(t *testing.T) {
	for _, args := range [][]string{{"demo"}, {"demo", "--bus", "pipe"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			cmd := exec.Command(testbin.A2ABus(t), args...)
			cmd.Env = testEnv(t)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			require.NoError(t, err, "exit 0; stderr: %s", stderr.String())
			s := string(out)
			assert.Contains(t, s, "Your A2A peer id is discussant-2 (discussant was taken on this host)")
			assert.Contains(t, s, "discussant discovers discussant-2 in session chat-2")
			assert.Contains(t, s, "discussant-2 wakes: task")
			assert.Contains(t, s, `completed: "Agreed: seat 2 is mine."`)
			assert.Contains(t, s, "delegates settled")
			assert.Regexp(t, `round trip, send to the requester's wake-up: \d+\.\d+ ms`, s)
			assert.Empty(t, stderr.String(), "nothing to warn about")
		})
	}
	t.Run("bad bus", func(t *testing.T) {
		out, err := exec.Command(testbin.A2ABus(t), "demo", "--bus", "fake").CombinedOutput()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit)
		assert.Equal(t, 2, exit.ExitCode())
		assert.Contains(t, string(out), "--bus")
	})
}

func TestWatchEndsWhenTheBrokerGoes(t *testing.T) {
	b := startServe(t)
	watch := exec.Command(testbin.A2ABus(t), "watch", "--connection-file", b.path)
	watch.Env = testEnv(t)
	stderr, err := watch.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, watch.Start())
	first, err := bufio.NewReader(stderr).ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, first, "watching")
	require.NoError(t, b.stop(t, syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- watch.Wait() }()
	select {
	case err := <-done:
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit)
		assert.Equal(t, 1, exit.ExitCode())
	case <-time.After(10 * time.Second):
		watch.Process.Kill()
		<-done
		t.Fatal("watch outlived the broker")
	}
}
