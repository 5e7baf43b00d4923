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

// earlierStore puts in dir a tasks.db that the bbolt store of an earlier
// version wrote (boltstore's testdata): 30 tasks, t000 to t029, as
// storetest.NewRecord makes them, in sessions c0 to c2, the even ones
// completed. It returns those tasks.
func earlierStore(t *testing.T, dir string) []*store.Record {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "boltstore", "testdata", boltstore.FileName))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, boltstore.FileName), data, 0o600))
	var want []*store.Record
	for i := range 30 {
		rec := storetest.NewRecord(fmt.Sprintf("t%03d", i), fmt.Sprint("c", i%3), "req", "asg", i)
		if i%2 == 0 {
			rec.Task.Status.State = wire.StateCompleted
		}
		want = append(want, rec)
	}
	return want
}

// TestAnEarlierStoreIsMigrated: a data dir written by the bbolt store
// opens with every task, index and count, once.
func TestAnEarlierStoreIsMigrated(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	want := earlierStore(t, dir)

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
	earlierStore(t, dir)
	require.NoError(t, os.Truncate(filepath.Join(dir, boltstore.FileName), 0))
	_, err := pebblestore.Open(dir, pebblestore.Options{})
	require.ErrorIs(t, err, boltstore.ErrDataLoss)
	_, err = os.Stat(filepath.Join(dir, pebblestore.DirName))
	assert.ErrorIs(t, err, os.ErrNotExist, "no new store")
}
