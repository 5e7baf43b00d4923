package admission

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestChooseCuts: which session connections the watchdog closes, given
// what waits for each, whether each stopped reading, and what the
// connections it closed still hold.
func TestChooseCuts(t *testing.T) {
	const M = 1 << 20
	now := time.Now()
	lim := cutLimits{conn: 16 * M, session: 32 * M, all: 64 * M}
	// conn is a connection of session with pending bytes waiting; stuck
	// says for how long the server could write none of them (0: it
	// writes).
	conn := func(cid uint64, session string, pending int, stuck time.Duration) *watchedConn {
		c := &watchedConn{cid: cid, session: session, pending: pending}
		if stuck > 0 {
			c.stuck = now.Add(-stuck)
		}
		return c
	}
	held := func(session string, bytes int) heldBytes {
		return heldBytes{session: session, bytes: bytes, until: now.Add(time.Second)}
	}
	for _, tc := range []struct {
		name  string
		conns []*watchedConn
		held  []heldBytes
		want  []uint64
	}{
		{
			name:  "within every bound, a stalled connection stays",
			conns: []*watchedConn{conn(1, "a", 10*M, time.Second), conn(2, "b", 10*M, 0)},
		},
		{
			name:  "one over its own bound is cut, reading or not",
			conns: []*watchedConn{conn(1, "a", 17*M, 0), conn(2, "a", 10*M, time.Second)},
			want:  []uint64{1},
		},
		{
			name:  "a session over its bound loses its largest, and then, with what that one holds, the rest of its own",
			conns: []*watchedConn{conn(1, "a", 12*M, 0), conn(2, "a", 14*M, 0), conn(3, "a", 10*M, 0), conn(4, "a", stallBytes-1, 0), conn(5, "b", 15*M, 0)},
			want:  []uint64{2, 1, 3},
		},
		{
			name:  "all over their bound lose the largest until within",
			conns: []*watchedConn{conn(1, "a", 15*M, 0), conn(2, "b", 15*M, 0), conn(3, "c", 15*M, 0), conn(4, "d", 15*M, 0), conn(5, "e", 14*M, 0)},
			want:  []uint64{1},
		},
		{
			name:  "what a session's cut connections hold: its connections with stallBytes waiting go, others' stay",
			conns: []*watchedConn{conn(1, "a", M, time.Second), conn(2, "a", 2*M, 0), conn(3, "a", stallBytes-1, time.Second), conn(4, "b", M, time.Second)},
			held:  []heldBytes{held("a", 30*M)},
			want:  []uint64{2, 1},
		},
		{
			name:  "what all cut connections hold: every stalled one goes, whatever its session",
			conns: []*watchedConn{conn(1, "a", M, time.Second), conn(2, "b", 2*M, time.Second), conn(3, "c", 3*M, 0)},
			held:  []heldBytes{held("x", 20*M), held("y", 20*M), held("z", 20*M)},
			want:  []uint64{2, 1},
		},
		{
			name: "stalled is stallBytes waiting and none written for stallAfter",
			conns: []*watchedConn{
				conn(1, "a", stallBytes, stallAfter), conn(2, "b", stallBytes-1, time.Second),
				conn(3, "c", stallBytes, stallAfter-time.Millisecond), conn(4, "d", stallBytes, 0),
			},
			held: []heldBytes{held("x", 64*M)},
			want: []uint64{1},
		},
		{
			name:  "nothing waiting is never cut",
			conns: []*watchedConn{conn(1, "a", 0, time.Second)},
			held:  []heldBytes{held("a", 100*M)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hm := map[uint64]heldBytes{}
			for i, h := range tc.held {
				hm[uint64(1000+i)] = h
			}
			var got []uint64
			for _, c := range chooseCuts(slices.Clone(tc.conns), hm, lim, now) {
				got = append(got, c.cid)
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

// The watchdog's tests below run in a synctest bubble, on a fake server:
// time.Sleep moves the bubble's clock on at once (an hour idle costs
// nothing), and synctest.Wait returns once the watchdog has done what
// that time asks of it and waits again.

// fakeServer is a server whose session connections the test sets.
type fakeServer struct {
	mu      sync.Mutex
	conns   map[uint64]Conn
	cuts    []Conn
	reading uint64 // a connection whose reader takes a byte at each look
}

func newFakeServer(conns ...Conn) *fakeServer {
	f := &fakeServer{conns: map[uint64]Conn{}}
	for _, c := range conns {
		f.conns[c.ID] = c
	}
	return f
}

func (f *fakeServer) SessionConns() []Conn {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Conn
	for id, c := range f.conns {
		if id == f.reading && c.Pending > 0 {
			c.Pending--
			f.conns[id] = c
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Conn) int { return int(a.ID) - int(b.ID) })
	return out
}

// Cut closes the connection: the server reports it no more.
func (f *fakeServer) Cut(c Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.conns, c.ID)
	f.cuts = append(f.cuts, c)
}

func (f *fakeServer) set(c Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.conns[c.ID] = c
}

func (f *fakeServer) cutIDs() []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []uint64
	for _, c := range f.cuts {
		ids = append(ids, c.ID)
	}
	return ids
}

// startWatchdog starts a watchdog on srv whose collections and returns
// of memory are counted, not done. Call it in a bubble.
func startWatchdog(t *testing.T, srv Server, cfg WatchConfig) (w *Watchdog, gcs, frees *atomic.Int64) {
	t.Helper()
	w = newWatchdog(srv, cfg)
	gcs, frees = new(atomic.Int64), new(atomic.Int64)
	w.gc = func() { gcs.Add(1) }
	w.freeOS = func() { frees.Add(1) }
	w.wg.Go(w.run)
	t.Cleanup(w.Close)
	return w, gcs, frees
}

var testLimits = WatchConfig{Conn: 16 << 20, Session: 32 << 20, All: 64 << 20, HoldFor: 4 * time.Second}

// TestTheWatchdogIdlesUntilSomethingIsPublished: with session connections
// open and nothing published, the watchdog neither wakes nor looks; a
// publish is looked at a tick later (a large one at once), and with
// nothing waiting it goes back to waiting, no timer running.
func TestTheWatchdogIdlesUntilSomethingIsPublished(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := newFakeServer(Conn{ID: 1, Session: "a"}, Conn{ID: 2, Session: "b"})
		w, _, _ := startWatchdog(t, srv, testLimits)
		time.Sleep(time.Hour)
		synctest.Wait()
		assert.Zero(t, w.wakes.Load(), "an hour with nothing published: no wake-up")
		assert.Zero(t, w.Looks())
		assert.True(t, w.Idle())

		w.Published(100)
		synctest.Wait()
		assert.False(t, w.Idle(), "a publish arms it")
		assert.Zero(t, w.Looks(), "a small publish is looked at a tick later")
		time.Sleep(watchEvery)
		synctest.Wait()
		assert.Equal(t, int64(1), w.Looks(), "looked at a tick later")
		assert.True(t, w.Idle(), "nothing waits: idle again")
		w.Published(100)
		w.Published(100)
		time.Sleep(time.Hour)
		synctest.Wait()
		assert.Equal(t, int64(2), w.Looks(), "two publishes within a tick: one look")
		assert.Equal(t, int64(2), w.wakes.Load(), "and nothing more for an hour")

		w.Published(kickSize)
		synctest.Wait()
		assert.Equal(t, int64(3), w.Looks(), "a large publish is looked at at once")
		for range kickEvery / (16 << 10) {
			w.Published(16 << 10)
		}
		synctest.Wait()
		assert.Equal(t, int64(4), w.Looks(), "so is a MiB of small ones")
		assert.True(t, w.Idle())
	})
}

// TestTheWatchdogLooksWhileBytesWait: while bytes wait for a session
// connection the watchdog looks every tick, whether or not anything more
// is published; once nothing waits, it stops.
func TestTheWatchdogLooksWhileBytesWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := newFakeServer(Conn{ID: 1, Session: "a", Pending: 1000, Out: 1000})
		w, _, _ := startWatchdog(t, srv, testLimits)
		w.Published(1000)
		time.Sleep(watchEvery + time.Second)
		synctest.Wait()
		assert.Equal(t, int64(11), w.Looks(), "a tick after the publish, then every tick for a second")
		assert.False(t, w.Idle())
		srv.set(Conn{ID: 1, Session: "a", Out: 1000})
		time.Sleep(time.Hour)
		synctest.Wait()
		assert.Equal(t, int64(12), w.Looks(), "one more look sees nothing waiting, and that is all")
		assert.True(t, w.Idle())
		assert.Empty(t, srv.cutIDs())
	})
}

