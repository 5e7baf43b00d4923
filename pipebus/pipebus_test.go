package pipebus_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/a2a-bus/a2a-bus/broker/brokertest"
	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/pipebus"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/transport/bustest"
	"github.com/a2a-bus/a2a-bus/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(testbin.Exit))
}

func TestConformancePair(t *testing.T) {
	const buffer, limit = 64, 8192
	f := bustest.Features{HostScope: transport.ScopeOwner, Buffer: buffer, MaxMessageBytes: limit}
	newHarness := func(t *testing.T) bustest.Harness {
		bus, client, err := pipebus.Pair(
			pipebus.Config{MaxMessageBytes: limit, CloseGrace: 50 * time.Millisecond},
			pipebus.ClientConfig{Buffer: buffer})
		require.NoError(t, err)
		return bustest.Harness{Bus: bus, Client: client}
	}
	bustest.Run(t, f, newHarness)
	brokertest.Run(t, f, newHarness)
}

// lockedBuffer collects a child's stderr.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startChild runs a2a-bus serve --bus=pipe as a child and returns the host
// end of its stdio.
func startChild(t *testing.T, args ...string) (*pipebus.Child, *lockedBuffer) {
	t.Helper()
	cmd := exec.Command(testbin.A2ABus(t), append([]string{"serve", "--bus=pipe", "--data-dir="}, args...)...)
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	ch, err := pipebus.Start(cmd, pipebus.ClientConfig{})
	require.NoError(t, err)
	t.Cleanup(func() {
		ch.Close()
		if t.Failed() {
			t.Logf("broker stderr:\n%s", stderr.String())
		}
	})
	return ch, stderr
}

func TestConformanceChild(t *testing.T) {
	newHarness := func(t *testing.T) bustest.Harness {
		ch, _ := startChild(t)
		return bustest.Harness{Client: ch}
	}
	bustest.Run(t, bustest.Features{}, newHarness)
	brokertest.Run(t, bustest.Features{}, newHarness)
}

// rawChild drives a child's stdio line by line, as a host in any language
// would.
type rawChild struct {
	t      *testing.T
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	stderr *lockedBuffer
}

func startRaw(t *testing.T, args ...string) *rawChild {
	t.Helper()
	cmd := exec.Command(testbin.A2ABus(t), append([]string{"serve", "--bus=pipe", "--data-dir="}, args...)...)
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	r := &rawChild{t: t, cmd: cmd, in: in, out: bufio.NewReaderSize(out, 1<<20), stderr: &lockedBuffer{}}
	cmd.Stderr = r.stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("broker stderr:\n%s", r.stderr.String())
		}
	})
	return r
}

func (r *rawChild) send(line string) {
	r.t.Helper()
	_, err := io.WriteString(r.in, line+"\n")
	require.NoError(r.t, err)
}

// read returns the next line of stdout, which must be a JSON object.
func (r *rawChild) read() map[string]json.RawMessage {
	r.t.Helper()
	type res struct {
		line string
		err  error
	}
	c := make(chan res, 1)
	go func() {
		l, err := r.out.ReadString('\n')
		c <- res{l, err}
	}()
	select {
	case got := <-c:
		require.NoError(r.t, got.err)
		var m map[string]json.RawMessage
		require.NoError(r.t, json.Unmarshal([]byte(got.line), &m), "stdout carries only JSON lines: %q", got.line)
		return m
	case <-time.After(10 * time.Second):
		r.t.Fatal("no line from the broker")
		return nil
	}
}

func errorCode(t *testing.T, m map[string]json.RawMessage) int {
	t.Helper()
	require.Contains(t, m, "error", "want an error response, got %v", m)
	var e wire.Error
	require.NoError(t, json.Unmarshal(m["error"], &e))
	require.NotNil(t, e.Data)
	return e.Code
}

