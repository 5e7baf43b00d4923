package host

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/transport/fakebus"
)

// fakeBroker is a link's broker in memory: a fake bus answering every
// call with which broker it is.
type fakeBroker struct {
	bus  *fakebus.Bus
	gone chan struct{}
}

func newFakeBroker(t *testing.T, name string) *fakeBroker {
	b := &fakeBroker{bus: fakebus.New(fakebus.Config{}), gone: make(chan struct{})}
	require.NoError(t, b.bus.Serve(transport.HandlerFunc(func(context.Context, transport.Caller, []byte) []byte {
		return []byte(`{"jsonrpc":"2.0","id":1,"result":"` + name + `"}`)
	})))
	t.Cleanup(func() { b.bus.Close() })
	return b
}

func TestRejoinerCallsWaitForTheNextBroker(t *testing.T) {
	first := newFakeBroker(t, "first")
	var firstUp atomic.Bool
	firstUp.Store(true)
	var next atomic.Pointer[fakeBroker]
	r, err := newRejoiner(context.Background(), func(context.Context) (*link, error) {
		if b := next.Load(); b != nil {
			return &link{client: b.bus, gone: b.gone, desc: "next"}, nil
		}
		if firstUp.Load() {
			return &link{client: first.bus, gone: first.gone, desc: "first"}, nil
		}
		return nil, errors.New("no broker yet")
	}, slog.New(slog.DiscardHandler), liveness{})
	require.NoError(t, err)
	defer r.Close()
	sess, err := r.Session(context.Background(), "s1")
	require.NoError(t, err)
	defer sess.Close()
	call := func(ctx context.Context) (string, error) {
		raw, err := sess.Call(ctx, "which", nil)
		var who string
		if err == nil {
			err = json.Unmarshal(raw, &who)
		}
		return who, err
	}
	who, err := call(context.Background())
	require.NoError(t, err)
	assert.Equal(t, "first", who)

	// The first broker goes, and nothing answers for a while.
	firstUp.Store(false)
	close(first.gone)
	require.Eventually(t, func() bool { return r.pid() == 0 && r.describe() == "rejoining the broker" }, 5*time.Second, time.Millisecond)
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = call(short)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "a call during the gap waits, bounded by its context")

	answered := make(chan string, 1)
	go func() {
		who, _ := call(context.Background())
		answered <- who
	}()
	next.Store(newFakeBroker(t, "next"))
	select {
	case who := <-answered:
		assert.Equal(t, "next", who, "the waiting call goes through once a broker is back")
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting call never went through")
	}
	assert.Equal(t, 1, r.rejoins())
}

func TestRejoinerCloseEndsAWaitingCall(t *testing.T) {
	b := newFakeBroker(t, "only")
	dialed := 0
	r, err := newRejoiner(context.Background(), func(context.Context) (*link, error) {
		dialed++
		if dialed == 1 {
			return &link{client: b.bus, gone: b.gone}, nil
		}
		return nil, errors.New("gone for good")
	}, slog.New(slog.DiscardHandler), liveness{})
	require.NoError(t, err)
	sess, err := r.Session(context.Background(), "s1")
	require.NoError(t, err)
	close(b.gone)
	require.Eventually(t, func() bool { return r.describe() == "rejoining the broker" }, 5*time.Second, time.Millisecond)
	errc := make(chan error, 1)
	go func() {
		_, err := sess.Call(context.Background(), "x", nil)
		errc <- err
	}()
	// Whether the call already waits or is about to: it ends.
	require.NoError(t, r.Close())
	select {
	case err := <-errc:
		assert.ErrorIs(t, err, transport.ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("Close left a call waiting")
	}
	require.NoError(t, r.Close(), "idempotent")
}

// realBroker is a fake bus served by a real broker.
func realBroker(t *testing.T) *fakebus.Bus {
	bus := fakebus.New(fakebus.Config{})
	b, err := broker.New(context.Background(), bus, broker.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { bus.Close(); b.Close() })
	return bus
}

// dyingClient is a link whose broker dies just as a session is opened on
// it: the supervisor closes it between current() and Session().
type dyingClient struct {
	*fakebus.Bus
	gone   chan struct{}
	closed chan struct{}
	once   sync.Once
}

func (c *dyingClient) Session(ctx context.Context, id string) (transport.Session, error) {
	close(c.gone)
	select {
	case <-c.closed:
	case <-time.After(5 * time.Second):
	}
	return c.Bus.Session(ctx, id)
}

func (c *dyingClient) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Bus.Close()
}

