package pebblestore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/store/pebblestore"
	"github.com/a2a-bus/a2a-bus/store/storetest"
	"github.com/a2a-bus/a2a-bus/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t *testing.T, dir string) *pebblestore.Store {
	t.Helper()
	s, err := pebblestore.Open(dir, pebblestore.Options{})
	require.NoError(t, err)
	return s
}

func fill(t *testing.T, s *pebblestore.Store, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for w := range 20 {
		wg.Go(func() {
			for i := w; i < n; i += 20 {
				assert.NoError(t, s.Create(context.Background(), storetest.NewRecord(fmt.Sprint("t", i), "c", "a", "b", i), 0))
			}
		})
	}
	wg.Wait()
}

func TestSuite(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Tasks { return open(t, t.TempDir()) })
	storetest.RunUpdate(t, func(t *testing.T) store.Tasks { return open(t, t.TempDir()) })
}

func TestRegistrySuite(t *testing.T) {
	storetest.RunRegistry(t, func(t *testing.T) store.Store { return open(t, t.TempDir()) })
	storetest.RunDurableRegistry(t, func(t *testing.T, dir string) store.Store { return open(t, dir) })
}

// A registration that does not decode is an error, not skipped: reading
// past it would give its name to another agent.
func TestADamagedRegistrationIsRefused(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	require.NoError(t, s.PutRegistration(context.Background(), storetest.NewRegistration("a", "c1", "planner")))
	require.NoError(t, s.Close())
	db, err := pebble.Open(filepath.Join(dir, pebblestore.DirName), &pebble.Options{Logger: quiet{}})
	require.NoError(t, err)
	require.NoError(t, db.Set([]byte("gb"), []byte("{not json"), pebble.Sync))
	require.NoError(t, db.Close())

	s = open(t, dir)
	defer s.Close()
	_, err = s.Registrations(context.Background())
	assert.ErrorIs(t, err, pebblestore.ErrCorrupt)
}

// Registering and deregistering are acknowledged only after their log
// sync, as a task's change is.
func TestARegistrationIsAcknowledgedAfterItsLogSync(t *testing.T) {
	for name, change := range map[string]func(s *pebblestore.Store) error{
		"put": func(s *pebblestore.Store) error {
			return s.PutRegistration(context.Background(), storetest.NewRegistration("a", "c1", "planner"))
		},
		"delete": func(s *pebblestore.Store) error { return s.DeleteRegistration(context.Background(), "a") },
	} {
		t.Run(name, func(t *testing.T) { requireAcknowledgedAfterSync(t, change) })
	}
}

func TestDurableSuite(t *testing.T) {
	storetest.RunDurable(t, storetest.Durable{
		Open:   func(t *testing.T, dir string) store.Tasks { return open(t, dir) },
		Queued: func(s store.Tasks) int { return pebblestore.Queued(s.(*pebblestore.Store)) },
		Hold:   func(s store.Tasks) func() { return pebblestore.Hold(s.(*pebblestore.Store)) },
		CutShort: func(t *testing.T, dir string) string {
			leftover := filepath.Join(dir, pebblestore.DirName+".new")
			require.NoError(t, os.MkdirAll(leftover, 0o700))
			require.NoError(t, os.WriteFile(filepath.Join(leftover, "000001.log"), []byte("half"), 0o600))
			return leftover
		},
	})
}

func TestTheDataDirIsPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new", "data")
	s := open(t, dir)
	defer s.Close()
	require.NoError(t, s.Create(context.Background(), storetest.NewRecord("t1", "c", "a", "b", 0), 0))
	require.NoError(t, pebblestore.Flush(s))
	for _, d := range []string{dir, filepath.Join(dir, pebblestore.DirName)} {
		st, err := os.Stat(d)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o700), st.Mode().Perm(), d)
	}
	files, err := filepath.Glob(filepath.Join(dir, pebblestore.DirName, "*"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	require.NoError(t, s.Close()) // the marker is written
	// The data dir's own files: its lock, the marker.
	files = append(files, filepath.Join(dir, pebblestore.LockName), filepath.Join(dir, pebblestore.MarkerName))
	for _, f := range files {
		st, err := os.Stat(f)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), st.Mode().Perm(), f)
	}
}

