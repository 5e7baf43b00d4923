package e2e_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/wire"
)

// sidecar is a real `a2a-bus serve` process, reached as a host in another
// language would: plain nats.go and the JSON of docs/PROTOCOL.md.
// E2E_BROKER_BINARY runs the tests against another build of the command.
type sidecar struct {
	t    *testing.T
	cmd  *exec.Cmd
	pid  int
	url  string
	host *nats.Conn
	done chan struct{}
	// connFile is the connection file's path; a2aURL and a2aToken the
	// gateway's, with --a2a-listen.
	connFile         string
	a2aURL, a2aToken string
}

func startSidecar(t *testing.T, args ...string) *sidecar {
	t.Helper()
	var logs io.Writer = io.Discard
	if os.Getenv("E2E_BROKER_LOG") != "" {
		logs = os.Stderr
	}
	return startServe(t, logLevel(), logs, args...)
}

// startServe starts a2a-bus serve at that log level, with its log after
// the connection file's path going to logs, and joins it as the host.
func startServe(t *testing.T, level string, logs io.Writer, args ...string) *sidecar {
	t.Helper()
	bin := os.Getenv("E2E_BROKER_BINARY")
	if bin == "" {
		bin = testbin.A2ABus(t)
	}
	dir := t.TempDir()
	cmd := exec.Command(bin, append([]string{"serve", "--connection-file", filepath.Join(dir, "run", "connection.json"),
		"--data-dir", filepath.Join(dir, "data"), "--log-level", level}, args...)...)
	cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+dir, "XDG_STATE_HOME="+dir, "HOME="+dir)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	s := &sidecar{t: t, cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{})}
	r := bufio.NewReader(stderr)
	first, err := r.ReadString('\n')
	require.NoError(t, err, "the connection file's path on stderr")
	go func() {
		io.Copy(logs, r)
		cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() {
		if s.host != nil {
			s.host.Close()
		}
		cmd.Process.Signal(syscall.SIGKILL)
		<-s.done
	})
	s.connFile = strings.TrimSpace(first)
	data, err := os.ReadFile(s.connFile)
	require.NoError(t, err)
	var info struct{ URL, Token string }
	require.NoError(t, json.Unmarshal(data, &info))
	var a2a struct {
		URL   string `json:"a2aUrl"`
		Token string `json:"a2aToken"`
	}
	require.NoError(t, json.Unmarshal(data, &a2a))
	s.url, s.a2aURL, s.a2aToken = info.URL, a2a.URL, a2a.Token
	s.host, err = nats.Connect(info.URL, nats.Token(info.Token))
	require.NoError(t, err)
	return s
}

// poll asks cond every interval until it holds or within has passed, and
// says whether it held. It is for what another process does on its own
// schedule and tells no one (its resident memory, its NATS server's
// closing of connections, its gateway answering again): there is no
// event to wait on. cond runs on the test's goroutine.
func poll(within, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

// logLevel is the broker's: errors only, unless E2E_BROKER_LOG names one
// (its logs then go to the test's stderr).
func logLevel() string {
	if l := os.Getenv("E2E_BROKER_LOG"); l != "" {
		return l
	}
	return "error"
}

// memory returns the broker process's resident memory and its peak, in
// bytes (Linux).
func (s *sidecar) memory() (rss, peak int64) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.pid))
	require.NoError(s.t, err)
	for _, line := range strings.Split(string(data), "\n") {
		name, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch name {
		case "VmRSS":
			rss = kb << 10
		case "VmHWM":
			peak = kb << 10
		case "RssAnon", "RssFile", "RssShmem":
			if os.Getenv("E2E_BROKER_LOG") != "" {
				s.t.Logf("%s: %d MiB", name, kb>>10)
			}
		}
	}
	return rss, peak
}

