// Package bustest is the conformance suite of the transport contract.
// Every bus runs it from its own test file with a single call:
//
//	func TestConformance(t *testing.T) {
//		bustest.Run(t, bustest.Features{BoundSessions: true}, func(t *testing.T) bustest.Harness {
//			b := mybus.New(...)
//			return bustest.Harness{Bus: b, Client: b}
//		})
//	}
//
// Each test names the sentence of the transport package's documentation
// it checks. Tests that need something a bus lacks skip, saying why. The
// suite installs its own handler and needs no broker; the broker over
// the bus is checked by broker/brokertest, which a bus runs next.
package bustest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// Harness is one bus under test, fresh for each test.
type Harness struct {
	// Bus is the broker side. Nil when the broker runs in another process
	// (a child a2a-bus serve): tests that install their own handler then
	// skip, and the end-to-end tests use the broker already serving.
	Bus transport.Bus
	// Client is the session side.
	Client transport.Client
}

// Features declares what differs between buses.
type Features struct {
	// BoundSessions: the bus tells the handler which session a call comes
	// from (Caller{ScopeSession, id}). False for the pipe, whose caller is
	// its owner (ScopeOwner).
	BoundSessions bool
	// HostScope is the scope with which the Client's host calls
	// (transport.HostCaller) reach the handler; zero when the Client makes
	// none.
	HostScope transport.Scope
	// Buffer is the subscription buffer the harness configured (0: the
	// default). The slow-receiver test overruns it.
	Buffer int
	// MaxMessageBytes is the request limit the harness configured (0:
	// wire.DefaultMaxMessageBytes).
	MaxMessageBytes int
}

// Timeout bounds every wait of the suite. Waits are on channels and
// conditions; the one pause (a millisecond, to let an asynchronous bus
// deliver before publishing more) is a pacing step, not a proof.
const Timeout = 10 * time.Second

// Run runs the suite.
func Run(t *testing.T, f Features, newHarness func(t *testing.T) Harness) {
	if f.Buffer <= 0 {
		f.Buffer = transport.DefaultSubscriptionBuffer
	}
	if f.MaxMessageBytes <= 0 {
		f.MaxMessageBytes = wire.DefaultMaxMessageBytes
	}
	s := &suite{f: f, newHarness: newHarness}
	handlerTests := []struct {
		name string
		fn   func(*testing.T, Harness)
	}{
		{"Serve/SecondServeIsErrServing", s.testServeTwice},
		{"Serve/ServeAfterCloseIsErrClosed", s.testServeAfterClose},
		{"Serve/RequestsReachTheHandlerWithTheCaller", s.testCaller},
		{"Serve/HostCallsReachTheHandlerWithTheHostScope", s.testHostCaller},
		{"Serve/TheResponseIsReturnedAsIs", s.testResponse},
		{"Serve/ErrorResponsesAreWireErrors", s.testErrorResponse},
		{"Serve/HandlerIsCalledConcurrently", s.testHandlerConcurrent},
		{"Serve/ConcurrentCallsGetTheirOwnResponses", s.testConcurrentCalls},
		{"Serve/CloseCancelsHandlerContexts", s.testCloseCancelsHandlers},
		{"Serve/CloseFailsPendingCalls", s.testCloseFailsPending},
		{"Publish/ReachesSubscriptionsFromTheStart", s.testPublishAfterSubscribe},
		{"Publish/ReachesOnlyTheSessionsSubscribers", s.testPublishRouting},
		{"Publish/KeepsOrderPerSession", s.testPublishOrder},
		{"Publish/EverySubscriptionReceivesEverything", s.testManySubscriptions},
		{"Publish/WithoutSubscribersIsNotAnError", s.testPublishNoSubscriber},
		{"Publish/NeverWaitsForASlowReceiver", s.testSlowReceiver},
		{"Publish/AfterCloseIsErrClosed", s.testPublishAfterClose},
		{"Session/CloseFailsPendingCalls", s.testSessionClosePending},
		{"Session/CallHonoursContextWhilePending", s.testCallContext},
		{"Session/SessionsAreIndependent", s.testSessionsIndependent},
		{"Bus/CloseIsIdempotent", s.testBusCloseIdempotent},
	}
	for _, tc := range handlerTests {
		t.Run(tc.name, func(t *testing.T) {
			h := s.harness(t)
			if h.Bus == nil {
				t.Skip("the broker side runs in another process: the suite cannot install its own handler")
			}
			tc.fn(t, h)
		})
	}
	// The client's own behaviour: these need only that something answers
	// calls, the suite's echo handler or, with Bus nil, the broker in the
	// other process.
	clientTests := []struct {
		name string
		fn   func(*testing.T, Harness)
	}{
		{"Subscription/CloseClosesCAndIsIdempotent", s.testSubscriptionClose},
		{"Session/CloseEndsSubscriptionsAndCalls", s.testSessionClose},
		{"Session/CallHonoursAnEndedContext", s.testCallEndedContext},
		{"Session/OversizedCallIsErrTooLarge", s.testTooLarge},
		{"Client/CloseEndsEverySession", s.testClientClose},
	}
	for _, tc := range clientTests {
		t.Run(tc.name, func(t *testing.T) {
			h := s.harness(t)
			if h.Bus != nil {
				require.NoError(t, h.Bus.Serve(&echo{}))
			}
			tc.fn(t, h)
		})
	}
}

