package boltstore_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/flock"
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

// write makes an earlier version's file in dir with bbolt, in the layout
// the reader expects, one commit per task as the earlier store made them
// (unsynced: nothing here is about durability).
func write(t *testing.T, dir string, pageSize int, recs ...*store.Record) string {
	t.Helper()
	path := filepath.Join(dir, boltstore.FileName)
	db, err := bolt.Open(path, 0o600, &bolt.Options{PageSize: pageSize, NoSync: true})
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		for _, b := range []string{"meta", "tasks", "member", "open", "ctxopen", "ended"} {
			if _, err := tx.CreateBucket([]byte(b)); err != nil {
				return err
			}
		}
		return tx.Bucket([]byte("meta")).Put([]byte("schema"), []byte(fmt.Sprint(boltstore.SchemaVersion)))
	}))
	for _, rec := range recs {
		data, err := rec.Encode()
		require.NoError(t, err)
		require.NoError(t, db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("tasks")).Put([]byte(rec.Task.ID), data) }))
	}
	require.NoError(t, db.Close())
	return path
}

func records(n int) []*store.Record {
	var recs []*store.Record
	for i := range n {
		recs = append(recs, storetest.NewRecord(fmt.Sprintf("t%04d", i), "c", "a", "b", i))
	}
	return recs
}

// all reads every task of the store in dir.
func all(t *testing.T, dir string, opts boltstore.Options) []*store.Record {
	t.Helper()
	s, err := boltstore.Open(dir, opts)
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	var got []*store.Record
	require.NoError(t, s.ForEach(func(rec *store.Record) error {
		got = append(got, rec)
		return nil
	}))
	return got
}

func ids(recs []*store.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.Task.ID)
	}
	return out
}

// TestAnEarlierVersionsFileIsRead: testdata/tasks.db was written by the
// earlier store itself (its write path, indexes and all): 30 tasks, the
// even ones completed, as storetest.NewRecord makes them. They are read
// whole, in id order, and the file is not written to.
func TestAnEarlierVersionsFileIsRead(t *testing.T) {
	fixture, err := os.ReadFile(filepath.Join("testdata", boltstore.FileName))
	require.NoError(t, err)
	dir := t.TempDir()
	path := filepath.Join(dir, boltstore.FileName)
	require.NoError(t, os.WriteFile(path, fixture, 0o600))

	got := all(t, dir, boltstore.Options{})
	require.Len(t, got, 30)
	for i, rec := range got {
		want := storetest.NewRecord(fmt.Sprintf("t%03d", i), fmt.Sprint("c", i%3), "req", "asg", i)
		if i%2 == 0 {
			want.Task.Status.State = wire.StateCompleted
		}
		wantJSON, err := want.Encode()
		require.NoError(t, err)
		gotJSON, err := rec.Encode()
		require.NoError(t, err)
		assert.JSONEq(t, string(wantJSON), string(gotJSON), "task %d", i)
	}
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, fixture, after, "read, never written")
}

func TestForEachStopsAtTheFirstError(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, 0, records(5)...)
	s, err := boltstore.Open(dir, boltstore.Options{})
	require.NoError(t, err)
	defer s.Close()
	stop := errors.New("stop")
	n := 0
	err = s.ForEach(func(*store.Record) error {
		if n++; n == 2 {
			return stop
		}
		return nil
	})
	assert.ErrorIs(t, err, stop)
	assert.Equal(t, 2, n)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "idempotent")
}

func TestATaskThatDoesNotDecodeIsCorrupt(t *testing.T) {
	dir := t.TempDir()
	path := write(t, dir, 0, records(2)...)
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("tasks")).Put([]byte("t0001"), []byte("{not json")) }))
	require.NoError(t, db.Close())
	s, err := boltstore.Open(dir, boltstore.Options{})
	require.NoError(t, err)
	defer s.Close()
	err = s.ForEach(func(*store.Record) error { return nil })
	assert.ErrorIs(t, err, boltstore.ErrCorrupt)
	assert.Contains(t, err.Error(), "t0001")
}

func TestNoFileIsAnError(t *testing.T) {
	_, err := boltstore.Open(t.TempDir(), boltstore.Options{})
	assert.ErrorIs(t, err, os.ErrNotExist)
	_, err = boltstore.Open(t.TempDir(), boltstore.Options{LockTimeout: -time.Second})
	assert.ErrorContains(t, err, "LockTimeout")
}