// TestRejoinerALinkLostWhileOpeningASessionIsNotTheSessionsEnd: a link
// that dies just as a session's side is opened on it answers ErrClosed;
// the session waits for the next link instead of ending its runtime.
func TestRejoinerALinkLostWhileOpeningASessionIsNotTheSessionsEnd(t *testing.T) {
	first := realBroker(t)
	firstGone := make(chan struct{})
	var dials atomic.Int32
	r, err := newRejoiner(context.Background(), func(context.Context) (*link, error) {
		switch dials.Add(1) {
		case 1:
			return &link{client: first, gone: firstGone, desc: "first"}, nil
		case 2:
			d := &dyingClient{Bus: realBroker(t), gone: make(chan struct{}), closed: make(chan struct{})}
			return &link{client: d, gone: d.gone, desc: "dying"}, nil
		}
		return &link{client: realBroker(t), gone: make(chan struct{}), desc: "healthy"}, nil
	}, slog.New(slog.DiscardHandler), liveness{})
	require.NoError(t, err)
	defer r.Close()
	sess, err := r.Session(context.Background(), "s1")
	require.NoError(t, err)
	defer sess.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	feed, err := runtime.NewFeed(ctx, sess, runtime.FeedConfig{CheckInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	defer feed.Close()

	close(firstGone) // the first broker dies
	it, err := feed.Next(ctx)
	require.NoError(t, err, "the session is open and a healthy broker is next: the feed goes on")
	require.NotNil(t, it.Gap, "with a new epoch")
	assert.GreaterOrEqual(t, dials.Load(), int32(3))
}

// TestABrokerInThisProcessClosesAfterItsBus: Close closes the bus (no
// request is served any more; running ones finish), then the broker, then
// the store, as broker.New says.
func TestABrokerInThisProcessClosesAfterItsBus(t *testing.T) {
	for _, name := range []string{"nats", "fake"} {
		t.Run(name, func(t *testing.T) {
			open := map[string]func(context.Context, Config) (*Host, error){"nats": Open, "fake": OpenFake}[name]
			h, err := open(context.Background(), Config{Bus: NATS, DataDir: t.TempDir()})
			require.NoError(t, err)
			var order []string
			for i := len(h.closers) - 1; i >= 0; i-- {
				order = append(order, h.closers[i].name)
			}
			want := []string{"bus", "broker", "store"}
			if name == "nats" {
				want = append([]string{"client"}, want...) // in-process connections first
			}
			assert.Equal(t, want, order)
			require.NoError(t, h.Close())
		})
	}
}

// TestRejoinerBacksOffABrokerThatDiesYoung: a broker that cannot be
// dialed is dialed again at once, then after rejoinFirstWait, the wait
// doubling up to rejoinMaxWait. A link that dies within rejoinSteady of
// being made keeps the backoff where it was; one that lasted longer
// starts it over. The clock is synctest's: every wait is the rejoiner's
// own, to the nanosecond, however busy the machine.
func TestRejoinerBacksOffABrokerThatDiesYoung(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var (
			fail   int             // dials to fail before the next succeeds
			gone   chan struct{}   // the current link's
			wentAt time.Time       // when the last link went
			dials  []time.Duration // each dial, after wentAt
		)
		r, err := newRejoiner(context.Background(), func(context.Context) (*link, error) {
			mu.Lock()
			defer mu.Unlock()
			dials = append(dials, time.Since(wentAt))
			if fail > 0 {
				fail--
				return nil, errors.New("the broker cannot start")
			}
			gone = make(chan struct{})
			return &link{client: newStuckClient(), gone: gone, desc: "broker"}, nil
		}, slog.New(slog.DiscardHandler), liveness{})
		require.NoError(t, err)
		defer r.Close()
		// lose ends the current link after it lasted for, with the next
		// failing dials to come, and returns the dials until one was
		// made again.
		lose := func(lasted time.Duration, failing int) []time.Duration {
			time.Sleep(lasted) // synctest's clock: at once
			mu.Lock()
			fail, wentAt, dials = failing, time.Now(), nil
			close(gone)
			mu.Unlock()
			synctest.Wait() // the supervisor saw it go
			_, _, err := r.current(context.Background())
			require.NoError(t, err)
			mu.Lock()
			defer mu.Unlock()
			return dials
		}
		ms := time.Millisecond
		// Young: at once, then 50 ms, doubling to 1 s between dials.
		assert.Equal(t, []time.Duration{0, 50 * ms, 150 * ms, 350 * ms, 750 * ms, 1550 * ms, 2550 * ms, 3550 * ms, 4550 * ms},
			lose(0, 8))
		require.Equal(t, rejoinFirstWait, 50*ms)
		require.Equal(t, rejoinMaxWait, time.Second)
		// The next link dies young too: the backoff goes on from where
		// it was, and the first dial waits too.
		assert.Equal(t, []time.Duration{rejoinMaxWait}, lose(rejoinSteady-ms, 0))
		// One that lasted rejoinSteady starts the backoff over.
		assert.Equal(t, []time.Duration{0, 50 * ms, 150 * ms}, lose(rejoinSteady, 2))
		assert.Equal(t, 3, r.rejoins())
	})
}
