package admission

import (
	"cmp"
	"fmt"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Conn is a session connection as the server last reported it.
type Conn struct {
	ID      uint64
	Session string
	// Pending is the bytes waiting to be written to it.
	Pending int
	// Out is the bytes delivered to it, those waiting included.
	Out int64
}

// Server is what a Watchdog watches: the server's session connections.
type Server interface {
	// SessionConns returns the session connections. It is called only
	// while something was published or waits.
	SessionConns() []Conn
	// Cut closes a connection the watchdog chose, which had
	// c.Pending bytes waiting.
	Cut(c Conn)
}

// WatchConfig are a Watchdog's bounds on the bytes waiting to be written
// to session connections, and what it does about memory.
type WatchConfig struct {
	// Conn, Session and All bound what waits for one connection, for one
	// session's, and for all of them (see chooseCuts). All must be
	// positive.
	Conn, Session, All int
	// HoldFor is how long the bytes of a connection that was cut still
	// count as waiting: the server lets go of them only when its last
	// write to it gives up.
	HoldFor time.Duration
	// ReturnMemory gives the memory back to the operating system at
	// once (debug.FreeOSMemory, which stops the whole process for a
	// moment) when an episode of backlog or cuts is over. Off: the
	// runtime returns it at its own pace, once collected.
	ReturnMemory bool
}

// How the watchdog paces its looks, and tells a connection that stopped
// reading.
const (
	// watchEvery is the wait between two looks while anything was
	// published or waits.
	watchEvery = 100 * time.Millisecond
	// kickEvery is how many published bytes make the watchdog look
	// before its tick, and kickSize how large one publish must be to make
	// it look by itself: a burst of large notifications is looked at as
	// it lands, not a tick later.
	kickEvery = 1 << 20
	kickSize  = 64 << 10
	// stallAfter: a session connection with at least stallBytes waiting,
	// of which the server could write none for this long, has stopped
	// reading. One that reads takes what waits at loopback speed, and a
	// few notifications fit in its socket; one that holds less than
	// stallBytes is left to the other bounds.
	stallAfter = 100 * time.Millisecond
	stallBytes = 64 << 10
	// quietFor is how long an episode (cuts, a backlog, a burst as large
	// as the All bound) must have been over before the watchdog lets its
	// memory go.
	quietFor = time.Second
)

// Watchdog closes the session connections that stopped reading, so that
// what waits to be written to them stays within its bounds (see
// chooseCuts), counting what cut ones still hold for HoldFor. It also
// keeps the heap near what is live while a backlog is held (see collect),
// and collects once an episode is over so that the memory can go back to
// the system.
//
// It does nothing while nothing is published: it is woken by Published,
// looks a tick (watchEvery) later, or at once after a large publish, and
// keeps looking every tick only while bytes wait, cut connections hold
// some, or an episode is not over. Then it waits for the next publish,
// with no timer running.
type Watchdog struct {
	srv Server
	cfg WatchConfig

	signal chan struct{} // wakes the loop: a publish while idle, or a large one
	stop   chan struct{}
	sent   atomic.Int64 // bytes published since the last look
	urgent atomic.Bool  // look at once: much was published
	armed  atomic.Bool  // the loop's tick runs: a small publish need not wake it

	// collecting is set while a collection the watchdog started runs.
	collecting atomic.Bool
	looks      atomic.Int64 // calls of SessionConns
	wakes      atomic.Int64 // the loop's wake-ups
	// gc and freeOS are runtime.GC and debug.FreeOSMemory (tests count them).
	gc, freeOS func()

	wg        sync.WaitGroup
	closeOnce sync.Once
}

// Validate reports a bound that is not positive or a negative HoldFor.
func (cfg WatchConfig) Validate() error {
	if cfg.Conn <= 0 || cfg.Session <= 0 || cfg.All <= 0 {
		return fmt.Errorf("admission: WatchConfig bounds %d, %d and %d: each must be positive", cfg.Conn, cfg.Session, cfg.All)
	}
	if cfg.HoldFor < 0 {
		return fmt.Errorf("admission: WatchConfig.HoldFor is %v: want 0 or more", cfg.HoldFor)
	}
	return nil
}

// StartWatchdog starts watching srv. Close stops it. It panics on a
// config that Validate refuses: the caller validated its own first.
func StartWatchdog(srv Server, cfg WatchConfig) *Watchdog {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	w := newWatchdog(srv, cfg)
	w.wg.Go(w.run)
	return w
}

func newWatchdog(srv Server, cfg WatchConfig) *Watchdog {
	return &Watchdog{srv: srv, cfg: cfg, signal: make(chan struct{}, 1), stop: make(chan struct{}), gc: runtime.GC, freeOS: debug.FreeOSMemory}
}

// Published tells the watchdog that n bytes were published to session
// connections (notifications, replies).
func (w *Watchdog) Published(n int) {
	if w.sent.Add(int64(n)) >= kickEvery || n >= kickSize {
		w.urgent.Store(true)
		w.wake()
	} else if !w.armed.Load() {
		w.wake()
	}
}

func (w *Watchdog) wake() {
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// Looks returns how many times the watchdog has looked at the
// connections.
func (w *Watchdog) Looks() int64 { return w.looks.Load() }

// Idle reports whether the watchdog waits for a publish, with no timer.
func (w *Watchdog) Idle() bool { return !w.armed.Load() }

// Close stops the watchdog and waits for it. Idempotent.
func (w *Watchdog) Close() {
	w.closeOnce.Do(func() { close(w.stop) })
	w.wg.Wait()
}

// watchState is what the loop remembers from one look to the next.
type watchState struct {
	conns   map[uint64]*watchedConn // the session connections, by id
	held    map[uint64]heldBytes    // cut connections whose bytes the server may still hold
	waiting int                     // bytes waiting for the session connections, at the last look
	busy    time.Time               // when it last saw a cut, a backlog or a burst
	burst   int64                   // bytes published since it last let memory go
}

func (w *Watchdog) run() {
	st := &watchState{conns: map[uint64]*watchedConn{}, held: map[uint64]heldBytes{}}
	tick := time.NewTimer(watchEvery)
	tick.Stop()
	defer tick.Stop()
	armed := false
	for {
		select {
		case <-w.stop:
			return
		case <-tick.C:
		case <-w.signal:
			if !w.urgent.Swap(false) {
				// A publish while idle: look a tick later. (None left to
				// look at: a look since has taken it.)
				if !armed && w.sent.Load() > 0 {
					armed = true
					w.armed.Store(true)
					tick.Reset(watchEvery)
				}
				continue
			}
		}
		w.wakes.Add(1)
		armed = w.step(st, time.Now())
		w.armed.Store(armed)
		if !armed && w.sent.Load() > 0 {
			// A publish that did not wake the loop because it was
			// armed: Published adds to sent before it reads armed.
			armed = true
			w.armed.Store(true)
		}
		if armed {
			tick.Reset(watchEvery)
		} else {
			tick.Stop()
		}
	}
}

// step is one look at now. It reports whether the next tick is due:
// something waits, is held, or an episode is not over.
func (w *Watchdog) step(st *watchState, now time.Time) bool {
	sent := w.sent.Swap(0)
	st.burst += sent
	st.expire(now)
	if sent > 0 || st.waiting > 0 {
		cuts, waiting := w.look(st, now)
		st.waiting = waiting
		if cuts > 0 || (sent > 0 && st.burst >= int64(w.cfg.All)) {
			st.busy = now
		}
	}
	held := st.heldBytes()
	if held > 0 || st.waiting >= kickEvery {
		st.busy = now
		if slack := w.cfg.All / 8; held+st.waiting >= slack {
			w.collect(uint64(slack))
		}
	}
	if !st.busy.IsZero() && now.Sub(st.busy) >= quietFor {
		// What the cut connections and the burst held is garbage now:
		// collected at once rather than when the runtime gets round to
		// it, so that the runtime can give it back to the system.
		st.busy, st.burst = time.Time{}, 0
		w.gc()
		if w.cfg.ReturnMemory {
			w.freeOS()
		}
	}
	return st.waiting > 0 || held > 0 || !st.busy.IsZero()
}

// collect starts a collection if the heap has grown by slack over what
// was live after the last one, and none is under way. While stalled
// connections hold a backlog, or cut ones their bytes, those bytes are
// live, and the collector's own pace (GOGC=100) would let the heap grow
// to twice them before it collects: the bound on what waits would hold
// for what is live, not for the process.
func (w *Watchdog) collect(slack uint64) {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 || sample[1].Value.Kind() != metrics.KindUint64 ||
		sample[1].Value.Uint64() <= sample[0].Value.Uint64()+slack || !w.collecting.CompareAndSwap(false, true) {
		return
	}
	// On a goroutine of its own: the watchdog goes on looking meanwhile.
	w.wg.Go(func() {
		defer w.collecting.Store(false)
		w.gc()
	})
}

// look updates st from the server's connections and cuts what
// chooseCuts says. It returns how many it cut, and the bytes waiting for
// the connections it left.
func (w *Watchdog) look(st *watchState, now time.Time) (int, int) {
	w.looks.Add(1)
	reported := w.srv.SessionConns()
	seen := make(map[uint64]*watchedConn, len(reported))
	conns := make([]*watchedConn, 0, len(reported))
	waiting := 0
	for _, ci := range reported {
		// What was written: what was delivered less what waits. (What
		// waits also counts each message's header, so a delivery alone
		// makes this go down, never up.)
		written := ci.Out - int64(ci.Pending)
		c := st.conns[ci.ID]
		switch {
		case c == nil:
			c = &watchedConn{cid: ci.ID, session: ci.Session}
		case ci.Pending == 0 || written > c.written:
			c.stuck = time.Time{}
		case c.stuck.IsZero():
			c.stuck = now
		}
		c.pending, c.written = ci.Pending, written
		seen[ci.ID] = c
		conns = append(conns, c)
		waiting += ci.Pending
	}
	// A connection gone since the last look, with bytes waiting, was
	// closed by the server (its bound, its write deadline) or by its
	// client: what it held counts as held.
	for cid, c := range st.conns {
		if _, ok := seen[cid]; !ok && c.pending > 0 {
			st.held[cid] = heldBytes{session: c.session, bytes: c.pending, until: now.Add(w.cfg.HoldFor)}
		}
	}
	st.conns = seen
	cuts := chooseCuts(conns, st.held, cutLimits{conn: w.cfg.Conn, session: w.cfg.Session, all: w.cfg.All}, now)
	for _, c := range cuts {
		w.srv.Cut(Conn{ID: c.cid, Session: c.session, Pending: c.pending})
		st.held[c.cid] = heldBytes{session: c.session, bytes: c.pending, until: now.Add(w.cfg.HoldFor)}
		delete(st.conns, c.cid)
		waiting -= c.pending
	}
	return len(cuts), waiting
}

// watchedConn is a session connection as the watchdog last saw it.
type watchedConn struct {
	cid     uint64
	session string
	pending int   // bytes waiting to be written
	written int64 // bytes delivered to it less those waiting
	// stuck is since when bytes have waited and the server wrote none;
	// zero while nothing waits or it writes.
	stuck time.Time
}

// stalled reports whether c has stopped reading, as seen at now.
func (c *watchedConn) stalled(now time.Time) bool {
	return c.pending >= stallBytes && !c.stuck.IsZero() && now.Sub(c.stuck) >= stallAfter
}

// heldBytes is what a cut connection held, counted until.
type heldBytes struct {
	session string
	bytes   int
	until   time.Time
}

// heldBytes returns what the cut connections still hold.
func (st *watchState) heldBytes() int {
	n := 0
	for _, h := range st.held {
		n += h.bytes
	}
	return n
}

// expire forgets what cut connections held once the server has let go of
// it.
func (st *watchState) expire(now time.Time) {
	for cid, h := range st.held {
		if !now.Before(h.until) {
			delete(st.held, cid)
		}
	}
}

// cutLimits are the watchdog's bounds on bytes waiting to be written: to
// one session connection, to one session's, to all of them.
type cutLimits struct{ conn, session, all int }

// chooseCuts returns the connections to cut, largest first:
//   - one with more than lim.conn waiting;
//   - while what waits for its session's connections, or for all of them,
//     is over their bound by itself: the largest, until it is within;
//   - while its session, with what its cut connections still hold, is
//     over its bound: one with stallBytes waiting (its session's own
//     connections are what holds it);
//   - while all sessions, with what cut connections still hold, are over
//     their bound: one that stopped reading (it would only add to it).
//
// Cutting moves what a connection waits for to what cut ones hold, so a
// bound passed with what they hold stays passed until the server lets go
// of it.
func chooseCuts(conns []*watchedConn, held map[uint64]heldBytes, lim cutLimits, now time.Time) []*watchedConn {
	live, kept := map[string]int{}, map[string]int{}
	liveAll, keptAll := 0, 0
	for _, c := range conns {
		live[c.session] += c.pending
		liveAll += c.pending
	}
	for _, h := range held {
		kept[h.session] += h.bytes
		keptAll += h.bytes
	}
	slices.SortStableFunc(conns, func(a, b *watchedConn) int { return cmp.Compare(b.pending, a.pending) })
	var cuts []*watchedConn
	for _, c := range conns {
		if c.pending == 0 {
			break
		}
		s := c.session
		cut := c.pending > lim.conn || live[s] > lim.session || liveAll > lim.all ||
			(c.pending >= stallBytes && live[s]+kept[s] > lim.session) ||
			(c.stalled(now) && liveAll+keptAll > lim.all)
		if !cut {
			continue
		}
		cuts = append(cuts, c)
		live[s] -= c.pending
		liveAll -= c.pending
		kept[s] += c.pending
		keptAll += c.pending
	}
	return cuts
}
