package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/transport/fakebus"
	"github.com/a2a-bus/a2a-bus/wire"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// pusher registers an agent in one session and pushes numbered messages
// to a target agent.
type pusher struct {
	sess  transport.Session
	token string
}

func registerRaw(t *testing.T, c transport.Client, session, name string) (transport.Session, string) {
	t.Helper()
	s, err := c.Session(ctxT(t), session)
	require.NoError(t, err)
	res, err := s.Call(ctxT(t), wire.MethodRegister, wire.RegisterParams{ContextID: session, Card: &wire.AgentCard{Name: name}})
	require.NoError(t, err)
	var r wire.RegisterResult
	require.NoError(t, json.Unmarshal(res, &r))
	return s, r.Token
}

// busClient is a bus that is also its own client, as the fake is.
type busClient interface {
	transport.Bus
	transport.Client
}

// twoSessions serves a broker (bcfg) on bus, both closed with the test,
// and registers agent "a" in session s1, whose session it returns, and
// agent "b" in session s2, which pushes to "a".
func twoSessions(t *testing.T, bus busClient, bcfg broker.Config) (transport.Session, pusher) {
	t.Helper()
	b, err := broker.New(context.Background(), bus, bcfg)
	require.NoError(t, err)
	t.Cleanup(func() { bus.Close(); b.Close() })
	sess, _ := registerRaw(t, bus, "s1", "a")
	other, token := registerRaw(t, bus, "s2", "b")
	return sess, pusher{other, token}
}

func (p pusher) push(t *testing.T, to string, n int) {
	t.Helper()
	_, err := p.sess.Call(ctxT(t), wire.MethodSend, map[string]any{
		"token": p.token, "to": to, "oneway": true,
		"message": map[string]any{"parts": []any{map[string]any{"kind": "text", "text": fmt.Sprint(n)}}},
	})
	require.NoError(t, err)
}

func pushedNumber(t *testing.T, it runtime.Item) string {
	t.Helper()
	require.Nil(t, it.Gap, "unexpected reset: %+v", it.Gap)
	require.NotNil(t, it.Event)
	require.NotNil(t, it.Event.Push)
	return *it.Event.Push.Message.Parts[0].Text
}

type feedEnv struct {
	bus    *fakebus.Bus
	feed   *runtime.Feed
	pusher pusher
}

func newFeedEnv(t *testing.T, bcfg broker.Config, fcfg fakebus.Config, poll time.Duration) *feedEnv {
	t.Helper()
	bus := fakebus.New(fcfg)
	sess, p := twoSessions(t, bus, bcfg)
	// An event before the feed starts is not the feed's business.
	p.push(t, "a", -1)
	feed, err := runtime.NewFeed(ctxT(t), sess, runtime.FeedConfig{CheckInterval: poll})
	require.NoError(t, err)
	t.Cleanup(func() { feed.Close() })
	return &feedEnv{bus: bus, feed: feed, pusher: p}
}

func TestFeedDeliversInOrderFromWhereItStarts(t *testing.T) {
	e := newFeedEnv(t, broker.Config{}, fakebus.Config{}, time.Hour)
	for i := range 5 {
		e.pusher.push(t, "a", i)
	}
	for i := range 5 {
		it, err := e.feed.Next(ctxT(t))
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprint(i), pushedNumber(t, it))
	}
	assert.Zero(t, e.feed.Stats().Replayed)
}

func TestFeedFillsAGapByReplay(t *testing.T) {
	e := newFeedEnv(t, broker.Config{}, fakebus.Config{}, time.Hour)
	e.pusher.push(t, "a", 0)
	e.bus.Disconnect("s1")
	e.pusher.push(t, "a", 1)
	e.pusher.push(t, "a", 2)
	e.bus.Reconnect("s1")
	e.pusher.push(t, "a", 3)
	for i := range 4 {
		it, err := e.feed.Next(ctxT(t))
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprint(i), pushedNumber(t, it))
	}
	assert.GreaterOrEqual(t, e.feed.Stats().Replayed, uint64(2), "1 and 2 can only have come by replay")
}

func TestFeedRecoversWhatASlowReceiverDropped(t *testing.T) {
	e := newFeedEnv(t, broker.Config{}, fakebus.Config{Buffer: 4}, time.Hour)
	const n = 100
	for i := range n {
		e.pusher.push(t, "a", i)
	}
	for i := range n {
		it, err := e.feed.Next(ctxT(t))
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint(i), pushedNumber(t, it))
	}
	assert.Positive(t, e.feed.Stats().Replayed)
}