func TestBadInputKeepsTheBrokerServing(t *testing.T) {
	r := startRaw(t, "--max-message-bytes=2048")
	r.send(`{"jsonrpc":"2.0","id":"reg","method":"a2a.agents.register","params":{"contextId":"s1","card":{"name":"a"}}}`)
	reg := r.read()
	var res wire.RegisterResult
	require.NoError(t, json.Unmarshal(reg["result"], &res))
	token := res.Token

	tests := []struct {
		name   string
		line   string
		code   int
		nullID bool
	}{
		{"over-long line", `{"jsonrpc":"2.0","id":1,"method":"a2a.agents.list","params":{"pad":"` + strings.Repeat("x", 5000) + `"}}`, -32600, true},
		{"over-long garbage", strings.Repeat("\x00\xff", 3000), -32600, true},
		{"not JSON", `hello broker`, -32700, true},
		{"truncated JSON", `{"jsonrpc":"2.0","id":1,`, -32700, true},
		{"invalid UTF-8", "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a2a.agents.list\",\"params\":{\"token\":\"\xc3\x28\"}}", -32700, true},
		{"a batch", `[{"jsonrpc":"2.0","id":1,"method":"a2a.agents.list"}]`, -32600, true},
		{"a number", `12`, -32600, true},
		{"no method", `{"jsonrpc":"2.0","id":1}`, -32600, true},
		{"a response", `{"jsonrpc":"2.0","id":1,"result":{}}`, -32600, true},
		{"unknown method", `{"jsonrpc":"2.0","id":1,"method":"a2a.agents.explode"}`, -32601, false},
		{"sessions methods exist only on NATS", `{"jsonrpc":"2.0","id":1,"method":"a2a.sessions.open","params":{"contextId":"s1"}}`, -32601, false},
		{"params of the wrong type", `{"jsonrpc":"2.0","id":1,"method":"a2a.agents.list","params":"token"}`, -32602, false},
		{"a param of the wrong type", `{"jsonrpc":"2.0","id":1,"method":"a2a.tasks.list","params":{"token":"` + token + `","role":7}}`, -32602, false},
		{"an invalid part", `{"jsonrpc":"2.0","id":1,"method":"a2a.message.send","params":{"token":"` + token + `","message":{"parts":[{"kind":"text","text":1}]}}}`, -32602, false},
		{"a part of no kind", `{"jsonrpc":"2.0","id":1,"method":"a2a.message.send","params":{"token":"` + token + `","message":{"parts":[{"text":"hi"}]}}}`, -32602, false},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r.t = t
			r.send(tc.line)
			resp := r.read()
			assert.Equal(t, tc.code, errorCode(t, resp))
			if tc.nullID {
				assert.Equal(t, "null", string(resp["id"]))
			} else {
				assert.Equal(t, "1", string(resp["id"]))
			}
			// A valid request afterwards still succeeds.
			r.send(`{"jsonrpc":"2.0","id":"after` + string(rune('a'+i)) + `","method":"a2a.agents.list","params":{"token":"` + token + `"}}`)
			ok := r.read()
			assert.Contains(t, ok, "result")
			assert.Equal(t, `"after`+string(rune('a'+i))+`"`, string(ok["id"]))
		})
	}
	t.Run("a notification and a blank line are not answered", func(t *testing.T) {
		r.t = t
		r.send(`{"jsonrpc":"2.0","method":"a2a.agents.list","params":{"token":"` + token + `"}}`)
		r.send(``)
		r.send(`{"jsonrpc":"2.0","id":"next","method":"a2a.agents.list","params":{"token":"` + token + `"}}`)
		assert.Equal(t, `"next"`, string(r.read()["id"]))
	})
	t.Run("the warning went to stderr", func(t *testing.T) {
		assert.Eventually(t, func() bool { return strings.Contains(r.stderr.String(), "request without id ignored") }, 10*time.Second, 10*time.Millisecond)
	})
}

func TestEOFIsACleanExit(t *testing.T) {
	r := startRaw(t)
	r.send(`{"jsonrpc":"2.0","id":1,"method":"a2a.agents.register","params":{"contextId":"s1","card":{"name":"a"}}}`)
	require.NoError(t, r.in.Close())
	// The answer to what was read goes out before the exit.
	assert.Contains(t, r.read(), "result")
	_, err := r.out.ReadString('\n')
	assert.ErrorIs(t, err, io.EOF)
	require.NoError(t, r.cmd.Wait(), "exit status 0")
	assert.Contains(t, r.stderr.String(), "end of input")
}

func TestSignalIsACleanExit(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			r := startRaw(t)
			r.send(`{"jsonrpc":"2.0","id":1,"method":"a2a.agents.register","params":{"contextId":"s1","card":{"name":"a"}}}`)
			r.read()
			require.NoError(t, r.cmd.Process.Signal(sig))
			require.NoError(t, r.cmd.Wait(), "exit status 0")
			assert.Contains(t, r.stderr.String(), "shutting down")
		})
	}
}

