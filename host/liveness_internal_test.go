package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

func TestConfigLiveness(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
		want time.Duration
	}{
		{"zero is the default", Config{}, DefaultHealthTimeout},
		{"set", Config{HealthTimeout: 3 * time.Second}, 3 * time.Second},
		{"NoHealthCheck turns the check off", Config{NoHealthCheck: true}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, liveness{timeout: c.want}, c.cfg.liveness())
		})
	}
}

// scriptedCaller answers each health call as its script says, in turn:
// the script is given the clock, which it may move on (the process stood
// still while the call waited).
type scriptedCaller struct {
	stuckClient
	clock  *time.Time
	script []func(clock *time.Time) error
	calls  int
}

func (c *scriptedCaller) CallHost(ctx context.Context, method string, _ any) (json.RawMessage, error) {
	if method != wire.MethodAdminInfo {
		return nil, fmt.Errorf("unexpected %s", method)
	}
	step := c.script[min(c.calls, len(c.script)-1)]
	c.calls++
	if err := step(c.clock); err != nil {
		return nil, err
	}
	return json.RawMessage(`{}`), nil
}

// checkTimeout is the health timeout of the scripted checks.
const checkTimeout = time.Second

// The steps of a script.
var (
	answer = func(*time.Time) error { return nil }
	// errorAnswer: the broker answered, with an error.
	errorAnswer = func(*time.Time) error { return wire.ErrUnauthorized }
	// onTime: the deadline passed, on time.
	onTime = func(clock *time.Time) error {
		*clock = clock.Add(checkTimeout)
		return context.DeadlineExceeded
	}
	// stoppedHost: the deadline passed 15 s late, this process stopped.
	stoppedHost = func(clock *time.Time) error {
		*clock = clock.Add(checkTimeout + 15*time.Second)
		return context.DeadlineExceeded
	}
	linkFailed = func(*time.Time) error {
		return fmt.Errorf("%w: the broker closed the pipe", transport.ErrUnavailable)
	}
)

// TestAHealthCheckJudgesTheBrokerNotItsOwnStall: a deadline that passed
// while the host was not running is no verdict on the broker: the host
// asks again (up to healthTries calls), and only a deadline that passed
// on time, or a failed link, says the broker does not answer.
func TestAHealthCheckJudgesTheBrokerNotItsOwnStall(t *testing.T) {
	for _, c := range []struct {
		name   string
		script []func(*time.Time) error
		dead   bool
		calls  int
	}{
		{"it answers", s(answer), false, 1},
		{"an error is an answer", s(errorAnswer), false, 1},
		{"no answer in time", s(onTime), true, 1},
		{"the link failed", s(linkFailed), true, 1},
		{"the host stood still, then it answers", s(stoppedHost, answer), false, 2},
		{"the host stood still, then no answer in time", s(stoppedHost, onTime), true, 2},
		{"the host stood still at every call", s(stoppedHost), true, healthTries},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := time.Unix(1e9, 0)
			hc := &scriptedCaller{stuckClient: newStuckClient(), clock: &clock, script: c.script}
			r, err := newRejoiner(context.Background(), func(context.Context) (*link, error) {
				return &link{client: hc, gone: make(chan struct{})}, nil
			}, slog.New(slog.DiscardHandler), liveness{timeout: checkTimeout, every: time.Hour, now: func() time.Time { return clock }})
			require.NoError(t, err)
			defer r.Close()
			err = r.check(r.cur)
			assert.Equal(t, c.dead, err != nil, "verdict: %v", err)
			assert.Equal(t, c.calls, hc.calls)
		})
	}
}

func s(steps ...func(*time.Time) error) []func(*time.Time) error {
	return steps
}

// stuckClient is a broker that is alive and answers nothing: every call
// waits until its context ends or the client closes.
type stuckClient struct {
	closed chan struct{}
	once   *sync.Once
}

func newStuckClient() stuckClient {
	return stuckClient{closed: make(chan struct{}), once: new(sync.Once)}
}

func (c stuckClient) wait(ctx context.Context) (json.RawMessage, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.closed:
		return nil, transport.ErrClosed
	}
}

func (c stuckClient) Session(_ context.Context, id string) (transport.Session, error) {
	return stuckSession{c, id}, nil
}

func (c stuckClient) CallHost(ctx context.Context, _ string, _ any) (json.RawMessage, error) {
	return c.wait(ctx)
}

func (c stuckClient) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

type stuckSession struct {
	c  stuckClient
	id string
}

func (s stuckSession) ID() string { return s.id }
func (s stuckSession) Call(ctx context.Context, _ string, _ any) (json.RawMessage, error) {
	return s.c.wait(ctx)
}
func (s stuckSession) Subscribe(context.Context) (transport.Subscription, error) {
	return nil, errors.New("no subscriptions here")
}
func (s stuckSession) Close() error { return nil }

// TestRejoinerReplacesABrokerThatDoesNotAnswer: a call on a broker that
// is alive but answers nothing stalls; the supervisor's health call gets
// no answer either, so it kills the broker and dials the next. The
// stalled call fails with ErrUnavailable, the next goes through. On
// synctest's clock: the stalled call fails two health timeouts after it
// was made (it waited one, then the health call another).
func TestRejoinerReplacesABrokerThatDoesNotAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		stuck := newStuckClient()
		stuckGone := make(chan struct{})
		var killed atomic.Int32
		next := newFakeBroker(t, "next")
		var dials atomic.Int32
		r, err := newRejoiner(context.Background(), func(context.Context) (*link, error) {
			if dials.Add(1) == 1 {
				return &link{client: stuck, gone: stuckGone, desc: "stuck", kill: func() {
					killed.Add(1)
					close(stuckGone) // as a killed child's pipe ends
				}}, nil
			}
			return &link{client: next.bus, gone: next.gone, desc: "next"}, nil
		}, slog.New(slog.DiscardHandler), liveness{timeout: DefaultHealthTimeout, every: time.Hour})
		require.NoError(t, err)
		defer r.Close()
		sess, err := r.Session(context.Background(), "s1")
		require.NoError(t, err)
		defer sess.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start := time.Now()
		_, err = sess.Call(ctx, "which", nil)
		require.ErrorIs(t, err, transport.ErrUnavailable, "the stalled call fails once the broker is taken for dead")
		assert.Equal(t, 2*DefaultHealthTimeout, time.Since(start))
		raw, err := sess.Call(ctx, "which", nil)
		require.NoError(t, err)
		assert.JSONEq(t, `"next"`, string(raw))
		assert.Equal(t, int32(1), killed.Load(), "the stuck broker was killed once")
		assert.Equal(t, 1, r.rejoins())
	})
}

// TestRejoinerWithoutHealthChecksWaits: with the check off, a call on a
// broker that answers nothing waits for its context, however long (an
// hour on synctest's clock), and the broker is kept (a broker held at a
// breakpoint).
func TestRejoinerWithoutHealthChecksWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		stuck := newStuckClient()
		r, err := newRejoiner(context.Background(), func(context.Context) (*link, error) {
			return &link{client: stuck, gone: make(chan struct{}), desc: "stuck", kill: func() { t.Error("killed") }}, nil
		}, slog.New(slog.DiscardHandler), liveness{})
		require.NoError(t, err)
		defer r.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		start := time.Now()
		_, err = r.CallHost(ctx, wire.MethodAdminInfo, nil)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, time.Hour, time.Since(start))
		assert.Zero(t, r.rejoins())
	})
}
