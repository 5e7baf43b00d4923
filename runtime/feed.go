package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// DefaultCheckInterval is about how often a waiting Feed asks the broker
// for events it may have missed with nothing to tell it so, so that even
// a lost last event is found. Each wait is drawn from 80 % to 120 % of
// it, so that many sessions' checks do not come together.
//
// A feed learns of a loss from the loss's own signal first: a seq gap, a
// subscription that ended (the connection dropped, or the bus cut a slow
// receiver) or that dropped events; each makes it replay at once. The
// check is for what no signal shows.
const DefaultCheckInterval = 30 * time.Second

// DefaultRetryInterval is how soon a waiting Feed asks again after the
// broker did not answer a replay.
const DefaultRetryInterval = 2 * time.Second

// DefaultReplayTimeout bounds each replay a Feed makes of its own
// (FeedConfig.ReplayTimeout).
const DefaultReplayTimeout = 30 * time.Second

// FeedConfig configures a Feed. The zero value is the default; NewFeed
// refuses a config that Validate refuses.
type FeedConfig struct {
	// CheckInterval is about how often Next, while it waits, replays to
	// find an event lost with no signal (DefaultCheckInterval). 0 means
	// DefaultCheckInterval.
	CheckInterval time.Duration
	// RetryInterval is how soon Next, while it waits, replays again
	// after a replay the broker did not answer. 0 means
	// DefaultRetryInterval.
	RetryInterval time.Duration
	// ReplayTimeout bounds each replay the feed makes of its own, to fill
	// a gap or at a check: one whose answer never comes (the request was
	// lost when the broker's connection was cut and made again, or a
	// broker too busy to answer dropped it) is given up and tried again
	// after RetryInterval, instead of holding the feed, and every
	// delegate of the session, for good. 0 means DefaultReplayTimeout.
	ReplayTimeout time.Duration
	// ShouldCheck, when set, is asked at each check whether anyone waits
	// for an event; when nobody does, the check is skipped, so that idle
	// sessions cost the broker nothing.
	ShouldCheck func() bool
	// Logger receives the feed's logs. nil discards them.
	Logger *slog.Logger
}

// Validate reports the first setting of cfg that is out of range.
func (cfg FeedConfig) Validate() error {
	switch {
	case cfg.CheckInterval < 0:
		return fmt.Errorf("runtime: FeedConfig.CheckInterval is %v: want 0 (DefaultCheckInterval) or more", cfg.CheckInterval)
	case cfg.RetryInterval < 0:
		return fmt.Errorf("runtime: FeedConfig.RetryInterval is %v: want 0 (DefaultRetryInterval) or more", cfg.RetryInterval)
	case cfg.ReplayTimeout < 0:
		return fmt.Errorf("runtime: FeedConfig.ReplayTimeout is %v: want 0 (DefaultReplayTimeout) or more", cfg.ReplayTimeout)
	}
	return nil
}

// Item is what Feed.Next returns: an event, or a gap.
type Item struct {
	// Event is the next notification for the session, in seq order.
	Event *wire.Event
	// Gap, when set, says that events may have been lost for good: the
	// broker restarted (a new epoch: registrations are gone too), or
	// replay no longer holds what was missed. Whoever consumes the feed
	// re-reads its state (re-registers, lists its tasks).
	Gap *Gap
}

// Gap describes a break in the feed.
type Gap struct {
	// Epoch is the broker's current epoch.
	Epoch string
	// NewEpoch is true when the broker restarted.
	NewEpoch bool
	// Reason says what happened, for logs.
	Reason string
}

// Feed turns one session's subscription into the session's notifications
// in seq order without gaps: it replays what the bus lost (a seq gap, a
// slow receiver's drops, a lost subscription, a lost last event found by
// the check), and says when that is not possible. It is not safe for
// concurrent use: one goroutine calls Next.
type Feed struct {
	cfg     FeedConfig
	log     *slog.Logger
	sess    transport.Session
	sub     transport.Subscription
	dropped uint64 // sub.Dropped() last seen

	epoch string
	next  uint64 // the next seq expected
	queue []Item
	// unsure is set while the broker has not answered the latest replay:
	// the next one comes after RetryInterval, not a check's wait.
	unsure bool
	// check bounds each wait of Next: one timer for the feed, set again
	// for each wait, not one made for each event.
	check *time.Timer

	replayed, gaps uint64
}

// ErrFeedClosed is returned by Next once the session is closed.
var ErrFeedClosed = errors.New("runtime: the session's feed is closed")

