package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// link is one connection to one broker: a client, and a channel closed
// when that broker is gone (its process died, its connection dropped).
type link struct {
	client transport.Client
	gone   <-chan struct{}
	// kill ends a broker that is alive but does not answer, before its
	// client is closed (a pipe child: SIGKILL, which ends a stopped
	// process too, where closing its stdin would wait ChildGrace for
	// nothing). nil: closing the client is all there is to it (a joined
	// sidecar is not ours to kill).
	kill func()
	pid  int // the broker's process
	desc string
}

// dialer makes a link to the broker as it is now: it reads the connection
// file again, or starts the pipe child again. An error means "not yet".
type dialer func(ctx context.Context) (*link, error)

// Rejoin backoff: the first retry comes quickly (a restarted broker is
// usually ready within tens of milliseconds), later ones every
// rejoinMaxWait at most.
const (
	rejoinFirstWait = 50 * time.Millisecond
	rejoinMaxWait   = time.Second
	// rejoinSteady is how long a link must last for the backoff to start
	// over: a broker that dies young (a child that cannot start) is
	// dialed less and less often, not hundreds of times a second.
	rejoinSteady = 5 * time.Second
)

// liveness says how the rejoiner checks that its broker answers: a broker
// can be alive and stuck (stopped with SIGSTOP, deadlocked, writing
// garbage), and then its link is never gone.
type liveness struct {
	// timeout is a health call's deadline: a broker that does not answer
	// within it is taken for dead. <= 0: no checks.
	timeout time.Duration
	// every is how long the link may be idle between checks; 0 means
	// healthEvery.
	every time.Duration
	// now is the clock a check judges lateness by; nil means time.Now.
	now func() time.Time
}

// healthEvery is how often a host asks its broker whether it answers
// when no call stalls: one small call (a2a.admin.info reads two counters)
// every 10 s costs next to nothing, and a broker that got stuck while
// nobody called is found before most users would call again. A variable
// only so that a test's host process can check sooner.
var healthEvery = 10 * time.Second

// healthTries bounds the health calls of one check that the host itself
// cut short by not running (see check): a broker is judged even if this
// process keeps being stopped.
const healthTries = 3

// rejoiner is a transport.Client over a broker that may die and come back:
// when the current link is gone it dials a new one, with backoff, for as
// long as it is open. A broker that is alive but does not answer a health
// call within its deadline (asked when a call has waited that long, and
// every live.every) is treated as gone: it is killed if it is ours, its
// link closed, and another dialed. Its sessions outlive links: a call
// made while no link is up waits for one (bounded by its context), a
// subscription ends with its link (the runtime subscribes again, and
// replays or resyncs), and the session's side on the new link is opened
// on first use.
type rejoiner struct {
	dial dialer
	log  *slog.Logger
	live liveness

	// stalled wakes the supervisor to check the broker: a call has waited
	// live.timeout without an answer. One pending wake is enough.
	stalled chan struct{}

	ctx    context.Context // canceled by Close: the supervisor stops
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	cur   *link         // nil while down
	up    chan struct{} // closed when cur is set; replaced when it goes
	gen   uint64        // counts links
	joins int           // links made after the first
}

var (
	_ transport.Client     = (*rejoiner)(nil)
	_ transport.HostCaller = (*rejoiner)(nil)
)

// newRejoiner dials the first link (which must succeed: a host that
// cannot reach its broker at all fails to open) and starts supervising.
func newRejoiner(ctx context.Context, dial dialer, log *slog.Logger, live liveness) (*rejoiner, error) {
	first, err := dial(ctx)
	if err != nil {
		return nil, err
	}
	if live.every <= 0 {
		live.every = healthEvery
	}
	if live.now == nil {
		live.now = time.Now
	}
	r := &rejoiner{dial: dial, log: log, live: live, stalled: make(chan struct{}, 1),
		cur: first, up: make(chan struct{}), gen: 1}
	close(r.up)
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.wg.Go(r.supervise)
	return r, nil
}

