// Package pebblestore is the durable task store: a Pebble database (the
// LSM key-value store of CockroachDB) in the data directory. A change is
// acknowledged only once it is in the write-ahead log and the log is
// synced; the changes that arrive while a sync runs share the next one
// (group commit), and a lone change does not wait for company.
//
// Pebble was chosen over bbolt, which the store used before, because a
// commit there is one append to a preallocated, recycled log and one
// fdatasync: bbolt rewrites the B+tree pages a change touches and syncs
// twice (its pages, then its meta page). On the same disk a lone create
// took 2.0-2.2 × one append+fdatasync of its bytes with the bbolt store
// (1.6 × for a bare bbolt put), 1.03-1.16 × with this one.
// Pebble also compacts in the background without stopping commits, checks
// every block and log record by checksum, and tells a torn log tail (a
// change never acknowledged) from damage in the middle.
package pebblestore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/gofrs/flock"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/wire"
)

// SchemaVersion is the version of the key layout this package writes.
// 2 adds the send index (roleSend) and the records' idempotency keys: a
// version 1 store is one without them, and is marked 2 when opened, so
// that a broker that knows only 1 (and would drop the keys on update)
// refuses it. 3 adds the registrations (pReg): a version 2 store opens
// with none, and is marked 3, so that a broker that would leave them
// stale refuses it.
const SchemaVersion = 3

// DirName is the name of the database folder in the data directory.
const DirName = "tasks"

// Named errors of Open.
var (
	// ErrLocked: another running broker holds the data directory.
	ErrLocked = errors.New("pebblestore: the data directory is held by another running broker")
	// ErrNewerSchema: the store was written by a newer version.
	ErrNewerSchema = errors.New("pebblestore: the task store is from a newer version")
	// ErrCorrupt: the store is damaged (a checksum, the manifest, or a
	// log record in the middle of the log).
	ErrCorrupt = errors.New("pebblestore: the task store is corrupt")
	// ErrDataLoss: the store's folder is there but its database is not
	// (emptied or half removed), and Options.AcceptDataLoss is not set.
	ErrDataLoss = errors.New("pebblestore: the task store may have lost acknowledged changes")
)

// Key prefixes. Index keys end with the task id.
const (
	pMeta   = 'm' // "schema" -> version
	pTask   = 't' // id -> record JSON
	pMember = 'b' // instance \x00 role \x00 id -> state
	pOpen   = 'o' // id -> requester's session (open tasks)
	pCount  = 'c' // session -> number of open tasks it requested (8 bytes)
	pEnded  = 'e' // updatedAt ms (8 bytes) id -> nil (terminal tasks)
	pReg    = 'g' // instance -> registration JSON (schema 3)
)

const (
	roleRequester = 'r'
	roleAssignee  = 'a'
	// A member key of this role is instance \x00 's' \x00 SendKey -> id:
	// the index FindSend reads (schema 2). It sorts apart from the two
	// roles, so List never walks it.
	roleSend = 's'
)

// Options configures Open. The zero value is the default.
type Options struct {
	// LockTimeout is how long Open waits for another process to let go of
	// the store. 0 means one second.
	LockTimeout time.Duration
	// MaxBatch bounds the changes that share one commit. 0 means 1000.
	MaxBatch int
	// AcceptDataLoss opens a store whose database is gone from its folder
	// as a new one; OnDataLoss hears why. By default Open refuses it
	// (ErrDataLoss).
	AcceptDataLoss bool
	OnDataLoss     func(problem string)
	// Logger receives Pebble's own messages (Debug and Warn). nil
	// discards them.
	Logger *slog.Logger

	fs vfs.FS // tests watch the disk through it; nil is the plain one
}

// Store is the durable store. It implements store.Store.
type Store struct {
	db      *pebble.DB
	ops     chan *op
	applied chan *group // from the committer to the syncer
	max     int
	broken  atomic.Value // the error of a failed sync

	qmu    sync.RWMutex // held shared to queue a change, exclusively to close
	closed bool

	ctx    context.Context // canceled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // the committer and the syncer

	cmu    sync.Mutex        // guards counts, which the committer changes
	counts map[string]uint64 // open tasks per requester's session, as on disk
	maxID  string            // the greatest task id stored; the committer's

	lock *flock.Flock // the data dir's, held while open

	// The syncer's waits for company, and those that ran out (tests).
	lingers, lingersRunOut atomic.Int64

	closeOnce sync.Once
}

var _ store.Store = (*Store)(nil)

// op is one change waiting for the committer. fn either fails without
// writing anything, or writes and succeeds: so a failing change does not
// spoil the others of its batch.
type op struct {
	fn   func(t *tx) error
	done chan error
}

