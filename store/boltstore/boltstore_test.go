package boltstore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/store/boltstore"
	"github.com/a2a-bus/a2a-bus/store/storetest"
	"github.com/a2a-bus/a2a-bus/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t *testing.T, dir string) *boltstore.Store {
	t.Helper()
	s, err := boltstore.Open(dir, boltstore.Options{})
	require.NoError(t, err)
	return s
}

func TestSuite(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return open(t, t.TempDir()) })
}

func TestChangesSurviveReopening(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	ctx := context.Background()
	require.NoError(t, s.Create(ctx, storetest.NewRecord("t1", "c1", "a", "b", 0), 2))
	require.NoError(t, s.Create(ctx, storetest.NewRecord("t2", "c1", "a", "b", 1), 2))
	_, err := s.Update(ctx, "t1", func(r *store.Record) error {
		r.Task.Status.State = wire.StateCompleted
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, s.Close())

	s = open(t, dir)
	defer s.Close()
	got, err := s.Get(ctx, "t1")
	require.NoError(t, err)
	assert.Equal(t, wire.StateCompleted, got.Task.Status.State)
	open, err := s.List(ctx, store.Query{OpenOnly: true})
	require.NoError(t, err)
	require.Len(t, open, 1)
	assert.Equal(t, "t2", open[0].Task.ID)
	// The open-task count came back too: one slot of two is free.
	require.NoError(t, s.Create(ctx, storetest.NewRecord("t3", "c1", "a", "b", 2), 2))
	assert.ErrorIs(t, s.Create(ctx, storetest.NewRecord("t4", "c1", "a", "b", 3), 2), store.ErrLimit)
	st, err := os.Stat(filepath.Join(dir, boltstore.FileName))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
}

func TestTheDataDirIsPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new", "data")
	s := open(t, dir)
	defer s.Close()
	st, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), st.Mode().Perm())
	f, err := os.Stat(filepath.Join(dir, boltstore.FileName))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), f.Mode().Perm())
}

func TestASecondOpenerIsRefused(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	defer s.Close()
	_, err := boltstore.Open(dir, boltstore.Options{LockTimeout: 50e6})
	assert.ErrorIs(t, err, boltstore.ErrLocked)
	assert.Contains(t, err.Error(), dir)
}

func TestANewerSchemaIsRefused(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	require.NoError(t, s.Close())
	db, err := bolt.Open(filepath.Join(dir, boltstore.FileName), 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("meta")).Put([]byte("schema"), []byte(fmt.Sprint(boltstore.SchemaVersion+1)))
	}))
	require.NoError(t, db.Close())
	_, err = boltstore.Open(dir, boltstore.Options{})
	assert.ErrorIs(t, err, boltstore.ErrNewerSchema)
	assert.Contains(t, err.Error(), "schema 2")
}

func TestACorruptFileIsRefused(t *testing.T) {
	tests := map[string]func(t *testing.T, path string){
		"garbage": func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, []byte(strings.Repeat("not a database ", 1000)), 0o600))
		},
		"meta pages overwritten": func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			require.NoError(t, err)
			defer f.Close()
			for _, off := range []int64{0, 4096} {
				_, err := f.WriteAt([]byte(strings.Repeat("\xde\xad", 64)), off+16)
				require.NoError(t, err)
			}
		},
		"truncated": func(t *testing.T, path string) {
			require.NoError(t, os.Truncate(path, 5000))
		},
		"no schema": func(t *testing.T, path string) {
			db, err := bolt.Open(path, 0o600, nil)
			require.NoError(t, err)
			require.NoError(t, db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("meta")).Delete([]byte("schema")) }))
			require.NoError(t, db.Close())
		},
	}
	for name, damage := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir)
			for i := range 50 {
				require.NoError(t, s.Create(context.Background(), storetest.NewRecord(fmt.Sprint("t", i), "c", "a", "b", i), 0))
			}
			require.NoError(t, s.Close())
			damage(t, filepath.Join(dir, boltstore.FileName))
			_, err := boltstore.Open(dir, boltstore.Options{})
			require.Error(t, err)
			assert.ErrorIs(t, err, boltstore.ErrCorrupt, "%v", err)
		})
	}
}

func TestCloseFailsQueuedChanges(t *testing.T) {
	s := open(t, t.TempDir())
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			err := s.Create(context.Background(), storetest.NewRecord(fmt.Sprint("t", i), "c", "a", "b", i), 0)
			if err != nil {
				assert.ErrorIs(t, err, store.ErrClosed)
			}
		})
	}
	require.NoError(t, s.Close())
	wg.Wait()
	require.NoError(t, s.Close())
}

func BenchmarkCreate(b *testing.B) {
	for _, senders := range []int{1, 64} {
		b.Run(fmt.Sprintf("durable/senders=%d", senders), func(b *testing.B) {
			storetest.BenchmarkCreate(b, func(b *testing.B) store.Store {
				s, err := boltstore.Open(b.TempDir(), boltstore.Options{})
				require.NoError(b, err)
				return s
			}, senders)
		})
		b.Run(fmt.Sprintf("memory/senders=%d", senders), func(b *testing.B) {
			storetest.BenchmarkCreate(b, func(*testing.B) store.Store { return store.NewMemory() }, senders)
		})
	}
}