func TestASecondOpenerIsRefused(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	defer s.Close()
	_, err := pebblestore.Open(dir, pebblestore.Options{LockTimeout: 50 * time.Millisecond})
	assert.ErrorIs(t, err, pebblestore.ErrLocked)
	assert.Contains(t, err.Error(), dir)
}

func TestANewerSchemaIsRefused(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, open(t, dir).Close())
	db, err := pebble.Open(filepath.Join(dir, pebblestore.DirName), &pebble.Options{Logger: quiet{}})
	require.NoError(t, err)
	require.NoError(t, db.Set([]byte("mschema"), []byte(fmt.Sprint(pebblestore.SchemaVersion+1)), pebble.Sync))
	require.NoError(t, db.Close())
	_, err = pebblestore.Open(dir, pebblestore.Options{})
	assert.ErrorIs(t, err, pebblestore.ErrNewerSchema)
	assert.Contains(t, err.Error(), fmt.Sprintf("schema %d", pebblestore.SchemaVersion+1))
}

// A store of an older schema (1: before the send index; 2: before the
// registrations) opens with its tasks and no registration, and is marked
// as the current schema, so that an older broker refuses it after.
func TestAnOlderSchemaIsMarkedCurrent(t *testing.T) {
	for _, old := range []string{"1", "2"} {
		t.Run("schema "+old, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir)
			require.NoError(t, s.Create(context.Background(), storetest.NewRecord("t1", "c1", "a", "b", 0), 0))
			require.NoError(t, s.Close())
			db, err := pebble.Open(filepath.Join(dir, pebblestore.DirName), &pebble.Options{Logger: quiet{}})
			require.NoError(t, err)
			require.NoError(t, db.Set([]byte("mschema"), []byte(old), pebble.Sync))
			require.NoError(t, db.Close())

			s = open(t, dir)
			got, err := s.Get(context.Background(), "t1")
			require.NoError(t, err)
			assert.Equal(t, "t1", got.Task.ID)
			regs, err := s.Registrations(context.Background())
			require.NoError(t, err)
			assert.Empty(t, regs, "no registration is held")
			require.NoError(t, s.PutRegistration(context.Background(), storetest.NewRegistration("a", "c1", "planner")))
			require.NoError(t, s.Close())
			db, err = pebble.Open(filepath.Join(dir, pebblestore.DirName), &pebble.Options{Logger: quiet{}})
			require.NoError(t, err)
			v, closer, err := db.Get([]byte("mschema"))
			require.NoError(t, err)
			assert.Equal(t, fmt.Sprint(pebblestore.SchemaVersion), string(v))
			closer.Close()
			require.NoError(t, db.Close())
		})
	}
}

// damageMiddle overwrites bytes in the middle of each file of the store
// whose name ends with suffix.
func damageMiddle(t *testing.T, dir, suffix string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, pebblestore.DirName, "*"+suffix))
	require.NoError(t, err)
	require.NotEmpty(t, files, "no %s file", suffix)
	for _, path := range files {
		st, err := os.Stat(path)
		require.NoError(t, err)
		if st.Size() < 1024 {
			continue
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		require.NoError(t, err)
		_, err = f.WriteAt([]byte(strings.Repeat("\xde\xad", 32)), st.Size()/2)
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
}

func TestADamagedStoreIsRefused(t *testing.T) {
	tests := map[string]struct {
		flush  bool
		damage func(t *testing.T, dir string)
	}{
		"a record in the middle of the log": {false, func(t *testing.T, dir string) { damageMiddle(t, dir, ".log") }},
		"a table's block":                   {true, func(t *testing.T, dir string) { damageMiddle(t, dir, ".sst") }},
		"the manifest": {false, func(t *testing.T, dir string) {
			files, _ := filepath.Glob(filepath.Join(dir, pebblestore.DirName, "MANIFEST-*"))
			require.NotEmpty(t, files)
			for _, f := range files {
				require.NoError(t, os.WriteFile(f, []byte(strings.Repeat("not a manifest ", 100)), 0o600))
			}
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir)
			fill(t, s, 2000)
			if tc.flush {
				require.NoError(t, pebblestore.Flush(s))
			}
			require.NoError(t, s.Close())
			tc.damage(t, dir)
			for range 2 { // refused each time, and leaves nothing held
				var logged lines
				log := slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelInfo}))
				_, err := pebblestore.Open(dir, pebblestore.Options{LockTimeout: 100 * time.Millisecond, Logger: log})
				require.Error(t, err)
				assert.ErrorIs(t, err, pebblestore.ErrCorrupt, "%v", err)
				// One line: the cause and the folder, then what to do; no
				// library detail (stack traces are for the debug log).
				assert.NotContains(t, err.Error(), "\n")
				assert.Contains(t, err.Error(), filepath.Join(dir, pebblestore.DirName))
				assert.Contains(t, err.Error(), "restore the data dir from a backup")
				for _, line := range strings.Split(strings.TrimSpace(logged.String()), "\n") {
					assert.NotContains(t, line, `\n`, "a log line with a line break in it")
					assert.NotContains(t, line, "stack trace")
				}
			}
		})
	}
}