// Open opens (creating it if needed) the store in dir. A directory held by
// another process, a store from a newer version and a damaged store are
// errors: the store never starts over silently.
func Open(dir string, opts Options) (*Store, error) {
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = time.Second
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 1000
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.fs == nil {
		opts.fs = vfs.Default
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pebblestore: %w", err)
	}
	// The data dir's lock comes first: a migration and a first store are
	// made by one broker, not by two at once.
	lock, err := lockDir(dir, opts.LockTimeout)
	if err != nil {
		return nil, err
	}
	s, err := openLocked(dir, opts)
	if err != nil {
		lock.Unlock()
		return nil, err
	}
	s.lock = lock
	return s, nil
}

// LockName is the file in the data dir whose lock a store holds while it
// is open.
const LockName = "tasks.lock"

func lockDir(dir string, timeout time.Duration) (*flock.Flock, error) {
	l := flock.New(filepath.Join(dir, LockName), flock.SetPermissions(0o600))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ok, err := l.TryLockContext(ctx, 20*time.Millisecond)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return nil, fmt.Errorf("pebblestore: lock %s: %w", l.Path(), err)
	}
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrLocked, dir)
	}
	return l, nil
}

// openLocked opens the store in dir, whose lock the caller holds.
func openLocked(dir string, opts Options) (s *Store, err error) {
	path := filepath.Join(dir, DirName)
	if err := migrate(dir, opts); err != nil {
		return nil, err
	}
	if err := createIfMissing(path, opts, nil); err != nil {
		return nil, err
	}
	db, err := open(path, opts, true)
	if errors.Is(err, pebble.ErrDBDoesNotExist) {
		problem := "the folder holds no database (no CURRENT file)"
		if !opts.AcceptDataLoss {
			return nil, fmt.Errorf("%w: %s: %s; start with --accept-data-loss to begin a new store there", ErrDataLoss, path, problem)
		}
		if opts.OnDataLoss != nil {
			opts.OnDataLoss(problem)
		}
		if db, err = open(path, opts, false); err == nil {
			err = prepare(db, path)
		}
	}
	defer func() {
		if err != nil && db != nil {
			_ = fatalAsError(db.Close)
		}
	}()
	if err != nil {
		return nil, err
	}
	if err := check(db, path); err != nil {
		return nil, err
	}
	counts, err := loadCounts(db)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	maxID, err := lastID(db)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	s = &Store{db: db, ops: make(chan *op, opts.MaxBatch), applied: make(chan *group, 64), max: opts.MaxBatch, counts: counts, maxID: maxID}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Go(s.commit)
	s.wg.Go(s.sync)
	return s, nil
}