type suite struct {
	f          Features
	newHarness func(t *testing.T) Harness
}

func (s *suite) harness(t *testing.T) Harness {
	h := s.newHarness(t)
	require.NotNil(t, h.Client)
	t.Cleanup(func() {
		assert.NoError(t, h.Client.Close())
		if h.Bus != nil {
			assert.NoError(t, h.Bus.Close())
		}
	})
	return h
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	t.Cleanup(cancel)
	return ctx
}

// echo answers every request with its params and records callers.
type echo struct {
	mu      sync.Mutex
	callers []transport.Caller
}

func (e *echo) ServeRPC(_ context.Context, from transport.Caller, raw []byte) []byte {
	e.mu.Lock()
	e.callers = append(e.callers, from)
	e.mu.Unlock()
	req, perr := wire.ParseRequest(raw, 0)
	if perr != nil {
		return wire.ErrorResponse(nil, perr)
	}
	if req.Method == "fail" {
		return wire.ErrorResponse(req.ID, wire.ErrTaskLimit.Withf("scripted failure"))
	}
	out, _ := wire.EncodeResult(req.ID, req.Params)
	return out
}

func (e *echo) last() transport.Caller {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.callers[len(e.callers)-1]
}

func session(t *testing.T, h Harness, id string) transport.Session {
	t.Helper()
	s, err := h.Client.Session(ctxT(t), id)
	require.NoError(t, err)
	return s
}

func subscribe(t *testing.T, s transport.Session) transport.Subscription {
	t.Helper()
	sub, err := s.Subscribe(ctxT(t))
	require.NoError(t, err)
	return sub
}

// note encodes a notification for session with a seq, as the broker would.
func note(session string, seq int) []byte {
	b, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "method": wire.NotifyPush,
		"params": map[string]any{"recipient": "r", "recipientContextId": session, "contextId": session, "seq": seq, "epoch": "e"},
	})
	return b
}

// receive returns the next notification, skipping syncSub's markers.
func receive(t *testing.T, sub transport.Subscription) []byte {
	t.Helper()
	deadline := time.After(Timeout)
	for {
		select {
		case m, ok := <-sub.C():
			require.True(t, ok, "subscription ended")
			if isMarker(m) {
				continue
			}
			return m
		case <-deadline:
			t.Fatal("no notification arrived")
			return nil
		}
	}
}

func isMarker(m []byte) bool {
	h, err := wire.DecodeNotificationHead(m)
	return err == nil && h.Method == wire.NotifyPush && h.Seq == 0 && h.Epoch == "e"
}

func seqOf(t *testing.T, msg []byte) uint64 {
	t.Helper()
	h, err := wire.DecodeNotificationHead(msg)
	require.NoError(t, err)
	return h.Seq
}

