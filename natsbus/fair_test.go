package natsbus

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// gate is a job that runs until released, recording that it started.
type gate struct {
	mu      sync.Mutex
	started []string
	release chan struct{}
	served  map[string]int
	refused map[string]int
}

func newGate() *gate {
	return &gate{release: make(chan struct{}), served: map[string]int{}, refused: map[string]int{}}
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
		g.mu.Unlock()
		<-g.release
		g.mu.Lock()
		g.served[key]++
		g.mu.Unlock()
	}
}

// waitServed waits until n jobs have been served.
func (g *gate) waitServed(t *testing.T, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		total := 0
		for _, c := range g.served {
			total += c
		}
		return total >= n
	}, 5*time.Second, time.Millisecond)
}

func (g *gate) order() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.started...)
}

// waitStarted waits until n jobs have started.
func (g *gate) waitStarted(t *testing.T, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return len(g.order()) >= n }, 5*time.Second, time.Millisecond)
}

func TestFairQueue_AFloodWaitsBehindItself(t *testing.T) {
	q := newFairQueue(fairLimits{total: 4, perKey: 2, maxWait: 100, maxBytes: 1 << 20, rate: rate.Inf})
	g := newGate()
	for range 50 {
		require.NoError(t, q.submit("flood", 1, g.job("flood")))
	}
	g.waitStarted(t, 2)
	// The flood holds its two places; the quiet session starts at once.
	require.NoError(t, q.submit("quiet", 1, g.job("quiet")))
	g.waitStarted(t, 3)
	assert.Equal(t, []string{"flood", "flood", "quiet"}, g.order())
	close(g.release)
	g.waitServed(t, 51)
	q.close()
	assert.Equal(t, 50, g.served["flood"])
	assert.Equal(t, 1, g.served["quiet"])
}

func TestFairQueue_TurnsGoRoundRobin(t *testing.T) {
	q := newFairQueue(fairLimits{total: 1, perKey: 1, maxWait: 100, maxBytes: 1 << 20, rate: rate.Inf})
	g := newGate()
	require.NoError(t, q.submit("a", 1, g.job("a")))
	g.waitStarted(t, 1)
	for range 3 {
		require.NoError(t, q.submit("a", 1, g.job("a")))
	}
	require.NoError(t, q.submit("b", 1, g.job("b")))
	require.NoError(t, q.submit("c", 1, g.job("c")))
	close(g.release)
	g.waitServed(t, 6)
	q.close()
	assert.Equal(t, []string{"a", "a", "b", "c", "a", "a"}, g.order(), "a waiting key does not go twice while others wait")
}

func TestFairQueue_TooManyWaitingIsBusy(t *testing.T) {
	q := newFairQueue(fairLimits{total: 1, perKey: 1, maxWait: 2, maxBytes: 1 << 20, rate: rate.Inf})
	g := newGate()
	for range 3 { // one runs, two wait
		require.NoError(t, q.submit("a", 1, g.job("a")))
	}
	assert.ErrorIs(t, q.submit("a", 1, g.job("a")), errBusy)
	assert.NoError(t, q.submit("b", 1, g.job("b")), "another key has its own bound")
	// Bytes bound too: one waiting request of 1 MiB fills it.
	q2 := newFairQueue(fairLimits{total: 1, perKey: 1, maxWait: 100, maxBytes: 1 << 20, rate: rate.Inf})
	require.NoError(t, q2.submit("a", 1, g.job("a")))
	require.NoError(t, q2.submit("a", 1<<20, g.job("a")))
	assert.ErrorIs(t, q2.submit("a", 1, g.job("a")), errBusy)
	close(g.release)
	q.close()
	q2.close()
}

func TestFairQueue_RateHoldsAKeyBack(t *testing.T) {
	q := newFairQueue(fairLimits{total: 10, perKey: 10, maxWait: 100, maxBytes: 1 << 20, rate: 20, burst: 2}, "host")
	g := newGate()
	close(g.release)
	start := time.Now()
	for range 6 {
		require.NoError(t, q.submit("s", 1, g.job("s")))
	}
	for range 20 {
		require.NoError(t, q.submit("host", 1, g.job("host")))
	}
	require.Eventually(t, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.served["s"] == 6 && g.served["host"] == 20
	}, 5*time.Second, time.Millisecond, "the held-back requests start when the rate allows")
	// Two at once (the burst), four more at 20 a second: at least 150 ms.
	assert.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond)
	q.close()
}

func TestFairQueue_CloseAnswersWhatWaits(t *testing.T) {
	q := newFairQueue(fairLimits{total: 1, perKey: 1, maxWait: 100, maxBytes: 1 << 20, rate: rate.Inf})
	g := newGate()
	for range 4 {
		require.NoError(t, q.submit("a", 1, g.job("a")))
	}
	g.waitStarted(t, 1)
	done := make(chan struct{})
	go func() { q.close(); close(done) }()
	require.Eventually(t, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.refused["a"] == 3
	}, 5*time.Second, time.Millisecond, "the waiting ones are answered unserved")
	select {
	case <-done:
		t.Fatal("close returned while a request still ran")
	default:
	}
	close(g.release)
	<-done
	assert.Equal(t, 1, g.served["a"])
	assert.ErrorIs(t, q.submit("a", 1, g.job("a")), errQueueClosed)
	q.close() // idempotent
}