// TestAnEmptiedStoreIsALoss: a store folder without its database (files
// removed) is not taken for a new store.
func TestAnEmptiedStoreIsALoss(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	require.NoError(t, s.Create(context.Background(), storetest.NewRecord("t1", "c", "a", "b", 0), 0))
	require.NoError(t, s.Close())
	files, err := filepath.Glob(filepath.Join(dir, pebblestore.DirName, "*"))
	require.NoError(t, err)
	for _, f := range files {
		require.NoError(t, os.Remove(f))
	}
	_, err = pebblestore.Open(dir, pebblestore.Options{})
	require.ErrorIs(t, err, pebblestore.ErrDataLoss)
	assert.Contains(t, err.Error(), "--accept-data-loss")

	var heard string
	s, err = pebblestore.Open(dir, pebblestore.Options{AcceptDataLoss: true, OnDataLoss: func(p string) { heard = p }})
	require.NoError(t, err)
	defer s.Close()
	assert.NotEmpty(t, heard)
	require.NoError(t, s.Create(context.Background(), storetest.NewRecord("t2", "c", "a", "b", 0), 0))
}

func BenchmarkCreate(b *testing.B) {
	for _, senders := range []int{1, 64} {
		b.Run(fmt.Sprintf("durable/senders=%d", senders), func(b *testing.B) {
			storetest.BenchmarkCreate(b, func(b *testing.B) store.Tasks {
				s, err := pebblestore.Open(b.TempDir(), pebblestore.Options{})
				require.NoError(b, err)
				return s
			}, senders)
		})
	}
}

// gatedFS holds a sync of the files whose names end in suffix (the
// write-ahead log's, ".log", unless told otherwise) until the test lets
// it go, and says when one starts.
type gatedFS struct {
	vfs.FS
	suffix  string
	armed   atomic.Bool // the next sync is held
	syncing chan struct{}
	release chan struct{}
	stop    chan struct{} // closed when the test ends: nothing is held
	fail    atomic.Bool   // every sync fails
	// A file whose sync failed was synced again.
	syncedAfterFailing atomic.Bool
}

func newGatedFS(suffix string) *gatedFS {
	return &gatedFS{FS: vfs.Default, suffix: suffix, syncing: make(chan struct{}), release: make(chan struct{}), stop: make(chan struct{})}
}

func (fs *gatedFS) wrap(f vfs.File, name string, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(name, fs.suffix) {
		return f, err
	}
	return &gatedFile{File: f, fs: fs}, nil
}

func (fs *gatedFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, c)
	return fs.wrap(f, name, err)
}

func (fs *gatedFS) ReuseForWrite(old, name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(old, name, c)
	return fs.wrap(f, name, err)
}

type gatedFile struct {
	vfs.File
	fs     *gatedFS
	failed atomic.Bool
}

func (f *gatedFile) gate() {
	if f.fs.armed.CompareAndSwap(true, false) {
		select {
		case f.fs.syncing <- struct{}{}:
		case <-f.fs.stop:
			return
		}
		select {
		case <-f.fs.release:
		case <-f.fs.stop:
		}
	}
}

var errDisk = errors.New("injected: the disk failed a sync")