// TestAFileWithoutBucketsHoldsNoTasks: what a first start of an earlier
// version left when it was cut short before it made its buckets.
func TestAFileWithoutBucketsHoldsNoTasks(t *testing.T) {
	dir := t.TempDir()
	db, err := bolt.Open(filepath.Join(dir, boltstore.FileName), 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	assert.Empty(t, all(t, dir, boltstore.Options{}))
}

func TestAHeldFileIsRefused(t *testing.T) {
	dir := t.TempDir()
	path := write(t, dir, 0, records(1)...)
	// A running broker of an earlier version holds it (exclusively).
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	_, err = boltstore.Open(dir, boltstore.Options{LockTimeout: 50 * time.Millisecond})
	assert.ErrorIs(t, err, boltstore.ErrLocked)
	assert.Contains(t, err.Error(), dir)
}

func TestANewerSchemaIsRefused(t *testing.T) {
	dir := t.TempDir()
	db, err := bolt.Open(write(t, dir, 0), 0o600, nil)
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
	inBolt := func(fn func(tx *bolt.Tx) error) func(t *testing.T, path string) {
		return func(t *testing.T, path string) {
			db, err := bolt.Open(path, 0o600, nil)
			require.NoError(t, err)
			require.NoError(t, db.Update(fn))
			require.NoError(t, db.Close())
		}
	}
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
		"no schema":        inBolt(func(tx *bolt.Tx) error { return tx.Bucket([]byte("meta")).Delete([]byte("schema")) }),
		"no meta":          inBolt(func(tx *bolt.Tx) error { return tx.DeleteBucket([]byte("meta")) }),
		"an index missing": inBolt(func(tx *bolt.Tx) error { return tx.DeleteBucket([]byte("ended")) }),
	}
	for name, damage := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := write(t, dir, 4096, records(50)...)
			damage(t, path)
			_, err := boltstore.Open(dir, boltstore.Options{})
			require.Error(t, err)
			assert.ErrorIs(t, err, boltstore.ErrCorrupt, "%v", err)
		})
	}
}

// TestADamagedDataPageIsRefused damages leaf pages of a file with
// thousands of tasks: Open reports the file as corrupt, without a panic
// and without leaving a goroutine or the file lock behind.
func TestADamagedDataPageIsRefused(t *testing.T) {
	dir := t.TempDir()
	path := write(t, dir, 4096, records(2000)...)
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
	require.GreaterOrEqual(t, damaged, 3, "pages damaged")
	for range 5 {
		_, err := boltstore.Open(dir, boltstore.Options{LockTimeout: 200 * time.Millisecond})
		require.ErrorIs(t, err, boltstore.ErrCorrupt)
	}
	// Not held: a writer could take it.
	l := flock.New(path)
	ok, err := l.TryLock()
	require.NoError(t, err)
	assert.True(t, ok, "the file lock is let go")
	require.NoError(t, l.Unlock())
}

func TestAnEmptyFileIsRefused(t *testing.T) {
	dir := t.TempDir()
	path := write(t, dir, 0, records(1)...)
	require.NoError(t, os.Truncate(path, 0))
	_, err := boltstore.Open(dir, boltstore.Options{})
	require.ErrorIs(t, err, boltstore.ErrDataLoss)
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), "--accept-data-loss")
	// Asked to, it reads what the file holds: nothing.
	var heard string
	assert.Empty(t, all(t, dir, boltstore.Options{AcceptDataLoss: true, OnDataLoss: func(p string) { heard = p }}))
	assert.Contains(t, heard, "empty")
}

// TestADamagedNewestCommitRecordIsRefused damages the meta page of the
// last commit, after it was acknowledged: bbolt alone would open the file
// at the commit before and lose the change without a word.
func TestADamagedNewestCommitRecordIsRefused(t *testing.T) {
	dir := t.TempDir()
	path := write(t, dir, 4096, records(2)...)
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
	got := all(t, dir, boltstore.Options{AcceptDataLoss: true})
	assert.Equal(t, []string{"t0000"}, ids(got), "the older commit record does not have t0001")
}

// TestADamagedCommitRecordIsFoundAtAnyPageSize: a file made where pages
// are 16 KiB (arm64, say), whose first commit record is damaged, is
// refused here too: the other record is found where bbolt would find it.
func TestADamagedCommitRecordIsFoundAtAnyPageSize(t *testing.T) {
	for _, pageSize := range []int{8192, 16384, 65536} {
		t.Run(fmt.Sprint(pageSize), func(t *testing.T) {
			dir := t.TempDir()
			path := write(t, dir, pageSize, records(1)...)
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