// TestTheWatchdogCutsWhatStoppedReading: a connection over its own bound
// is cut at the first look; then, with what it still holds, all sessions
// are over their bound, and a connection that stopped reading is cut once
// nothing could be written to it for stallAfter, while one that reads is
// not. What the cut ones hold keeps the watchdog looking until the server
// has let go of it; then the episode ends, and the memory is collected,
// and returned to the system only if asked.
func TestTheWatchdogCutsWhatStoppedReading(t *testing.T) {
	for _, returnMemory := range []bool{false, true} {
		t.Run(map[bool]string{false: "memory returned at the runtime's pace", true: "memory returned at once"}[returnMemory], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const M = 1 << 20
				cfg := WatchConfig{Conn: 4 * M, Session: 16 * M, All: 8 * M, HoldFor: 4 * time.Second, ReturnMemory: returnMemory}
				srv := newFakeServer(
					Conn{ID: 1, Session: "a", Pending: 2 * M, Out: 2 * M},
					Conn{ID: 2, Session: "b", Pending: 2 * M, Out: 2 * M},
					Conn{ID: 3, Session: "c", Pending: 5 * M, Out: 5 * M},
				)
				srv.reading = 1 // takes a little at each look
				w, gcs, frees := startWatchdog(t, srv, cfg)
				w.Published(kickSize)
				synctest.Wait()
				assert.Equal(t, []uint64{3}, srv.cutIDs(), "over its own bound: cut at once")
				// A look sees it waiting, the next a stallAfter later sees
				// it stopped.
				time.Sleep(stallAfter + watchEvery)
				synctest.Wait()
				assert.Equal(t, []uint64{3, 2}, srv.cutIDs(), "the stalled one is cut, the reader is not")
				srv.set(Conn{ID: 1, Session: "a", Out: 2 * M}) // the reader caught up
				wakes := w.wakes.Load()
				time.Sleep(cfg.HoldFor)
				synctest.Wait()
				assert.Greater(t, w.wakes.Load(), wakes+int64(cfg.HoldFor/watchEvery)/2, "what the cut ones hold keeps it awake")
				assert.False(t, w.Idle())
				assert.Zero(t, frees.Load(), "the episode is not over")
				time.Sleep(quietFor + 2*watchEvery)
				synctest.Wait()
				assert.True(t, w.Idle(), "over: idle again")
				assert.Equal(t, []uint64{3, 2}, srv.cutIDs())
				assert.NotZero(t, gcs.Load(), "collected")
				if returnMemory {
					assert.Equal(t, int64(1), frees.Load(), "and the memory returned, as asked")
				} else {
					assert.Zero(t, frees.Load(), "debug.FreeOSMemory is not called unless asked")
				}
				looks, collected := w.Looks(), gcs.Load()
				time.Sleep(time.Hour)
				synctest.Wait()
				assert.Equal(t, looks, w.Looks(), "idle: no look")
				assert.Equal(t, collected, gcs.Load(), "idle: no collection")
			})
		})
	}
}

func TestTheWatchdogCloseIsIdempotent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := StartWatchdog(newFakeServer(), testLimits)
		w.Published(kickSize)
		w.Close()
		w.Close()
		w.Published(kickSize) // after Close: nothing to wake, and no block
	})
}
