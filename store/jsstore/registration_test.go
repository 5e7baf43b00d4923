package jsstore_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/store/jsstore"
	"github.com/a2a-bus/a2a-bus/store/storetest"
)

// A registration written at a revision is written only if the stored one
// is still that one (none, for 0), whichever node read and whichever
// writes.
func testRegistrationWrittenOnlyAsRead(t *testing.T, c *cluster) {
	ctx := ctxT(t)
	p := c.prefix(t)
	a, b := c.open(t, 0, p), c.open(t, 1, p)
	first := storetest.NewRegistration("inst", "chat-1", "planner")
	second := storetest.NewRegistration("inst", "chat-1", "planner-2")
	third := storetest.NewRegistration("inst", "chat-1", "planner-3")

	_, rev, err := a.RegistrationRev(ctx, "inst")
	require.ErrorIs(t, err, store.ErrNotFound)
	require.Zero(t, rev)
	require.NoError(t, a.PutRegistrationAt(ctx, first, 0))
	require.ErrorIs(t, b.PutRegistrationAt(ctx, second, 0), store.ErrChanged, "a create over a stored registration")
	got, r1, err := b.RegistrationRev(ctx, "inst")
	require.NoError(t, err)
	assert.Equal(t, "planner", got.AgentID)
	require.NotZero(t, r1)

	require.NoError(t, b.PutRegistrationAt(ctx, second, r1))
	require.ErrorIs(t, a.PutRegistrationAt(ctx, third, r1), store.ErrChanged, "a write at a revision replaced since")
	require.ErrorIs(t, a.DeleteRegistrationAt(ctx, "inst", r1), store.ErrChanged, "a delete at a revision replaced since")
	got, r2, err := a.RegistrationRev(ctx, "inst")
	require.NoError(t, err)
	assert.Equal(t, "planner-2", got.AgentID)
	assert.Greater(t, r2, r1)

	require.NoError(t, a.DeleteRegistrationAt(ctx, "inst", r2))
	_, _, err = b.RegistrationRev(ctx, "inst")
	require.ErrorIs(t, err, store.ErrNotFound)
	require.ErrorIs(t, b.DeleteRegistrationAt(ctx, "inst", r2), store.ErrChanged, "a delete of what is gone")
	// Absent again (a removal marker on the key): a create is stored.
	require.NoError(t, b.PutRegistrationAt(ctx, third, 0))
	got, _, err = a.RegistrationRev(ctx, "inst")
	require.NoError(t, err)
	assert.Equal(t, "planner-3", got.AgentID)
}

// Stores on three nodes write one registration at once, each at the
// revision they all read: exactly one write is stored each round, and
// the others are store.ErrChanged.
func testRacingRegistrationWrites(t *testing.T, c *cluster) {
	ctx := ctxT(t)
	p := c.prefix(t)
	stores := []*jsstore.Store{c.open(t, 0, p), c.open(t, 1, p), c.open(t, 2, p)}
	const rounds, writers = 15, 6
	for round := range rounds {
		// None in the first round, and after a round a delete won: the
		// writes then race to create it.
		_, rev, err := stores[round%3].RegistrationRev(ctx, "inst")
		if err != nil {
			require.ErrorIs(t, err, store.ErrNotFound)
		}
		errs := make([]error, writers)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range writers {
			wg.Go(func() {
				<-start
				reg := storetest.NewRegistration("inst", "chat", fmt.Sprintf("r%d-w%d", round, i))
				if round%3 == 2 {
					// Every third round, deletes race the writes.
					if i%2 == 1 {
						errs[i] = stores[i%3].DeleteRegistrationAt(ctx, "inst", rev)
						return
					}
				}
				errs[i] = stores[i%3].PutRegistrationAt(ctx, reg, rev)
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			if err == nil {
				require.Equal(t, -1, winner, "round %d: writes %d and %d both stored", round, winner, i)
				winner = i
				continue
			}
			require.ErrorIs(t, err, store.ErrChanged, "round %d write %d", round, i)
		}
		require.NotEqual(t, -1, winner, "round %d: no write stored", round)
		got, _, err := stores[(round+1)%3].RegistrationRev(ctx, "inst")
		if round%3 == 2 && winner%2 == 1 {
			require.ErrorIs(t, err, store.ErrNotFound, "round %d: the delete won", round)
			continue
		}
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprintf("r%d-w%d", round, winner), got.AgentID, "round %d", round)
	}
}
