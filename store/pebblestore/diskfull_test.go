package pebblestore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/store/pebblestore"
	"github.com/a2a-bus/a2a-bus/store/storetest"
)

// answerBound is how soon a change is answered on a full disk.
const answerBound = 2 * time.Second

// fullFS is a disk that can be made full: then every write of a file
// whose name ends in suffix (every file for "") fails with ENOSPC, as a
// full disk's do, without writing anything.
type fullFS struct {
	*errorfs.FS
	full   atomic.Bool
	failed atomic.Int64 // writes refused
}

func newFullFS(suffix string) *fullFS { return newFullFSOf(suffix, true) }

// newFullFSOf is newFullFS whose full disk, with entries false, still
// takes new files and folders (as one with inodes left does: tmpfs, a
// quota of bytes), and refuses only the bytes written to them.
func newFullFSOf(suffix string, entries bool) *fullFS {
	fs := &fullFS{}
	fs.FS = errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if !fs.full.Load() || !strings.HasSuffix(op.Path, suffix) {
			return nil
		}
		switch op.Kind {
		case errorfs.OpCreate, errorfs.OpLink, errorfs.OpReuseForWrite, errorfs.OpMkdirAll:
			if !entries {
				return nil
			}
			fallthrough
		case errorfs.OpFileWrite, errorfs.OpFileWriteAt, errorfs.OpFilePreallocate:
			fs.failed.Add(1)
			return &os.PathError{Op: "write", Path: op.Path, Err: syscall.ENOSPC}
		}
		return nil
	}))
	return fs
}

// lines is a log handler's output, counted.
type lines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *lines) count() int { return strings.Count(l.String(), "\n") }

// diskHarness is a store on a disk a test can fill.
type diskHarness struct {
	t     *testing.T
	dir   string
	fs    *fullFS
	s     *pebblestore.Store
	log   *lines
	acked []string // the creates acknowledged
	n     int
}

