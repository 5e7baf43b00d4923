// Package storetest is the conformance suite every store.Tasks passes:
// the in-memory store and the durable one run the same tests.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/wire"
)

// Run runs the suite. newStore returns a new, empty store; the suite
// closes it.
func Run(t *testing.T, newStore func(t *testing.T) store.Tasks) {
	tests := []struct {
		name string
		fn   func(*testing.T, store.Tasks)
	}{
		{"CreateThenGetReturnsTheTask", testCreateGet},
		{"CreateTwiceIsErrExists", testCreateExists},
		{"GetUnknownIsErrNotFound", testGetUnknown},
		{"CreateStopsAtTheOpenLimitPerContext", testLimit},
		{"TerminalTasksFreeTheirSlot", testLimitFreed},
		{"UpdateAppliesAndReturnsTheResult", testUpdate},
		{"UpdateErrorChangesNothing", testUpdateAbort},
		{"UpdateUnknownIsErrNotFound", testUpdateUnknown},
		{"ConcurrentUpdatesAreAtomic", testConcurrentUpdates},
		{"ConcurrentCreatesRespectTheLimit", testConcurrentLimit},
		{"ListSelectsByInstanceRoleAndState", testList},
		{"ListIsInIDOrder", testListOrder},
		{"ListPagesFollowEachOther", testListPages},
		{"ListPageStopsAtMaxBytes", testListMaxBytes},
		{"OpenCountCountsOpenTasks", testOpenCount},
		{"ReturnedRecordsAreCopies", testCopies},
		{"PruneKeepsOpenTasksAndTheNewestTerminal", testPrune},
		{"CloseIsIdempotentAndEndsUse", testClose},
		{"FindSendFindsATaskByItsRequesterAndKey", testFindSend},
		{"FindSendForgetsAPrunedTask", testFindSendPruned},
		{"AppliedKeysAreKeptWithTheTaskAndBoundedPerMember", testApplied},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			t.Cleanup(func() { s.Close() })
			tc.fn(t, s)
		})
	}
}

var base = time.Date(2026, 9, 5, 12, 0, 0, 0, time.UTC)

// NewRecord returns an open task between two instances, created at
// base+n ms; the suite's fixtures.
func NewRecord(id, contextID, requester, assignee string, n int) *store.Record {
	at := wire.NewTime(base.Add(time.Duration(n) * time.Millisecond))
	text := "hello " + id
	return &store.Record{
		Task: wire.Task{
			ID:             id,
			ContextID:      contextID,
			RequesterName:  requester + "-name",
			AgentName:      assignee + "-name",
			AgentContextID: "ctx-" + assignee,
			Status:         wire.TaskStatus{State: wire.StateSubmitted, Timestamp: at},
			History: []wire.Message{{
				MessageID: "m-" + id, Role: wire.RoleUser, From: requester + "-name",
				TaskID: id, ContextID: contextID,
				Parts: []wire.Part{{Kind: wire.KindText, Text: &text}},
			}},
			Artifacts: []wire.Artifact{},
			CreatedAt: at,
			UpdatedAt: at,
		},
		RequesterInstance: requester,
		AssigneeInstance:  assignee,
	}
}

func ctx() context.Context { return context.Background() }

func testCreateGet(t *testing.T, s store.Tasks) {
	rec := NewRecord("t1", "c1", "a", "b", 0)
	require.NoError(t, s.Create(ctx(), rec, 0))
	got, err := s.Get(ctx(), "t1")
	require.NoError(t, err)
	assert.Equal(t, rec.Task.ID, got.Task.ID)
	assert.Equal(t, rec.RequesterInstance, got.RequesterInstance)
	assert.Equal(t, rec.AssigneeInstance, got.AssigneeInstance)
	assert.Equal(t, rec.Task.Status.State, got.Task.Status.State)
	assert.True(t, rec.Task.CreatedAt.Equal(got.Task.CreatedAt.Time))
	require.Len(t, got.Task.History, 1)
	assert.Equal(t, "hello t1", *got.Task.History[0].Parts[0].Text)
}

func testCreateExists(t *testing.T, s store.Tasks) {
	require.NoError(t, s.Create(ctx(), NewRecord("t1", "c1", "a", "b", 0), 0))
	err := s.Create(ctx(), NewRecord("t1", "c1", "a", "b", 1), 0)
	assert.ErrorIs(t, err, store.ErrExists)
}