// supervise replaces each link that goes, or stops answering, until
// Close.
func (r *rejoiner) supervise() {
	wait := time.Duration(0) // before the next dial
	for {
		r.mu.Lock()
		cur := r.cur
		r.mu.Unlock()
		since := time.Now()
		dead, open := r.watch(cur)
		if !open {
			return
		}
		if time.Since(since) >= rejoinSteady {
			wait = 0
		}
		// New calls wait for the next link from here on; those on this
		// one fail (ErrUnavailable) as it closes.
		r.mu.Lock()
		r.cur, r.up = nil, make(chan struct{})
		r.mu.Unlock()
		if dead && cur.kill != nil {
			cur.kill()
		}
		cur.client.Close()
		next, waited := r.redial(wait)
		if next == nil {
			return // closed meanwhile
		}
		wait = waited
		r.mu.Lock()
		r.cur = next
		r.gen++
		r.joins++
		close(r.up)
		r.mu.Unlock()
		r.log.Info("rejoined the broker", "broker", next.desc)
	}
}

// watch returns once cur is gone (dead false) or its broker did not
// answer a health call (dead true), having logged which; open is false
// when the rejoiner closed first. It checks the broker when a call
// stalls, and every live.every while none does.
func (r *rejoiner) watch(cur *link) (dead, open bool) {
	var idle *time.Timer
	var tick <-chan time.Time
	if r.live.timeout > 0 {
		idle = time.NewTimer(r.live.every)
		defer idle.Stop()
		tick = idle.C
	}
	for {
		select {
		case <-r.ctx.Done():
			return false, false
		case <-cur.gone:
			r.log.Warn("the broker is gone; rejoining", "was", cur.desc)
			return false, true
		case <-tick:
		case <-r.stalled:
		}
		err := r.check(cur)
		switch {
		case r.ctx.Err() != nil:
			return false, false
		case err != nil:
			select {
			case <-cur.gone:
				// It went during the check: an exit, not a stall.
				r.log.Warn("the broker is gone; rejoining", "was", cur.desc)
				return false, true
			default:
			}
			r.log.Warn("the broker does not answer; taking it for dead and rejoining",
				"broker", cur.desc, "timeout", r.live.timeout, "error", err)
			return true, true
		}
		// The check answered every call that stalled before it.
		select {
		case <-r.stalled:
		default:
		}
		if idle != nil {
			idle.Reset(r.live.every)
		}
	}
}

// check asks cur's broker a health call (a2a.admin.info, which every
// broker answers, and answers from memory), and returns why it got no
// answer, nil if it got one (an error answer is an answer too).
//
// A deadline that passed while this process itself was not running (a
// host stopped by SIGSTOP, a laptop lid, a debugger, or starved) says
// nothing of the broker: its answer may be waiting unread, and at the
// continue every late timer fires at once. Such a call is made again,
// with a fresh deadline, before the broker is judged.
func (r *rejoiner) check(cur *link) error {
	hc, ok := cur.client.(transport.HostCaller)
	if !ok {
		return nil // nothing to ask with: exit is all it can tell
	}
	for try := 1; ; try++ {
		start := r.live.now()
		ctx, cancel := context.WithTimeout(r.ctx, r.live.timeout)
		_, err := hc.CallHost(ctx, wire.MethodAdminInfo, nil)
		cancel()
		if err == nil || !unanswered(err) {
			return nil
		}
		if errors.Is(err, context.DeadlineExceeded) {
			took := r.live.now().Sub(start)
			if took > r.live.timeout+lateBy(r.live.timeout) && try < healthTries {
				r.log.Debug("a health call's deadline passed while this process was not running; asking again",
					"took", took, "timeout", r.live.timeout)
				continue
			}
			return fmt.Errorf("no answer in %v", took.Round(time.Millisecond))
		}
		return err
	}
}