func (f *gatedFile) Sync() error { return f.SyncData() }
func (f *gatedFile) SyncData() error {
	if f.failed.Load() {
		f.fs.syncedAfterFailing.Store(true)
	}
	f.gate()
	if f.fs.fail.Load() {
		f.failed.Store(true)
		return errDisk
	}
	return f.File.SyncData()
}

// TestAChangeIsAcknowledgedAfterItsLogSync: a SIGKILL test cannot tell a
// synced log from the page cache. Here the log's sync is held: the
// change is not acknowledged until the sync that follows it is done.
func TestAChangeIsAcknowledgedAfterItsLogSync(t *testing.T) {
	s := requireAcknowledgedAfterSync(t, func(s *pebblestore.Store) error {
		return s.Create(context.Background(), storetest.NewRecord("t1", "c", "a", "b", 0), 0)
	})
	got, err := s.Get(context.Background(), "t1")
	require.NoError(t, err)
	assert.Equal(t, "t1", got.Task.ID)
}

// TestALoneChangeIsSyncedAsItIsApplied: a change made alone asks
// Pebble for its log sync as it is applied, and is answered once that
// sync is done (TestAChangeIsAcknowledgedAfterItsLogSync): the syncer
// writes no record of its own to sync the log. An update that writes
// nothing asks for no sync: for it the syncer writes one.
func TestALoneChangeIsSyncedAsItIsApplied(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	ctx := context.Background()
	for i := range 3 {
		require.NoError(t, s.Create(ctx, storetest.NewRecord(fmt.Sprint("t", i), "c", "a", "b", i), 0))
	}
	_, err := s.Update(ctx, "t0", func(r *store.Record) error {
		r.Task.Status.State = wire.StateWorking
		return nil
	})
	require.NoError(t, err)
	assert.Zero(t, pebblestore.SyncRecords(s), "a lone change was synced with a record of the syncer's")
	refused := errors.New("refused")
	_, err = s.Update(ctx, "t0", func(*store.Record) error { return refused })
	require.ErrorIs(t, err, refused)
	assert.Equal(t, int64(1), pebblestore.SyncRecords(s), "a refused update is answered once what it read is synced")
}

// TestAReadIsNeverOfOlderBytes: the store keeps the tasks it last read,
// decoded, for the update that follows a read; a read or an update
// after a change sees the change, for more tasks than are kept, and a
// record handed out is the caller's to change.
func TestAReadIsNeverOfOlderBytes(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	ctx := context.Background()
	const n = 100
	for i := range n {
		require.NoError(t, s.Create(ctx, storetest.NewRecord(fmt.Sprint("t", i), "c", "a", "b", i), 0))
	}
	for round, state := range []wire.State{wire.StateWorking, wire.StateInputRequired, wire.StateCompleted} {
		for i := range n {
			id := fmt.Sprint("t", i)
			got, err := s.Get(ctx, id)
			require.NoError(t, err)
			got.Task.Status.State = wire.StateFailed // the caller's
			*got.Task.History[0].Parts[0].Text = "changed by the reader"
			updated, err := s.Update(ctx, id, func(r *store.Record) error {
				require.Equal(t, fmt.Sprint("hello ", id), *r.Task.History[0].Parts[0].Text, "round %d", round)
				require.NotEqual(t, state, r.Task.Status.State, "round %d", round)
				r.Task.Status.State = state
				return nil
			})
			require.NoError(t, err)
			updated.Task.Status.State = wire.StateFailed // the caller's
		}
		for i := range n {
			got, err := s.Get(ctx, fmt.Sprint("t", i))
			require.NoError(t, err)
			assert.Equal(t, state, got.Task.Status.State)
		}
	}
}