func testGetUnknown(t *testing.T, s store.Tasks) {
	_, err := s.Get(ctx(), "nope")
	assert.ErrorIs(t, err, store.ErrNotFound)
}

func testLimit(t *testing.T, s store.Tasks) {
	for i := range 3 {
		require.NoError(t, s.Create(ctx(), NewRecord(fmt.Sprint("t", i), "c1", "a", "b", i), 3))
	}
	assert.ErrorIs(t, s.Create(ctx(), NewRecord("t3", "c1", "a", "b", 3), 3), store.ErrLimit)
	// Another session has its own count.
	assert.NoError(t, s.Create(ctx(), NewRecord("t4", "c2", "a", "b", 4), 3))
	// No limit at all.
	assert.NoError(t, s.Create(ctx(), NewRecord("t5", "c1", "a", "b", 5), 0))
}

func testLimitFreed(t *testing.T, s store.Tasks) {
	require.NoError(t, s.Create(ctx(), NewRecord("t1", "c1", "a", "b", 0), 1))
	require.ErrorIs(t, s.Create(ctx(), NewRecord("t2", "c1", "a", "b", 1), 1), store.ErrLimit)
	_, err := s.Update(ctx(), "t1", func(r *store.Record) error {
		r.Task.Status.State = wire.StateCompleted
		return nil
	})
	require.NoError(t, err)
	assert.NoError(t, s.Create(ctx(), NewRecord("t2", "c1", "a", "b", 1), 1))
}

