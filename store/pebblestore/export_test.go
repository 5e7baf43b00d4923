package pebblestore

import (
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
func Flush(s *Store) error { return s.db.Flush() }

// Compact compacts the whole key space, as Pebble does in the background.
func Compact(s *Store) error {
	return s.db.Compact(context.Background(), []byte{0}, []byte{0xff}, false)
}

// Compactions is how many compactions Pebble has finished.
func Compactions(s *Store) int64 { return s.db.Metrics().Compact.Count }