// open opens the database at path. mustExist refuses a folder without a
// database (pebble.ErrDBDoesNotExist). The caller holds the data dir's
// lock, so Pebble's own LOCK is free unless something else holds it.
func open(path string, opts Options, mustExist bool) (*pebble.DB, error) {
	o := &pebble.Options{
		ErrorIfNotExists: mustExist,
		// The plain file system: Pebble's default wraps it in a disk
		// health check whose goroutine a failed Open leaves running.
		FS:                 privateFS{opts.fs},
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             logger{opts.Logger},
		// Damage found by a read is an error for that read (and for
		// Open, which reads everything once): a warning here, not
		// Pebble's default, a fatal log.
		EventListener: &pebble.EventListener{DataCorruption: func(info pebble.DataCorruptionInfo) {
			opts.Logger.Warn("pebble: damaged data", "path", info.Path, "error", info.Details)
		}},
	}
	// Compaction is most of a busy store's work: every flushed file spans
	// the whole key space (tasks and their index keys), so with Pebble's
	// defaults each compaction of level 0 rewrote all of the level below.
	// Flushes split into files of 256 KiB (not 4 MiB), which overlap
	// fewer files below, and level 0 compacts at 8 sub-levels deep rather
	// than 4, so each compaction carries more: with 64 senders creating
	// 300,000 tasks, 1.7 bytes written to disk per byte logged instead of
	// 2.8, and 30 % more creates a second. Writes stop only at 24 deep
	// (Pebble's default is 12), so that the later start does not bring a
	// stall nearer.
	o.FlushSplitBytes = 256 << 10
	o.L0CompactionThreshold = 8
	o.L0StopWritesThreshold = 24
	// A create looks up an id it expects not to find: a Bloom filter on
	// every level answers that without reading a block.
	for i := range o.Levels {
		o.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	db, err := pebble.Open(path, o)
	switch {
	case err == nil:
		return db, nil
	case errors.Is(err, pebble.ErrDBDoesNotExist):
		return nil, err
	case isLocked(err):
		return nil, fmt.Errorf("%w: %s (its LOCK is held)", ErrLocked, filepath.Dir(path))
	case isSystemError(err):
		return nil, fmt.Errorf("pebblestore: open %s: %w", path, err)
	default:
		// A checksum, a malformed manifest, a log record damaged in the
		// middle: the store is not sound.
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
}

// isSystemError tells an error of the operating system (permissions,
// space, ...) from Pebble's judgement of the store's content.
func isSystemError(err error) bool {
	var pe *os.PathError
	var errno syscall.Errno
	return errors.As(err, &pe) || errors.As(err, &errno)
}

// isLocked tells Pebble's LOCK file held by a process that did not take
// the data dir's lock first (not a broker of this version).
func isLocked(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "lock held by current process") ||
		strings.Contains(msg, "resource temporarily unavailable") ||
		strings.Contains(msg, "being used by another process") // Windows
}

// createIfMissing makes a new, empty store at path when there is none,
// whole or not at all: it is built under another name and renamed into
// place, so that a crash during a first start never leaves a folder
// without a database, which the next start would rightly take for a lost
// one. A rename onto a folder another broker made meanwhile fails, and
// theirs is kept.
func createIfMissing(path string, opts Options, fill func(db *pebble.DB) error) error {
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		return nil // there, or not ours to know: Open looks at it
	}
	tmp := path + ".new"
	os.RemoveAll(tmp) // a crash's leftover: it never held an acknowledged change
	db, err := open(tmp, opts, false)
	if err != nil {
		return fmt.Errorf("pebblestore: create %s: %w", path, err)
	}
	err = prepare(db, path)
	if err == nil && fill != nil {
		err = fill(db)
	}
	if cerr := fatalAsError(db.Close); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
		if err != nil {
			if _, serr := os.Lstat(path); serr == nil {
				err = nil // another broker made it first
			}
		}
	}
	os.RemoveAll(tmp)
	if err != nil {
		return fmt.Errorf("pebblestore: create %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

// syncDir makes a folder's entries durable (a new entry's name). Where a
// folder cannot be synced (Windows), its entries are durable already.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("pebblestore: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil && runtime.GOOS != "windows" {
		return fmt.Errorf("pebblestore: sync %s: %w", dir, err)
	}
	return nil
}

// prepare writes the schema version of a new store.
func prepare(db *pebble.DB, path string) error {
	if err := fatalAsError(func() error {
		return db.Set(key(pMeta, "schema"), []byte(strconv.Itoa(SchemaVersion)), pebble.Sync)
	}); err != nil {
		return fmt.Errorf("pebblestore: prepare %s: %w", path, err)
	}
	return nil
}

