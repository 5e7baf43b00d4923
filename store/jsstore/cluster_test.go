package jsstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/store/jsstore"
	"github.com/a2a-bus/a2a-bus/store/storetest"
	"github.com/a2a-bus/a2a-bus/wire"
)

// leader returns the node that leads prefix's tasks bucket.
func (c *cluster) leader(t *testing.T, prefix string) int {
	t.Helper()
	js, err := jetstream.New(c.conns[0])
	require.NoError(t, err)
	ctx := ctxT(t)
	var name string
	require.Eventually(t, func() bool {
		s, err := js.Stream(ctx, "KV_"+prefix+"_tasks")
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		if err != nil || info.Cluster == nil {
			return false
		}
		name = info.Cluster.Leader
		return name != ""
	}, 30*time.Second, 20*time.Millisecond, "the bucket has no leader")
	for i := range c.N() {
		if c.Name(i) == name {
			return i
		}
	}
	t.Fatalf("no node is named %q", name)
	return -1
}

func appendMsg(r *store.Record, id string) {
	r.Task.History = append(r.Task.History, wire.Message{MessageID: id, Parts: []wire.Part{wire.TextPart(id)}})
}

func historyIDs(r *store.Record) []string {
	var out []string
	for _, m := range r.Task.History {
		out = append(out, m.MessageID)
	}
	return out
}

