package pebblestore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/store/boltstore"
	"github.com/a2a-bus/a2a-bus/store/pebblestore"
	"github.com/a2a-bus/a2a-bus/store/storetest"
	"github.com/a2a-bus/a2a-bus/wire"
)

// TestAnEarlierStoreIsMigrated: a data dir written by the bbolt store
// opens with every task, index and count, once.
func TestAnEarlierStoreIsMigrated(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	old, err := boltstore.Open(dir, boltstore.Options{})
	require.NoError(t, err)
	for i := range 30 {
		rec := storetest.NewRecord(fmt.Sprintf("t%03d", i), fmt.Sprint("c", i%3), "req", "asg", i)
		if i%2 == 0 {
			rec.Task.Status.State = wire.StateCompleted
		}
		require.NoError(t, old.Create(ctx, rec, 0))
	}
	want, _, err := old.List(ctx, store.Query{})
	require.NoError(t, err)
	require.NoError(t, old.Close())

	s := open(t, dir)
	got, _, err := s.List(ctx, store.Query{})
	require.NoError(t, err)
	assert.Equal(t, want, got)
	n, err := s.OpenCount(ctx)
	require.NoError(t, err)
	assert.Equal(t, 15, n)
	mine, _, err := s.List(ctx, store.Query{Instance: "asg", Role: store.Assignee, OpenOnly: true})
	require.NoError(t, err)
	assert.Len(t, mine, 15)
	// The per-session counts came over: c0 has 5 open tasks.
	assert.ErrorIs(t, s.Create(ctx, storetest.NewRecord("t999", "c0", "req", "asg", 999), 5), store.ErrLimit)
	require.NoError(t, s.Close())

	_, err = os.Stat(filepath.Join(dir, boltstore.FileName))
	assert.ErrorIs(t, err, os.ErrNotExist, "the old file is set aside")
	_, err = os.Stat(filepath.Join(dir, boltstore.FileName+pebblestore.MigratedSuffix))
	assert.NoError(t, err)
	s = open(t, dir) // and not migrated again
	defer s.Close()
	got, _, err = s.List(ctx, store.Query{})
	require.NoError(t, err)
	assert.Len(t, got, 30)
}

// TestADamagedEarlierStoreStopsTheMigration: the bbolt file's checks
// still hold: an emptied tasks.db is a loss, and nothing is migrated.
func TestADamagedEarlierStoreStopsTheMigration(t *testing.T) {
	dir := t.TempDir()
	old, err := boltstore.Open(dir, boltstore.Options{})
	require.NoError(t, err)
	require.NoError(t, old.Create(context.Background(), storetest.NewRecord("t1", "c", "a", "b", 0), 0))
	require.NoError(t, old.Close())
	require.NoError(t, os.Truncate(filepath.Join(dir, boltstore.FileName), 0))
	_, err = pebblestore.Open(dir, pebblestore.Options{})
	require.ErrorIs(t, err, boltstore.ErrDataLoss)
	_, err = os.Stat(filepath.Join(dir, pebblestore.DirName))
	assert.ErrorIs(t, err, os.ErrNotExist, "no new store")
}