// syncSub waits until a marker (seq 0) published after Subscribe arrives.
// Every bus must pass without it (Publish/ReachesSubscriptionsFromTheStart
// checks that); tests use it to be sure that what they publish next is
// not racing anything earlier. receive skips markers.
func syncSub(t *testing.T, bus transport.Bus, session string, sub transport.Subscription) {
	t.Helper()
	deadline := time.Now().Add(Timeout)
	marker := note(session, 0)
	for time.Now().Before(deadline) {
		require.NoError(t, bus.Publish(session, marker))
		select {
		case m := <-sub.C():
			require.True(t, isMarker(m), "only markers were published")
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatal("subscription never became live")
}

func (s *suite) testServeTwice(t *testing.T, h Harness) {
	require.NoError(t, h.Bus.Serve(&echo{}))
	assert.ErrorIs(t, h.Bus.Serve(&echo{}), transport.ErrServing)
}

func (s *suite) testServeAfterClose(t *testing.T, h Harness) {
	require.NoError(t, h.Bus.Close())
	assert.ErrorIs(t, h.Bus.Serve(&echo{}), transport.ErrClosed)
}

func (s *suite) testCaller(t *testing.T, h Harness) {
	e := &echo{}
	require.NoError(t, h.Bus.Serve(e))
	for _, id := range []string{"s1", "a.b*c> d", "ünï"} {
		sess := session(t, h, id)
		_, err := sess.Call(ctxT(t), "ping", nil)
		require.NoError(t, err)
		want := transport.Caller{Scope: transport.ScopeOwner}
		if s.f.BoundSessions {
			want = transport.Caller{Scope: transport.ScopeSession, Session: id}
		}
		assert.Equal(t, want, e.last())
	}
}

func (s *suite) testHostCaller(t *testing.T, h Harness) {
	hc, ok := h.Client.(transport.HostCaller)
	if s.f.HostScope == 0 {
		t.Skip("the client makes no host calls")
	}
	require.True(t, ok, "Features.HostScope is set: the Client must implement transport.HostCaller")
	e := &echo{}
	require.NoError(t, h.Bus.Serve(e))
	_, err := hc.CallHost(ctxT(t), "a2a.sessions.open", map[string]any{"contextId": "x"})
	require.NoError(t, err)
	assert.Equal(t, transport.Caller{Scope: s.f.HostScope}, e.last())
}

func (s *suite) testResponse(t *testing.T, h Harness) {
	require.NoError(t, h.Bus.Serve(&echo{}))
	sess := session(t, h, "s1")
	res, err := sess.Call(ctxT(t), "echo", map[string]any{"a": []int{1, 2}, "b": "ü"})
	require.NoError(t, err)
	assert.JSONEq(t, `{"a":[1,2],"b":"ü"}`, string(res))
	res, err = sess.Call(ctxT(t), "echo", json.RawMessage(`{"raw":true}`))
	require.NoError(t, err)
	assert.JSONEq(t, `{"raw":true}`, string(res))
	res, err = sess.Call(ctxT(t), "echo", nil)
	require.NoError(t, err)
	assert.JSONEq(t, `{}`, string(res))
}

func (s *suite) testErrorResponse(t *testing.T, h Harness) {
	require.NoError(t, h.Bus.Serve(&echo{}))
	_, err := session(t, h, "s1").Call(ctxT(t), "fail", nil)
	assert.ErrorIs(t, err, wire.ErrTaskLimit)
	var we *wire.Error
	require.ErrorAs(t, err, &we)
	assert.Equal(t, "scripted failure", we.Message)
}

// barrier blocks each request until n are in the handler at once.
type barrier struct {
	n       int
	mu      sync.Mutex
	arrived int
	all     chan struct{}
}

func (b *barrier) ServeRPC(ctx context.Context, _ transport.Caller, raw []byte) []byte {
	b.mu.Lock()
	b.arrived++
	if b.arrived == b.n {
		close(b.all)
	}
	b.mu.Unlock()
	req, _ := wire.ParseRequest(raw, 0)
	select {
	case <-b.all:
		out, _ := wire.EncodeResult(req.ID, req.Params)
		return out
	case <-ctx.Done():
		return wire.ErrorResponse(req.ID, wire.ErrInternal.Withf("canceled"))
	case <-time.After(Timeout):
		return wire.ErrorResponse(req.ID, wire.ErrInternal.Withf("the handler was not called concurrently"))
	}
}

func (s *suite) testHandlerConcurrent(t *testing.T, h Harness) {
	const n = 8
	require.NoError(t, h.Bus.Serve(&barrier{n: n, all: make(chan struct{})}))
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, err := session(t, h, fmt.Sprint("s", i)).Call(ctxT(t), "wait", nil)
			assert.NoError(t, err)
		})
	}
	wg.Wait()
}

