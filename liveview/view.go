package liveview

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-bus/a2a-bus/natsbus"
)

// Defaults of Config's zero fields.
const (
	// DefaultMaxViewers bounds the pages that follow the stream at once:
	// a handful of tabs on one desktop, with room to spare.
	DefaultMaxViewers = 16
	// DefaultBuffer is how many lines wait for one viewer: a burst of a
	// few hundred events passes; a page that stops reading is cut soon.
	DefaultBuffer = 256
	// DefaultTimeline is how many timeline entries the view keeps.
	DefaultTimeline = 500
	// DefaultWriteTimeout bounds each write to a viewer: a page whose
	// connection takes nothing for that long is cut.
	DefaultWriteTimeout = 10 * time.Second
	// DefaultCallTimeout bounds each admin call of a snapshot.
	DefaultCallTimeout = 5 * time.Second
)

// Config configures a View. The zero value of each field but Token is its
// default.
type Config struct {
	// Token is the bearer token every data endpoint requires: a fresh
	// random one per start (serve makes 32 bytes, hex). Required.
	Token string
	// AllowRemote accepts any Host header. Without it a request must
	// name a loopback address or localhost, so that a page of another
	// site cannot reach the view through a name it makes resolve to
	// 127.0.0.1 (DNS rebinding).
	AllowRemote bool
	// MaxViewers bounds the event streams open at once; one more is
	// answered 503. 0 means DefaultMaxViewers.
	MaxViewers int
	// Buffer is how many lines may wait for one viewer; a viewer further
	// behind is cut (its page reconnects and is sent the timeline
	// again). 0 means DefaultBuffer.
	Buffer int
	// Timeline is how many entries the view keeps, the newest. 0 means
	// DefaultTimeline.
	Timeline int
	// WriteTimeout bounds each write to a viewer. 0 means
	// DefaultWriteTimeout.
	WriteTimeout time.Duration
	// CallTimeout bounds each admin call. 0 means DefaultCallTimeout.
	CallTimeout time.Duration
	// Logger receives the view's logs. nil discards them.
	Logger *slog.Logger
}

// ErrBadConfig is returned by New for a Config it cannot run with.
var ErrBadConfig = errors.New("liveview: bad config")

// ErrClosed is returned for a request that came after Close.
var ErrClosed = errors.New("liveview: closed")

// errFull is the answer to one viewer too many.
var errFull = errors.New("liveview: too many viewers")

func (c *Config) defaults() error {
	if c.Token == "" {
		return fmt.Errorf("%w: no Token", ErrBadConfig)
	}
	if c.MaxViewers < 0 || c.Buffer < 0 || c.Timeline < 0 || c.WriteTimeout < 0 || c.CallTimeout < 0 {
		return fmt.Errorf("%w: a negative bound", ErrBadConfig)
	}
	if c.MaxViewers == 0 {
		c.MaxViewers = DefaultMaxViewers
	}
	if c.Buffer == 0 {
		c.Buffer = DefaultBuffer
	}
	if c.Timeline == 0 {
		c.Timeline = DefaultTimeline
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// View is the live view of one broker, read through one host
// connection. Its Handler serves the page and the data.
type View struct {
	cfg Config
	c   *natsbus.Client
	log *slog.Logger

	// ctx is canceled by Close: it ends the streams and the calls.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	closed  bool
	viewers map[*viewer]struct{}
	// sub brings every session's notifications while viewers follow;
	// stop ends the goroutine that reads it. Both nil while no one does.
	sub  *nats.Subscription
	stop chan struct{}
	// unwatched is when the last subscription ended (zero before the
	// first): the next one notes the gap in the timeline.
	unwatched time.Time
	// readers are the goroutines that read sub, one at a time (a new
	// one may start while the last one ends).
	readers sync.WaitGroup
	tl      timeline
	// watched is closed when the first viewer joins.
	watched     chan struct{}
	watchedOnce sync.Once

	snap *snapshots
}

// New returns the view of the broker that c, a host credential's client,
// reaches. The view does not own c: close c after the view.
func New(c *natsbus.Client, cfg Config) (*View, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: no client", ErrBadConfig)
	}
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	v := &View{cfg: cfg, c: c, log: cfg.Logger, viewers: map[*viewer]struct{}{},
		tl: newTimeline(cfg.Timeline), watched: make(chan struct{}), snap: newSnapshots()}
	v.ctx, v.cancel = context.WithCancel(context.Background())
	return v, nil
}

// Viewers returns how many pages follow the stream now.
func (v *View) Viewers() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.viewers)
}