// NewFeed subscribes to the session and learns where its notifications
// stand, so that Next returns only what comes after.
func NewFeed(ctx context.Context, sess transport.Session, cfg FeedConfig) (*Feed, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.CheckInterval == 0 {
		cfg.CheckInterval = DefaultCheckInterval
	}
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = DefaultRetryInterval
	}
	if cfg.ReplayTimeout == 0 {
		cfg.ReplayTimeout = DefaultReplayTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	f := &Feed{cfg: cfg, log: cfg.Logger, sess: sess}
	sub, err := sess.Subscribe(ctx)
	if err != nil {
		return nil, err
	}
	f.sub = sub
	if err := f.sync(ctx); err != nil {
		sub.Close()
		return nil, err
	}
	return f, nil
}

// Close ends the subscription.
func (f *Feed) Close() error { return f.sub.Close() }

// Epoch returns the broker epoch the feed follows.
func (f *Feed) Epoch() string { return f.epoch }

// sync learns the current epoch and last seq: nothing before is wanted.
func (f *Feed) sync(ctx context.Context) error {
	raw, err := f.sess.Call(ctx, wire.MethodReplay, wire.ReplayParams{ContextID: f.sess.ID()})
	if err != nil {
		return fmt.Errorf("runtime: learn where the session stands: %w", err)
	}
	var res wire.ReplayResult
	if err := wire.Unmarshal(raw, &res); err != nil || res.Epoch == "" {
		return fmt.Errorf("runtime: learn where the session stands: a bad replay result")
	}
	f.epoch, f.next = res.Epoch, res.LastSeq+1
	return nil
}

func (f *Feed) replay(ctx context.Context, epoch string, after uint64) (*wire.ReplayResult, error) {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.ReplayTimeout)
	defer cancel()
	raw, err := f.sess.Call(ctx, wire.MethodReplay, wire.ReplayParams{ContextID: f.sess.ID(), Epoch: &epoch, AfterSeq: &after})
	if err != nil {
		return nil, err
	}
	var res wire.ReplayResult
	if err := wire.Unmarshal(raw, &res); err != nil {
		return nil, fmt.Errorf("runtime: bad replay result: %w", err)
	}
	return &res, nil
}

// wait returns how long Next waits before it asks the broker on its own:
// RetryInterval after an unanswered replay, else CheckInterval drawn
// from 80 % to 120 %.
func (f *Feed) wait() time.Duration {
	if f.unsure {
		return f.cfg.RetryInterval
	}
	d := f.cfg.CheckInterval
	return d*4/5 + rand.N(d*2/5+1)
}

// Next returns the session's next event, or a Gap. While it waits it
// asks the broker on its own only for what no signal shows (see
// DefaultCheckInterval), or again after a replay it did not answer. It
// returns ctx's error when ctx ends, and ErrFeedClosed once the session
// is closed.
func (f *Feed) Next(ctx context.Context) (Item, error) {
	check := f.check
	if len(f.queue) == 0 { // a wait ahead: arm the check
		if check == nil {
			check = time.NewTimer(f.wait())
			f.check = check
		} else {
			check.Reset(f.wait())
		}
		defer check.Stop()
	}
	retrying := f.unsure // check is armed for RetryInterval
	for len(f.queue) == 0 {
		if f.unsure && !retrying {
			// A replay just went unanswered: ask again soon.
			check.Reset(f.cfg.RetryInterval)
		}
		retrying = f.unsure
		if d := f.sub.Dropped(); d != f.dropped {
			// The receiver fell behind: fetch what was dropped now.
			f.dropped = d
			if _, err := f.catchUp(ctx, "the subscription dropped events"); err != nil {
				return Item{}, err
			}
			continue
		}
		select {
		case raw, ok := <-f.sub.C():
			if !ok {
				if err := f.resubscribe(ctx); err != nil {
					return Item{}, err
				}
				continue
			}
			if err := f.take(ctx, raw); err != nil {
				return Item{}, err
			}
		case <-check.C:
			if f.cfg.ShouldCheck == nil || f.cfg.ShouldCheck() {
				if _, err := f.catchUp(ctx, ""); err != nil {
					return Item{}, err
				}
			}
			check.Reset(f.wait())
			retrying = f.unsure
		case <-ctx.Done():
			return Item{}, ctx.Err()
		}
	}
	it := f.queue[0]
	f.queue[0] = Item{}
	f.queue = f.queue[1:]
	return it, nil
}