func (s *suite) testConcurrentCalls(t *testing.T, h Harness) {
	require.NoError(t, h.Bus.Serve(&echo{}))
	sessions := []transport.Session{session(t, h, "s1"), session(t, h, "s2")}
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			res, err := sessions[i%2].Call(ctxT(t), "echo", map[string]int{"i": i})
			if assert.NoError(t, err) {
				assert.JSONEq(t, fmt.Sprintf(`{"i":%d}`, i), string(res))
			}
		})
	}
	wg.Wait()
}

// blocker holds every request until its context ends, and then answers
// nothing: whatever a caller gets comes from the bus.
type blocker struct {
	entered  chan struct{}
	returned atomic.Int32
}

func (b *blocker) ServeRPC(ctx context.Context, _ transport.Caller, raw []byte) []byte {
	defer b.returned.Add(1)
	b.entered <- struct{}{}
	<-ctx.Done()
	return nil
}

func (s *suite) testCloseCancelsHandlers(t *testing.T, h Harness) {
	bl := &blocker{entered: make(chan struct{}, 1)}
	require.NoError(t, h.Bus.Serve(bl))
	sess := session(t, h, "s1")
	go sess.Call(context.Background(), "block", nil) //nolint:errcheck // the call fails when the bus closes
	select {
	case <-bl.entered:
	case <-time.After(Timeout):
		t.Fatal("the request never reached the handler")
	}
	// Close returns only once the handler, which returns only when its
	// context ends, has returned.
	require.NoError(t, h.Bus.Close())
	assert.Equal(t, int32(1), bl.returned.Load(), "Close returned before the running handler")
}

// pendingCall serves a blocker and starts a call from session s1 that
// stays pending in the handler; it returns the session and the channel
// its error arrives on.
func pendingCall(t *testing.T, h Harness, ctx context.Context) (transport.Session, <-chan error) {
	bl := &blocker{entered: make(chan struct{}, 1)}
	require.NoError(t, h.Bus.Serve(bl))
	sess := session(t, h, "s1")
	errc := make(chan error, 1)
	go func() {
		_, err := sess.Call(ctx, "block", nil)
		errc <- err
	}()
	select {
	case <-bl.entered:
	case <-time.After(Timeout):
		t.Fatal("the request never reached the handler")
	}
	return sess, errc
}

// callError waits for a pending call's error.
func callError(t *testing.T, errc <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(Timeout):
		t.Fatalf("a pending call hangs after %s", what)
		return nil
	}
}

func (s *suite) testCloseFailsPending(t *testing.T, h Harness) {
	_, errc := pendingCall(t, h, context.Background())
	require.NoError(t, h.Bus.Close())
	err := callError(t, errc, "Close")
	// An in-process session sees ErrClosed; a remote one sees its link
	// go, or, on a shared server, hears that the broker shuts down.
	var we *wire.Error
	shutdown := errors.As(err, &we) && errors.Is(err, wire.ErrInternal) && strings.Contains(we.Message, "shutting down")
	assert.True(t, errors.Is(err, transport.ErrClosed) || errors.Is(err, transport.ErrUnavailable) || shutdown, "got %v", err)
}

func (s *suite) testPublishRouting(t *testing.T, h Harness) {
	require.NoError(t, h.Bus.Serve(&echo{}))
	s1, s2 := session(t, h, "s1"), session(t, h, "s.2 *>")
	sub1, sub2 := subscribe(t, s1), subscribe(t, s2)
	syncSub(t, h.Bus, s1.ID(), sub1)
	syncSub(t, h.Bus, s2.ID(), sub2)
	require.NoError(t, h.Bus.Publish(s1.ID(), note(s1.ID(), 1)))
	require.NoError(t, h.Bus.Publish(s2.ID(), note(s2.ID(), 2)))
	assert.Equal(t, uint64(1), seqOf(t, receive(t, sub1)))
	assert.Equal(t, uint64(2), seqOf(t, receive(t, sub2)), "s2's first notification is its own, not s1's")
	// Had s2's reached s1 too, it would come before this one.
	require.NoError(t, h.Bus.Publish(s1.ID(), note(s1.ID(), 3)))
	assert.Equal(t, uint64(3), seqOf(t, receive(t, sub1)), "s1's next notification is its own, not s2's")
}