// unanswered reports whether a call's error means the broker did not
// answer: a deadline, a link that failed or closed. Any other error is
// the broker's answer.
func unanswered(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, transport.ErrUnavailable) ||
		errors.Is(err, transport.ErrClosed)
}

// lateBy is how much later than its deadline a health call may end for
// its timer to count as on time: more says the process was not running
// when it was due. Timers of a busy process run a little late; a
// generous margin only makes the host ask once more.
func lateBy(timeout time.Duration) time.Duration {
	return max(timeout/10, 100*time.Millisecond)
}

// watchCall arms the stall trigger for one call on the current link:
// should it wait live.timeout without an answer, the supervisor checks
// the broker. Call the returned func when the call returns.
func (r *rejoiner) watchCall() (disarm func() bool) {
	if r.live.timeout <= 0 {
		return func() bool { return false }
	}
	return time.AfterFunc(r.live.timeout, r.kick).Stop
}

// kick wakes the supervisor to check the broker; it never waits.
func (r *rejoiner) kick() {
	select {
	case r.stalled <- struct{}{}:
	default:
	}
}

// redial dials until it has a link or the rejoiner closes (nil), first
// after wait (0: at once), then backing off. It returns the wait due
// before the dial after this link's, should it die young too.
func (r *rejoiner) redial(wait time.Duration) (*link, time.Duration) {
	for {
		if wait > 0 {
			select {
			case <-r.ctx.Done():
				return nil, 0
			case <-time.After(wait):
			}
		}
		next := min(max(2*wait, rejoinFirstWait), rejoinMaxWait)
		l, err := r.dial(r.ctx)
		if err == nil {
			return l, next
		}
		if r.ctx.Err() != nil {
			return nil, 0
		}
		r.log.Debug("rejoining failed; retrying", "error", err, "in", next)
		wait = next
	}
}

// current waits until a link is up, and returns it with its number.
func (r *rejoiner) current(ctx context.Context) (*link, uint64, error) {
	for {
		r.mu.Lock()
		cur, up, gen := r.cur, r.up, r.gen
		r.mu.Unlock()
		if r.ctx.Err() != nil {
			return nil, 0, transport.ErrClosed
		}
		if cur != nil {
			return cur, gen, nil
		}
		select {
		case <-up:
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-r.ctx.Done():
			return nil, 0, transport.ErrClosed
		}
	}
}

// describe says which broker the current link reaches.
func (r *rejoiner) describe() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == nil {
		return "rejoining the broker"
	}
	return r.cur.desc
}

// pid returns the current broker's process id, 0 while down.
func (r *rejoiner) pid() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == nil {
		return 0
	}
	return r.cur.pid
}

// rejoins counts the links made after the first: how often the broker was
// lost and found again.
func (r *rejoiner) rejoins() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.joins
}

// onLink runs fn with the current link's client, waiting for one. A
// client closed under fn (the link went: ErrClosed while the rejoiner is
// open) is no answer: fn runs again on the next link. Only what fn does
// before it sends anything may be retried so (opening a session).
func (r *rejoiner) onLink(ctx context.Context, fn func(c transport.Client, gen uint64) error) error {
	for {
		cur, gen, err := r.current(ctx)
		if err != nil {
			return err
		}
		err = fn(cur.client, gen)
		if !errors.Is(err, transport.ErrClosed) || r.ctx.Err() != nil {
			return err
		}
		r.mu.Lock()
		same := r.gen == gen && r.cur != nil
		r.mu.Unlock()
		if same {
			return err // closed, yet the link is current: not the link's going
		}
	}
}