// What one broker's store acknowledged, a store on another node and
// connection reads: a changed task, its send key, the open tasks and the
// session's count. (The durable part of the store suite, for a store
// whose directory is the cluster.)
func testReopen(t *testing.T, c *cluster) {
	ctx := ctxT(t)
	p := c.prefix(t)
	s := c.open(t, 0, p)
	require.NoError(t, s.Create(ctx, storetest.NewRecord("t1", "c1", "a", "b", 0), 2))
	require.NoError(t, s.Create(ctx, storetest.WithSendKey(storetest.NewRecord("t2", "c1", "a", "b", 1), "m2", "d2"), 2))
	_, err := s.Update(ctx, "t1", func(r *store.Record) error {
		r.Task.Status.State = wire.StateCompleted
		r.Apply("a", "k1", "d1")
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, s.Close())

	s = c.open(t, 2, p)
	got, err := s.Get(ctx, "t1")
	require.NoError(t, err)
	assert.Equal(t, wire.StateCompleted, got.Task.Status.State)
	assert.Equal(t, []store.Applied{{By: "a", Key: "k1", Digest: "d1"}}, got.Applied)
	got, err = s.FindSend(ctx, "a", "m2")
	require.NoError(t, err)
	assert.Equal(t, "t2", got.Task.ID)
	open, _, err := s.List(ctx, store.Query{OpenOnly: true})
	require.NoError(t, err)
	require.Len(t, open, 1)
	assert.Equal(t, "t2", open[0].Task.ID)
	require.NoError(t, s.Create(ctx, storetest.NewRecord("t3", "c1", "a", "b", 2), 2))
	assert.ErrorIs(t, s.Create(ctx, storetest.NewRecord("t4", "c1", "a", "b", 3), 2), store.ErrLimit)
	n, err := s.OpenCount(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
}

// OpenMembers tells the members of the open tasks from the index alone;
// the members of a task closed a moment ago may still be among them (its
// index keys' removal markers live a moment).
func testOpenMembers(t *testing.T, c *cluster) {
	ctx := ctxT(t)
	s := c.open(t, 1, c.prefix(t))
	got, err := s.OpenMembers(ctx)
	require.NoError(t, err)
	assert.Empty(t, got)
	require.NoError(t, s.Create(ctx, storetest.NewRecord("t1", "c1", "a", "b", 0), 8))
	require.NoError(t, s.Create(ctx, storetest.NewRecord("t2", "c2", "c", "d", 1), 8))
	require.NoError(t, s.Create(ctx, storetest.NewRecord("t3", "c1", "a", "e.with.dots", 2), 8))
	got, err = s.OpenMembers(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b", "c", "d", "e.with.dots"}, got)
	_, err = s.Update(ctx, "t2", func(r *store.Record) error {
		r.Task.Status.State = wire.StateCompleted
		return nil
	})
	require.NoError(t, err)
	got, err = s.OpenMembers(ctx)
	require.NoError(t, err)
	assert.Subset(t, got, []string{"a", "b", "e.with.dots"})
	assert.Subset(t, []string{"a", "b", "c", "d", "e.with.dots"}, got)
}

// A read right after an update acknowledged on another node's
// connection sees it, on a node that does not lead the bucket: reads go
// to the leader, not to a follower that may lag (the buckets allow no
// direct get).
func testReadYourWritesAcrossNodes(t *testing.T, c *cluster) {
	ctx := ctxT(t)
	p := c.prefix(t)
	c.open(t, 0, p) // makes the buckets
	leader := c.leader(t, p)
	writerNode, readerNode := (leader+1)%c.N(), (leader+2)%c.N()
	w, r := c.open(t, writerNode, p), c.open(t, readerNode, p)
	js, err := jetstream.New(c.conns[readerNode])
	require.NoError(t, err)
	str, err := js.Stream(ctx, "KV_"+p+"_tasks")
	require.NoError(t, err)
	assert.False(t, str.CachedInfo().Config.AllowDirect, "no follower answers a read")

	require.NoError(t, w.Create(ctx, storetest.NewRecord("t1", "c1", "a", "b", 0), 0))
	for i := range 200 {
		id := fmt.Sprint("u", i)
		_, err := w.Update(ctx, "t1", func(rec *store.Record) error { appendMsg(rec, id); return nil })
		require.NoError(t, err)
		got, err := r.Get(ctx, "t1")
		require.NoError(t, err)
		require.Equal(t, id, got.Task.History[len(got.Task.History)-1].MessageID, "read %d misses the update before it", i)
		// And the other way round: the writer reads what it did not write.
		id = fmt.Sprint("v", i)
		_, err = r.Update(ctx, "t1", func(rec *store.Record) error { appendMsg(rec, id); return nil })
		require.NoError(t, err)
		got, err = w.Get(ctx, "t1")
		require.NoError(t, err)
		require.Equal(t, id, got.Task.History[len(got.Task.History)-1].MessageID, "read %d misses the update before it", i)
	}
}

// An update whose fn refuses the task as this store last saw it is
// judged again on the task as it is now, changed by another node's
// store: it is refused only for what the task is when the update runs.
func testRefusalJudgedOnTheTaskAsItIs(t *testing.T, c *cluster) {
	ctx := ctxT(t)
	p := c.prefix(t)
	a, b := c.open(t, 0, p), c.open(t, 1, p)
	require.NoError(t, a.Create(ctx, storetest.NewRecord("t1", "c1", "a", "b", 0), 0))
	_, err := a.Get(ctx, "t1")
	require.NoError(t, err)
	_, err = b.Update(ctx, "t1", func(r *store.Record) error {
		r.Task.Status.State = wire.StateInputRequired
		return nil
	})
	require.NoError(t, err)
	notYet := errors.New("not waiting for input")
	var saw []wire.State
	got, err := a.Update(ctx, "t1", func(r *store.Record) error {
		saw = append(saw, r.Task.Status.State)
		if r.Task.Status.State != wire.StateInputRequired {
			return notYet
		}
		r.Task.Status.State = wire.StateWorking
		return nil
	})
	require.NoError(t, err, "fn saw %v", saw)
	assert.Equal(t, wire.StateWorking, got.Task.Status.State)
	assert.Equal(t, wire.StateInputRequired, saw[len(saw)-1])
	// A refusal of the task as it is stands.
	_, err = a.Update(ctx, "t1", func(r *store.Record) error { return notYet })
	assert.ErrorIs(t, err, notYet)
}

// Stores on three nodes claim the same names at once: exactly one claim
// of each wins, every store sees the same holder, a store that is not
// the holder cannot release it, and a released name can be claimed
// again.
func testNames(t *testing.T, c *cluster) {
	ctx := ctxT(t)
	p := c.prefix(t)
	stores := []*jsstore.Store{c.open(t, 0, p), c.open(t, 1, p), c.open(t, 2, p)}
	const names, claimants = 20, 6
	for n := range names {
		name := fmt.Sprintf("planner.%d*>", n) // any characters
		var wg sync.WaitGroup
		errs := make([]error, claimants)
		start := make(chan struct{})
		for i := range claimants {
			wg.Go(func() {
				<-start
				errs[i] = stores[i%len(stores)].ClaimName(ctx, name, fmt.Sprint("inst-", i))
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			if err == nil {
				require.Equal(t, -1, winner, "name %s: claims %d and %d both won", name, winner, i)
				winner = i
				continue
			}
			require.ErrorIs(t, err, store.ErrNameTaken, "name %s claim %d", name, i)
		}
		require.NotEqual(t, -1, winner, "name %s: no claim won", name)
		holder := fmt.Sprint("inst-", winner)
		for _, s := range stores {
			got, err := s.NameHolder(ctx, name)
			require.NoError(t, err)
			assert.Equal(t, holder, got)
		}
		// The holder claiming again is no error; another is refused.
		require.NoError(t, stores[n%3].ClaimName(ctx, name, holder))
		require.ErrorIs(t, stores[n%3].ClaimName(ctx, name, "someone-else"), store.ErrNameTaken)
		// A release by another instance does nothing.
		require.NoError(t, stores[(n+1)%3].ReleaseName(ctx, name, "someone-else"))
		got, err := stores[(n+2)%3].NameHolder(ctx, name)
		require.NoError(t, err)
		assert.Equal(t, holder, got, "a release by a non-holder freed the name")
		// The holder's release frees it, for anyone.
		require.NoError(t, stores[(n+1)%3].ReleaseName(ctx, name, holder))
		_, err = stores[(n+2)%3].NameHolder(ctx, name)
		require.ErrorIs(t, err, store.ErrNotFound)
		require.NoError(t, stores[n%3].ClaimName(ctx, name, "next"))
		got, err = stores[(n+1)%3].NameHolder(ctx, name)
		require.NoError(t, err)
		assert.Equal(t, "next", got)
	}
	_, err := stores[0].NameHolder(ctx, "never-claimed")
	assert.ErrorIs(t, err, store.ErrNotFound)
}

// A release races claims by others: it never frees a claim other than
// the releaser's own.
func testReleaseNeverFreesAnothersClaim(t *testing.T, c *cluster) {
	ctx := ctxT(t)
	p := c.prefix(t)
	a, b := c.open(t, 0, p), c.open(t, 1, p)
	for i := range 30 {
		name := fmt.Sprint("n", i)
		require.NoError(t, a.ClaimName(ctx, name, "old"))
		var wg sync.WaitGroup
		var claimed atomic.Bool
		wg.Go(func() { assert.NoError(t, a.ReleaseName(ctx, name, "old")) })
		wg.Go(func() {
			// Claims until the release lets it in.
			for !claimed.Load() {
				err := b.ClaimName(ctx, name, "new")
				if err == nil {
					claimed.Store(true)
					return
				}
				if !assert.ErrorIs(t, err, store.ErrNameTaken) {
					return
				}
			}
		})
		wg.Wait()
		require.True(t, claimed.Load())
		// A late release of the old holder's changes nothing.
		require.NoError(t, a.ReleaseName(ctx, name, "old"))
		got, err := a.NameHolder(ctx, name)
		require.NoError(t, err)
		require.Equal(t, "new", got)
	}
}

// Stores on two nodes increment one task at once: no increment is lost.
func testRacingUpdates(t *testing.T, c *cluster) {
	ctx := ctxT(t)
	p := c.prefix(t)
	stores := []*jsstore.Store{c.open(t, 0, p), c.open(t, 1, p)}
	require.NoError(t, stores[0].Create(ctx, storetest.NewRecord("t1", "c1", "a", "b", 0), 0))
	const workers, each = 6, 15
	var runs atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			s := stores[w%len(stores)]
			for i := range each {
				id := fmt.Sprintf("w%d-%d", w, i)
				_, err := s.Update(ctx, "t1", func(r *store.Record) error {
					runs.Add(1)
					appendMsg(r, id)
					return nil
				})
				assert.NoError(t, err)
			}
		})
	}
	wg.Wait()
	got, err := stores[1].Get(ctx, "t1")
	require.NoError(t, err)
	ids := historyIDs(got)
	assert.Len(t, ids, 1+workers*each, "every increment is kept once")
	slices.Sort(ids)
	assert.Len(t, slices.Compact(ids), 1+workers*each, "no increment is kept twice")
	t.Logf("%d updates ran fn %d times", workers*each, runs.Load())
	assert.Greater(t, runs.Load(), int64(workers*each), "the updates raced: some ran fn again")
}

// Stores on three nodes create for one session at once: the cap holds
// across them, and a slot freed on one is taken once.
func testCapAcrossBrokers(t *testing.T, c *cluster) {
	ctx := ctxT(t)
	p := c.prefix(t)
	stores := []*jsstore.Store{c.open(t, 0, p), c.open(t, 1, p), c.open(t, 2, p)}
	const limit, tries = 5, 45
	race := func(round int) (ok []string) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range tries {
			wg.Go(func() {
				<-start
				id := fmt.Sprintf("r%d-t%02d", round, i)
				err := stores[i%3].Create(ctx, storetest.NewRecord(id, "c1", "a", "b", i), limit)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					ok = append(ok, id)
				case !errors.Is(err, store.ErrLimit):
					t.Errorf("create %s: %v", id, err)
				}
			})
		}
		close(start)
		wg.Wait()
		slices.Sort(ok)
		return ok
	}
	first := race(0)
	require.Len(t, first, limit)
	// Two end, on two stores: two slots free, and only two.
	for i, id := range first[:2] {
		_, err := stores[i].Update(ctx, id, func(r *store.Record) error {
			r.Task.Status.State = wire.StateCompleted
			return nil
		})
		require.NoError(t, err)
	}
	second := race(1)
	assert.Len(t, second, 2)
	n, err := stores[2].OpenCount(ctx)
	require.NoError(t, err)
	assert.Equal(t, limit, n)
	open, _, err := stores[1].List(ctx, store.Query{Instance: "a", OpenOnly: true})
	require.NoError(t, err)
	assert.Len(t, open, limit)
}

