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
)

// link is one connection to one broker: a client, and a channel closed
// when that broker is gone (its process died, its connection dropped).
type link struct {
	client transport.Client
	gone   <-chan struct{}
	pid    int // the broker's process
	desc   string
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

// rejoiner is a transport.Client over a broker that may die and come back:
// when the current link is gone it dials a new one, with backoff, for as
// long as it is open. Its sessions outlive links: a call made while no
// link is up waits for one (bounded by its context), a subscription ends
// with its link (the runtime subscribes again, and replays or resyncs),
// and the session's side on the new link is opened on first use.
type rejoiner struct {
	dial dialer
	log  *slog.Logger

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
func newRejoiner(ctx context.Context, dial dialer, log *slog.Logger) (*rejoiner, error) {
	first, err := dial(ctx)
	if err != nil {
		return nil, err
	}
	r := &rejoiner{dial: dial, log: log, cur: first, up: make(chan struct{}), gen: 1}
	close(r.up)
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.wg.Go(r.supervise)
	return r, nil
}

// supervise replaces each link that goes, until Close.
func (r *rejoiner) supervise() {
	wait := time.Duration(0) // before the next dial
	for {
		r.mu.Lock()
		cur := r.cur
		r.mu.Unlock()
		since := time.Now()
		select {
		case <-r.ctx.Done():
			return
		case <-cur.gone:
		}
		if time.Since(since) >= rejoinSteady {
			wait = 0
		}
		r.mu.Lock()
		r.cur, r.up = nil, make(chan struct{})
		r.mu.Unlock()
		cur.client.Close()
		r.log.Warn("the broker is gone; rejoining", "was", cur.desc)
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