// resetPeak starts the peak of memory() from the current resident size.
func (s *sidecar) resetPeak() {
	require.NoError(s.t, os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", s.pid), []byte("5"), 0))
}

var rpcIDs atomic.Int64

// call sends one request on subject with the reply in inbox, and returns
// the result or the broker's error.
func call(t *testing.T, nc *nats.Conn, subject, inbox, method string, params any) (json.RawMessage, error) {
	t.Helper()
	body, err := wire.EncodeRequest(uint64(rpcIDs.Add(1)), method, params)
	require.NoError(t, err)
	return request(t, nc, subject, inbox, method, body)
}

// request is call with the request encoded already: a test that sends
// the same large request many times encodes it once (under -race, an
// encoding and its copies of 800 KB cost the test more than the broker's
// work on the request).
func request(t *testing.T, nc *nats.Conn, subject, inbox, method string, body []byte) (json.RawMessage, error) {
	t.Helper()
	reply := inbox + "." + nats.NewInbox()[len(nats.InboxPrefix):]
	sub, err := nc.SubscribeSync(reply)
	require.NoError(t, err)
	defer sub.Unsubscribe()
	require.NoError(t, nc.PublishRequest(subject, reply, body))
	msg, err := sub.NextMsg(30 * time.Second)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", method, err)
	}
	return wire.DecodeResult(msg.Data)
}

// hostCall is a host-only request on a2a.host.rpc.
func (s *sidecar) hostCall(method string, params any) (json.RawMessage, error) {
	return call(s.t, s.host, natsbus.HostRPC, "_INBOX", method, params)
}

// client is one connection with a session's credential.
type client struct {
	t       *testing.T
	session string
	nc      *nats.Conn
}

// open opens a session's credential and connects with it.
func (s *sidecar) open(session string) *client {
	s.t.Helper()
	raw, err := s.hostCall(wire.MethodSessionOpen, wire.SessionParams{ContextID: session})
	require.NoError(s.t, err)
	var creds wire.SessionCredentials
	require.NoError(s.t, json.Unmarshal(raw, &creds))
	nc, err := nats.Connect(creds.URL, nats.UserInfo(creds.User, creds.Password), nats.CustomInboxPrefix(natsbus.SessionInbox(session)))
	require.NoError(s.t, err)
	s.t.Cleanup(nc.Close)
	return &client{t: s.t, session: session, nc: nc}
}

func (c *client) call(method string, params any) (json.RawMessage, error) {
	return call(c.t, c.nc, natsbus.RPCSubject(c.session), natsbus.SessionInbox(c.session), method, params)
}

// encode encodes a request of the client's for request, with an id of
// its own: a request sent again with it is sent again with that id.
func (c *client) encode(method string, params any) []byte {
	c.t.Helper()
	body, err := wire.EncodeRequest(uint64(rpcIDs.Add(1)), method, params)
	require.NoError(c.t, err)
	return body
}

// request sends a request encoded by encode and returns its result or
// the broker's error.
func (c *client) request(method string, body []byte) (json.RawMessage, error) {
	return request(c.t, c.nc, natsbus.RPCSubject(c.session), natsbus.SessionInbox(c.session), method, body)
}

// register registers an agent of the client's session and returns its
// token and agentId.
func (c *client) register(name string, card *wire.AgentCard) (token, id string) {
	c.t.Helper()
	if card == nil {
		card = &wire.AgentCard{}
	}
	card.Name = name
	raw, err := c.call(wire.MethodRegister, wire.RegisterParams{ContextID: c.session, Card: card})
	require.NoError(c.t, err)
	var r wire.RegisterResult
	require.NoError(c.t, json.Unmarshal(raw, &r))
	return r.Token, r.AgentID
}

// events subscribes to the client's session's notifications.
func (c *client) events() *nats.Subscription {
	c.t.Helper()
	sub, err := c.nc.SubscribeSync(natsbus.EventsSubject(c.session))
	require.NoError(c.t, err)
	require.NoError(c.t, sub.SetPendingLimits(-1, -1))
	require.NoError(c.t, c.nc.Flush())
	return sub
}

func textMessage(s string) *wire.Message {
	return &wire.Message{Parts: []wire.Part{wire.TextPart(s)}}
}

func isCode(err error, want *wire.Error) bool {
	var we *wire.Error
	return errors.As(err, &we) && errors.Is(err, want)
}
