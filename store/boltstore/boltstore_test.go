package boltstore_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/store/boltstore"
	"github.com/a2a-bus/a2a-bus/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t *testing.T, dir string) *boltstore.Store {
	t.Helper()
	s, err := boltstore.Open(dir, boltstore.Options{})
	require.NoError(t, err)
	return s
}

func TestSuite(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Tasks { return open(t, t.TempDir()) })
}

func TestDurableSuite(t *testing.T) {
	storetest.RunDurable(t, storetest.Durable{
		Open:   func(t *testing.T, dir string) store.Tasks { return open(t, dir) },
		Queued: func(s store.Tasks) int { return boltstore.Queued(s.(*boltstore.Store)) },
		CutShort: func(t *testing.T, dir string) string {
			leftover := filepath.Join(dir, boltstore.FileName+".new")
			require.NoError(t, os.WriteFile(leftover, nil, 0o600))
			return leftover
		},
	})
}

// TestCommitsAreSynced: a SIGKILL test cannot tell fsync from the page
// cache; this checks the setting that makes acknowledgements durable.
func TestCommitsAreSynced(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	assert.True(t, s.Syncs())
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

// TestADamagedDataPageIsRefused damages leaf pages of a store with
// thousands of tasks: Open reports the file as corrupt, without a panic
// and without leaving a goroutine or the file lock behind.
func TestADamagedDataPageIsRefused(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	var wg sync.WaitGroup
	for w := range 50 {
		wg.Go(func() {
			for i := w; i < 2000; i += 50 {
				assert.NoError(t, s.Create(context.Background(), storetest.NewRecord(fmt.Sprint("t", i), "c", "a", "b", i), 0))
			}
		})
	}
	wg.Wait()
	require.NoError(t, s.Close())
	path := filepath.Join(dir, boltstore.FileName)
	st, err := os.Stat(path)
	require.NoError(t, err)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	hdr := make([]byte, 16)
	damaged := 0
	for p := int64(2); p < st.Size()/4096; p++ {
		_, err := f.ReadAt(hdr, p*4096)
		require.NoError(t, err)
		// A leaf page (flags 0x02) whose id is its own position.
		if hdr[8] == 0x02 && uint64(hdr[0])|uint64(hdr[1])<<8 == uint64(p&0xffff) {
			if damaged++; damaged%3 == 0 {
				_, err := f.WriteAt([]byte{0x10, 0x00}, p*4096+8)
				require.NoError(t, err)
			}
		}
	}
	require.NoError(t, f.Close())
	require.Positive(t, damaged)
	for range 5 {
		_, err := boltstore.Open(dir, boltstore.Options{LockTimeout: 200 * time.Millisecond})
		require.ErrorIs(t, err, boltstore.ErrCorrupt)
	}
}

func TestAnEmptyFileIsRefused(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	require.NoError(t, s.Create(context.Background(), storetest.NewRecord("t1", "c", "a", "b", 0), 0))
	require.NoError(t, s.Close())
	path := filepath.Join(dir, boltstore.FileName)
	require.NoError(t, os.Truncate(path, 0))
	_, err := boltstore.Open(dir, boltstore.Options{})
	require.ErrorIs(t, err, boltstore.ErrDataLoss)
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), "--accept-data-loss")
	// Asked to, it starts with what the file holds: nothing.
	var heard string
	s, err = boltstore.Open(dir, boltstore.Options{AcceptDataLoss: true, OnDataLoss: func(p string) { heard = p }})
	require.NoError(t, err)
	defer s.Close()
	assert.Contains(t, heard, "empty")
	_, err = s.Get(context.Background(), "t1")
	assert.ErrorIs(t, err, store.ErrNotFound)
}

// TestADamagedNewestCommitRecordIsRefused damages the meta page of the
// last commit, after it was acknowledged: bbolt alone would open the file
// at the commit before and lose the change without a word.
func TestADamagedNewestCommitRecordIsRefused(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	require.NoError(t, s.Create(context.Background(), storetest.NewRecord("t1", "c", "a", "b", 0), 0))
	require.NoError(t, s.Create(context.Background(), storetest.NewRecord("t2", "c", "a", "b", 1), 0))
	require.NoError(t, s.Close())
	path := filepath.Join(dir, boltstore.FileName)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	txid := func(off int64) uint64 {
		b := make([]byte, 8)
		_, err := f.ReadAt(b, off+16+48)
		require.NoError(t, err)
		return binary.LittleEndian.Uint64(b)
	}
	newest := int64(0)
	if txid(4096) > txid(0) {
		newest = 4096
	}
	_, err = f.WriteAt([]byte{0xff}, newest+16+30) // inside the root bucket's page id
	require.NoError(t, err)
	require.NoError(t, f.Close())

	_, err = boltstore.Open(dir, boltstore.Options{})
	require.ErrorIs(t, err, boltstore.ErrDataLoss)
	assert.Contains(t, err.Error(), "commit record")
	// What bbolt would have done: the last acknowledged change is gone.
	s, err = boltstore.Open(dir, boltstore.Options{AcceptDataLoss: true})
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Get(context.Background(), "t2")
	assert.ErrorIs(t, err, store.ErrNotFound, "the older commit record does not have t2")
}

// TestADamagedCommitRecordIsFoundAtAnyPageSize: a file made where pages
// are 16 KiB (arm64, say), whose first commit record is damaged, is
// refused here too: the other record is found where bbolt would find it.
func TestADamagedCommitRecordIsFoundAtAnyPageSize(t *testing.T) {
	for _, pageSize := range []int{8192, 16384, 65536} {
		t.Run(fmt.Sprint(pageSize), func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, boltstore.FileName)
			db, err := bolt.Open(path, 0o600, &bolt.Options{PageSize: pageSize})
			require.NoError(t, err)
			require.NoError(t, db.Update(func(tx *bolt.Tx) error {
				for _, b := range []string{"meta", "tasks", "member", "open", "ctxopen", "ended"} {
					if _, err := tx.CreateBucket([]byte(b)); err != nil {
						return err
					}
				}
				return tx.Bucket([]byte("meta")).Put([]byte("schema"), []byte(fmt.Sprint(boltstore.SchemaVersion)))
			}))
			require.NoError(t, db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("tasks")).Put([]byte("t0"), []byte("{}")) }))
			require.NoError(t, db.Close())
			// Meta page 0: the one that tells where meta page 1 is.
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			require.NoError(t, err)
			_, err = f.WriteAt([]byte{0xff}, 16+30)
			require.NoError(t, err)
			require.NoError(t, f.Close())
			_, err = boltstore.Open(dir, boltstore.Options{})
			require.ErrorIs(t, err, boltstore.ErrDataLoss)
		})
	}
}
