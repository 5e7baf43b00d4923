package pebblestore

import "github.com/cockroachdb/pebble/v2/vfs"

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