// testPublishAfterSubscribe: a notification published right after
// Subscribe returns is received, with no marker to wait for.
func (s *suite) testPublishAfterSubscribe(t *testing.T, h Harness) {
	require.NoError(t, h.Bus.Serve(&echo{}))
	for i := range 20 {
		id := fmt.Sprint("fresh-", i)
		sub := subscribe(t, session(t, h, id))
		require.NoError(t, h.Bus.Publish(id, note(id, 1)))
		assert.Equal(t, uint64(1), seqOf(t, receive(t, sub)))
	}
}

func (s *suite) testPublishOrder(t *testing.T, h Harness) {
	require.NoError(t, h.Bus.Serve(&echo{}))
	sess := session(t, h, "s1")
	sub := subscribe(t, sess)
	syncSub(t, h.Bus, "s1", sub)
	n := min(1000, s.f.Buffer)
	for i := 1; i <= n; i++ {
		require.NoError(t, h.Bus.Publish("s1", note("s1", i)))
	}
	for i := 1; i <= n; i++ {
		require.Equal(t, uint64(i), seqOf(t, receive(t, sub)))
	}
	assert.Zero(t, sub.Dropped())
}

func (s *suite) testManySubscriptions(t *testing.T, h Harness) {
	require.NoError(t, h.Bus.Serve(&echo{}))
	sess := session(t, h, "s1")
	a, b := subscribe(t, sess), subscribe(t, sess)
	syncSub(t, h.Bus, "s1", a)
	syncSub(t, h.Bus, "s1", b)
	for i := 1; i <= 3; i++ {
		require.NoError(t, h.Bus.Publish("s1", note("s1", i)))
	}
	for i := 1; i <= 3; i++ {
		assert.Equal(t, uint64(i), seqOf(t, receive(t, a)))
		assert.Equal(t, uint64(i), seqOf(t, receive(t, b)))
	}
}

func (s *suite) testPublishNoSubscriber(t *testing.T, h Harness) {
	require.NoError(t, h.Bus.Serve(&echo{}))
	assert.NoError(t, h.Bus.Publish("nobody", note("nobody", 1)))
}

func (s *suite) testSlowReceiver(t *testing.T, h Harness) {
	require.NoError(t, h.Bus.Serve(&echo{}))
	sess := session(t, h, "s1")
	sub := subscribe(t, sess)
	syncSub(t, h.Bus, "s1", sub)
	// Publish, without reading, until the subscription has had to drop:
	// Publish returns each time; the receiver loses what does not fit.
	n := 0
	deadline := time.Now().Add(Timeout)
	for sub.Dropped() == 0 {
		require.True(t, time.Now().Before(deadline), "a receiver that does not read never lost a notification")
		for range s.f.Buffer {
			n++
			require.NoError(t, h.Bus.Publish("s1", note("s1", n)))
		}
		if sub.Dropped() == 0 {
			time.Sleep(time.Millisecond) // let an asynchronous bus deliver
		}
	}
	// Drain what arrived: in order, a subsequence, and the rest counted.
	var last uint64
	got := 0
	for got+int(sub.Dropped()) < n {
		var m []byte
		select {
		case m = <-sub.C():
		case <-time.After(Timeout):
			t.Fatalf("%d received and %d dropped of %d", got, sub.Dropped(), n)
		}
		if isMarker(m) {
			continue
		}
		seq := seqOf(t, m)
		require.Greater(t, seq, last, "order is kept across drops")
		last = seq
		got++
	}
	assert.Equal(t, n, got+int(sub.Dropped()), "every notification is received or counted as dropped")
}

func (s *suite) testPublishAfterClose(t *testing.T, h Harness) {
	require.NoError(t, h.Bus.Serve(&echo{}))
	require.NoError(t, h.Bus.Close())
	assert.ErrorIs(t, h.Bus.Publish("s1", note("s1", 1)), transport.ErrClosed)
}

// ping is a call that both the suite's echo handler and a broker answer
// with a result.
func ping(t *testing.T, sess transport.Session) error {
	_, err := sess.Call(ctxT(t), wire.MethodRegister, wire.RegisterParams{ContextID: sess.ID(), Card: &wire.AgentCard{Name: "ping"}})
	return err
}