func newDiskHarness(t *testing.T, suffix string, opts pebblestore.Options) *diskHarness {
	h := &diskHarness{t: t, dir: t.TempDir(), fs: newFullFS(suffix), log: &lines{}}
	opts.Logger = slog.New(slog.NewTextHandler(h.log, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s, err := pebblestore.Open(h.dir, pebblestore.WithFS(opts, h.fs))
	require.NoError(t, err)
	h.s = s
	t.Cleanup(func() {
		h.fs.full.Store(false) // whatever the test did: the store can close
		s.Close()
		select {
		case <-pebblestore.Shut(s):
		case <-time.After(30 * time.Second):
			t.Error("the store never closed")
		}
		if t.Failed() {
			t.Logf("the store's log:\n%s", h.log)
		}
	})
	return h
}

// create makes a task, failing the test if it is not answered within
// answerBound; it returns the answer.
func (h *diskHarness) create() error {
	h.t.Helper()
	h.n++
	id := fmt.Sprintf("t%05d", h.n)
	done := make(chan error, 1)
	go func() { done <- h.s.Create(context.Background(), storetest.NewRecord(id, "c", "a", "b", h.n), 0) }()
	select {
	case err := <-done:
		if err == nil {
			h.acked = append(h.acked, id)
		}
		return err
	case <-time.After(answerBound):
		h.t.Fatalf("create %s: no answer within %v", id, answerBound)
		return nil
	}
}

// requireAcked fails the test unless every acknowledged create is in s.
func (h *diskHarness) requireAcked(s *pebblestore.Store) {
	h.t.Helper()
	for _, id := range h.acked {
		got, err := s.Get(context.Background(), id)
		require.NoError(h.t, err, "acknowledged task %s", id)
		require.Equal(h.t, id, got.Task.ID)
	}
}

// fill makes the disk full and has the store meet it: by a change, whose
// log write finds no room, or by a flush, whose table does. It returns
// the flush's answer, if one was started.
func (h *diskHarness) fill(byFlush bool) <-chan error {
	h.t.Helper()
	h.fs.full.Store(true)
	if !byFlush {
		require.ErrorIs(h.t, h.create(), pebblestore.ErrDiskFull)
		return nil
	}
	flushed := make(chan error, 1)
	go func() { flushed <- pebblestore.Flush(h.s) }()
	require.Eventually(h.t, func() bool { return pebblestore.WaitingForRoom(h.s) > 0 }, 10*time.Second, time.Millisecond, "the flush meets the full disk")
	return flushed
}

var fullDiskCases = []struct {
	name   string
	suffix string // of the files whose writes find no room
	flush  bool   // the store meets the full disk in a flush
}{
	{"the log finds no room", ".log", false},
	{"a flush finds no room for its table", ".sst", true},
	{"no file finds room", "", false},
}

// TestAFullDiskIsABoundedError: on a full disk a change fails within
// answerBound with ErrDiskFull, and reads are answered; once there is
// room again, the next change is made, with no reopen from outside; every
// change acknowledged before is there, and after a restart. The store
// logs the full disk once, not once a retry.
func TestAFullDiskIsABoundedError(t *testing.T) {
	for _, tc := range fullDiskCases {
		t.Run(tc.name, func(t *testing.T) {
			h := newDiskHarness(t, tc.suffix, pebblestore.Options{})
			ctx := context.Background()
			for range 50 {
				require.NoError(t, h.create())
			}
			flushed := h.fill(tc.flush)
			for range 20 {
				err := h.create()
				require.ErrorIs(t, err, pebblestore.ErrDiskFull)
				var r interface{ Reason() string }
				require.ErrorAs(t, err, &r)
				assert.Equal(t, "the disk is full", r.Reason())
				_, err = h.s.Update(ctx, h.acked[0], func(*store.Record) error { return nil })
				require.ErrorIs(t, err, pebblestore.ErrDiskFull)
			}
			h.requireAcked(h.s)
			rs, _, err := h.s.List(ctx, store.Query{Instance: "a"})
			require.NoError(t, err, "lists are answered")
			// A change refused may be there too: applied before the
			// disk filled, it waits for its sync.
			assert.GreaterOrEqual(t, len(rs), len(h.acked))
			// The retries meanwhile, and the writes refused, leave a line or
			// two, not one each.
			refused := h.fs.failed.Load()
			logged := h.log.count()

			h.fs.full.Store(false)
			require.NoError(t, h.create(), "the next change once there is room")
			if flushed != nil {
				require.NoError(t, <-flushed, "the flush is done once there is room")
			}
			for range 20 {
				require.NoError(t, h.create())
			}
			h.requireAcked(h.s)
			t.Logf("writes refused: %d; lines logged meanwhile: %d", refused, logged)
			assert.LessOrEqual(t, logged, 2, "%s", h.log)
			require.NoError(t, h.s.Close())

			s := open(t, h.dir)
			defer s.Close()
			h.requireAcked(s)
		})
	}
}

// TestCloseIsBoundedOnAFullDisk: Close gives up waiting for a full disk
// after CloseTimeout, naming it; the store is closed to its callers. The
// database closes in the background once there is room, and every change
// acknowledged is there.
func TestCloseIsBoundedOnAFullDisk(t *testing.T) {
	const closeTimeout = 200 * time.Millisecond
	for _, tc := range fullDiskCases {
		t.Run(tc.name, func(t *testing.T) {
			h := newDiskHarness(t, tc.suffix, pebblestore.Options{CloseTimeout: closeTimeout})
			for range 50 {
				require.NoError(t, h.create())
			}
			flushed := h.fill(tc.flush)
			closed := make(chan error, 1)
			start := time.Now()
			go func() { closed <- h.s.Close() }()
			select {
			case err := <-closed:
				t.Logf("Close returned after %v: %v", time.Since(start), err)
				require.ErrorIs(t, err, pebblestore.ErrCloseAbandoned)
			case <-time.After(answerBound):
				t.Fatalf("Close waited %v for a full disk", answerBound)
			}
			_, err := h.s.Get(context.Background(), h.acked[0])
			require.ErrorIs(t, err, store.ErrClosed)
			require.ErrorIs(t, h.create(), store.ErrClosed)
			select {
			case <-pebblestore.Shut(h.s):
				t.Fatal("the database closed while its writes waited for room")
			default:
			}

			h.fs.full.Store(false)
			select {
			case <-pebblestore.Shut(h.s):
			case <-time.After(10 * time.Second):
				t.Fatal("the database did not close once there was room")
			}
			if flushed != nil {
				<-flushed
			}
			s := open(t, h.dir)
			defer s.Close()
			h.requireAcked(s)
		})
	}
}

// TestAFirstOpenOnAFullDiskFails: a store that cannot be made on a full
// disk is an error naming it, at once.
func TestAFirstOpenOnAFullDiskFails(t *testing.T) {
	fs := newFullFS("")
	fs.full.Store(true)
	_, err := pebblestore.Open(t.TempDir(), pebblestore.WithFS(pebblestore.Options{}, fs))
	require.ErrorIs(t, err, syscall.ENOSPC)
}

// TestConcurrentChangesThroughFailuresLoseNothingAcknowledged: senders
// and readers go on while the disk fills and empties and the log's sync
// fails and the store is reopened, again and again. Every change is
// answered; every one acknowledged is there, and after a restart.
func TestConcurrentChangesThroughFailuresLoseNothingAcknowledged(t *testing.T) {
	t.Cleanup(pebblestore.SetReopenEvery(0))
	full := newFullFS("")
	fs := newGatedFS(".log")
	fs.FS = full
	dir := t.TempDir()
	s, err := pebblestore.Open(dir, pebblestore.WithFS(pebblestore.Options{}, fs))
	require.NoError(t, err)
	t.Cleanup(func() {
		full.full.Store(false)
		fs.fail.Store(false)
		s.Close()
		<-pebblestore.Shut(s)
	})
	ctx := context.Background()
	var mu sync.Mutex
	var acked []string
	var refused atomic.Int64
	answered := make(chan struct{}, 1024) // a tick per answer, for the faults' pace
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("w%d-%06d", w, i)
				done := make(chan error, 1)
				go func() { done <- s.Create(ctx, storetest.NewRecord(id, fmt.Sprint("c", w), "a", "b", i), 0) }()
				select {
				case err := <-done:
					select {
					case answered <- struct{}{}:
					default:
					}
					if err != nil {
						refused.Add(1)
						continue
					}
					mu.Lock()
					acked = append(acked, id)
					mu.Unlock()
				case <-time.After(10 * time.Second):
					t.Errorf("create %s: no answer", id)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			// Reads answer, with the task or the store's failure while it
			// is being reopened.
			_, _, err := s.List(ctx, store.Query{Instance: "a", Limit: 10})
			if err != nil && !errors.Is(err, pebblestore.ErrFailed) {
				t.Errorf("list: %v", err)
				return
			}
		}
	})
	// The faults come and go every 50 answers.
	pace := func() {
		for range 50 {
			select {
			case <-answered:
			case <-time.After(10 * time.Second):
				t.Fatal("no change is answered")
			}
		}
	}
	for round := range 6 {
		pace()
		if round%2 == 0 {
			full.full.Store(true)
		} else {
			fs.fail.Store(true)
		}
		pace()
		full.full.Store(false)
		fs.fail.Store(false)
	}
	pace()
	close(stop)
	wg.Wait()
	require.NoError(t, s.Create(ctx, storetest.NewRecord("last", "c", "a", "b", 0), 0), "the store takes changes at the end")
	t.Logf("acknowledged %d, refused %d", len(acked), refused.Load())
	require.NotEmpty(t, acked)
	require.Positive(t, refused.Load())
	for _, id := range acked {
		_, err := s.Get(ctx, id)
		require.NoError(t, err, "acknowledged %s", id)
	}
	require.NoError(t, s.Close())
	s2 := open(t, dir)
	defer s2.Close()
	for _, id := range acked {
		_, err := s2.Get(ctx, id)
		require.NoError(t, err, "acknowledged %s, after a restart", id)
	}
}