// TestARefusedUpdateWaitsForTheChangeItSaw: an update whose fn refuses
// the task as it finds it (a retry that finds its change applied, say)
// is not answered while the change it saw waits for its log sync: the
// answer would stand on a change that a crash may yet undo.
func TestARefusedUpdateWaitsForTheChangeItSaw(t *testing.T) {
	fs := newGatedFS(".log")
	s, err := pebblestore.Open(t.TempDir(), pebblestore.WithFS(pebblestore.Options{}, fs))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	t.Cleanup(func() { close(fs.stop) }) // runs before the close, even when the test fails
	ctx := context.Background()
	require.NoError(t, s.Create(ctx, storetest.NewRecord("t1", "c", "a", "b", 0), 0))
	handed := pebblestore.Handed(s)
	fs.armed.Store(true)
	first := make(chan error, 1)
	go func() {
		_, err := s.Update(ctx, "t1", func(r *store.Record) error { r.Apply("a", "k", "d"); return nil })
		first <- err
	}()
	<-fs.syncing // the change is applied; its sync is held
	applied := errors.New("applied already")
	second := make(chan error, 1)
	go func() {
		_, err := s.Update(ctx, "t1", func(r *store.Record) error {
			if _, ok := r.FindApplied("a", "k"); ok {
				return applied
			}
			return errors.New("the applied change was not seen")
		})
		second <- err
	}()
	// The refusal is checked, and handed to the syncer behind the first
	// change (the syncer may hold both, or the second may still wait in
	// its queue), and waits for the next sync: answered, it would be
	// early.
	require.Eventually(t, func() bool { return pebblestore.Handed(s) == handed+2 || len(second) > 0 }, 10*time.Second, time.Millisecond)
	require.Empty(t, second, "refused while the change it saw waits for its sync")
	require.Empty(t, first)
	close(fs.release)
	require.NoError(t, <-first)
	require.ErrorIs(t, <-second, applied)
}

// requireAcknowledgedAfterSync makes change on a new store whose log
// syncs are held, and fails the test if it is answered before its sync
// or while the sync is held; it returns the store, open.
func requireAcknowledgedAfterSync(t *testing.T, change func(s *pebblestore.Store) error) *pebblestore.Store {
	t.Helper()
	fs := newGatedFS(".log")
	s, err := pebblestore.Open(t.TempDir(), pebblestore.WithFS(pebblestore.Options{}, fs))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	t.Cleanup(func() { close(fs.stop) }) // runs before the close, even when the test fails
	done := make(chan error, 1)
	fs.armed.Store(true)
	go func() { done <- change(s) }()
	select {
	case <-fs.syncing:
	case err := <-done:
		t.Fatalf("acknowledged (%v) without a log sync", err)
	}
	select {
	case err := <-done:
		t.Fatalf("acknowledged (%v) while its log sync was held", err)
	default:
	}
	close(fs.release)
	require.NoError(t, <-done)
	return s
}

// TestAfterABusySyncTheSyncerWaitsForCompany: after a sync that carried
// LingerMin changes or more, the syncer waits (here as long as it takes)
// until as many changes are there before the next sync, so that the
// senders it has just answered share one. Close ends the wait: what is
// waiting is synced and acknowledged.
func TestAfterABusySyncTheSyncerWaitsForCompany(t *testing.T) {
	h := newLingerHarness(t, time.Hour)
	first, busy := h.busySync(pebblestore.LingerMin, false)
	for _, err := range h.answers(append(first, busy...)) {
		require.NoError(t, err)
	}

	// A lone change now waits for company...
	later := h.create(1)
	select {
	case err := <-later[0]:
		t.Fatalf("acknowledged (%v) without waiting after a busy sync", err)
	case <-time.After(100 * time.Millisecond):
	}
	// ...and goes with it once as many are there.
	for _, err := range h.answers(append(later, h.create(pebblestore.LingerMin-1)...)) {
		require.NoError(t, err)
	}

	// Close ends a wait: the change is synced and acknowledged.
	last := h.create(1)
	id := fmt.Sprintf("t%03d", h.n)
	require.NoError(t, h.s.Close())
	require.NoError(t, h.answers(last)[0])
	s, err := pebblestore.Open(h.dir, pebblestore.Options{})
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Get(context.Background(), id)
	assert.NoError(t, err, "the change acknowledged at close is stored")
}

// lingerHarness drives a store whose log syncs a test can hold and fail.
type lingerHarness struct {
	t   *testing.T
	dir string
	s   *pebblestore.Store
	fs  *gatedFS
	n   int // the creates sent: the last one's id is t<n>
}

// newLingerHarness opens a store whose syncer waits linger for company,
// until the test's end, after the store is closed.
func newLingerHarness(t *testing.T, linger time.Duration) *lingerHarness {
	t.Cleanup(pebblestore.SetLinger(linger))
	fs := newGatedFS(".log")
	dir := t.TempDir()
	s, err := pebblestore.Open(dir, pebblestore.WithFS(pebblestore.Options{}, fs))
	require.NoError(t, err)
	t.Cleanup(func() {
		close(fs.stop) // nothing is held from here on
		s.Close()
	})
	return &lingerHarness{t: t, dir: dir, s: s, fs: fs}
}