// check reads the schema version, then every key and value once, so that
// a damaged block shows up now, as an error, not later in the middle of
// a request.
func check(db *pebble.DB, path string) error {
	v, closer, err := db.Get(key(pMeta, "schema"))
	if err != nil {
		return fmt.Errorf("%w: %s: no schema version: %v", ErrCorrupt, path, err)
	}
	version, err := strconv.Atoi(string(v))
	closer.Close()
	if err != nil {
		return fmt.Errorf("%w: %s: no schema version", ErrCorrupt, path)
	}
	if version > SchemaVersion {
		return fmt.Errorf("%w: %s has schema %d, this broker knows up to %d", ErrNewerSchema, path, version, SchemaVersion)
	}
	if version < SchemaVersion {
		if err := prepare(db, path); err != nil {
			return err
		}
	}
	it, err := db.NewIter(nil)
	if err != nil {
		return fmt.Errorf("pebblestore: %w", err)
	}
	for it.First(); it.Valid(); it.Next() {
		_ = it.Value()
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	return nil
}

// loadCounts reads the open-task counts.
func loadCounts(db *pebble.DB) (map[string]uint64, error) {
	counts := map[string]uint64{}
	err := walkAfter(db, []byte{pCount}, "", func(session, v []byte) (bool, error) {
		if len(v) != 8 {
			return false, fmt.Errorf("open-task count of %q: %d bytes", session, len(v))
		}
		counts[string(session)] = binary.BigEndian.Uint64(v)
		return true, nil
	})
	return counts, err
}

// lastID returns the greatest stored task id.
func lastID(db *pebble.DB) (string, error) {
	it, err := prefixIter(db, []byte{pTask})
	if err != nil {
		return "", err
	}
	id := ""
	if it.Last() {
		id = string(it.Key()[1:])
	}
	return id, it.Close()
}

// logger hands Pebble's messages to a slog.Logger.
type logger struct{ l *slog.Logger }

func (l logger) Infof(format string, args ...any) {
	l.l.Debug("pebble: " + fmt.Sprintf(format, args...))
}
func (l logger) Errorf(format string, args ...any) {
	l.l.Warn("pebble: " + fmt.Sprintf(format, args...))
}

// Fatalf is Pebble's report of an invariant it cannot go on without.
func (l logger) Fatalf(format string, args ...any) {
	msg := "pebble: " + fmt.Sprintf(format, args...)
	l.l.Error(msg)
	panic(msg)
}

// commit runs the changes, in two stages that overlap. The committer
// applies each batch of queued changes at once, without waiting for the
// disk (Pebble makes a change visible before its log sync in any case);
// the syncer then syncs the log once for every batch applied meanwhile,
// and only then answers their senders. So while one fdatasync runs, the
// next batches are built and applied, and a lone change waits for
// nothing but its own sync.
func (s *Store) commit() {
	defer close(s.applied)
	batch := make([]*op, 0, s.max)
	for {
		select {
		case o := <-s.ops:
			batch = append(batch[:0], o)
		case <-s.ctx.Done():
			// Close queues nothing more; what is queued fails unrun.
			for {
				select {
				case o := <-s.ops:
					o.done <- store.ErrClosed
				default:
					return
				}
			}
		}
	more:
		for len(batch) < s.max {
			select {
			case o := <-s.ops:
				batch = append(batch, o)
			default:
				break more
			}
		}
		if err := s.failed(); err != nil {
			for _, o := range batch {
				o.done <- err
			}
			continue
		}
		g := &group{ops: slices.Clone(batch), results: make([]error, len(batch))}
		t := &tx{Batch: s.db.NewIndexedBatch(), counts: s.counts, pending: map[string]uint64{}, maxID: s.maxID}
		for i, o := range batch {
			g.results[i] = o.fn(t)
		}
		err := fatalAsError(func() error { return t.Commit(pebble.NoSync) })
		t.Close()
		// Raised even if the commit failed: a bound too high only costs
		// a lookup.
		s.maxID = t.maxID
		if err != nil {
			// Not applied, or not known to be: the store stops here.
			err = fmt.Errorf("pebblestore: commit: %w", err)
			s.fail(err)
			for _, o := range batch {
				o.done <- err
			}
			continue
		}
		s.cmu.Lock()
		for session, n := range t.pending {
			if n == 0 {
				delete(s.counts, session)
			} else {
				s.counts[session] = n
			}
		}
		s.cmu.Unlock()
		s.applied <- g
	}
}

// group is a batch applied and waiting for its sync.
type group struct {
	ops     []*op
	results []error
}

// lingerMin is the fewest changes a sync must have carried for the
// syncer to wait for company before the next one.
const lingerMin = 8

// lingerFor bounds that wait, from how long the last sync took: twice
// that, and never more than a millisecond, since one slow sync says
// little of the next.
var lingerFor = func(lastSync time.Duration) time.Duration { return min(2*lastSync, time.Millisecond) }

// maxLingerSkip bounds how many syncs go without a wait after waits
// that ran out.
const maxLingerSkip = 64

// sync syncs the log for the groups applied, as many at once as are
// waiting, and answers their senders. A failed sync leaves it unknown
// what reached the disk: the store fails every change from then on.
//
// Under load, the changes that arrive while one sync runs wait for the
// next, and senders that each wait for their change split into cohorts
// that each get a sync of their own: 64 senders shared one sync about
// 16 at a time. So after a sync of lingerMin changes or more, the
// syncer waits for as many as that sync carried, for at most lingerFor:
// the senders it has just answered are back within that, and the
// cohorts merge. With 16 and 64 senders creating tasks, that made
// 23-45 % and 13-22 % more creates a second, at a lower p50 latency (go
// test -bench, old and new interleaved). Where changes do not come from
// senders waiting on their answers (a steady stream), a wait runs out
// instead and only adds latency: after one that did, the syncer goes
// 1, then 2, 4, ... up to maxLingerSkip syncs without waiting, until a
// wait fills again. A sender alone, or a few, waits at most once, right
// after a burst.
func (s *Store) sync() {
	var groups []*group
	wait := time.NewTimer(time.Hour)
	wait.Stop()
	defer wait.Stop()
	last, took := 0, time.Duration(0) // the last sync's changes, and its time
	skip, backoff := 0, 0             // syncs to go without a wait
	for g := range s.applied {
		groups = append(groups[:0], g)
		n, open := len(g.ops), true
	more:
		for {
			select {
			case g, ok := <-s.applied:
				if !ok {
					open = false
					break more
				}
				groups = append(groups, g)
				n += len(g.ops)
			default:
				break more
			}
		}
		switch {
		case !open || last < lingerMin || n >= last || s.failed() != nil:
		case skip > 0:
			skip--
		default:
			s.lingers.Add(1)
			wait.Reset(lingerFor(took))
		linger:
			for n < last {
				select {
				case g, ok := <-s.applied:
					if !ok {
						open = false
						break linger // closing: what is here is synced now
					}
					groups = append(groups, g)
					n += len(g.ops)
				case <-wait.C:
					break linger
				}
			}
			wait.Stop()
			if n < last && open {
				s.lingersRunOut.Add(1)
				backoff = min(max(2*backoff, 1), maxLingerSkip)
				skip = backoff
			} else {
				backoff = 0
			}
		}
		err := s.failed()
		if err == nil {
			// A log record of its own, synced, syncs every batch
			// before it.
			start := time.Now()
			if serr := fatalAsError(func() error { return s.db.LogData(syncMark, pebble.Sync) }); serr != nil {
				err = fmt.Errorf("pebblestore: sync: %w", serr)
				s.fail(err)
			} else {
				took = time.Since(start)
			}
		}
		last = n
		for _, g := range groups {
			for i, o := range g.ops {
				if err != nil {
					o.done <- err
				} else {
					o.done <- g.results[i]
				}
			}
		}
	}
}

// syncMark is the log record whose sync makes the batches before it
// durable. Pebble replays it as nothing.
var syncMark = []byte{0}

// fatalAsError runs a commit, a log sync or a close. Pebble reports a
// failed one as fatal (its pipeline cannot go on): where Pebble's own
// goroutine is the caller's, that is an error here, which fails the
// store. A failure Pebble meets in a goroutine of its own (a failed sync
// while it switches log files, or of its manifest) still ends the
// process: Logger.Fatalf panics there, as Pebble requires.
func fatalAsError(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	return fn()
}

func (s *Store) failed() error {
	if err, ok := s.broken.Load().(error); ok {
		return err
	}
	return nil
}

func (s *Store) fail(err error) { s.broken.CompareAndSwap(nil, err) }

// tx is one commit's batch, with the open-task counts as its changes
// leave them: the store keeps the counts in memory too (the committer
// alone changes them), so that a create does not read them from disk.
type tx struct {
	*pebble.Batch
	counts  map[string]uint64 // committed; read-only here
	pending map[string]uint64 // changed by this batch
	maxID   string            // no stored task has a greater id
}

func (t *tx) count(session string) uint64 {
	if n, ok := t.pending[session]; ok {
		return n
	}
	return t.counts[session]
}

// setCount changes a session's count, in the batch and in memory.
func (t *tx) setCount(session string, n uint64) error {
	t.pending[session] = n
	if n == 0 {
		return t.Delete(key(pCount, session), nil)
	}
	return t.Set(key(pCount, session), binary.BigEndian.AppendUint64(nil, n), nil)
}

// run queues a change and waits until it is committed (on disk) or fails.
// Once queued, the change is committed or not whatever the caller does,
// so run waits for the committer's answer: a committed change is never
// reported as failed.
func (s *Store) run(ctx context.Context, fn func(t *tx) error) error {
	o := &op{fn: fn, done: make(chan error, 1)}
	s.qmu.RLock()
	if s.closed {
		s.qmu.RUnlock()
		return store.ErrClosed
	}
	select {
	case s.ops <- o:
	case <-ctx.Done():
		s.qmu.RUnlock()
		return ctx.Err()
	}
	s.qmu.RUnlock()
	return <-o.done
}

// reader is what both a batch (inside a commit) and a snapshot read.
type reader interface {
	Get(key []byte) ([]byte, io.Closer, error)
	NewIter(o *pebble.IterOptions) (*pebble.Iterator, error)
}

// view runs fn on a consistent snapshot of the committed store.
func (s *Store) view(fn func(r reader) error) error {
	s.qmu.RLock() // Close waits for the reads under way
	defer s.qmu.RUnlock()
	if s.closed {
		return store.ErrClosed
	}
	snap := s.db.NewSnapshot()
	defer snap.Close()
	return fn(snap)
}

func key(prefix byte, parts ...string) []byte {
	n := 1
	for _, p := range parts {
		n += len(p)
	}
	k := make([]byte, 1, n)
	k[0] = prefix
	for _, p := range parts {
		k = append(k, p...)
	}
	return k
}

// get returns a copy of the value at k, nil when there is none.
func get(r reader, k []byte) ([]byte, error) {
	v, closer, err := r.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := bytes.Clone(v)
	closer.Close()
	if out == nil {
		out = []byte{}
	}
	return out, nil
}

// prefixIter walks the keys that start with prefix, from start on.
func prefixIter(r reader, prefix []byte) (*pebble.Iterator, error) {
	return r.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: upperBound(prefix)})
}

