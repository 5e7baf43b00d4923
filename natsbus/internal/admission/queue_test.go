package admission

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// The queue's tests run in a synctest bubble: its workers, its rate
// timer and the jobs' waits run on the bubble's clock, and
// synctest.Wait returns once every job that can start has started (or
// ended) and blocks, so each test sees the queue settled, not a moment
// of it.

// gate is a job that runs until released, recording that it started.
type gate struct {
	mu      sync.Mutex
	start   time.Time
	started []string
	at      []time.Duration // when each started, since start
	release chan struct{}
	served  map[string]int
	refused map[string]int
}

func newGate() *gate {
	return &gate{start: time.Now(), release: make(chan struct{}), served: map[string]int{}, refused: map[string]int{}}
}

func (g *gate) job(key string) func(bool) {
	return func(serve bool) {
		g.mu.Lock()
		if !serve {
			g.refused[key]++
			g.mu.Unlock()
			return
		}
		g.started = append(g.started, key)
		g.at = append(g.at, time.Since(g.start))
		g.mu.Unlock()
		<-g.release
		g.mu.Lock()
		g.served[key]++
		g.mu.Unlock()
	}
}

func (g *gate) order() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.started...)
}

func (g *gate) servedOf(key string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.served[key]
}

func (g *gate) refusedOf(key string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.refused[key]
}

func TestQueue_AFloodWaitsBehindItself(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := NewQueue(Limits{Total: 4, PerKey: 2, MaxWait: 100, MaxBytes: 1 << 20, Rate: rate.Inf})
		defer q.Close()
		g := newGate()
		for range 50 {
			require.NoError(t, q.Submit("flood", 1, g.job("flood")))
		}
		synctest.Wait()
		assert.Equal(t, []string{"flood", "flood"}, g.order(), "the flood holds its two places and no more")
		require.NoError(t, q.Submit("quiet", 1, g.job("quiet")))
		synctest.Wait()
		assert.Equal(t, []string{"flood", "flood", "quiet"}, g.order(), "the quiet session starts at once")
		close(g.release)
		synctest.Wait()
		assert.Equal(t, 50, g.servedOf("flood"))
		assert.Equal(t, 1, g.servedOf("quiet"))
	})
}

// TestQueue_TheUnlimitedKeyIsBoundOnlyByTheTotal: the host's key runs
// past PerKey, up to Total, while a session's key stops at PerKey.
func TestQueue_TheUnlimitedKeyIsBoundOnlyByTheTotal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := NewQueue(Limits{Total: 6, PerKey: 2, MaxWait: 100, MaxBytes: 1 << 20, Rate: rate.Inf}, "host")
		defer q.Close()
		g := newGate()
		for range 3 {
			require.NoError(t, q.Submit("s", 1, g.job("s")))
		}
		for range 10 {
			require.NoError(t, q.Submit("host", 1, g.job("host")))
		}
		synctest.Wait()
		running := map[string]int{}
		for _, k := range g.order() {
			running[k]++
		}
		assert.Equal(t, map[string]int{"s": 2, "host": 4}, running, "the session stops at PerKey, the host at what is left of Total")
		close(g.release)
		synctest.Wait()
		assert.Equal(t, 3, g.servedOf("s"))
		assert.Equal(t, 10, g.servedOf("host"))
	})
}

func TestQueue_TurnsGoRoundRobin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := NewQueue(Limits{Total: 1, PerKey: 1, MaxWait: 100, MaxBytes: 1 << 20, Rate: rate.Inf})
		defer q.Close()
		g := newGate()
		require.NoError(t, q.Submit("a", 1, g.job("a")))
		synctest.Wait()
		require.Equal(t, []string{"a"}, g.order())
		for range 3 {
			require.NoError(t, q.Submit("a", 1, g.job("a")))
		}
		require.NoError(t, q.Submit("b", 1, g.job("b")))
		require.NoError(t, q.Submit("c", 1, g.job("c")))
		close(g.release)
		synctest.Wait()
		assert.Equal(t, []string{"a", "a", "b", "c", "a", "a"}, g.order(), "a waiting key does not go twice while others wait")
	})
}