// TestFeedFindsALostLastEventByItsCheck: an event lost on the bus with no
// signal (no gap after it, no subscription ended), is found by the first
// check: on synctest's clock, from 80 % to 120 % of DefaultCheckInterval
// after Next began to wait.
func TestFeedFindsALostLastEventByItsCheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newFeedEnv(t, broker.Config{}, fakebus.Config{}, 0)
		e.bus.Disconnect("s1")
		e.pusher.push(t, "a", 7)
		e.bus.Reconnect("s1")
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		began := time.Now()
		it, err := e.feed.Next(ctx)
		require.NoError(t, err)
		assert.Equal(t, "7", pushedNumber(t, it))
		waited := time.Since(began)
		assert.GreaterOrEqual(t, waited, runtime.DefaultCheckInterval*4/5, "found before the first check")
		assert.LessOrEqual(t, waited, runtime.DefaultCheckInterval*6/5, "not found by the first check")
	})
}

func TestFeedReportsAGapWhenReplayCannotFill(t *testing.T) {
	e := newFeedEnv(t, broker.Config{ReplayWindow: 3}, fakebus.Config{}, time.Hour)
	e.bus.Disconnect("s1")
	for i := range 10 {
		e.pusher.push(t, "a", i)
	}
	e.bus.Reconnect("s1")
	e.pusher.push(t, "a", 10)
	it, err := e.feed.Next(ctxT(t))
	require.NoError(t, err)
	require.NotNil(t, it.Gap, "events 0 to 7 are gone: the consumer must re-read")
	assert.False(t, it.Gap.NewEpoch)
	// Then what the broker still holds, in order.
	for _, want := range []string{"8", "9", "10"} {
		it, err := e.feed.Next(ctxT(t))
		require.NoError(t, err)
		assert.Equal(t, want, pushedNumber(t, it))
	}
}

func TestFeedEndsWithItsSession(t *testing.T) {
	e := newFeedEnv(t, broker.Config{}, fakebus.Config{}, 10*time.Millisecond)
	e.bus.Close()
	_, err := e.feed.Next(ctxT(t))
	assert.ErrorIs(t, err, runtime.ErrFeedClosed)
}

// TestFeedOverNATSWithATinyBuffer: a NATS subscriber that holds only 4
// notifications falls far behind; the feed still delivers every event,
// in order, by replay.
func TestFeedOverNATSWithATinyBuffer(t *testing.T) {
	bus, err := natsbus.New(natsbus.Config{})
	require.NoError(t, err)
	b, err := broker.New(context.Background(), bus, broker.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { bus.Close(); b.Close() })
	slow, err := bus.Connect(natsbus.ClientConfig{Buffer: 4})
	require.NoError(t, err)
	fast, err := bus.Connect(natsbus.ClientConfig{})
	require.NoError(t, err)
	sess, _ := registerRaw(t, slow, "s1", "a")
	other, token := registerRaw(t, fast, "s2", "b")
	feed, err := runtime.NewFeed(ctxT(t), sess, runtime.FeedConfig{CheckInterval: time.Hour})
	require.NoError(t, err)
	defer feed.Close()
	const n = 300
	p := pusher{other, token}
	for i := range n {
		p.push(t, "a", i)
	}
	for i := range n {
		it, err := feed.Next(ctxT(t))
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint(i), pushedNumber(t, it))
	}
	assert.Positive(t, feed.Stats().Replayed, "the tiny buffer dropped events, and replay brought them back")
	assert.Zero(t, feed.Stats().Gaps)
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// flakySubscriber is a session whose subscriptions the test can end (a
// lost connection), and whose next Subscribe calls fail while fail > 0.
type flakySubscriber struct {
	transport.Session
	mu   sync.Mutex
	fail int
	// refuse, when set, is what every Subscribe returns (after fail).
	refuse error
	subs   []transport.Subscription
	tries  []time.Time
}

func (s *flakySubscriber) Subscribe(ctx context.Context) (transport.Subscription, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tries = append(s.tries, time.Now())
	if s.fail > 0 {
		s.fail--
		return nil, fmt.Errorf("%w: the link is not back yet", transport.ErrUnavailable)
	}
	if s.refuse != nil {
		return nil, s.refuse
	}
	sub, err := s.Session.Subscribe(ctx)
	if err == nil {
		s.subs = append(s.subs, sub)
	}
	return sub, err
}

