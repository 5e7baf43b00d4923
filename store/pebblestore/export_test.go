package pebblestore

import (
	"time"

	"context"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// WithFS makes Open use fs.
func WithFS(opts Options, fs vfs.FS) Options {
	opts.fs = fs
	return opts
}

// Queued is how many changes wait for the committer.
func Queued(s *Store) int { return len(s.ops) }

// Flush writes the memtable to a table file, so that a test can damage
// one.
func Flush(s *Store) error { return s.db.Load().Flush() }

// Compact compacts the whole key space, as Pebble does in the background.
func Compact(s *Store) error {
	return s.db.Load().Compact(context.Background(), []byte{0}, []byte{0xff}, false)
}

// Compactions is how many compactions Pebble has finished.
func Compactions(s *Store) int64 { return s.db.Load().Metrics().Compact.Count }

// LingerMin is the fewest changes a sync must carry for the syncer to
// wait after it.
const LingerMin = lingerMin

// SetLinger makes the syncer's wait d, whatever the last sync took, until
// undo. Set it before Open, and undo it after Close.
func SetLinger(d time.Duration) (undo func()) {
	old := lingerFor
	lingerFor = func(time.Duration) time.Duration { return d }
	return func() { lingerFor = old }
}

// Lingers is how many times the syncer has waited for company, and how
// many of those waits ran out.
func Lingers(s *Store) (waits, runOut int64) { return s.lingers.Load(), s.lingersRunOut.Load() }

// SyncRecords is how many log records the syncer has written to sync
// the log: none for a change Pebble syncs as it applies it.
func SyncRecords(s *Store) int64 { return s.syncRecords.Load() }

// LingerFor is the syncer's longest wait after a sync that took d.
func LingerFor(d time.Duration) time.Duration { return lingerFor(d) }

// SetReopenEvery makes the least time between two tries to reopen a
// failed store d, until undo. Set it before Open, and undo it after
// Close.
func SetReopenEvery(d time.Duration) (undo func()) {
	old := reopenEvery
	reopenEvery = d
	return func() { reopenEvery = old }
}

// Shut is closed once the store's database is closed and its data dir
// let go, also after a Close that gave up waiting for the disk.
func Shut(s *Store) <-chan struct{} { return s.shut }

// WaitingForRoom is how many writes wait for room on the disk.
func WaitingForRoom(s *Store) int { return s.disk.waiters() }

// Hold keeps the committer busy with a change of its own, which writes
// nothing, until release: the changes made meanwhile queue behind it.
func Hold(s *Store) (release func()) {
	let, started, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		s.run(context.Background(), func(*tx) error { close(started); <-let; return nil })
	}()
	<-started
	return func() { close(let); <-done }
}

// Handed is how many changes the committer has handed to the syncer,
// answered or not.
func Handed(s *Store) int64 { return s.handed.Load() }