// create sends k creates, each from a sender of its own, and returns
// when all are applied (a read sees a change before its sync).
func (h *lingerHarness) create(k int) []chan error {
	var ids []string
	var dones []chan error
	for range k {
		h.n++
		id := fmt.Sprintf("t%03d", h.n)
		rec := storetest.NewRecord(id, "c", "a", "b", h.n)
		done := make(chan error, 1)
		go func() { done <- h.s.Create(context.Background(), rec, 0) }()
		ids, dones = append(ids, id), append(dones, done)
	}
	require.Eventually(h.t, func() bool {
		for _, id := range ids {
			if _, err := h.s.Get(context.Background(), id); err != nil {
				return false
			}
		}
		return true
	}, 30*time.Second, time.Millisecond)
	return dones
}

// answers waits for each change's answer (failing the test if one does
// not come) and returns them.
func (h *lingerHarness) answers(dones []chan error) []error {
	var errs []error
	for _, done := range dones {
		select {
		case err := <-done:
			errs = append(errs, err)
		case <-time.After(30 * time.Second):
			h.t.Fatal("a change was not answered")
		}
	}
	return errs
}

// busySync makes the next sync carry k changes: they are applied while
// the sync before them is held. The next sync is held too if holdNext.
func (h *lingerHarness) busySync(k int, holdNext bool) (first, busy []chan error) {
	h.fs.armed.Store(true)
	first = h.create(1)
	<-h.fs.syncing
	busy = h.create(k)
	h.fs.armed.Store(holdNext)
	h.fs.release <- struct{}{}
	if holdNext {
		<-h.fs.syncing
	}
	return first, busy
}

// TestAWaitThatRunsOutIsNotRepeated: where changes do not come back as
// their answers go out, a wait for company runs out; the sync after it
// does not wait.
func TestAWaitThatRunsOutIsNotRepeated(t *testing.T) {
	h := newLingerHarness(t, 100*time.Millisecond)
	first, busy := h.busySync(2*pebblestore.LingerMin, false)
	for _, err := range h.answers(append(first, busy...)) {
		require.NoError(t, err)
	}
	// Fewer than the busy sync carried: the wait runs out.
	for _, err := range h.answers(h.create(pebblestore.LingerMin)) {
		require.NoError(t, err)
	}
	waits, runOut := pebblestore.Lingers(h.s)
	require.Equal(t, [2]int64{1, 1}, [2]int64{waits, runOut})
	// The next sync does not wait.
	require.NoError(t, h.answers(h.create(1))[0])
	waits, _ = pebblestore.Lingers(h.s)
	assert.Equal(t, int64(1), waits, "the sync after a wait that ran out waited")
}

// TestAFailedStoreDoesNotWaitForCompany: once a sync has failed, the
// changes applied meanwhile get their error at once, however busy the
// failed sync was.
func TestAFailedStoreDoesNotWaitForCompany(t *testing.T) {
	h := newLingerHarness(t, time.Hour)
	first, busy := h.busySync(pebblestore.LingerMin, true) // the busy sync is held
	require.NoError(t, h.answers(first)[0])
	late := h.create(1)
	h.fs.fail.Store(true)
	h.fs.release <- struct{}{}
	for _, err := range h.answers(append(busy, late...)) {
		assert.Error(t, err)
	}
	waits, _ := pebblestore.Lingers(h.s)
	assert.Zero(t, waits)
}

// TestAWaitIsBoundedByAMillisecond: the wait is twice the last sync's
// time, but one slow sync (a disk's hiccup) makes no long wait.
func TestAWaitIsBoundedByAMillisecond(t *testing.T) {
	assert.Equal(t, 400*time.Microsecond, pebblestore.LingerFor(200*time.Microsecond))
	assert.Equal(t, time.Millisecond, pebblestore.LingerFor(time.Second))
}