// Two brokers create the same keyed send at once, each under its own
// task id: one creates, the other is told the key is taken, and finds
// the winner by it.
func testKeyedCreatesRace(t *testing.T, c *cluster) {
	ctx := ctxT(t)
	p := c.prefix(t)
	a, b := c.open(t, 0, p), c.open(t, 1, p)
	for i := range 20 {
		key := fmt.Sprint("msg-", i)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for j, s := range []*jsstore.Store{a, b} {
			wg.Go(func() {
				<-start
				errs[j] = s.Create(ctx, storetest.WithSendKey(storetest.NewRecord(fmt.Sprintf("t%d-%d", i, j), "c1", "req", "asg", i), key, "d"), 0)
			})
		}
		close(start)
		wg.Wait()
		won := slices.IndexFunc(errs, func(err error) bool { return err == nil })
		require.NotEqual(t, -1, won, "key %s: neither create won: %v", key, errs)
		lost := 1 - won
		require.ErrorIs(t, errs[lost], jsstore.ErrSendKeyTaken, "key %s", key)
		require.ErrorIs(t, errs[lost], store.ErrExists)
		got, err := []*jsstore.Store{a, b}[lost].FindSend(ctx, "req", key)
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprintf("t%d-%d", i, won), got.Task.ID)
		_, err = a.Get(ctx, fmt.Sprintf("t%d-%d", i, lost))
		assert.ErrorIs(t, err, store.ErrNotFound, "the losing create left no task")
	}
	n, err := a.OpenCount(ctx)
	require.NoError(t, err)
	assert.Equal(t, 20, n, "the losing creates took no slot")
}