// TestAStartOnAFullDiskStopsAndLetsGoOnceThereIsRoom: a start replays
// the log's changes and writes them to a table before Pebble's Open
// returns, and Pebble tries a table that found no room again at once,
// for ever. On a full disk the start stops instead, in one line naming
// the full disk; the open's write waits for room in the background (not
// tried again and again), a start meanwhile is told why, and once there
// is room the data dir is let go and the store opens whole.
func TestAStartOnAFullDiskStopsAndLetsGoOnceThereIsRoom(t *testing.T) {
	fs := newFullFSOf("", false)
	dir := t.TempDir()
	opts := pebblestore.WithFS(pebblestore.Options{}, fs)
	s, err := pebblestore.Open(dir, opts)
	require.NoError(t, err)
	for i := range 300 {
		require.NoError(t, s.Create(context.Background(), storetest.NewRecord(fmt.Sprint("t", i), "c", "a", "b", i), 0))
	}
	require.NoError(t, s.Close()) // the changes are in the log, not yet in a table

	fs.full.Store(true)
	opened := make(chan error, 1)
	go func() {
		s, err := pebblestore.Open(dir, opts)
		if err == nil {
			s.Close()
		}
		opened <- err
	}()
	select {
	case err = <-opened:
	case <-time.After(30 * time.Second):
		fs.full.Store(false) // let the open end
		t.Fatal("the start never ended on a full disk")
	}
	require.ErrorIs(t, err, pebblestore.ErrDiskFull)
	assert.NotContains(t, err.Error(), "\n")
	assert.Contains(t, err.Error(), "free room on the disk")
	link := filepath.Join(t.TempDir(), "link")
	require.NoError(t, os.Symlink(dir, link))
	for _, d := range []string{dir, link} { // the same data dir, by another name too
		_, err = pebblestore.Open(d, opts)
		require.ErrorIs(t, err, pebblestore.ErrDiskFull, d)
		assert.Contains(t, err.Error(), "an earlier start", d)
	}

	// The write waits: it is tried again now and then, not at once.
	tried := fs.failed.Load()
	require.Eventually(t, func() bool { return fs.failed.Load() >= tried+3 }, 30*time.Second, 10*time.Millisecond)
	assert.Less(t, fs.failed.Load(), tried+20, "the write that found no room is tried again at once")

	fs.full.Store(false)
	require.Eventually(t, func() bool {
		s, err = pebblestore.Open(dir, opts)
		return err == nil
	}, 30*time.Second, 20*time.Millisecond, "the store opens once there is room: %v", err)
	for i := range 300 {
		_, err := s.Get(context.Background(), fmt.Sprint("t", i))
		require.NoError(t, err)
	}
	require.NoError(t, s.Close())
}

