package runtime_test

import (
	"context"
	"encoding/json"
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
	"github.com/a2a-bus/a2a-bus/wire"
)

// unanswering leaves replays of its session unanswered, as a broker whose
// connection was cut with the request in it does: the call waits until
// its context ends.
type unanswering struct {
	transport.Session
	replays atomic.Int32 // how many more replays to leave unanswered
}

func (s *unanswering) Call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	if method == wire.MethodReplay && s.replays.Add(-1) >= 0 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.Session.Call(ctx, method, params)
}

// TestFeedGivesUpAReplayWhoseAnswerNeverComes: a replay that is never
// answered is given up after ReplayTimeout, and the replay tried again
// RetryInterval later brings what the feed missed: the feed, and every
// delegate of the session behind it, is not held for good by one lost
// request. On synctest's clock, with the default settings: the event
// comes a check (80 % to 120 % of its interval), a replay timeout and a
// retry after Next began to wait.
func TestFeedGivesUpAReplayWhoseAnswerNeverComes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bus := fakebus.New(fakebus.Config{})
		sess, p := twoSessions(t, bus, broker.Config{})
		s := &unanswering{Session: sess}
		feed, err := runtime.NewFeed(ctxT(t), s, runtime.FeedConfig{})
		require.NoError(t, err)
		t.Cleanup(func() { feed.Close() })

		s.replays.Store(1)
		bus.Disconnect("s1")
		p.push(t, "a", 7) // lost: only a replay brings it
		bus.Reconnect("s1")
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		began := time.Now()
		it, err := feed.Next(ctx)
		require.NoError(t, err, "the feed is still held by the unanswered replay")
		assert.Equal(t, "7", pushedNumber(t, it))
		assert.Less(t, s.replays.Load(), int32(0), "the unanswered replay was made, and given up")
		after := time.Since(began) - runtime.DefaultReplayTimeout - runtime.DefaultRetryInterval
		assert.GreaterOrEqual(t, after, runtime.DefaultCheckInterval*4/5, "the check, the timeout and the retry")
		assert.LessOrEqual(t, after, runtime.DefaultCheckInterval*6/5, "the check, the timeout and the retry")
	})
}
