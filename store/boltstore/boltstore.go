// Package boltstore reads the task store of earlier versions: one bbolt
// file, tasks.db, in the data directory. store/pebblestore migrates a data
// dir that has one, once: it opens the file here, with every check the
// earlier store made when it opened it, and copies its tasks. Nothing
// here writes to the file.
package boltstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/wire"
)

// SchemaVersion is the version of the file layout this package reads.
const SchemaVersion = 1

// FileName is the name of the database file in the data directory.
const FileName = "tasks.db"

// Named errors of Open.
var (
	// ErrLocked: another running broker (of an earlier version) holds
	// the file.
	ErrLocked = errors.New("boltstore: the data directory is held by another running broker")
	// ErrNewerSchema: the file was written by a newer version.
	ErrNewerSchema = errors.New("boltstore: the data file is from a newer version")
	// ErrCorrupt: the file is damaged.
	ErrCorrupt = errors.New("boltstore: the data file is corrupt")
	// ErrDataLoss: the file cannot show that it holds every acknowledged
	// change (it is empty, or a commit record is damaged), and
	// Options.AcceptDataLoss is not set.
	ErrDataLoss = errors.New("boltstore: the data file may have lost acknowledged changes")
)

// The buckets of the layout. Only tasks (id -> record JSON) is read; the
// others held the earlier store's indexes, which a reader rebuilds from
// the tasks, and must be there all the same.
var (
	bMeta   = []byte("meta") // "schema" -> version
	bTasks  = []byte("tasks")
	buckets = [][]byte{bMeta, bTasks, []byte("member"), []byte("open"), []byte("ctxopen"), []byte("ended")}
)

// Options configures Open. The zero value is the default.
type Options struct {
	// LockTimeout is how long Open waits for a broker of an earlier
	// version to let go of the file. 0 means one second.
	LockTimeout time.Duration
	// AcceptDataLoss opens a file that cannot show that it holds every
	// acknowledged change, with what it holds; OnDataLoss hears why. By
	// default Open refuses such a file (ErrDataLoss).
	AcceptDataLoss bool
	OnDataLoss     func(problem string)
}

// Store is an earlier version's task file, open for reading.
type Store struct {
	db *bolt.DB // nil for an empty file whose loss was accepted
}

// Open opens the file in dir for reading, and checks it: a file held by
// another process, from a newer version, or damaged (anywhere: every page
// is read once, here) is an error, and so is one that may have lost
// acknowledged changes, unless opts accepts it.
func Open(dir string, opts Options) (s *Store, err error) {
	if opts.LockTimeout < 0 {
		return nil, errors.New("boltstore: Options.LockTimeout must not be negative")
	}
	if opts.LockTimeout == 0 {
		opts.LockTimeout = time.Second
	}
	path := filepath.Join(dir, FileName)
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("boltstore: %w", err)
	}
	problem, err := dataProblem(path)
	if err != nil {
		return nil, fmt.Errorf("boltstore: %w", err)
	}
	if problem != "" {
		if !opts.AcceptDataLoss {
			return nil, errDataLoss(path, problem)
		}
		if opts.OnDataLoss != nil {
			opts.OnDataLoss(problem)
		}
		if info.Size() == 0 {
			return &Store{}, nil // what it holds: nothing
		}
		// bbolt opens a file with a damaged meta page at the other.
	}
	// A damaged file can make bbolt panic, or fault on the mapped file,
	// rather than fail: both become an error here.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	var db *bolt.DB
	defer func() {
		if r := recover(); r != nil {
			if db != nil {
				db.Close()
			}
			s, err = nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, r)
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: opts.LockTimeout, ReadOnly: true})
	switch {
	case errors.Is(err, bolterrors.ErrTimeout):
		return nil, fmt.Errorf("%w: %s", ErrLocked, dir)
	case err != nil && isSystemError(err):
		return nil, fmt.Errorf("boltstore: open %s: %w", path, err)
	case err != nil:
		// Invalid meta pages, checksums, a version mismatch, a file too
		// small: the file is not a sound database.
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	if err := db.View(func(tx *bolt.Tx) error { return check(tx, path) }); err != nil {
		db.Close()
		return nil, err
	}
	return &Store{db: db}, nil
}

// check checks the schema and the buckets, and reads every page once: a
// damaged page then shows up now, as an error (Open turns faults into
// panics it recovers), not in the middle of a migration. bbolt's own
// tx.Check walks in a goroutine of its own, where a fault on the mapped
// file would kill the process.
func check(tx *bolt.Tx, path string) error {
	meta := tx.Bucket(bMeta)
	if meta == nil && tx.Bucket(bTasks) == nil {
		return nil // no bucket yet: a first start of an earlier version cut short
	}
	var schema []byte
	if meta != nil {
		schema = meta.Get([]byte("schema"))
	}
	v, err := strconv.Atoi(string(schema))
	if err != nil {
		return fmt.Errorf("%w: %s: no schema version", ErrCorrupt, path)
	}
	if v > SchemaVersion {
		return fmt.Errorf("%w: %s has schema %d, this broker knows up to %d", ErrNewerSchema, path, v, SchemaVersion)
	}
	for _, b := range buckets {
		if tx.Bucket(b) == nil {
			return fmt.Errorf("%w: %s: bucket %s missing", ErrCorrupt, path, b)
		}
	}
	return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
		n := 0
		c := b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			n += len(k) + len(v)
		}
		if n < 0 {
			return fmt.Errorf("%w: %s: bucket %s: impossible size", ErrCorrupt, path, name)
		}
		return nil
	})
}

// isSystemError tells an error of the operating system (permissions,
// space, ...) from bbolt's judgement of the file's content.
func isSystemError(err error) bool {
	var pe *os.PathError
	var errno syscall.Errno
	return errors.As(err, &pe) || errors.As(err, &errno)
}

// ForEach calls fn with every task of the file, in id order, until fn
// returns an error, which it returns. A task that does not decode is
// ErrCorrupt.
func (s *Store) ForEach(fn func(*store.Record) error) error {
	if s.db == nil {
		return nil
	}
	return s.db.View(func(tx *bolt.Tx) error {
		tasks := tx.Bucket(bTasks)
		if tasks == nil {
			return nil
		}
		return tasks.ForEach(func(id, data []byte) error {
			var rec store.Record
			if err := wire.Unmarshal(data, &rec); err != nil {
				return fmt.Errorf("%w: task %s: %v", ErrCorrupt, id, err)
			}
			return fn(&rec)
		})
	})
}

// Close closes the file. Idempotent.
func (s *Store) Close() error {
	if s.db == nil {
		return nil
	}
	return s.db.Close()
}