// take handles one notification from the subscription.
func (f *Feed) take(ctx context.Context, raw []byte) error {
	ev, err := wire.DecodeEvent(raw)
	if err != nil {
		f.log.Warn("undecodable notification skipped", "error", err)
		return nil
	}
	h := ev.Head()
	session := h.RecipientContextID
	if session == "" {
		session = h.ContextID
	}
	if session != f.sess.ID() {
		return nil // not ours (a bus that broadcasts)
	}
	if h.Epoch != f.epoch {
		// Another epoch: a late notification of a run that is over, or
		// the first of a new run. Ask the broker which.
		answered, err := f.catchUp(ctx, "")
		if err != nil || !answered || h.Epoch != f.epoch {
			return err // stale, or unknown for now: replay brings what counts
		}
	}
	switch {
	case h.Seq < f.next:
		return nil // already delivered (a replay got there first)
	case h.Seq > f.next:
		answered, err := f.catchUp(ctx, "a gap in seq")
		if err != nil || !answered {
			// The broker is out of reach: leave the gap open; a later
			// replay fills it, this event included.
			return err
		}
		if h.Seq < f.next {
			return nil
		}
		if h.Seq > f.next {
			// Replay could not fill it: lost for good.
			f.queue = append(f.queue, Item{Gap: &Gap{Epoch: f.epoch, Reason: fmt.Sprintf("events %d to %d are lost", f.next, h.Seq-1)}})
			f.gaps++
		}
	}
	f.queue = append(f.queue, Item{Event: ev})
	f.next = h.Seq + 1
	return nil
}

// catchUp replays everything after the last delivered seq. A gap that
// replay cannot fill, or a new epoch, becomes a Gap, after which the
// feed follows the broker from what it still holds. It reports whether
// the broker answered; a broker out of reach is no error (Next tries
// again after RetryInterval).
func (f *Feed) catchUp(ctx context.Context, why string) (answered bool, err error) {
	for attempt := 0; ; attempt++ {
		res, err := f.replay(ctx, f.epoch, f.next-1)
		var we *wire.Error
		f.unsure = err != nil && !errors.As(err, &we)
		switch {
		case err == nil:
			// A replay answers a page at a time: go on until the last.
			if f.enqueue(res.Events, why) > 0 && f.next <= res.LastSeq {
				attempt = -1
				continue
			}
			return true, nil
		case errors.As(err, &we) && errors.Is(err, wire.ErrReplayGap) && we.Data != nil && attempt < 3:
			newEpoch := we.Data.Epoch != f.epoch
			reason := "events were lost beyond the replay window"
			if newEpoch {
				reason = "the broker restarted"
			}
			if why != "" {
				reason = why + ": " + reason
			}
			f.queue = append(f.queue, Item{Gap: &Gap{Epoch: we.Data.Epoch, NewEpoch: newEpoch, Reason: reason}})
			f.gaps++
			f.epoch, f.next = we.Data.Epoch, max(we.Data.OldestSeq, 1)
			if newEpoch {
				f.next = 1
			}
			why = ""
			// Take what the broker still holds from there on.
		case errors.Is(err, transport.ErrClosed):
			return false, ErrFeedClosed
		case ctx.Err() != nil:
			return false, ctx.Err()
		default:
			// The broker is out of reach for now; Next retries.
			f.log.Debug("replay failed; will retry", "error", err)
			return false, nil
		}
	}
}

// enqueue queues the replayed events not yet delivered and returns how
// many it queued.
func (f *Feed) enqueue(events []json.RawMessage, why string) int {
	n := 0
	for _, raw := range events {
		ev, err := wire.DecodeEvent(raw)
		if err != nil {
			continue
		}
		if h := ev.Head(); h.Seq >= f.next {
			f.queue = append(f.queue, Item{Event: ev})
			f.next = h.Seq + 1
			n++
		}
	}
	f.replayed += uint64(n)
	if n > 0 {
		f.log.Debug("replayed missed events", "why", why, "count", n)
	}
	return n
}

// resubscribe replaces a subscription that ended (a lost connection),
// then replays what passed meanwhile.
func (f *Feed) resubscribe(ctx context.Context) error {
	backoff := 50 * time.Millisecond
	for {
		sub, err := f.sess.Subscribe(ctx)
		if err == nil {
			f.sub, f.dropped = sub, 0
			_, err := f.catchUp(ctx, "resubscribed")
			return err
		}
		switch {
		case errors.Is(err, transport.ErrClosed):
			return ErrFeedClosed
		case errors.Is(err, transport.ErrRefused):
			// Asking again gets the same answer: the session's delegates
			// are told, and the host sees why.
			return fmt.Errorf("runtime: subscribe again: %w", err)
		}
		f.log.Debug("resubscribe failed; retrying", "error", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
			backoff = min(2*backoff, 2*time.Second)
		}
	}
}