// Watched is closed when the first page starts following the stream.
func (v *View) Watched() <-chan struct{} { return v.watched }

// Close ends every stream and the subscription, and waits for the
// goroutine that read it. The handlers it served return; the HTTP server
// is the caller's to shut down. Idempotent.
func (v *View) Close() error {
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return nil
	}
	v.closed = true
	for vw := range v.viewers {
		v.cutLocked(vw)
	}
	v.unsubscribeLocked()
	v.mu.Unlock()
	v.cancel()
	v.readers.Wait()
	return nil
}

// join adds a viewer, subscribing to the notifications if it is the
// first, and returns it with the timeline as it stands.
func (v *View) join(cut func()) (*viewer, []byte, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return nil, nil, ErrClosed
	}
	if len(v.viewers) >= v.cfg.MaxViewers {
		return nil, nil, errFull
	}
	if v.sub == nil {
		if err := v.subscribeLocked(); err != nil {
			return nil, nil, err
		}
	}
	vw := &viewer{lines: make(chan []byte, v.cfg.Buffer), hint: make(chan struct{}, 1), cut: make(chan struct{}), abort: cut}
	v.viewers[vw] = struct{}{}
	v.watchedOnce.Do(func() { close(v.watched) })
	return vw, v.tl.resetLine(), nil
}

// leave removes a viewer; the last one to leave ends the subscription.
func (v *View) leave(vw *viewer) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.viewers[vw]; !ok {
		return // cut already
	}
	delete(v.viewers, vw)
	if len(v.viewers) == 0 {
		v.unsubscribeLocked()
	}
}

// cutLocked drops a viewer that fell behind (or all, at Close): its
// handler returns at once, a write under way included.
func (v *View) cutLocked(vw *viewer) {
	delete(v.viewers, vw)
	close(vw.cut)
	vw.abort()
	if len(v.viewers) == 0 {
		v.unsubscribeLocked()
	}
}

// subscribeLocked subscribes to every session's notifications and starts
// the goroutine that reads them. The subscription is made only while a
// page follows: it counts as a subscriber of every session (as a2a-bus
// watch does), which keeps their notifications from being dropped as
// idle.
func (v *View) subscribeLocked() error {
	msgs := make(chan *nats.Msg, 1<<14)
	sub, err := v.c.Conn().ChanSubscribe("a2a.session.*.events", msgs)
	if err != nil {
		return fmt.Errorf("liveview: subscribe: %w", err)
	}
	if err := v.c.Conn().FlushTimeout(v.cfg.CallTimeout); err != nil {
		sub.Unsubscribe()
		return fmt.Errorf("liveview: subscribe: %w", err)
	}
	stop := make(chan struct{})
	v.sub, v.stop = sub, stop
	if !v.unwatched.IsZero() {
		v.tl.addGap(v.unwatched)
	}
	v.readers.Add(1)
	go v.read(msgs, stop)
	return nil
}

// unsubscribeLocked ends the subscription and its reader (which may be
// the caller: it returns at its next turn).
func (v *View) unsubscribeLocked() {
	if v.sub == nil {
		return
	}
	v.sub.Unsubscribe()
	close(v.stop)
	v.sub, v.stop, v.unwatched = nil, nil, time.Now()
}

// read takes the notifications until stop.
func (v *View) read(msgs <-chan *nats.Msg, stop <-chan struct{}) {
	defer v.readers.Done()
	for {
		select {
		case m := <-msgs:
			v.ingest(m.Data)
		case <-stop:
			return
		}
	}
}

// ingest adds a notification to the timeline, once, and hands it to
// every viewer without waiting for any: one that has no room is cut.
func (v *View) ingest(raw []byte) {
	e, ok := entryOf(raw)
	if !ok {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	line, fresh := v.tl.add(e)
	if !fresh {
		return
	}
	v.snap.changes.Add(1)
	for vw := range v.viewers {
		select {
		case vw.lines <- line:
		default:
			v.log.Info("live view: a page fell behind; it is cut and starts over", "behind", cap(vw.lines))
			v.cutLocked(vw)
			continue
		}
		select {
		case vw.hint <- struct{}{}:
		default: // one hint waits already
		}
	}
}

// viewer is one page following the stream.
type viewer struct {
	lines chan []byte
	// hint holds a "changed" line to send, at most one.
	hint chan struct{}
	// cut is closed when the view drops the viewer; abort makes the
	// write under way, if any, fail at once.
	cut   chan struct{}
	abort func()
}