func (s *suite) testSubscriptionClose(t *testing.T, h Harness) {
	sess := session(t, h, "s1")
	// A context without a deadline is a valid one.
	sub, err := sess.Subscribe(context.Background())
	require.NoError(t, err)
	require.NoError(t, sub.Close())
	require.NoError(t, sub.Close())
	requireClosed(t, sub)
	assert.NoError(t, ping(t, sess), "the session still works")
}

func requireClosed(t *testing.T, sub transport.Subscription) {
	t.Helper()
	deadline := time.After(Timeout)
	for {
		select {
		case _, ok := <-sub.C():
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("the subscription's channel was not closed")
		}
	}
}

func (s *suite) testSessionClose(t *testing.T, h Harness) {
	sess := session(t, h, "s1")
	sub := subscribe(t, sess)
	require.NoError(t, ping(t, sess))
	require.NoError(t, sess.Close())
	require.NoError(t, sess.Close())
	requireClosed(t, sub)
	assert.ErrorIs(t, ping(t, sess), transport.ErrClosed)
	_, err := sess.Subscribe(ctxT(t))
	assert.ErrorIs(t, err, transport.ErrClosed)
}

func (s *suite) testSessionClosePending(t *testing.T, h Harness) {
	sess, errc := pendingCall(t, h, context.Background())
	require.NoError(t, sess.Close())
	assert.ErrorIs(t, callError(t, errc, "the session closed"), transport.ErrClosed)
}

func (s *suite) testSessionsIndependent(t *testing.T, h Harness) {
	require.NoError(t, h.Bus.Serve(&echo{}))
	a, b := session(t, h, "s1"), session(t, h, "s2")
	subA, subB := subscribe(t, a), subscribe(t, b)
	syncSub(t, h.Bus, "s2", subB)
	require.NoError(t, a.Close())
	requireClosed(t, subA)
	require.NoError(t, h.Bus.Publish("s2", note("s2", 1)))
	assert.Equal(t, uint64(1), seqOf(t, receive(t, subB)), "the other session still receives")
	assert.NoError(t, ping(t, b), "and calls")
	// The same id may be opened again.
	again := session(t, h, "s1")
	assert.NoError(t, ping(t, again))
}

func (s *suite) testCallEndedContext(t *testing.T, h Harness) {
	sess := session(t, h, "s1")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := sess.Call(ctx, wire.MethodRegister, wire.RegisterParams{ContextID: "s1", Card: &wire.AgentCard{Name: "late"}})
	assert.ErrorIs(t, err, context.Canceled)
}

func (s *suite) testCallContext(t *testing.T, h Harness) {
	ctx, cancel := context.WithCancel(context.Background())
	_, errc := pendingCall(t, h, ctx)
	cancel()
	assert.ErrorIs(t, callError(t, errc, "its context ended"), context.Canceled)
}

func (s *suite) testTooLarge(t *testing.T, h Harness) {
	sess := session(t, h, "s1")
	big := make([]byte, s.f.MaxMessageBytes)
	for i := range big {
		big[i] = 'a'
	}
	// The padding is an unknown member, which the broker ignores.
	card := func(pad []byte) map[string]any {
		return map[string]any{"contextId": "s1", "card": map[string]any{"name": "big"}, "pad": string(pad)}
	}
	_, err := sess.Call(ctxT(t), wire.MethodRegister, card(big))
	assert.ErrorIs(t, err, transport.ErrTooLarge)
	// A call just under the limit passes.
	_, err = sess.Call(ctxT(t), wire.MethodRegister, card(big[:s.f.MaxMessageBytes-300]))
	assert.NoError(t, err)
}

func (s *suite) testClientClose(t *testing.T, h Harness) {
	a, b := session(t, h, "s1"), session(t, h, "s2")
	subA := subscribe(t, a)
	require.NoError(t, ping(t, b))
	require.NoError(t, h.Client.Close())
	require.NoError(t, h.Client.Close())
	requireClosed(t, subA)
	assert.ErrorIs(t, ping(t, b), transport.ErrClosed)
	_, err := h.Client.Session(ctxT(t), "s3")
	assert.ErrorIs(t, err, transport.ErrClosed)
}

func (s *suite) testBusCloseIdempotent(t *testing.T, h Harness) {
	require.NoError(t, h.Bus.Serve(&echo{}))
	require.NoError(t, h.Bus.Close())
	require.NoError(t, h.Bus.Close())
}