// upperBound is the first key after every key with prefix.
func upperBound(prefix []byte) []byte {
	end := bytes.Clone(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// Create implements store.Store.
func (s *Store) Create(ctx context.Context, rec *store.Record, maxOpen int) error {
	data, err := rec.Encode()
	if err != nil {
		return fmt.Errorf("pebblestore: encode task: %w", err)
	}
	open := rec.Task.Status.State.Open()
	return s.run(ctx, func(b *tx) error {
		// Task ids sort in creation order (the broker makes them so): an
		// id past every stored one is new without a lookup.
		if rec.Task.ID <= b.maxID {
			old, err := get(b, key(pTask, rec.Task.ID))
			if err != nil {
				return err
			}
			if old != nil {
				return store.ErrExists
			}
		}
		if open && maxOpen > 0 && b.count(rec.Task.ContextID) >= uint64(maxOpen) {
			return store.ErrLimit
		}
		if err := put(b, rec, data, nil); err != nil {
			return err
		}
		b.maxID = max(b.maxID, rec.Task.ID)
		return nil
	})
}

func memberKey(instance string, role byte, id string) []byte {
	return key(pMember, instance, "\x00", string(role), "\x00", id)
}

func endedKey(rec *store.Record) []byte {
	k := make([]byte, 9, 9+len(rec.Task.ID))
	k[0] = pEnded
	binary.BigEndian.PutUint64(k[1:], uint64(rec.Task.UpdatedAt.UnixMilli()))
	return append(k, rec.Task.ID...)
}

// put writes rec (encoded as data) and brings the indexes from old (nil
// for a new task) to it. Batch writes go to memory: they fail only on a
// closed batch, which the committer never hands out.
func put(b *tx, rec *store.Record, data []byte, old *store.Record) error {
	id := rec.Task.ID
	state := []byte(rec.Task.Status.State)
	wasOpen := old != nil && old.Task.Status.State.Open()
	isOpen := rec.Task.Status.State.Open()
	errs := []error{
		b.Set(key(pTask, id), data, nil),
		b.Set(memberKey(rec.RequesterInstance, roleRequester, id), state, nil),
		b.Set(memberKey(rec.AssigneeInstance, roleAssignee, id), state, nil),
	}
	if old == nil && rec.SendKey != "" {
		errs = append(errs, b.Set(memberKey(rec.RequesterInstance, roleSend, rec.SendKey), []byte(id), nil))
	}
	n := b.count(rec.Task.ContextID)
	switch {
	case isOpen && !wasOpen:
		errs = append(errs, b.Set(key(pOpen, id), []byte(rec.Task.ContextID), nil), b.setCount(rec.Task.ContextID, n+1))
	case !isOpen && wasOpen:
		errs = append(errs, b.Delete(key(pOpen, id), nil), b.setCount(rec.Task.ContextID, n-min(n, 1)))
	}
	if old != nil && !old.Task.Status.State.Open() {
		errs = append(errs, b.Delete(endedKey(old), nil))
	}
	if !isOpen {
		errs = append(errs, b.Set(endedKey(rec), nil, nil))
	}
	return errors.Join(errs...)
}

func getRecord(r reader, id string) (*store.Record, error) {
	data, err := get(r, key(pTask, id))
	if err != nil {
		return nil, err
	}
	if data == nil {
		return nil, store.ErrNotFound
	}
	return decodeRecord(id, data)
}

func decodeRecord(id string, data []byte) (*store.Record, error) {
	var rec store.Record
	if err := wire.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("%w: task %s: %v", ErrCorrupt, id, err)
	}
	return &rec, nil
}

// Get implements store.Store.
func (s *Store) Get(_ context.Context, id string) (*store.Record, error) {
	s.qmu.RLock()
	defer s.qmu.RUnlock()
	if s.closed {
		return nil, store.ErrClosed
	}
	return getRecord(s.db, id)
}

// FindSend implements store.Store.
func (s *Store) FindSend(_ context.Context, instance, key string) (*store.Record, error) {
	s.qmu.RLock()
	defer s.qmu.RUnlock()
	if s.closed {
		return nil, store.ErrClosed
	}
	id, err := get(s.db, memberKey(instance, roleSend, key))
	if err != nil {
		return nil, err
	}
	if id == nil {
		return nil, store.ErrNotFound
	}
	rec, err := getRecord(s.db, string(id))
	if err == nil && (rec.RequesterInstance != instance || rec.SendKey != key) {
		return nil, store.ErrNotFound // an entry left behind by an older broker's prune
	}
	return rec, err
}

// Update implements store.Store. fn runs inside the commit; it must only
// change the record.
func (s *Store) Update(ctx context.Context, id string, fn func(*store.Record) error) (*store.Record, error) {
	var out *store.Record
	err := s.run(ctx, func(b *tx) error {
		old, err := getRecord(b, id)
		if err != nil {
			return err
		}
		rec := old.Clone()
		if err := fn(rec); err != nil {
			return err
		}
		data, err := rec.Encode()
		if err != nil {
			return fmt.Errorf("pebblestore: encode task: %w", err)
		}
		if err := put(b, rec, data, old); err != nil {
			return err
		}
		out = rec
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// List implements store.Store, from the indexes: by member instance
// (with the state kept in the index, so that only selected tasks are
// read, and the two roles merged in id order), or the open tasks; only a
// query of neither reads every task. It reads the tasks of the page, and
// the size of the first one past it.
func (s *Store) List(_ context.Context, q store.Query) ([]*store.Record, bool, error) {
	out := []*store.Record{}
	more := false
	err := s.view(func(r reader) error {
		var page store.Pager
		// take adds the task to the page; it reports false once the page
		// is full.
		take := func(id string, data []byte, check bool) (bool, error) {
			if data == nil {
				d, err := get(r, key(pTask, id))
				if err != nil {
					return false, err
				}
				if d == nil {
					return true, nil // an index entry without its task: not listed
				}
				data = d
			}
			var rec *store.Record
			if check {
				r, err := decodeRecord(id, data)
				if err != nil {
					return false, err
				}
				if !q.Matches(r) {
					return true, nil
				}
				rec = r
			}
			if !page.Take(q, len(data)) {
				more = true
				return false, nil
			}
			if rec == nil {
				r, err := decodeRecord(id, data)
				if err != nil {
					return false, err
				}
				rec = r
			}
			out = append(out, rec)
			return true, nil
		}
		switch {
		case q.Instance != "":
			return listMember(r, q, take)
		case q.OpenOnly && q.State == "":
			return walkAfter(r, []byte{pOpen}, q.After, func(k, _ []byte) (bool, error) {
				return take(string(k), nil, false)
			})
		default:
			return walkAfter(r, []byte{pTask}, q.After, func(k, v []byte) (bool, error) {
				return take(string(k), bytes.Clone(v), true)
			})
		}
	})
	if err != nil {
		return nil, false, err
	}
	return out, more, nil
}

// walkAfter calls fn with the rest of each key with prefix that sorts
// after after, and its value, in order, while fn reports true.
func walkAfter(r reader, prefix []byte, after string, fn func(rest, v []byte) (bool, error)) error {
	it, err := prefixIter(r, prefix)
	if err != nil {
		return err
	}
	start := append(bytes.Clone(prefix), after...)
	for ok := it.SeekGE(start); ok; ok = it.Next() {
		rest := it.Key()[len(prefix):]
		if after != "" && string(rest) == after {
			continue
		}
		if goOn, err := fn(bytes.Clone(rest), it.Value()); !goOn || err != nil {
			it.Close()
			return err
		}
	}
	return it.Close()
}

// listMember walks an instance's member index, one iterator per role,
// merged in id order, and takes the tasks whose indexed state q selects.
func listMember(r reader, q store.Query, take func(id string, data []byte, check bool) (bool, error)) error {
	type walk struct {
		it     *pebble.Iterator
		prefix []byte
		ok     bool
	}
	var walks []*walk
	defer func() {
		for _, w := range walks {
			w.it.Close()
		}
	}()
	for _, role := range []byte{roleRequester, roleAssignee} {
		if (q.Role == store.Requester && role != roleRequester) || (q.Role == store.Assignee && role != roleAssignee) {
			continue
		}
		prefix := memberKey(q.Instance, role, "")
		it, err := prefixIter(r, prefix)
		if err != nil {
			return err
		}
		w := &walk{it: it, prefix: prefix}
		w.ok = it.SeekGE(append(bytes.Clone(prefix), q.After...))
		if w.ok && q.After != "" && string(it.Key()[len(prefix):]) == q.After {
			w.ok = it.Next()
		}
		walks = append(walks, w)
	}
	for {
		// The walk whose next id is smallest goes first.
		var next *walk
		for _, w := range walks {
			if w.ok && (next == nil || bytes.Compare(w.it.Key()[len(w.prefix):], next.it.Key()[len(next.prefix):]) < 0) {
				next = w
			}
		}
		if next == nil {
			return nil
		}
		id, state := string(next.it.Key()[len(next.prefix):]), string(next.it.Value())
		next.ok = next.it.Next()
		if (q.State != "" && state != string(q.State)) || (q.OpenOnly && !stateOpen(state)) {
			continue
		}
		if ok, err := take(id, nil, false); !ok || err != nil {
			return err
		}
	}
}

func stateOpen(v string) bool {
	switch v {
	case "submitted", "working", "input-required":
		return true
	}
	return false
}

// OpenCount implements store.Store: the sum of the per-session counts.
func (s *Store) OpenCount(context.Context) (int, error) {
	s.qmu.RLock()
	defer s.qmu.RUnlock()
	if s.closed {
		return 0, store.ErrClosed
	}
	s.cmu.Lock()
	defer s.cmu.Unlock()
	n := 0
	for _, c := range s.counts {
		n += int(c)
	}
	return n, nil
}

// Prune implements store.Store, walking the terminal tasks oldest first.
// It counts them in the same batch, so it sees what earlier changes of a
// shared commit did.
func (s *Store) Prune(ctx context.Context, r store.Retention, now time.Time) (int, error) {
	var pruned int
	err := s.run(ctx, func(b *tx) error {
		pruned = 0
		var ended [][]byte
		if err := walkAfter(b, []byte{pEnded}, "", func(rest, _ []byte) (bool, error) {
			ended = append(ended, rest)
			return true, nil
		}); err != nil {
			return err
		}
		cutoff := uint64(0)
		if r.MaxAge > 0 {
			cutoff = uint64(now.Add(-r.MaxAge).UnixMilli())
		}
		var doomed [][]byte
		for _, k := range ended {
			tooOld := r.MaxAge > 0 && binary.BigEndian.Uint64(k[:8]) < cutoff
			tooMany := r.MaxTerminal > 0 && len(ended)-len(doomed) > r.MaxTerminal
			if !tooOld && !tooMany {
				break
			}
			doomed = append(doomed, k)
		}
		for _, k := range doomed {
			id := string(k[8:])
			rec, err := getRecord(b, id)
			if err == nil && rec.Task.Status.State.Open() {
				continue // never: an open task is not in this index
			}
			deletes := []error{b.Delete(append([]byte{pEnded}, k...), nil), b.Delete(key(pTask, id), nil)}
			if err == nil {
				deletes = append(deletes,
					b.Delete(memberKey(rec.RequesterInstance, roleRequester, id), nil),
					b.Delete(memberKey(rec.AssigneeInstance, roleAssignee, id), nil))
				if rec.SendKey != "" {
					deletes = append(deletes, b.Delete(memberKey(rec.RequesterInstance, roleSend, rec.SendKey), nil))
				}
			}
			// An entry without a readable task is dropped too, so that
			// pruning does not stop at it for ever.
			if err := errors.Join(deletes...); err != nil {
				return err
			}
			pruned++
		}
		return nil
	})
	return pruned, err
}

// PutRegistration implements store.Registry: one key a registration,
// committed and synced as a task's change is.
func (s *Store) PutRegistration(ctx context.Context, reg store.Registration) error {
	data, err := json.Marshal(reg)
	if err != nil {
		return fmt.Errorf("pebblestore: %w", err)
	}
	return s.run(ctx, func(t *tx) error { return t.Set(key(pReg, reg.Instance), data, nil) })
}

// DeleteRegistration implements store.Registry.
func (s *Store) DeleteRegistration(ctx context.Context, instance string) error {
	return s.run(ctx, func(t *tx) error { return t.Delete(key(pReg, instance), nil) })
}

// Registrations implements store.Registry. A damaged registration is an
// error: reading past it would hand its name to someone else.
func (s *Store) Registrations(context.Context) ([]store.Registration, error) {
	var out []store.Registration
	err := s.view(func(r reader) error {
		return walkAfter(r, []byte{pReg}, "", func(instance, v []byte) (bool, error) {
			var reg store.Registration
			if err := json.Unmarshal(v, &reg); err != nil || reg.Instance != string(instance) {
				return false, fmt.Errorf("%w: the registration of %q does not decode", ErrCorrupt, instance)
			}
			out = append(out, reg)
			return true, nil
		})
	})
	return out, err
}

// Close implements store.Store: it stops taking changes, fails those still
// queued with store.ErrClosed, and closes the database. Idempotent.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.qmu.Lock()
		s.closed = true
		s.qmu.Unlock()
		s.cancel()
		s.wg.Wait()
		err = fatalAsError(s.db.Close)
		if uerr := s.lock.Unlock(); err == nil {
			err = uerr
		}
	})
	return err
}