// TestRoundTripOverChildStdio is ADR 0162's scenario over a real child:
// two sessions both spawn discussant, the second becomes discussant-2,
// they find each other, a task is created and completed, and the
// requester is woken.
func TestRoundTripOverChildStdio(t *testing.T) {
	ch, _ := startChild(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type delegate struct {
		sess  transport.Session
		sub   transport.Subscription
		id    string
		token string
	}
	spawn := func(session string) *delegate {
		s, err := ch.Session(ctx, session)
		require.NoError(t, err)
		sub, err := s.Subscribe(ctx)
		require.NoError(t, err)
		res, err := s.Call(ctx, wire.MethodRegister, wire.RegisterParams{ContextID: session, Card: &wire.AgentCard{Name: "discussant"}})
		require.NoError(t, err)
		var r wire.RegisterResult
		require.NoError(t, json.Unmarshal(res, &r))
		return &delegate{s, sub, r.AgentID, r.Token}
	}
	next := func(d *delegate) *wire.TaskEvent {
		select {
		case raw := <-d.sub.C():
			ev, err := wire.DecodeEvent(raw)
			require.NoError(t, err)
			require.NotNil(t, ev.TaskEvent)
			return ev.TaskEvent
		case <-ctx.Done():
			t.Fatal("no event")
			return nil
		}
	}
	d1, d2 := spawn("chat-1"), spawn("chat-2")
	assert.Equal(t, "discussant", d1.id)
	assert.Equal(t, "discussant-2", d2.id)

	res, err := d1.sess.Call(ctx, wire.MethodListAgents, wire.TokenParams{Token: d1.token})
	require.NoError(t, err)
	var l wire.ListAgentsResult
	require.NoError(t, json.Unmarshal(res, &l))
	require.Len(t, l.Agents, 1)
	assert.Equal(t, "chat-2", l.Agents[0].ContextID)

	res, err = d1.sess.Call(ctx, wire.MethodSend, wire.SendParams{Token: d1.token, Message: &wire.Message{Parts: []wire.Part{wire.TextPart("your view?")}}})
	require.NoError(t, err)
	var sent wire.TaskResult
	require.NoError(t, json.Unmarshal(res, &sent))
	assert.Equal(t, "discussant-2", sent.Task.AgentName)

	created := next(d2)
	assert.Equal(t, wire.EventCreated, created.Kind)
	assert.Equal(t, "chat-2", created.RecipientContextID)
	_, err = d2.sess.Call(ctx, wire.MethodUpdateTask, wire.UpdateParams{Token: d2.token, TaskID: created.TaskID, State: wire.StateCompleted,
		Message: &wire.Message{Parts: []wire.Part{wire.TextPart("agreed")}}})
	require.NoError(t, err)

	woken := next(d1)
	assert.Equal(t, "discussant", woken.Recipient)
	assert.Equal(t, "chat-1", woken.RecipientContextID)
	assert.True(t, woken.Final)
	assert.Equal(t, "agreed", *woken.Message.Parts[0].Text)
	select {
	case raw := <-d2.sub.C():
		t.Fatalf("chat-2 got chat-1's event: %s", raw)
	default:
	}
}

// TestChildDeathFailsPendingCalls kills the broker under a stream of
// calls: each ends with success or ErrUnavailable, none hangs, and the
// subscriptions end.
func TestChildDeathFailsPendingCalls(t *testing.T) {
	ch, _ := startChild(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := ch.Session(ctx, "s1")
	require.NoError(t, err)
	sub, err := s.Subscribe(ctx)
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := 0
	for range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				_, err := s.Call(ctx, wire.MethodRegister, wire.RegisterParams{ContextID: "s1", Card: &wire.AgentCard{Name: "w"}})
				if err != nil {
					assert.ErrorIs(t, err, transport.ErrUnavailable)
					mu.Lock()
					failed++
					mu.Unlock()
					return
				}
			}
		})
	}
	require.NoError(t, kill(ch.Pid()))
	wg.Wait()
	assert.Equal(t, 8, failed)
	select {
	case _, ok := <-sub.C():
		assert.False(t, ok, "the subscription ends with the broker")
	case <-ctx.Done():
		t.Fatal("the subscription outlived the broker")
	}
	_, err = s.Call(ctx, wire.MethodReplay, map[string]any{})
	assert.ErrorIs(t, err, transport.ErrUnavailable)
	<-ch.Exited()
	var exit *exec.ExitError
	require.True(t, errors.As(ch.ExitErr(), &exit))
}