func TestQueue_TooManyWaitingIsBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := NewQueue(Limits{Total: 1, PerKey: 1, MaxWait: 2, MaxBytes: 1 << 20, Rate: rate.Inf})
		g := newGate()
		for range 3 { // one runs, two wait
			require.NoError(t, q.Submit("a", 1, g.job("a")))
		}
		err := q.Submit("a", 1, g.job("a"))
		assert.ErrorIs(t, err, ErrBusy)
		var be *BusyError
		require.ErrorAs(t, err, &be)
		assert.Equal(t, BusyError{Waiting: 2, WaitingBytes: 2, Size: 1, Running: 1, MaxWait: 2, MaxBytes: 1 << 20}, *be, "the count bound, with the figures")
		assert.NoError(t, q.Submit("b", 1, g.job("b")), "another key has its own bound")
		// Bytes bound too: one waiting request of 1 MiB fills it.
		q2 := NewQueue(Limits{Total: 1, PerKey: 1, MaxWait: 100, MaxBytes: 1 << 20, Rate: rate.Inf})
		require.NoError(t, q2.Submit("a", 1, g.job("a")))
		require.NoError(t, q2.Submit("a", 1<<20, g.job("a")))
		err = q2.Submit("a", 1, g.job("a"))
		assert.ErrorIs(t, err, ErrBusy)
		require.ErrorAs(t, err, &be)
		assert.Equal(t, BusyError{Bytes: true, Waiting: 1, WaitingBytes: 1 << 20, Size: 1, Running: 1, MaxWait: 100, MaxBytes: 1 << 20}, *be, "the bytes bound, with the figures")
		close(g.release)
		q.Close()
		q2.Close()
	})
}

// TestQueue_RateHoldsAKeyBack: a key past its burst starts its requests
// at its rate, each no sooner than its token; the unlimited key (the
// host's) is never held.
func TestQueue_RateHoldsAKeyBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := NewQueue(Limits{Total: 10, PerKey: 10, MaxWait: 100, MaxBytes: 1 << 20, Rate: 20, Burst: 2}, "host")
		defer q.Close()
		var mu sync.Mutex
		var at []time.Duration
		hostServed := 0
		start := time.Now()
		for range 6 {
			require.NoError(t, q.Submit("s", 1, func(bool) {
				mu.Lock()
				defer mu.Unlock()
				at = append(at, time.Since(start))
			}))
		}
		for range 20 {
			require.NoError(t, q.Submit("host", 1, func(bool) {
				mu.Lock()
				defer mu.Unlock()
				hostServed++
			}))
		}
		synctest.Wait()
		mu.Lock()
		assert.Equal(t, 20, hostServed, "the host's requests all ran at once")
		assert.Len(t, at, 2, "the burst ran at once, the rest waits for the rate")
		mu.Unlock()
		time.Sleep(time.Second)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, at, 6, "the held-back requests start when the rate allows")
		// Two at once (the burst), then one every 50 ms (20 a second).
		for i, d := range at {
			want := time.Duration(max(i-1, 0)) * 50 * time.Millisecond
			assert.GreaterOrEqual(t, d, want-time.Millisecond, "request %d started at %v", i, d)
			assert.Less(t, d, want+10*time.Millisecond, "request %d started at %v", i, d)
		}
	})
}

func TestQueue_CloseAnswersWhatWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := NewQueue(Limits{Total: 1, PerKey: 1, MaxWait: 100, MaxBytes: 1 << 20, Rate: rate.Inf})
		g := newGate()
		for range 4 {
			require.NoError(t, q.Submit("a", 1, g.job("a")))
		}
		synctest.Wait()
		require.Equal(t, []string{"a"}, g.order())
		done := make(chan struct{})
		go func() { q.Close(); close(done) }()
		synctest.Wait()
		assert.Equal(t, 3, g.refusedOf("a"), "the waiting ones are answered unserved")
		select {
		case <-done:
			t.Fatal("Close returned while a request still ran")
		default:
		}
		close(g.release)
		<-done
		assert.Equal(t, 1, g.servedOf("a"))
		assert.ErrorIs(t, q.Submit("a", 1, g.job("a")), ErrClosed)
		q.Close() // idempotent
	})
}

func TestQueue_WaitBlocksWhileAKeyIsFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := NewQueue(Limits{Total: 1, PerKey: 1, MaxWait: 4, MaxBytes: 1 << 20, Rate: rate.Inf})
		defer q.Close()
		g := newGate()
		for range 4 { // one runs, three wait: full (3/4 of 4)
			require.NoError(t, q.Submit("a", 1, g.job("a")))
		}
		var stop atomic.Bool
		waited := make(chan struct{})
		go func() { q.Wait("a", &stop); close(waited) }()
		q.Wait("b", &stop) // another key's reader is not held
		synctest.Wait()
		select {
		case <-waited:
			t.Fatal("the full key's reader was not held")
		default:
		}
		close(g.release)
		<-waited
	})
}

func TestQueue_WaitEndsWhenItsReaderStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := NewQueue(Limits{Total: 1, PerKey: 1, MaxWait: 4, MaxBytes: 1 << 20, Rate: rate.Inf})
		defer q.Close()
		g := newGate()
		defer close(g.release)
		for range 4 {
			require.NoError(t, q.Submit("a", 1, g.job("a")))
		}
		var stop atomic.Bool
		waited := make(chan struct{})
		go func() { q.Wait("a", &stop); close(waited) }()
		synctest.Wait()
		select {
		case <-waited:
			t.Fatal("the full key's reader was not held")
		default:
		}
		stop.Store(true)
		q.Wake()
		<-waited // a reader stopped (a closed connection) is not held
	})
}

// TestQueue_IdlingDoesNotRefillTheBurst: a session that sends a burst,
// waits for it, and sends another gets no fresh burst each time: its
// rate holds.
func TestQueue_IdlingDoesNotRefillTheBurst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const perSecond, burst = 2000, 200
		q := NewQueue(Limits{Total: 1024, PerKey: 16, MaxWait: 1024, MaxBytes: 1 << 30, Rate: perSecond, Burst: burst})
		defer q.Close()
		var served atomic.Int64
		start := time.Now()
		for time.Since(start) < 500*time.Millisecond {
			var wg sync.WaitGroup
			wg.Add(burst)
			for range burst {
				require.NoError(t, q.Submit("s", 1, func(bool) { served.Add(1); wg.Done() }))
			}
			wg.Wait()
		}
		elapsed := time.Since(start)
		limit := float64(burst) + perSecond*elapsed.Seconds()
		assert.LessOrEqual(t, float64(served.Load()), 1.1*limit, "served %d in %v", served.Load(), elapsed)
	})
}

// TestQueue_AHeldBackKeyAlwaysComesBack: a key held back by its rate
// has a timer to start it again, however the tokens fall; none is left
// waiting with nothing running.
func TestQueue_AHeldBackKeyAlwaysComesBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := NewQueue(Limits{Total: 1024, PerKey: 1, MaxWait: 1024, MaxBytes: 1 << 30, Rate: rate.Limit(1e5), Burst: 1})
		defer q.Close()
		var done atomic.Int64
		const n = 1000
		for range n {
			require.NoError(t, q.Submit("s", 1, func(bool) { done.Add(1) }))
		}
		// Each held-back start waits at least a millisecond: a thousand
		// of them take at most a second, and one stranded stays so.
		time.Sleep(2 * time.Second)
		synctest.Wait()
		assert.Equal(t, int64(n), done.Load(), "stranded after %d", done.Load())
	})
}

// TestQueue_IdleKeysAreKeptUntilASweep: a session's key outlives its
// request (so that a busy session does not make a key per request), and
// the keys of sessions gone idle are swept once they pile up, except
// those whose rate still remembers something.
func TestQueue_IdleKeysAreKeptUntilASweep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := NewQueue(Limits{Total: 4, PerKey: 2, MaxWait: 100, MaxBytes: 1 << 20, Rate: 1000, Burst: 10})
		defer q.Close()
		run := func(key string, took time.Duration) {
			done := make(chan struct{})
			require.NoError(t, q.Submit(key, 1, func(bool) {
				time.Sleep(took) // on the bubble's clock: the key's bucket is full again when it ends
				close(done)
			}))
			<-done
			synctest.Wait()
			q.mu.Lock()
			defer q.mu.Unlock()
			require.Zero(t, q.running, "the request has ended")
		}
		key := func(name string) *queueKey {
			q.mu.Lock()
			defer q.mu.Unlock()
			return q.keys[name]
		}
		run("s1", 5*time.Millisecond)
		first := key("s1")
		require.NotNil(t, first)
		run("s1", 0)
		assert.Same(t, first, key("s1"), "the key outlives its requests")

		// Many sessions come and go, each request taking a millisecond
		// (its key's bucket is full again when it ends): their keys stay
		// bounded.
		for i := range 1000 {
			run("gone-"+strconv.Itoa(i), time.Millisecond)
		}
		q.mu.Lock()
		n := len(q.keys)
		q.mu.Unlock()
		assert.LessOrEqual(t, n, 4*minSweep, "idle keys are swept")

		// Once every bucket is full again (10 tokens at 1,000 a second:
		// 10 ms on the bubble's clock), a sweep forgets every idle key
		// but one whose rate remembers a burst.
		time.Sleep(20 * time.Millisecond)
		run("s1", 0)
		q.mu.Lock()
		q.keys["s1"].rate.AllowN(time.Now(), 5) // short of 6 tokens: 6 ms to refill
		q.sweep(time.Now())
		_, kept := q.keys["s1"]
		left := len(q.keys)
		q.mu.Unlock()
		assert.True(t, kept, "a key whose rate remembers a burst is kept")
		assert.Equal(t, 1, left, "every idle key with a full bucket is forgotten")
	})
}