// TestFeedResubscribesWithBackoff: a subscription that ends is made
// again at once, then after 50 ms, the wait doubling up to 2 s, for as
// long as Subscribe fails; then the feed replays what passed meanwhile.
// The clock is synctest's.
func TestFeedResubscribesWithBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sess, p := twoSessions(t, fakebus.New(fakebus.Config{}), broker.Config{})
		s := &flakySubscriber{Session: sess}
		feed, err := runtime.NewFeed(ctxT(t), s, runtime.FeedConfig{CheckInterval: time.Hour})
		require.NoError(t, err)
		t.Cleanup(func() { feed.Close() })

		s.mu.Lock()
		s.fail, s.tries = 7, nil
		require.NoError(t, s.subs[0].Close()) // the link is lost
		s.mu.Unlock()
		p.push(t, "a", 7) // meanwhile: only a replay brings it
		it, err := feed.Next(ctxT(t))
		require.NoError(t, err)
		assert.Equal(t, "7", pushedNumber(t, it))

		s.mu.Lock()
		defer s.mu.Unlock()
		var waits []time.Duration
		for i := 1; i < len(s.tries); i++ {
			waits = append(waits, s.tries[i].Sub(s.tries[i-1]))
		}
		ms := time.Millisecond
		assert.Equal(t, []time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 2000 * ms}, waits)
	})
}

// TestAFeedWhoseResubscriptionIsRefusedEnds: a subscription the server
// refuses is not asked for again and again: after the tries that failed
// as unavailable, the refusal ends the feed's Next with it, so the
// session's delegates, and the host, see why.
func TestAFeedWhoseResubscriptionIsRefusedEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sess, _ := twoSessions(t, fakebus.New(fakebus.Config{}), broker.Config{})
		s := &flakySubscriber{Session: sess}
		feed, err := runtime.NewFeed(ctxT(t), s, runtime.FeedConfig{CheckInterval: time.Hour})
		require.NoError(t, err)
		t.Cleanup(func() { feed.Close() })

		s.mu.Lock()
		s.fail, s.tries = 2, nil
		s.refuse = fmt.Errorf("%w: maximum subscriptions exceeded", transport.ErrRefused)
		require.NoError(t, s.subs[0].Close()) // the link is lost
		s.mu.Unlock()
		_, err = feed.Next(ctxT(t))
		require.ErrorIs(t, err, transport.ErrRefused)
		s.mu.Lock()
		defer s.mu.Unlock()
		assert.Len(t, s.tries, 3, "two unavailable, then the refusal, and no more")
	})
}

// failing is a bus whose Publish fails while failures is positive.
type failing struct {
	*fakebus.Bus
	failures atomic.Int32
}

func (b *failing) Publish(session string, msg []byte) error {
	if b.failures.Add(-1) >= 0 {
		return errors.New("the link is down")
	}
	return b.Bus.Publish(session, msg)
}

// TestFeedGetsAnEventWhosePublishFailedWithoutACheck: the broker publishes
// again a notification whose publish failed, once the bus takes it, so a
// waiting feed gets it without a check of its own (there is none within
// the hour) and without a replay.
func TestFeedGetsAnEventWhosePublishFailedWithoutACheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bus := &failing{Bus: fakebus.New(fakebus.Config{})}
		sess, p := twoSessions(t, bus, broker.Config{})
		feed, err := runtime.NewFeed(ctxT(t), sess, runtime.FeedConfig{CheckInterval: time.Hour})
		require.NoError(t, err)
		t.Cleanup(func() { feed.Close() })

		bus.failures.Store(2) // the first publish and the first try again
		p.push(t, "a", 7)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		began := time.Now()
		it, err := feed.Next(ctx)
		require.NoError(t, err, "the event whose publish failed never came")
		assert.Equal(t, "7", pushedNumber(t, it))
		assert.Zero(t, feed.Stats().Replayed, "the event came by the bus, not by a replay")
		// 100 ms, then 200 ms after the failed try again: the republisher's
		// backoff, on synctest's clock.
		assert.Equal(t, 300*time.Millisecond, time.Since(began))
	})
}