// TestAFailedSyncIsNotTriedAgain: after a log sync fails, what reached
// the disk is unknown: the change is not acknowledged, and the sync is
// never tried again. Reads go on. The next change reopens the store from
// its log, as a restart would, and is made there; every change
// acknowledged before is there.
func TestAFailedSyncIsNotTriedAgain(t *testing.T) {
	t.Cleanup(pebblestore.SetReopenEvery(0))
	fs := newGatedFS(".log")
	dir := t.TempDir()
	s, err := pebblestore.Open(dir, pebblestore.WithFS(pebblestore.Options{}, fs))
	require.NoError(t, err)
	defer s.Close()
	ctx := context.Background()
	require.NoError(t, s.Create(ctx, storetest.NewRecord("t1", "c", "a", "b", 0), 0))
	fs.fail.Store(true)
	err = s.Create(ctx, storetest.NewRecord("t2", "c", "a", "b", 1), 0)
	require.ErrorIs(t, err, pebblestore.ErrFailed)
	_, err = s.Get(ctx, "t1")
	require.NoError(t, err, "reads go on")
	fs.fail.Store(false)
	require.NoError(t, s.Create(ctx, storetest.NewRecord("t3", "c", "a", "b", 2), 0), "the store is reopened")
	_, err = s.Update(ctx, "t1", func(r *store.Record) error {
		r.Task.Status.State = wire.StateWorking
		return nil
	})
	require.NoError(t, err)
	assert.False(t, fs.syncedAfterFailing.Load(), "a file whose sync failed was synced again")
	require.NoError(t, s.Close())

	s = open(t, dir)
	defer s.Close()
	got, err := s.Get(ctx, "t1")
	require.NoError(t, err)
	assert.Equal(t, wire.StateWorking, got.Task.Status.State)
	_, err = s.Get(ctx, "t3")
	require.NoError(t, err)
}

// TestAReopenThatFailsIsTriedAgain: while the log still fails, a try to
// reopen the store fails too, and the change with it; reads say so
// (ErrFailed) until the store is open again. The next change once the
// disk is sound reopens it, and every change acknowledged is there.
func TestAReopenThatFailsIsTriedAgain(t *testing.T) {
	t.Cleanup(pebblestore.SetReopenEvery(0))
	fs := newGatedFS(".log")
	s, err := pebblestore.Open(t.TempDir(), pebblestore.WithFS(pebblestore.Options{}, fs))
	require.NoError(t, err)
	defer s.Close()
	ctx := context.Background()
	require.NoError(t, s.Create(ctx, storetest.NewRecord("t1", "c", "a", "b", 0), 0))
	fs.fail.Store(true)
	require.ErrorIs(t, s.Create(ctx, storetest.NewRecord("t2", "c", "a", "b", 1), 0), pebblestore.ErrFailed)
	for i := range 3 {
		require.ErrorIs(t, s.Create(ctx, storetest.NewRecord(fmt.Sprint("u", i), "c", "a", "b", 2), 0), pebblestore.ErrFailed)
		if _, err := s.Get(ctx, "t1"); err != nil {
			require.ErrorIs(t, err, pebblestore.ErrFailed, "a read while the store is closed for its reopen")
		}
	}
	fs.fail.Store(false)
	require.NoError(t, s.Create(ctx, storetest.NewRecord("t3", "c", "a", "b", 3), 0))
	for _, id := range []string{"t1", "t3"} {
		_, err := s.Get(ctx, id)
		require.NoError(t, err, id)
	}
	assert.False(t, fs.syncedAfterFailing.Load(), "a file whose sync failed was synced again")
}