func testUpdate(t *testing.T, s store.Tasks) {
	require.NoError(t, s.Create(ctx(), NewRecord("t1", "c1", "a", "b", 0), 0))
	got, err := s.Update(ctx(), "t1", func(r *store.Record) error {
		r.Task.Status.State = wire.StateWorking
		r.Task.History = append(r.Task.History, wire.Message{MessageID: "m2", Parts: []wire.Part{wire.TextPart("more")}})
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, wire.StateWorking, got.Task.Status.State)
	again, err := s.Get(ctx(), "t1")
	require.NoError(t, err)
	assert.Equal(t, wire.StateWorking, again.Task.Status.State)
	assert.Len(t, again.Task.History, 2)
}

func testUpdateAbort(t *testing.T, s store.Tasks) {
	require.NoError(t, s.Create(ctx(), NewRecord("t1", "c1", "a", "b", 0), 0))
	boom := errors.New("boom")
	_, err := s.Update(ctx(), "t1", func(r *store.Record) error {
		r.Task.Status.State = wire.StateFailed
		return boom
	})
	assert.ErrorIs(t, err, boom)
	got, err := s.Get(ctx(), "t1")
	require.NoError(t, err)
	assert.Equal(t, wire.StateSubmitted, got.Task.Status.State)
}

func testUpdateUnknown(t *testing.T, s store.Tasks) {
	_, err := s.Update(ctx(), "nope", func(*store.Record) error { return nil })
	assert.ErrorIs(t, err, store.ErrNotFound)
}

func testConcurrentUpdates(t *testing.T, s store.Tasks) {
	require.NoError(t, s.Create(ctx(), NewRecord("t1", "c1", "a", "b", 0), 0))
	const n = 50
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, err := s.Update(ctx(), "t1", func(r *store.Record) error {
				r.Task.History = append(r.Task.History, wire.Message{MessageID: fmt.Sprint("m", i), Parts: []wire.Part{wire.TextPart("x")}})
				return nil
			})
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	got, err := s.Get(ctx(), "t1")
	require.NoError(t, err)
	assert.Len(t, got.Task.History, n+1, "every concurrent append is kept")
}

func testConcurrentLimit(t *testing.T, s store.Tasks) {
	const limit, tries = 5, 40
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, limited := 0, 0
	for i := range tries {
		wg.Go(func() {
			err := s.Create(ctx(), NewRecord(fmt.Sprint("t", i), "c1", "a", "b", i), limit)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, store.ErrLimit):
				limited++
			default:
				t.Errorf("create: %v", err)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, limit, ok)
	assert.Equal(t, tries-limit, limited)
}

func testList(t *testing.T, s store.Tasks) {
	require.NoError(t, s.Create(ctx(), NewRecord("t1", "c1", "a", "b", 0), 0))
	require.NoError(t, s.Create(ctx(), NewRecord("t2", "c1", "b", "a", 1), 0))
	require.NoError(t, s.Create(ctx(), NewRecord("t3", "c2", "c", "b", 2), 0))
	_, err := s.Update(ctx(), "t2", func(r *store.Record) error {
		r.Task.Status.State = wire.StateCompleted
		return nil
	})
	require.NoError(t, err)
	ids := func(q store.Query) []string {
		rs, more, err := s.List(ctx(), q)
		require.NoError(t, err)
		assert.False(t, more)
		return idsOf(rs)
	}
	assert.Equal(t, []string{"t1", "t2", "t3"}, ids(store.Query{}))
	assert.Equal(t, []string{"t1", "t2"}, ids(store.Query{Instance: "a"}))
	assert.Equal(t, []string{"t1"}, ids(store.Query{Instance: "a", Role: store.Requester}))
	assert.Equal(t, []string{"t2"}, ids(store.Query{Instance: "a", Role: store.Assignee}))
	assert.Equal(t, []string{"t1", "t3"}, ids(store.Query{Instance: "b", Role: store.Assignee}))
	assert.Equal(t, []string{"t1", "t3"}, ids(store.Query{OpenOnly: true}))
	assert.Equal(t, []string{"t2"}, ids(store.Query{State: wire.StateCompleted}))
	assert.Equal(t, []string{"t3"}, ids(store.Query{Instance: "c"}))
	assert.Equal(t, []string{}, ids(store.Query{Instance: "nobody"}))
}

func idsOf(rs []*store.Record) []string {
	out := []string{}
	for _, r := range rs {
		out = append(out, r.Task.ID)
	}
	return out
}

func testListOrder(t *testing.T, s store.Tasks) {
	// Created out of id order, listed by id (the broker's ids sort in
	// creation order; the store relies on nothing else).
	require.NoError(t, s.Create(ctx(), NewRecord("t3", "c1", "a", "b", 5), 0))
	require.NoError(t, s.Create(ctx(), NewRecord("t1", "c1", "b", "a", 9), 0))
	require.NoError(t, s.Create(ctx(), NewRecord("t2", "c1", "a", "b", 5), 0))
	for _, q := range []store.Query{{Instance: "a"}, {Instance: "b"}, {}, {OpenOnly: true}} {
		rs, _, err := s.List(ctx(), q)
		require.NoError(t, err)
		assert.Equal(t, []string{"t1", "t2", "t3"}, idsOf(rs), "query %+v", q)
	}
}

// testListPages reads every query a page at a time: the pages, put
// together, are the whole list, each page says whether more follow, and
// a page starts after the id given, whether or not that task still exists.
func testListPages(t *testing.T, s store.Tasks) {
	for i := range 9 {
		req, asg := "a", "b"
		if i%3 == 1 {
			req, asg = "b", "a" // a is assignee of some, requester of others
		}
		require.NoError(t, s.Create(ctx(), NewRecord(fmt.Sprintf("t%d", i), "c1", req, asg, i), 0))
	}
	_, err := s.Update(ctx(), "t4", func(r *store.Record) error {
		r.Task.Status.State = wire.StateCompleted
		return nil
	})
	require.NoError(t, err)
	for _, q := range []store.Query{{Instance: "a"}, {Instance: "a", Role: store.Assignee}, {Instance: "a", OpenOnly: true}, {}, {OpenOnly: true}} {
		whole, more, err := s.List(ctx(), q)
		require.NoError(t, err)
		require.False(t, more)
		for _, limit := range []int{1, 2, 4, 100} {
			var got []string
			page := q
			page.Limit = limit
			for n := 0; ; n++ {
				require.Less(t, n, 20, "paging does not end")
				rs, more, err := s.List(ctx(), page)
				require.NoError(t, err)
				assert.LessOrEqual(t, len(rs), limit)
				got = append(got, idsOf(rs)...)
				if !more {
					break
				}
				require.NotEmpty(t, rs, "more with an empty page")
				page.After = rs[len(rs)-1].Task.ID
			}
			assert.Equal(t, idsOf(whole), got, "query %+v by pages of %d", q, limit)
		}
	}
	// After an id that is not stored: the next ones in order.
	rs, _, err := s.List(ctx(), store.Query{Instance: "a", After: "t55"})
	require.NoError(t, err)
	assert.Equal(t, []string{"t6", "t7", "t8"}, idsOf(rs))
	rs, more, err := s.List(ctx(), store.Query{Instance: "a", After: "t8"})
	require.NoError(t, err)
	assert.Empty(t, rs)
	assert.False(t, more)
}

func testListMaxBytes(t *testing.T, s store.Tasks) {
	for i := range 5 {
		rec := NewRecord(fmt.Sprintf("t%d", i), "c1", "a", "b", i)
		text := strings.Repeat("x", 10_000*(i+1))
		rec.Task.History[0].Parts[0].Text = &text
		rec.Size = len(text) + 500 // as the broker counts it
		require.NoError(t, s.Create(ctx(), rec, 0))
	}
	// About 10k + 20k fit 35k; 30k more would not.
	rs, more, err := s.List(ctx(), store.Query{Instance: "a", MaxBytes: 35_000})
	require.NoError(t, err)
	assert.Equal(t, []string{"t0", "t1"}, idsOf(rs))
	assert.True(t, more)
	// The first task of a page is returned whatever its size.
	rs, more, err = s.List(ctx(), store.Query{Instance: "a", After: "t3", MaxBytes: 1})
	require.NoError(t, err)
	assert.Equal(t, []string{"t4"}, idsOf(rs))
	assert.False(t, more)
}

func testOpenCount(t *testing.T, s store.Tasks) {
	n, err := s.OpenCount(ctx())
	require.NoError(t, err)
	assert.Zero(t, n)
	for i := range 4 {
		require.NoError(t, s.Create(ctx(), NewRecord(fmt.Sprintf("t%d", i), fmt.Sprintf("c%d", i%2), "a", "b", i), 0))
	}
	_, err = s.Update(ctx(), "t1", func(r *store.Record) error {
		r.Task.Status.State = wire.StateFailed
		return nil
	})
	require.NoError(t, err)
	n, err = s.OpenCount(ctx())
	require.NoError(t, err)
	assert.Equal(t, 3, n)
}

func testCopies(t *testing.T, s store.Tasks) {
	rec := NewRecord("t1", "c1", "a", "b", 0)
	require.NoError(t, s.Create(ctx(), rec, 0))
	rec.Task.Status.State = wire.StateFailed // the caller's copy, not the store's
	got, err := s.Get(ctx(), "t1")
	require.NoError(t, err)
	assert.Equal(t, wire.StateSubmitted, got.Task.Status.State)
	got.Task.History = append(got.Task.History, wire.Message{MessageID: "x"})
	got.Task.Status.State = wire.StateFailed
	*got.Task.History[0].Parts[0].Text = "tampered"
	got.Task.History[0].Parts[0] = wire.TextPart("replaced")
	again, err := s.Get(ctx(), "t1")
	require.NoError(t, err)
	assert.Len(t, again.Task.History, 1)
	assert.Equal(t, wire.StateSubmitted, again.Task.Status.State)
	assert.Equal(t, "hello t1", *again.Task.History[0].Parts[0].Text, "nested parts are copies too")
	// An update that changes nested data and then fails changes nothing.
	_, err = s.Update(ctx(), "t1", func(r *store.Record) error {
		*r.Task.History[0].Parts[0].Text = "half-done"
		return errors.New("abort")
	})
	require.Error(t, err)
	again, err = s.Get(ctx(), "t1")
	require.NoError(t, err)
	assert.Equal(t, "hello t1", *again.Task.History[0].Parts[0].Text)
}

func testClose(t *testing.T, s store.Tasks) {
	require.NoError(t, s.Create(ctx(), NewRecord("t1", "c1", "a", "b", 0), 0))
	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
	_, err := s.Get(ctx(), "t1")
	assert.ErrorIs(t, err, store.ErrClosed)
	assert.ErrorIs(t, s.Create(ctx(), NewRecord("t2", "c1", "a", "b", 1), 0), store.ErrClosed)
	_, _, err = s.List(ctx(), store.Query{})
	assert.ErrorIs(t, err, store.ErrClosed)
	_, err = s.OpenCount(ctx())
	assert.ErrorIs(t, err, store.ErrClosed)
	_, err = s.Update(ctx(), "t1", func(*store.Record) error { return nil })
	assert.ErrorIs(t, err, store.ErrClosed)
}

func testPrune(t *testing.T, s store.Tasks) {
	// Ten tasks, updated a minute apart; the even ones end.
	for i := range 10 {
		rec := NewRecord(fmt.Sprint("t", i), "c1", "a", "b", i)
		require.NoError(t, s.Create(ctx(), rec, 0))
		if i%2 == 0 {
			_, err := s.Update(ctx(), rec.Task.ID, func(r *store.Record) error {
				r.Task.Status.State = wire.StateCompleted
				r.Task.UpdatedAt = wire.NewTime(base.Add(time.Duration(i) * time.Minute))
				return nil
			})
			require.NoError(t, err)
		}
	}
	now := base.Add(10 * time.Minute)
	n, err := s.Prune(ctx(), store.Retention{}, now)
	require.NoError(t, err)
	assert.Zero(t, n, "no bound, nothing pruned")
	// Older than 5 minutes: t0, t2, t4 (updated at 0, 2, 4 min).
	n, err = s.Prune(ctx(), store.Retention{MaxAge: 5*time.Minute + time.Second}, now)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	// At most one terminal task: t6 goes, t8 stays.
	n, err = s.Prune(ctx(), store.Retention{MaxTerminal: 1}, now)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	rs, _, err := s.List(ctx(), store.Query{})
	require.NoError(t, err)
	assert.Equal(t, []string{"t1", "t3", "t5", "t7", "t8", "t9"}, idsOf(rs), "open tasks all stay")
	rs, _, err = s.List(ctx(), store.Query{Instance: "a"})
	require.NoError(t, err)
	assert.Len(t, rs, 6, "the indexes forget pruned tasks")
	_, err = s.Get(ctx(), "t6")
	assert.ErrorIs(t, err, store.ErrNotFound)
	// Everything terminal, even a zero bound on count, never touches open tasks.
	n, err = s.Prune(ctx(), store.Retention{MaxAge: time.Nanosecond}, now.Add(time.Hour))
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	rs, _, err = s.List(ctx(), store.Query{OpenOnly: true})
	require.NoError(t, err)
	assert.Len(t, rs, 5)
}

// BenchmarkCreate measures task creations per second with the given
// number of concurrent senders, each in its own session (so the cap does
// not bind), and the p50 and p99 of one creation. newStore returns an
// empty store.
func BenchmarkCreate(b *testing.B, newStore func(b *testing.B) store.Tasks, senders int) {
	s := newStore(b)
	defer s.Close()
	var next atomic.Int64
	took := make([]time.Duration, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := range senders {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				// Ids in creation order, as the broker's are.
				rec := NewRecord(fmt.Sprintf("t%010d", i), fmt.Sprint("c", w), fmt.Sprint("r", w), "asg", int(i))
				start := time.Now()
				if err := s.Create(context.Background(), rec, 0); err != nil {
					b.Error(err)
					return
				}
				took[i-1] = time.Since(start)
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tasks/s")
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(took[len(took)*99/100].Nanoseconds())/1e3, "p99-µs")
}

// WithSendKey gives rec the send key a client's messageId makes.
func WithSendKey(rec *store.Record, key, digest string) *store.Record {
	rec.SendKey, rec.SendDigest = key, digest
	return rec
}

func testFindSend(t *testing.T, s store.Tasks) {
	require.NoError(t, s.Create(ctx(), WithSendKey(NewRecord("t1", "c1", "a", "b", 0), "m1", "d1"), 0))
	require.NoError(t, s.Create(ctx(), WithSendKey(NewRecord("t2", "c2", "b", "a", 1), "m1", "d2"), 0))
	require.NoError(t, s.Create(ctx(), NewRecord("t3", "c1", "a", "b", 2), 0))
	got, err := s.FindSend(ctx(), "a", "m1")
	require.NoError(t, err)
	assert.Equal(t, "t1", got.Task.ID)
	assert.Equal(t, "d1", got.SendDigest)
	got, err = s.FindSend(ctx(), "b", "m1")
	require.NoError(t, err)
	assert.Equal(t, "t2", got.Task.ID, "the key is per requester instance")
	for _, q := range [][2]string{{"a", "m2"}, {"c", "m1"}, {"a", ""}, {"b", "m-t3"}} {
		_, err = s.FindSend(ctx(), q[0], q[1])
		assert.ErrorIs(t, err, store.ErrNotFound, "instance %s key %s", q[0], q[1])
	}
	// An update keeps the key.
	_, err = s.Update(ctx(), "t1", func(r *store.Record) error {
		r.Task.Status.State = wire.StateWorking
		return nil
	})
	require.NoError(t, err)
	got, err = s.FindSend(ctx(), "a", "m1")
	require.NoError(t, err)
	assert.Equal(t, wire.StateWorking, got.Task.Status.State, "FindSend reads the task as it is now")
	// Nor does a list ever show the index.
	rs, _, err := s.List(ctx(), store.Query{Instance: "a"})
	require.NoError(t, err)
	assert.Equal(t, []string{"t1", "t2", "t3"}, idsOf(rs))
}

func testFindSendPruned(t *testing.T, s store.Tasks) {
	require.NoError(t, s.Create(ctx(), WithSendKey(NewRecord("t1", "c1", "a", "b", 0), "m1", "d1"), 0))
	_, err := s.Update(ctx(), "t1", func(r *store.Record) error {
		r.Task.Status.State = wire.StateCompleted
		return nil
	})
	require.NoError(t, err)
	n, err := s.Prune(ctx(), store.Retention{MaxTerminal: 0, MaxAge: time.Nanosecond}, base.Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = s.FindSend(ctx(), "a", "m1")
	assert.ErrorIs(t, err, store.ErrNotFound, "the key leaves with its task")
	// The key is free again: a new task may take it.
	require.NoError(t, s.Create(ctx(), WithSendKey(NewRecord("t2", "c1", "a", "b", 1), "m1", "d9"), 0))
	got, err := s.FindSend(ctx(), "a", "m1")
	require.NoError(t, err)
	assert.Equal(t, "t2", got.Task.ID)
}

func testApplied(t *testing.T, s store.Tasks) {
	require.NoError(t, s.Create(ctx(), NewRecord("t1", "c1", "a", "b", 0), 0))
	require.NoError(t, update(s, "t1", func(r *store.Record) { r.Apply("a", "mine", "d") }))
	for i := range store.MaxApplied + 3 {
		require.NoError(t, update(s, "t1", func(r *store.Record) { r.Apply("b", fmt.Sprint("k", i), fmt.Sprint("d", i)) }))
	}
	got, err := s.Get(ctx(), "t1")
	require.NoError(t, err)
	require.Len(t, got.Applied, store.MaxApplied+1)
	_, ok := got.FindApplied("b", "k2")
	assert.False(t, ok, "the oldest keys leave the window")
	d, ok := got.FindApplied("b", "k3")
	assert.True(t, ok)
	assert.Equal(t, "d3", d)
	d, ok = got.FindApplied("b", fmt.Sprint("k", store.MaxApplied+2))
	assert.True(t, ok)
	assert.Equal(t, fmt.Sprint("d", store.MaxApplied+2), d)
	d, ok = got.FindApplied("a", "mine")
	assert.True(t, ok, "one member's changes never push out the other's keys")
	assert.Equal(t, "d", d)
	_, ok = got.FindApplied("b", "mine")
	assert.False(t, ok, "keys are per member")
}

func update(s store.Tasks, id string, fn func(*store.Record)) error {
	_, err := s.Update(ctx(), id, func(r *store.Record) error {
		fn(r)
		return nil
	})
	return err
}

// RunUpdate runs the part of the suite that holds Update to running fn
// on the caller's goroutine, with no lock of the store held, and to
// storing its result only on the task fn was given. newStore returns a
// new, empty store; the suite closes it.
func RunUpdate(t *testing.T, newStore func(t *testing.T) store.Tasks) {
	t.Run("UpdateAppliesFnAgainToATaskChangedMeanwhile", func(t *testing.T) {
		s := newStore(t)
		t.Cleanup(func() { s.Close() })
		testUpdateAgain(t, s)
	})
}

// testUpdateAgain changes a task while an update's fn runs on it: the
// update applies fn again, to the changed task, and loses neither change.
func testUpdateAgain(t *testing.T, s store.Tasks) {
	require.NoError(t, s.Create(ctx(), NewRecord("t1", "c1", "a", "b", 0), 0))
	appendMsg := func(r *store.Record, id string) {
		r.Task.History = append(r.Task.History, wire.Message{MessageID: id, Parts: []wire.Part{wire.TextPart(id)}})
	}
	runs := 0
	got, err := s.Update(ctx(), "t1", func(r *store.Record) error {
		runs++
		if runs == 1 {
			other := make(chan error, 1)
			go func() {
				_, err := s.Update(ctx(), "t1", func(r *store.Record) error { appendMsg(r, "other"); return nil })
				other <- err
			}()
			require.NoError(t, <-other)
		}
		appendMsg(r, "mine")
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, 2, runs, "fn runs again on the task changed meanwhile")
	ids := func(r *store.Record) []string {
		var out []string
		for _, m := range r.Task.History {
			out = append(out, m.MessageID)
		}
		return out
	}
	want := []string{"m-t1", "other", "mine"}
	assert.Equal(t, want, ids(got))
	stored, err := s.Get(ctx(), "t1")
	require.NoError(t, err)
	assert.Equal(t, want, ids(stored))
}