func TestFairQueue_WaitBlocksWhileAKeyIsFull(t *testing.T) {
	q := newFairQueue(fairLimits{total: 1, perKey: 1, maxWait: 4, maxBytes: 1 << 20, rate: rate.Inf})
	g := newGate()
	for range 4 { // one runs, three wait: full (3/4 of 4)
		require.NoError(t, q.submit("a", 1, g.job("a")))
	}
	var stop atomic.Bool
	waited := make(chan struct{})
	go func() { q.wait("a", &stop); close(waited) }()
	q.wait("b", &stop) // another key's reader is not held
	select {
	case <-waited:
		t.Fatal("the full key's reader was not held")
	case <-time.After(20 * time.Millisecond):
	}
	close(g.release)
	<-waited
	q.close()
}

func TestFairQueue_WaitEndsWhenItsReaderStops(t *testing.T) {
	q := newFairQueue(fairLimits{total: 1, perKey: 1, maxWait: 4, maxBytes: 1 << 20, rate: rate.Inf})
	g := newGate()
	for range 4 {
		require.NoError(t, q.submit("a", 1, g.job("a")))
	}
	var stop atomic.Bool
	waited := make(chan struct{})
	go func() { q.wait("a", &stop); close(waited) }()
	stop.Store(true)
	q.wake()
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("a closed reader stays held")
	}
	close(g.release)
	q.close()
}

// TestFairQueue_IdlingDoesNotRefillTheBurst: a session that sends a
// burst, waits for it, and sends another gets no fresh burst each time:
// its rate holds.
func TestFairQueue_IdlingDoesNotRefillTheBurst(t *testing.T) {
	const perSecond, burst = 2000, 200
	q := newFairQueue(fairLimits{total: 1024, perKey: 16, maxWait: 1024, maxBytes: 1 << 30, rate: perSecond, burst: burst})
	defer q.close()
	var served atomic.Int64
	start := time.Now()
	for time.Since(start) < 500*time.Millisecond {
		var wg sync.WaitGroup
		wg.Add(burst)
		for range burst {
			require.NoError(t, q.submit("s", 1, func(bool) { served.Add(1); wg.Done() }))
		}
		wg.Wait()
	}
	elapsed := time.Since(start)
	limit := float64(burst) + perSecond*elapsed.Seconds()
	assert.LessOrEqual(t, float64(served.Load()), 1.1*limit, "served %d in %v", served.Load(), elapsed)
}

// TestFairQueue_AHeldBackKeyAlwaysComesBack: a key held back by its rate
// has a timer to start it again, however the tokens fall; none is left
// waiting with nothing running.
func TestFairQueue_AHeldBackKeyAlwaysComesBack(t *testing.T) {
	q := newFairQueue(fairLimits{total: 1024, perKey: 1, maxWait: 1024, maxBytes: 1 << 30, rate: rate.Limit(1e5), burst: 1})
	defer q.close()
	var done atomic.Int64
	const n = 1000
	for range n {
		require.NoError(t, q.submit("s", 1, func(bool) { done.Add(1) }))
	}
	require.Eventually(t, func() bool { return done.Load() == n }, 5*time.Second, time.Millisecond, "stranded after %d", done.Load())
}

// TestIdleKeysAreKeptUntilASweep: a session's key outlives its request
// (so that a busy session does not make a key per request), and the keys
// of sessions gone idle are swept once they pile up, except those whose
// rate still remembers something.
func TestIdleKeysAreKeptUntilASweep(t *testing.T) {
	q := newFairQueue(fairLimits{total: 4, perKey: 2, maxWait: 100, maxBytes: 1 << 20, rate: 1000, burst: 10})
	defer q.close()
	run := func(key string, took time.Duration) {
		done := make(chan struct{})
		require.NoError(t, q.submit(key, 1, func(bool) {
			time.Sleep(took) // long enough, and the key's bucket is full again when it ends
			close(done)
		}))
		<-done
		require.Eventually(t, func() bool {
			q.mu.Lock()
			defer q.mu.Unlock()
			return q.running == 0
		}, 5*time.Second, time.Millisecond)
	}
	key := func(name string) *fairKey {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.keys[name]
	}
	run("s1", 5*time.Millisecond)
	first := key("s1")
	require.NotNil(t, first)
	run("s1", 0)
	assert.Same(t, first, key("s1"), "the key outlives its requests")

	// Many sessions come and go: their keys stay bounded.
	for i := range 1000 {
		run("gone-"+strconv.Itoa(i), 0)
	}
	q.mu.Lock()
	n := len(q.keys)
	q.mu.Unlock()
	assert.LessOrEqual(t, n, 4*minSweep, "idle keys are swept")

	// Once every bucket is full again, a sweep forgets every idle key but
	// one whose rate remembers a burst.
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
}
