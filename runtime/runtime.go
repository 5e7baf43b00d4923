package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// Named errors.
var (
	// ErrSettled is returned by a Delegate's methods after Settle, and by
	// a Wait pending when it settled.
	ErrSettled = errors.New("runtime: the delegate has settled")
	// ErrClosed is returned after the Runtime is closed.
	ErrClosed = errors.New("runtime: closed")
)

// registerTimeout bounds the pump's registration of a delegate after a
// broker restart: a request whose answer never comes must not hold the
// pump, and every delegate of the session, for good.
const registerTimeout = 30 * time.Second

// DefaultQueue is how many events a delegate's wait queue holds.
const DefaultQueue = 4096

// Config configures a Runtime. The zero value is the default; New
// refuses a config that Validate refuses.
type Config struct {
	// Feed configures the session's event feed.
	Feed FeedConfig
	// Queue is how many events a delegate's wait queue holds; past it,
	// events are dropped and the delegate gets a Resync instead (it
	// re-reads its tasks). 0 means DefaultQueue.
	Queue int
	// Logger receives the runtime's logs. nil discards them.
	Logger *slog.Logger
	// Retry bounds how a change (a send, a reply, an update, a cancel)
	// whose answer was lost is tried again, within CallTimeout. The zero
	// value is DefaultRetry; Retry{Attempts: 1} never tries again.
	Retry Retry
	// CallTimeout bounds each call of a delegate's as a whole (Spawn,
	// Send, Push, Reply, Update, Cancel, Task, Tasks, TasksPage, Peers,
	// Peer, Settle): its waits for a broker that is away and its retries
	// included. A call still unanswered then fails with an error that is
	// transport.ErrUnavailable (a change may or may not have been
	// applied; sent again with its messageId it is applied once) and
	// context.DeadlineExceeded. A ctx that ends sooner ends it sooner;
	// Wait is not bounded. 0 means DefaultCallTimeout.
	CallTimeout time.Duration
}

// DefaultCallTimeout is Config.CallTimeout's default: long enough for a
// broker to restart (a sidecar or a pipe child is back within a second)
// and a change to be retried across it, short enough that a user whose
// broker is gone hears so within seconds, not minutes.
const DefaultCallTimeout = 10 * time.Second

// Validate reports the first setting of cfg that is out of range.
func (cfg Config) Validate() error {
	if cfg.Queue < 0 {
		return fmt.Errorf("runtime: Config.Queue is %d: want 0 (DefaultQueue) or more", cfg.Queue)
	}
	if cfg.CallTimeout < 0 {
		return fmt.Errorf("runtime: Config.CallTimeout is %v: want 0 (DefaultCallTimeout) or more", cfg.CallTimeout)
	}
	if err := cfg.Retry.validate(); err != nil {
		return err
	}
	return cfg.Feed.Validate()
}

// Retry is how often, and how far apart, a change whose answer was lost
// (the broker unreachable: a lost connection, a restart) is tried again.
// Every change carries a messageId, so the broker applies it once
// however often it is tried (docs/PROTOCOL.md §4.11).
type Retry struct {
	// Attempts is how many times a change is tried in all, at least 1 (1:
	// never again).
	Attempts int
	// Backoff is the first wait between two attempts; each wait doubles,
	// up to MaxBackoff. A MaxBackoff of 0 means Backoff: every wait is
	// the same.
	Backoff, MaxBackoff time.Duration
}

func (r Retry) validate() error {
	switch {
	case r == Retry{}:
		return nil // DefaultRetry
	case r.Attempts < 1:
		return fmt.Errorf("runtime: Config.Retry.Attempts is %d: want 1 (no retry) or more", r.Attempts)
	case r.Backoff < 0 || r.MaxBackoff < 0:
		return fmt.Errorf("runtime: Config.Retry's backoff is negative (%v, max %v)", r.Backoff, r.MaxBackoff)
	case r.MaxBackoff != 0 && r.MaxBackoff < r.Backoff:
		return fmt.Errorf("runtime: Config.Retry.MaxBackoff %v is below Backoff %v", r.MaxBackoff, r.Backoff)
	}
	return nil
}

// DefaultRetry tries a change 6 times over about 6 seconds: longer than a
// sidecar takes to restart.
var DefaultRetry = Retry{Attempts: 6, Backoff: 200 * time.Millisecond, MaxBackoff: 2 * time.Second}

// Runtime is one chat session's A2A runtime: what the session's parent
// uses to spawn delegates. The parent itself has no A2A handle: a Runtime
// has no method that sends A2A messages, so a parent cannot address a
// delegate or a peer. Each Delegate is the handle of one delegate.
type Runtime struct {
	cfg  Config
	log  *slog.Logger
	sess transport.Session
	feed *Feed
	// expired is the cause of a call's context whose CallTimeout passed.
	expired error

	ctx    context.Context // canceled by Close; the pump runs under it
	cancel context.CancelFunc
	done   chan struct{} // closed when the pump has stopped

	// naming is held exclusively while a delegate registers (and so may
	// get or change its agentId), and shared while the pump routes an
	// event: an event for a delegate being named waits for the name
	// instead of finding no one.
	naming sync.RWMutex

	mu        sync.Mutex
	closed    bool
	byID      map[string]*Delegate // by current agentId
	delegates map[*Delegate]struct{}
	waiting   int // delegates blocked in Wait
}