// TestAMarkerWithNoRoomStopsTheStart: the marker of the last
// acknowledged commit is written anew at a start that has none (a store
// of an earlier version); with no room for it the start stops in one
// line naming the full disk and the marker, and leaves no part of it.
func TestAMarkerWithNoRoomStopsTheStart(t *testing.T) {
	fs := newFullFSOf(pebblestore.MarkerName+".new", false)
	dir := t.TempDir()
	opts := pebblestore.WithFS(pebblestore.Options{}, fs)
	s, err := pebblestore.Open(dir, opts)
	require.NoError(t, err)
	require.NoError(t, s.Create(context.Background(), storetest.NewRecord("t1", "c", "a", "b", 0), 0))
	require.NoError(t, s.Close())
	require.NoError(t, os.Remove(filepath.Join(dir, pebblestore.MarkerName)))

	fs.full.Store(true)
	_, err = pebblestore.Open(dir, opts)
	require.ErrorIs(t, err, pebblestore.ErrDiskFull)
	assert.NotContains(t, err.Error(), "\n")
	assert.Contains(t, err.Error(), pebblestore.MarkerName)
	assert.NoFileExists(t, filepath.Join(dir, pebblestore.MarkerName+".new"))

	fs.full.Store(false)
	s, err = pebblestore.Open(dir, opts)
	require.NoError(t, err)
	_, err = s.Get(context.Background(), "t1")
	require.NoError(t, err)
	require.NoError(t, s.Close())
}