// Three brokers prune at once while a fourth caller reopens old
// terminal tasks: each task pruned is counted by one prune, a task
// reopened is never deleted (its update wins, or finds it gone), and
// retention keeps the newest terminal tasks.
func testConcurrentPrunes(t *testing.T, c *cluster) {
	ctx := ctxT(t)
	p := c.prefix(t)
	stores := []*jsstore.Store{c.open(t, 0, p), c.open(t, 1, p), c.open(t, 2, p)}
	const tasks, keep = 60, 10
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range tasks {
		r := storetest.NewRecord(fmt.Sprintf("t%02d", i), "c", "a", "b", i)
		r.Task.Status.State = wire.StateCompleted
		r.Task.UpdatedAt = wire.NewTime(base.Add(time.Duration(i) * time.Minute))
		require.NoError(t, stores[i%3].Create(ctx, r, 0))
	}
	var pruned atomic.Int64
	reopened := map[string]bool{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, s := range stores {
		wg.Go(func() {
			<-start
			n, err := s.Prune(ctx, store.Retention{MaxTerminal: keep}, base.Add(time.Hour))
			assert.NoError(t, err)
			pruned.Add(int64(n))
		})
	}
	var gone atomic.Int64
	wg.Go(func() {
		<-start
		// From the moment the prunes have begun deleting, every other
		// task from the oldest: some are pruned first, some reopened.
		for {
			_, err := stores[1].Get(ctx, "t00")
			if errors.Is(err, store.ErrNotFound) {
				break
			}
			if !assert.NoError(t, err) {
				return
			}
		}
		for i := 0; i < tasks-keep; i += 2 {
			id := fmt.Sprintf("t%02d", i)
			_, err := stores[i%3].Update(ctx, id, func(r *store.Record) error {
				r.Task.Status.State = wire.StateWorking
				return nil
			})
			if err == nil {
				reopened[id] = true
				continue
			}
			assert.ErrorIs(t, err, store.ErrNotFound, "reopen %s", id)
			gone.Add(1)
		}
	})
	close(start)
	wg.Wait()
	left, _, err := stores[0].List(ctx, store.Query{})
	require.NoError(t, err)
	assert.Equal(t, int64(tasks-len(left)), pruned.Load(), "each deleted task is counted once")
	there := map[string]bool{}
	ended := 0
	for _, r := range left {
		there[r.Task.ID] = true
		if r.Task.Status.State.Terminal() {
			ended++
		}
	}
	for id := range reopened {
		assert.True(t, there[id], "reopened task %s was deleted", id)
	}
	assert.Equal(t, keep, ended, "the newest terminal tasks are kept")
	for i := tasks - keep; i < tasks; i++ {
		assert.True(t, there[fmt.Sprintf("t%02d", i)])
	}
	t.Logf("%d reopened before their prune, %d pruned before their reopen", len(reopened), gone.Load())
}

// An ended task changed again moves in the terminal index, and Prune
// right after counts it once, at its new time.
func testPruneAfterAnEndedTaskChanged(t *testing.T, c *cluster) {
	ctx := ctxT(t)
	s := c.open(t, 0, c.prefix(t))
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, id := range []string{"a", "b", "c"} {
		r := storetest.NewRecord(id, "s", "x", "y", i)
		r.Task.Status.State = wire.StateCompleted
		r.Task.UpdatedAt = wire.NewTime(base.Add(time.Duration(i) * time.Minute))
		require.NoError(t, s.Create(ctx, r, 0))
	}
	_, err := s.Update(ctx, "c", func(r *store.Record) error {
		r.Task.UpdatedAt = wire.NewTime(base.Add(time.Hour))
		return nil
	})
	require.NoError(t, err)
	n, err := s.Prune(ctx, store.Retention{MaxTerminal: 2}, base.Add(2*time.Hour))
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	rs, _, err := s.List(ctx, store.Query{})
	require.NoError(t, err)
	var ids []string
	for _, r := range rs {
		ids = append(ids, r.Task.ID)
	}
	assert.Equal(t, []string{"b", "c"}, ids)
}

// Close under concurrent creates: each create either fails with
// ErrClosed or is there for a store opened afterwards, and nothing is
// there that was reported failed.
func testCloseUnderLoad(t *testing.T, c *cluster) {
	for round := range 3 {
		p := c.prefix(t)
		s := c.open(t, round%3, p)
		var wg sync.WaitGroup
		var mu sync.Mutex
		acked := map[string]bool{}
		started := make(chan struct{}, 100)
		for i := range 100 {
			wg.Go(func() {
				id := fmt.Sprintf("t%03d", i)
				started <- struct{}{}
				err := s.Create(context.Background(), storetest.NewRecord(id, "c", "a", "b", i), 0)
				if err == nil {
					mu.Lock()
					acked[id] = true
					mu.Unlock()
					return
				}
				assert.ErrorIs(t, err, store.ErrClosed)
			})
		}
		for range 30 + round*20 {
			<-started
		}
		require.NoError(t, s.Close())
		wg.Wait()
		require.NoError(t, s.Close())
		rs, _, err := c.open(t, (round+1)%3, p).List(ctxT(t), store.Query{})
		require.NoError(t, err)
		there := map[string]bool{}
		for _, r := range rs {
			there[r.Task.ID] = true
		}
		assert.Equal(t, acked, there, "round %d: the tasks there are those acknowledged", round)
	}
}

// A stream of creates and updates from stores on all three nodes goes
// on while the node leading the tasks bucket is killed with SIGKILL and
// restarted: every change acknowledged is there afterwards, once, and
// the two nodes left go on acknowledging changes.
func testKillANodeUnderLoad(t *testing.T, c *cluster) {
	p := c.prefix(t)
	stores := []*jsstore.Store{c.open(t, 0, p), c.open(t, 1, p), c.open(t, 2, p)}
	victim := c.leader(t, p)
	type task struct {
		mu      sync.Mutex
		updates []string // acknowledged
		failed  int
	}
	var (
		mu        sync.Mutex
		created   = map[string]*task{}
		failures  atomic.Int64
		afterKill atomic.Int64
		killed    atomic.Bool
	)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	const workers = 6
	for w := range workers {
		wg.Go(func() {
			s := stores[w%3]
			var mine []string
			for i := 0; ctx.Err() == nil; i++ {
				if i%3 == 0 || len(mine) == 0 {
					id := fmt.Sprintf("w%d-%04d", w, i)
					err := s.Create(context.Background(), storetest.NewRecord(id, fmt.Sprint("c", w), "a", "b", i), 0)
					if err != nil {
						failures.Add(1)
						continue
					}
					mu.Lock()
					created[id] = &task{}
					mu.Unlock()
					mine = append(mine, id)
				} else {
					id := mine[i%len(mine)]
					mu.Lock()
					tk := created[id]
					mu.Unlock()
					u := fmt.Sprintf("u%d-%d", w, i)
					_, err := s.Update(context.Background(), id, func(r *store.Record) error { appendMsg(r, u); return nil })
					tk.mu.Lock()
					if err != nil {
						tk.failed++
						failures.Add(1)
					} else {
						tk.updates = append(tk.updates, u)
					}
					tk.mu.Unlock()
					if err != nil {
						continue
					}
				}
				if killed.Load() {
					afterKill.Add(1)
				}
			}
		})
	}
	acked := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(created)
	}
	require.Eventually(t, func() bool { return acked() >= 30 }, 60*time.Second, 5*time.Millisecond)
	c.Kill(victim)
	killed.Store(true)
	require.Eventually(t, func() bool { return afterKill.Load() >= 50 }, 60*time.Second, 5*time.Millisecond,
		"the two nodes left acknowledge changes")
	c.Restart(victim)
	c.WaitHealthy(context.Background(), victim)
	more := afterKill.Load() + 30
	require.Eventually(t, func() bool { return afterKill.Load() >= more }, 60*time.Second, 5*time.Millisecond)
	stop()
	wg.Wait()
	t.Logf("%d tasks created, %d changes after the kill, %d calls failed", acked(), afterKill.Load(), failures.Load())

	// A store on the restarted node reads everything acknowledged.
	check := c.open(t, victim, p)
	rctx := ctxT(t)
	for id, tk := range created {
		got, err := check.Get(rctx, id)
		require.NoError(t, err, "acknowledged task %s", id)
		ids := historyIDs(got)
		for _, u := range tk.updates {
			require.Contains(t, ids, u, "task %s: acknowledged update %s", id, u)
		}
		// Unacknowledged updates may be there or not, but each once.
		require.LessOrEqual(t, len(ids), 1+len(tk.updates)+tk.failed, "task %s", id)
		sorted := slices.Clone(ids)
		slices.Sort(sorted)
		require.Len(t, slices.Compact(sorted), len(ids), "task %s: an update made twice", id)
	}
	rs, more2, err := check.List(rctx, store.Query{Limit: 1 << 20})
	require.NoError(t, err)
	require.False(t, more2)
	for _, r := range rs {
		_, ok := created[r.Task.ID]
		if !ok {
			// A create that failed may have been stored; never a stray.
			require.Regexp(t, `^w\d-\d{4}$`, r.Task.ID)
		}
	}
	n, err := check.OpenCount(rctx)
	require.NoError(t, err)
	assert.Equal(t, len(rs), n, "the session counts match the open tasks")
}