// New starts a runtime for the session sess (the session side of a bus).
// The runtime owns sess: Close closes it.
func New(ctx context.Context, sess transport.Session, cfg Config) (*Runtime, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Queue == 0 {
		cfg.Queue = DefaultQueue
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Retry == (Retry{}) {
		cfg.Retry = DefaultRetry
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	r := &Runtime{cfg: cfg, log: cfg.Logger.With("session", sess.ID()), sess: sess, done: make(chan struct{}),
		byID: map[string]*Delegate{}, delegates: map[*Delegate]struct{}{},
		expired: &callTimeout{cfg.CallTimeout}}
	fcfg := cfg.Feed
	if fcfg.Logger == nil {
		fcfg.Logger = r.log
	}
	if fcfg.ShouldCheck == nil {
		fcfg.ShouldCheck = r.anyoneWaiting
	}
	feed, err := NewFeed(ctx, sess, fcfg)
	if err != nil {
		return nil, err
	}
	r.feed = feed
	r.ctx, r.cancel = context.WithCancel(context.Background())
	go r.pump()
	return r, nil
}

// SessionID returns the session's id.
func (r *Runtime) SessionID() string { return r.sess.ID() }

func (r *Runtime) anyoneWaiting() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waiting > 0
}

// pump hands each of the session's events to the wait queue of its
// recipient, and turns a break in the feed into a resync.
func (r *Runtime) pump() {
	defer close(r.done)
	for {
		it, err := r.feed.Next(r.ctx)
		if err != nil {
			if r.ctx.Err() == nil {
				// The session or its client closed: an orderly end, not a
				// fault, unless it was something else.
				if errors.Is(err, ErrFeedClosed) {
					r.log.Debug("the session's feed ended", "error", err)
				} else {
					r.log.Warn("the session's feed ended", "error", err)
				}
				r.failAll(err)
			}
			return
		}
		if it.Gap != nil {
			r.resync(it.Gap)
			continue
		}
		head := it.Event.Head()
		r.naming.RLock()
		r.mu.Lock()
		d := r.byID[head.Recipient]
		r.mu.Unlock()
		if d != nil {
			d.deliver(Event{Task: it.Event.TaskEvent, Push: it.Event.Push}, r.cfg.Queue)
		}
		r.naming.RUnlock()
		if d == nil {
			r.log.Debug("event for no delegate of this session", "recipient", head.Recipient)
		}
	}
}

// resync brings every delegate back in line after a break: on a new epoch
// it registers them again by instance id (the broker lost them), then
// each re-reads its tasks and is told what changed.
func (r *Runtime) resync(gap *Gap) {
	r.log.Info("resyncing the session's delegates", "reason", gap.Reason, "newEpoch", gap.NewEpoch)
	for _, d := range r.live() {
		if gap.NewEpoch {
			// At once, so that peers can address it again; if that fails,
			// or is not answered in time, its next call or Wait does it.
			ctx, cancel := context.WithTimeout(r.ctx, registerTimeout)
			err := d.register(ctx)
			cancel()
			if err != nil {
				r.log.Warn("re-registering a delegate failed; it will retry", "delegate", d.ID(), "error", err)
			}
		}
		d.needResync(gap.Reason)
	}
}

func (r *Runtime) live() []*Delegate {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*Delegate, 0, len(r.delegates))
	for d := range r.delegates {
		out = append(out, d)
	}
	return out
}

func (r *Runtime) failAll(err error) {
	for _, d := range r.live() {
		d.fail(err)
	}
}

// Spawn registers a new delegate from its card. The broker makes the
// name unique on the host (discussant, then discussant-2): the delegate
// adopts the assigned id, which ID and Prompt tell it. A stable instance
// id is made for it.
func (r *Runtime) Spawn(ctx context.Context, card wire.AgentCard) (*Delegate, error) {
	return r.SpawnInstance(ctx, card, uuid.NewString())
}

// SpawnInstance is Spawn with the delegate's instance id given: a delegate
// spawned again with the instance id it had (after a restart of the
// broker or of its host) gets its tasks back.
func (r *Runtime) SpawnInstance(ctx context.Context, card wire.AgentCard, instanceID string) (*Delegate, error) {
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	card.AgentID, card.ContextID, card.RegisteredAt = "", "", nil
	d := &Delegate{r: r, instance: instanceID, asked: card.Name, card: card, seen: map[string]known{}, lost: map[string]uint64{}, wake: make(chan struct{}, 1), dead: make(chan struct{})}
	if err := r.bounded(ctx, func(ctx context.Context) error { return r.admit(ctx, d) }); err != nil {
		return nil, err
	}
	return d, nil
}