func TestStdioReopensPipes(t *testing.T) {
	// Run as a child so that stdin and stdout are pipes.
	if os.Getenv("PIPEBUS_STDIO_CHILD") == "1" {
		in, out := pipebus.Stdio(nil)
		if in == io.ReadCloser(os.Stdin) || out == io.WriteCloser(os.Stdout) {
			os.Exit(3)
		}
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestStdioReopensPipes$")
	cmd.Env = append(os.Environ(), "PIPEBUS_STDIO_CHILD=1")
	_, err := cmd.StdinPipe()
	require.NoError(t, err)
	_, err = cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	assert.NoError(t, cmd.Wait(), "stdin and stdout pipes are reopened as pollable files")
}

// TestStalledReaderDoesNotWedgeTheBroker stops reading the broker's
// output: Publish keeps returning at once (dropping what does not fit),
// and once a write has been blocked for the write timeout the bus stops
// with ErrPeerGone instead of hanging.
func TestStalledReaderDoesNotWedgeTheBroker(t *testing.T) {
	reqR, reqW, err := os.Pipe()
	require.NoError(t, err)
	respR, respW, err := os.Pipe()
	require.NoError(t, err)
	defer respR.Close()
	defer reqW.Close()
	bus, err := pipebus.New(reqR, respW, pipebus.Config{Queue: 16, WriteTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	defer bus.Close()
	require.NoError(t, bus.Serve(transport.HandlerFunc(func(context.Context, transport.Caller, []byte) []byte { return nil })))
	msg := []byte(`{"jsonrpc":"2.0","method":"a2a.push","params":{"recipientContextId":"s1","pad":"` + strings.Repeat("x", 4000) + `"}}`)
	// Publish until the pipe and the queue are full and a write has been
	// blocked for the timeout; nobody reads. Publish itself never waits.
	deadline := time.After(10 * time.Second)
publishing:
	for {
		select {
		case <-bus.Done():
			break publishing
		case <-deadline:
			t.Fatal("the bus hangs on a reader that stopped")
		default:
		}
		if err := bus.Publish("s1", msg); err != nil {
			require.ErrorIs(t, err, transport.ErrClosed)
		}
	}
	assert.Positive(t, bus.Dropped(), "what did not fit in the queue was dropped, not waited for")
	assert.ErrorIs(t, bus.Err(), pipebus.ErrPeerGone)
	assert.ErrorIs(t, bus.Publish("s1", msg), transport.ErrClosed)
}

// TestClosedReaderStopsTheBus closes the reading end: the next write fails
// and the bus stops with ErrPeerGone.
func TestClosedReaderStopsTheBus(t *testing.T) {
	reqR, reqW, err := os.Pipe()
	require.NoError(t, err)
	respR, respW, err := os.Pipe()
	require.NoError(t, err)
	defer reqW.Close()
	bus, err := pipebus.New(reqR, respW, pipebus.Config{})
	require.NoError(t, err)
	defer bus.Close()
	require.NoError(t, bus.Serve(transport.HandlerFunc(func(context.Context, transport.Caller, []byte) []byte { return nil })))
	require.NoError(t, respR.Close())
	require.NoError(t, bus.Publish("s1", []byte(`{"jsonrpc":"2.0","method":"a2a.push","params":{}}`)))
	select {
	case <-bus.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the bus did not notice its reader is gone")
	}
	assert.ErrorIs(t, bus.Err(), pipebus.ErrPeerGone)
}

// TestCallHonoursItsContextWhileTheBrokerDoesNotRead: with the broker's
// only request slot held and the pipe full, a call gives up at its
// deadline instead of blocking in the write.
func TestCallHonoursItsContextWhileTheBrokerDoesNotRead(t *testing.T) {
	bus, client, err := pipebus.Pair(pipebus.Config{MaxInFlight: 1}, pipebus.ClientConfig{})
	require.NoError(t, err)
	defer bus.Close()
	defer client.Close()
	// Every call holds its slot until the test ends (then Close need not
	// wait its grace for them).
	release := make(chan struct{})
	defer close(release)
	entered := make(chan struct{}, 1)
	require.NoError(t, bus.Serve(transport.HandlerFunc(func(ctx context.Context, _ transport.Caller, _ []byte) []byte {
		// The first call says it holds the slot; the ones served after
		// it, once it is released, must not block on saying so.
		select {
		case entered <- struct{}{}:
		default:
		}
		select {
		case <-ctx.Done():
		case <-release:
		}
		return nil
	})))
	s, err := client.Session(context.Background(), "s1")
	require.NoError(t, err)
	go s.Call(context.Background(), "block", nil) //nolint:errcheck // fails at Close
	<-entered
	// Fill the pipe: the broker reads one more line and then waits for a
	// slot; the rest stays in the pipe and the writer blocks.
	pad := strings.Repeat("x", 300<<10)
	for range 4 {
		go s.Call(context.Background(), "big", map[string]string{"pad": pad}) //nolint:errcheck // fails at Close
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := s.Call(ctx, "small", nil)
		done <- err
	}()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(10 * time.Second):
		t.Fatal("the call ignored its context")
	}
}

// TestAnOversizedResponseIsAnError: a response over the pipe's limit is
// answered with an error for its call instead of a line the host end
// would skip.
func TestAnOversizedResponseIsAnError(t *testing.T) {
	bus, client, err := pipebus.Pair(pipebus.Config{}, pipebus.ClientConfig{})
	require.NoError(t, err)
	defer bus.Close()
	defer client.Close()
	huge := []byte(`{"jsonrpc":"2.0","id":1,"result":"` + strings.Repeat("x", 65<<20) + `"}`)
	require.NoError(t, bus.Serve(transport.HandlerFunc(func(context.Context, transport.Caller, []byte) []byte { return huge })))
	s, err := client.Session(context.Background(), "s1")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = s.Call(ctx, "anything", nil)
	assert.ErrorIs(t, err, wire.ErrInternal)
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