// TestCommitsGoOnWhileACompactionRuns: compaction is online. A
// compaction whose new table cannot reach the disk (its sync is held)
// holds up no change: creates, updates and reads are answered meanwhile,
// and the compaction ends once the disk lets it.
func TestCommitsGoOnWhileACompactionRuns(t *testing.T) {
	fs := newGatedFS(".sst")
	s, err := pebblestore.Open(t.TempDir(), pebblestore.WithFS(pebblestore.Options{}, fs))
	require.NoError(t, err)
	defer s.Close()
	defer close(fs.stop) // before the close, even when the test fails
	ctx := context.Background()
	// Two overlapping tables in level 0 and an empty memtable: the
	// compaction has work, and nothing waits to be flushed.
	n := 0
	create := func(count int) {
		for range count {
			n++
			require.NoError(t, s.Create(ctx, storetest.NewRecord(fmt.Sprintf("t%05d", n), fmt.Sprint("c", n%7), "a", "b", n), 0))
		}
	}
	create(200)
	require.NoError(t, pebblestore.Flush(s))
	for i := 1; i <= 200; i += 2 {
		_, err := s.Update(ctx, fmt.Sprintf("t%05d", i), func(r *store.Record) error {
			r.Task.Status.State = wire.StateCompleted
			return nil
		})
		require.NoError(t, err)
	}
	require.NoError(t, pebblestore.Flush(s))
	before := pebblestore.Compactions(s)

	fs.armed.Store(true)
	compacted := make(chan error, 1)
	go func() { compacted <- pebblestore.Compact(s) }()
	select {
	case <-fs.syncing:
	case err := <-compacted:
		t.Fatalf("the compaction ended (%v) without syncing a table", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the compaction never synced a table")
	}
	// The compaction is held at its table's sync. Changes go on.
	changed := make(chan error, 1)
	go func() {
		changed <- func() error {
			for i := range 50 {
				if err := s.Create(ctx, storetest.NewRecord(fmt.Sprintf("u%05d", i), "c", "a", "b", i), 0); err != nil {
					return err
				}
				if _, err := s.Update(ctx, fmt.Sprintf("t%05d", 2*i+2), func(r *store.Record) error {
					r.Task.Status.State = wire.StateWorking
					return nil
				}); err != nil {
					return err
				}
			}
			_, _, err := s.List(ctx, store.Query{Instance: "a"})
			return err
		}()
	}()
	select {
	case err := <-changed:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("changes stalled behind a compaction")
	}
	select {
	case err := <-compacted:
		t.Fatalf("the compaction ended (%v) while its table's sync was held", err)
	default:
	}
	close(fs.release)
	require.NoError(t, <-compacted)
	assert.Greater(t, pebblestore.Compactions(s), before, "a compaction ran")
	for _, id := range []string{"t00001", "t00002", "u00049"} {
		got, err := s.Get(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, id, got.Task.ID)
	}
}

// quiet is a Pebble logger for the tests' own Pebble.
type quiet struct{}

func (quiet) Infof(string, ...any)           {}
func (quiet) Errorf(string, ...any)          {}
func (quiet) Fatalf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }

// TestFirstStartsAtOnceMakeOneStore: brokers started at the same moment
// on a new data dir take turns: one makes the store, the others open
// it, and every change of each is there.
func TestFirstStartsAtOnceMakeOneStore(t *testing.T) {
	for round := range 10 {
		dir := t.TempDir()
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				s, err := pebblestore.Open(dir, pebblestore.Options{LockTimeout: 30 * time.Second})
				if !assert.NoError(t, err, "round %d", round) {
					return
				}
				assert.NoError(t, s.Create(context.Background(), storetest.NewRecord(fmt.Sprint("t", i), "c", "a", "b", i), 0))
				assert.NoError(t, s.Close())
			})
		}
		wg.Wait()
		s := open(t, dir)
		rs, _, err := s.List(context.Background(), store.Query{})
		require.NoError(t, err)
		require.NoError(t, s.Close())
		require.Len(t, rs, 4, "round %d", round)
	}
}

// TestANegativeOptionIsRefused: the zero Options are the defaults; a
// negative field is invalid, and Open refuses it before it touches the
// data dir.
func TestANegativeOptionIsRefused(t *testing.T) {
	require.NoError(t, pebblestore.Options{}.Validate())
	for name, opts := range map[string]pebblestore.Options{
		"LockTimeout":  {LockTimeout: -1},
		"MaxBatch":     {MaxBatch: -1},
		"CloseTimeout": {CloseTimeout: -time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			assert.ErrorIs(t, opts.Validate(), pebblestore.ErrInvalidOptions)
			dir := filepath.Join(t.TempDir(), "data")
			_, err := pebblestore.Open(dir, opts)
			assert.ErrorIs(t, err, pebblestore.ErrInvalidOptions)
			_, err = os.Stat(dir)
			assert.ErrorIs(t, err, os.ErrNotExist)
		})
	}
}