// Session implements transport.Client.
func (r *rejoiner) Session(ctx context.Context, id string) (transport.Session, error) {
	s := &rejoinSession{r: r, id: id}
	err := r.onLink(ctx, func(c transport.Client, gen uint64) error {
		inner, err := c.Session(ctx, id)
		s.gen, s.inner = gen, inner
		return err
	})
	if err != nil {
		return nil, err
	}
	s.ctx, s.cancel = context.WithCancel(r.ctx)
	return s, nil
}

// CallHost implements transport.HostCaller. A call cut short by the
// link's going fails (it may have been applied).
func (r *rejoiner) CallHost(ctx context.Context, method string, params any) (json.RawMessage, error) {
	cur, _, err := r.current(ctx)
	if err != nil {
		return nil, err
	}
	hc, ok := cur.client.(transport.HostCaller)
	if !ok {
		return nil, fmt.Errorf("%w: this broker takes no host calls", transport.ErrUnavailable)
	}
	defer r.watchCall()()
	res, err := hc.CallHost(ctx, method, params)
	if errors.Is(err, transport.ErrClosed) && r.ctx.Err() == nil {
		err = fmt.Errorf("%w: the broker went away during the call", transport.ErrUnavailable)
	}
	return res, err
}

// Close implements transport.Client: it stops rejoining and closes the
// current link. Idempotent.
func (r *rejoiner) Close() error {
	r.cancel()
	r.wg.Wait()
	r.mu.Lock()
	cur := r.cur
	r.cur = nil
	r.mu.Unlock()
	if cur != nil {
		return cur.client.Close()
	}
	return nil
}

// rejoinSession is a session that follows the rejoiner's links.
type rejoinSession struct {
	r      *rejoiner
	id     string
	ctx    context.Context // canceled by Close
	cancel context.CancelFunc

	mu    sync.Mutex
	gen   uint64 // the link inner is on
	inner transport.Session
}

func (s *rejoinSession) ID() string { return s.id }

// side returns the session's side on the current link, waiting for one.
func (s *rejoinSession) side(ctx context.Context) (transport.Session, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	var side transport.Session
	err := s.r.onLink(ctx, func(c transport.Client, gen uint64) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.ctx.Err() != nil {
			return nil
		}
		if s.gen == gen && s.inner != nil {
			side = s.inner
			return nil
		}
		inner, err := c.Session(ctx, s.id)
		if err != nil {
			return err
		}
		if s.inner != nil {
			s.inner.Close()
		}
		s.gen, s.inner, side = gen, inner, inner
		return nil
	})
	switch {
	case s.ctx.Err() != nil:
		return nil, transport.ErrClosed
	case err != nil:
		return nil, err
	}
	return side, nil
}

// Call implements transport.Session. A call made while the broker is
// gone waits for it to come back; one cut short by its going fails (it
// may have been applied), and the caller decides what to do.
func (s *rejoinSession) Call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	inner, err := s.side(ctx)
	if err != nil {
		return nil, err
	}
	defer s.r.watchCall()()
	res, err := inner.Call(ctx, method, params)
	if errors.Is(err, transport.ErrClosed) && s.ctx.Err() == nil {
		// The link closed under the call, not this session.
		err = fmt.Errorf("%w: the broker went away during the call", transport.ErrUnavailable)
	}
	return res, err
}

// Subscribe implements transport.Session: a subscription on the current
// link, which ends with it.
func (s *rejoinSession) Subscribe(ctx context.Context) (transport.Subscription, error) {
	inner, err := s.side(ctx)
	if err != nil {
		return nil, err
	}
	sub, err := inner.Subscribe(ctx)
	if errors.Is(err, transport.ErrClosed) && s.ctx.Err() == nil {
		err = fmt.Errorf("%w: the broker went away", transport.ErrUnavailable)
	}
	return sub, err
}

// Close implements transport.Session. Idempotent.
func (s *rejoinSession) Close() error {
	s.cancel()
	s.mu.Lock()
	inner := s.inner
	s.inner = nil
	s.mu.Unlock()
	if inner != nil {
		return inner.Close()
	}
	return nil
}
