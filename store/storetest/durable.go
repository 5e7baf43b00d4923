package storetest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/wire"
)

// Durable is a store that keeps its tasks in a directory: the second
// part of the suite, for durable stores.
type Durable struct {
	// Open opens the store in dir, creating it when there is none.
	Open func(t *testing.T, dir string) store.Tasks
	// Queued reports how many changes wait for the store's committer.
	Queued func(s store.Tasks) int
	// Hold keeps the store's committer busy until release, so that the
	// changes made meanwhile queue for it.
	Hold func(s store.Tasks) (release func())
	// CutShort leaves in dir what a first start killed mid-way leaves,
	// and returns its path.
	CutShort func(t *testing.T, dir string) string
}

// RunDurable runs the durable part of the suite: what a store keeps
// across a close and an open, and how its commits share.
func RunDurable(t *testing.T, d Durable) {
	t.Run("ChangesSurviveReopening", func(t *testing.T) { testReopen(t, d) })
	t.Run("CloseNeverDropsAnAcknowledgedChange", func(t *testing.T) { testCloseUnderLoad(t, d) })
	t.Run("PruneSeesItsSharedCommit", func(t *testing.T) { testPruneShared(t, d) })
	t.Run("AFirstStartCutShortLeavesNoStore", func(t *testing.T) { testCutShort(t, d) })
}

// testCutShort: a store is made under another name and put in place
// whole, so a first start killed mid-way leaves no store to refuse, only
// a leftover that the next start removes.
func testCutShort(t *testing.T, d Durable) {
	dir := t.TempDir()
	leftover := d.CutShort(t, dir)
	s := d.Open(t, dir)
	require.NoError(t, s.Create(ctx(), NewRecord("t1", "c", "a", "b", 0), 0))
	require.NoError(t, s.Close())
	_, err := os.Stat(leftover)
	assert.ErrorIs(t, err, os.ErrNotExist)
	s = d.Open(t, dir)
	defer s.Close()
	_, err = s.Get(ctx(), "t1")
	assert.NoError(t, err)
}

func testReopen(t *testing.T, d Durable) {
	dir := t.TempDir()
	s := d.Open(t, dir)
	require.NoError(t, s.Create(ctx(), NewRecord("t1", "c1", "a", "b", 0), 2))
	require.NoError(t, s.Create(ctx(), WithSendKey(NewRecord("t2", "c1", "a", "b", 1), "m2", "d2"), 2))
	_, err := s.Update(ctx(), "t1", func(r *store.Record) error {
		r.Task.Status.State = wire.StateCompleted
		r.Apply("a", "k1", "d1")
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, s.Close())

	s = d.Open(t, dir)
	defer s.Close()
	got, err := s.Get(ctx(), "t1")
	require.NoError(t, err)
	assert.Equal(t, wire.StateCompleted, got.Task.Status.State)
	assert.Equal(t, []store.Applied{{By: "a", Key: "k1", Digest: "d1"}}, got.Applied, "idempotency keys survive")
	got, err = s.FindSend(ctx(), "a", "m2")
	require.NoError(t, err, "the send index survives")
	assert.Equal(t, "t2", got.Task.ID)
	open, _, err := s.List(ctx(), store.Query{OpenOnly: true})
	require.NoError(t, err)
	require.Len(t, open, 1)
	assert.Equal(t, "t2", open[0].Task.ID)
	// The open-task count came back too: one slot of two is free.
	require.NoError(t, s.Create(ctx(), NewRecord("t3", "c1", "a", "b", 2), 2))
	assert.ErrorIs(t, s.Create(ctx(), NewRecord("t4", "c1", "a", "b", 3), 2), store.ErrLimit)
}

// testCloseUnderLoad closes the store under 300 concurrent creates: each
// either fails with ErrClosed or is on disk after a reopen, and the
// store holds nothing that was reported as failed.
func testCloseUnderLoad(t *testing.T, d Durable) {
	for round := range 10 {
		dir := t.TempDir()
		s := d.Open(t, dir)
		var wg sync.WaitGroup
		var mu sync.Mutex
		acked := map[string]bool{}
		started := make(chan struct{}, 300)
		for i := range 300 {
			wg.Go(func() {
				id := fmt.Sprint("t", i)
				started <- struct{}{}
				err := s.Create(context.Background(), NewRecord(id, "c", "a", "b", i), 0)
				if err == nil {
					mu.Lock()
					acked[id] = true
					mu.Unlock()
					return
				}
				assert.ErrorIs(t, err, store.ErrClosed)
			})
		}
		for range 100 + round*20 {
			<-started
		}
		require.NoError(t, s.Close())
		wg.Wait()
		require.NoError(t, s.Close())
		s = d.Open(t, dir)
		rs, _, err := s.List(context.Background(), store.Query{})
		require.NoError(t, err)
		require.NoError(t, s.Close())
		onDisk := map[string]bool{}
		for _, r := range rs {
			onDisk[r.Task.ID] = true
		}
		for id := range acked {
			require.True(t, onDisk[id], "round %d: acknowledged %s is not on disk", round, id)
		}
		assert.Equal(t, len(acked), len(onDisk), "round %d: a change on disk was reported as failed", round)
	}
}

// testPruneShared queues two prunes and an update that ends a task
// behind a busy commit, so that they share the next: retention still
// keeps exactly its bound.
func testPruneShared(t *testing.T, d Durable) {
	s := d.Open(t, t.TempDir())
	defer s.Close()
	for i := range 11 {
		r := NewRecord(fmt.Sprint("t", i), "c", "a", "b", i)
		if i < 10 {
			r.Task.Status.State = wire.StateCompleted
		}
		require.NoError(t, s.Create(ctx(), r, 0))
	}
	release := hold(t, d, s)
	var wg sync.WaitGroup
	wg.Go(func() {
		_, err := s.Update(ctx(), "t10", func(r *store.Record) error { r.Task.Status.State = wire.StateCompleted; return nil })
		assert.NoError(t, err)
	})
	for range 2 {
		wg.Go(func() {
			_, err := s.Prune(ctx(), store.Retention{MaxTerminal: 5}, time.Now())
			assert.NoError(t, err)
		})
	}
	// They queue behind the busy commit: three changes wait for it.
	require.Eventually(t, func() bool { return d.Queued(s) == 3 }, 10*time.Second, time.Millisecond)
	release()
	wg.Wait()
	_, err := s.Prune(ctx(), store.Retention{MaxTerminal: 5}, time.Now())
	require.NoError(t, err)
	rs, _, err := s.List(ctx(), store.Query{State: wire.StateCompleted})
	require.NoError(t, err)
	assert.Len(t, rs, 5, "retention keeps exactly five terminal tasks")
}

// hold keeps the committer of s busy until release (Durable.Hold).
func hold(t *testing.T, d Durable, s store.Tasks) (release func()) {
	require.NotNil(t, d.Hold, "storetest.Durable.Hold is required")
	return d.Hold(s)
}