// admit registers d and makes it routable in one step (no event for it is
// routed meanwhile). When the runtime closed meanwhile it takes the
// registration back and returns ErrClosed: under the naming lock, which
// close waits for before it settles and closes the session, so the
// session is still there to deregister on (Close settles only the
// delegates it knows).
func (r *Runtime) admit(ctx context.Context, d *Delegate) error {
	r.naming.Lock()
	defer r.naming.Unlock()
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed { // close has passed its barrier: the session may be gone
		return ErrClosed
	}
	if err := d.registerLocked(ctx); err != nil {
		return err
	}
	r.mu.Lock()
	closed = r.closed
	if !closed {
		r.delegates[d] = struct{}{}
		r.byID[d.ID()] = d
	}
	r.mu.Unlock()
	if closed {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
		defer cancel()
		_ = d.Settle(sctx) // best effort: the broker's orphan handling covers a failure
		return ErrClosed
	}
	return nil
}

// rename moves a delegate's routing entry to its new agentId.
func (r *Runtime) rename(d *Delegate, oldID, newID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byID[oldID] == d {
		delete(r.byID, oldID)
	}
	if _, live := r.delegates[d]; live {
		r.byID[newID] = d
	}
}

func (r *Runtime) forget(d *Delegate) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.delegates, d)
	if r.byID[d.ID()] == d {
		delete(r.byID, d.ID())
	}
}

// Delegates returns the live delegates.
func (r *Runtime) Delegates() []*Delegate { return r.live() }

// Close settles every live delegate (deregistering it), stops the event
// pump and closes the session. Idempotent.
func (r *Runtime) Close() error { return r.close(true) }

// Leave closes the runtime like Close, but leaves its delegates
// registered: their tasks stay open, and spawning the same instance ids
// again (SpawnInstance) takes them back. For a host that stops and comes
// back, such as the A2A gateway across a broker restart. Idempotent, and
// once closed by either, the other does nothing.
func (r *Runtime) Leave() error { return r.close(false) }

func (r *Runtime) close(settle bool) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.mu.Unlock()
	// A delegate registering now sees the runtime closed and takes its
	// registration back, while the session is still open.
	r.naming.Lock()
	//lint:ignore SA2001 a barrier: it waits for the admits in flight
	r.naming.Unlock()
	if settle {
		ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
		defer cancel()
		for _, d := range r.live() {
			if err := d.Settle(ctx); err != nil && !errors.Is(err, ErrSettled) {
				r.log.Debug("settling a delegate at close failed", "delegate", d.ID(), "error", err)
			}
		}
	}
	r.cancel()
	<-r.done
	r.feed.Close()
	r.failAll(ErrClosed)
	return r.sess.Close()
}

// callTimeout is the error of a call whose CallTimeout passed: the broker
// is unavailable, and the call's deadline exceeded.
type callTimeout struct{ d time.Duration }

func (e *callTimeout) Error() string {
	return fmt.Sprintf("%v: no answer within %v (runtime.Config.CallTimeout)", transport.ErrUnavailable, e.d)
}

func (e *callTimeout) Unwrap() []error {
	return []error{transport.ErrUnavailable, context.DeadlineExceeded}
}

// bounded runs one call of a caller's within CallTimeout, its waits and
// retries included: past it, the call fails with transport.ErrUnavailable
// (and context.DeadlineExceeded). ctx ending sooner ends it sooner.
func (r *Runtime) bounded(ctx context.Context, call func(ctx context.Context) error) error {
	cctx, cancel := context.WithTimeoutCause(ctx, r.cfg.CallTimeout, r.expired)
	defer cancel()
	err := call(cctx)
	if err != nil && ctx.Err() == nil && context.Cause(cctx) == r.expired && !errors.Is(err, r.expired) &&
		(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, transport.ErrUnavailable)) {
		// The deadline passed during an attempt or a wait for the broker.
		return fmt.Errorf("%w: %w", r.expired, err)
	}
	return err
}

// retry runs a change until it is answered, or fails for another reason
// than a lost answer, or its attempts are spent. A change retried must
// carry its idempotency key, so that it is applied once.
func (r *Runtime) retry(ctx context.Context, change func() error) error {
	wait := r.cfg.Retry.Backoff
	for attempt := 1; ; attempt++ {
		err := change()
		if !errors.Is(err, transport.ErrUnavailable) || attempt >= r.cfg.Retry.Attempts {
			return err
		}
		r.log.Debug("answer lost; trying again", "attempt", attempt, "error", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-r.ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, max(r.cfg.Retry.MaxBackoff, r.cfg.Retry.Backoff)) // MaxBackoff 0: Backoff
	}
}

// call sends a request on the session.
func (r *Runtime) call(ctx context.Context, method string, params, result any) error {
	raw, err := r.sess.Call(ctx, method, params)
	if err != nil {
		return err
	}
	if result == nil {
		return nil
	}
	if err := wire.Unmarshal(raw, result); err != nil {
		return fmt.Errorf("runtime: bad %s result: %w", method, err)
	}
	return nil
}
