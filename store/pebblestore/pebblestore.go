// Package pebblestore is the durable task store: a Pebble database (the
// LSM key-value store of CockroachDB) in the data directory. A change is
// acknowledged only once it is in the write-ahead log and the log is
// synced; the changes that arrive while a sync runs share the next one
// (group commit), and a lone change does not wait for company.
//
// Pebble was chosen over bbolt, which the store used before, because a
// commit there is one append to a preallocated, recycled log and one
// fdatasync: bbolt rewrites the B+tree pages a change touches and syncs
// twice (its pages, then its meta page): a lone create costs little more
// than one append and one fdatasync of its bytes here, and markedly more
// there (go run ./bench measures both). Pebble also compacts in the background without stopping commits, checks
// every block and log record by checksum, and tells a torn log tail (a
// change never acknowledged) from damage in the middle.
//
// On a full disk the store takes no change (ErrDiskFull, at once) and
// reads go on; Pebble's writes wait for room and go on once there is
// (disk.go). A failed sync of the log fails the store (ErrFailed); it
// is never tried again: the next change reopens the store from its log
// (reopen.go). Close waits for the disk at most Options.CloseTimeout.
package pebblestore

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
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

	"github.com/a2a-bus/a2a-bus/internal/logsummary"
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

// Named errors of a change (Create, Update, Prune, PutRegistration,
// DeleteRegistration) and of Close. Each says why in words a client may
// see (Reason: no paths), which the broker puts in its answer.
var (
	// ErrDiskFull: the disk has no room. The writes that found none wait
	// for it (a change tries them again first, and they are tried every
	// half second); until they are done the store takes no change. Reads
	// go on. A change answered so may still be made durable once there is
	// room, if it was applied before the disk filled.
	ErrDiskFull = &failure{"pebblestore: the disk is full", "the disk is full"}
	// ErrFailed: a commit or a sync of the store's log failed, so that
	// what reached the disk is unknown. The failed sync is never tried
	// again: the next change reopens the store from its log, as a restart
	// would (at most once every second), and is made there if that works.
	// A change answered so may be in the log, and so in the store after
	// the reopen.
	ErrFailed = &failure{"pebblestore: the task store failed", "the task store failed and is reopened from its log"}
	// ErrCloseAbandoned: Close gave up waiting (Options.CloseTimeout) for
	// the disk: the store is closed to its callers, and the database
	// closes in the background once the writes waiting for room are done.
	// Every change acknowledged is on disk; the ones not acknowledged may
	// be lost.
	ErrCloseAbandoned = &failure{"pebblestore: closing the task store gave up waiting for the disk", "the task store is closing"}
)

// failure is a named error of a change.
type failure struct{ msg, reason string }

func (f *failure) Error() string { return f.msg }

// Reason says why the change failed, in words a client may see.
func (f *failure) Reason() string { return f.reason }

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

// Options configures Open. The zero value is the default; a negative
// value is invalid (Validate).
type Options struct {
	// LockTimeout is how long Open waits for another process to let go of
	// the store. 0 means DefaultLockTimeout.
	LockTimeout time.Duration
	// MaxBatch bounds the changes that share one commit. 0 means
	// DefaultMaxBatch.
	MaxBatch int
	// AcceptDataLoss opens a store whose database is gone from its folder
	// as a new one; OnDataLoss hears why. By default Open refuses it
	// (ErrDataLoss).
	AcceptDataLoss bool
	OnDataLoss     func(problem string)
	// Logger receives the store's messages (a full disk, a failure, a
	// reopen) and Pebble's own (at Debug and Warn): a message that
	// repeats (a retry's) is logged once, then counted, and the count
	// logged once a minute. nil discards them.
	Logger *slog.Logger
	// CloseTimeout bounds Close's wait for the disk (a full one, which
	// writes wait on, or a stuck one): after it Close returns
	// ErrCloseAbandoned and the database closes in the background, so
	// that a broker told to stop stops. 0 means DefaultCloseTimeout.
	CloseTimeout time.Duration

	fs   vfs.FS             // tests watch the disk through it; nil is the plain one
	log  *logsummary.Logger // Open's, on Logger
	disk *disk              // Open's: the writes that wait for room
}

// Defaults of Options' zero fields.
const (
	DefaultLockTimeout = time.Second
	DefaultMaxBatch    = 1000
	// DefaultCloseTimeout is within the 5 s a broker has to stop.
	DefaultCloseTimeout = 2 * time.Second
)

// ErrInvalidOptions is returned by Options.Validate, and so by Open, for
// a field out of its range.
var ErrInvalidOptions = errors.New("pebblestore: invalid options")

// Validate reports the first field of opts out of its range
// (ErrInvalidOptions): a negative one.
func (opts Options) Validate() error {
	switch {
	case opts.LockTimeout < 0:
		return fmt.Errorf("%w: LockTimeout must not be negative (got %v)", ErrInvalidOptions, opts.LockTimeout)
	case opts.MaxBatch < 0:
		return fmt.Errorf("%w: MaxBatch must not be negative (got %d)", ErrInvalidOptions, opts.MaxBatch)
	case opts.CloseTimeout < 0:
		return fmt.Errorf("%w: CloseTimeout must not be negative (got %v)", ErrInvalidOptions, opts.CloseTimeout)
	}
	return nil
}

// Store is the durable store. It implements store.Store.
type Store struct {
	path string // the database's folder
	opts Options
	// db is the database; nil while a failed one is being reopened. It
	// changes under qmu, held exclusively: a reader holds qmu shared
	// while it uses db.
	db      atomic.Pointer[pebble.DB]
	ops     chan *op
	applied chan *group // from the committer to the syncer
	max     int
	disk    *disk
	log     *logsummary.Logger

	// wmu is held from the check that the store has not failed to the
	// end of a write into Pebble's log (a commit, the syncer's record):
	// a failure of the log, which the store hears of first (disk), is
	// never met by a later write.
	wmu sync.Mutex

	logFaults atomic.Int64 // the log's failures told by disk, ever

	fmu      sync.Mutex
	broken   error         // a failed commit or sync: ErrFailed and its cause; nil when sound
	brokenCh chan struct{} // closed while broken
	fullAt   time.Time     // when the disk filled, for the log

	// The committer's, for reopening: when the next try is due (read by
	// run), the old database's close if it has not finished, and the
	// syncer's barrier not yet reached.
	nextReopen atomic.Int64 // unix nanoseconds
	closing    chan error
	barrier    chan struct{}

	qmu    sync.RWMutex // held shared to queue a change, exclusively to close
	closed bool

	ctx       context.Context // canceled by Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup // the committer and the syncer
	abandoned chan struct{}  // closed when Close gives up waiting for the disk
	shut      chan struct{}  // closed once the database is closed and the lock let go

	decoded decodedCache // the tasks last read, decoded (decoded.go)

	cmu    sync.Mutex        // guards counts, which the committer changes
	counts map[string]uint64 // open tasks per requester's session, as on disk
	maxID  string            // the greatest task id stored; the committer's

	// The last acknowledged commit, for a later start to check (marker.go):
	// commitSeq is the number of the last commit applied (the
	// committer's), acked that of the last one synced (the syncer's),
	// which marking writes to mark when kicked.
	commitSeq uint64
	acked     atomic.Uint64
	mark      *marker
	markKick  chan struct{}

	lock *flock.Flock // the data dir's, held while open

	// The syncer's waits for company, and those that ran out (tests).
	lingers, lingersRunOut atomic.Int64
	// handed counts the changes the committer has handed to the syncer
	// (tests).
	handed atomic.Int64
	// mayLinger is set by the syncer while its next sync may wait for
	// company: the committer then leaves the sync of what it applies to
	// the syncer, and asks Pebble for it at once otherwise.
	mayLinger atomic.Bool
	// The log records the syncer wrote to sync the log (tests).
	syncRecords atomic.Int64

	closeOnce sync.Once
	closeErr  error
}

var _ store.Store = (*Store)(nil)

// op is one change waiting for the committer. fn either fails without
// writing anything, or writes and succeeds: so a failing change does not
// spoil the others of its batch.
type op struct {
	fn    func(t *tx) error
	done  chan error
	state atomic.Int32 // opQueued, then opTaken by the committer or opAbandoned by its caller
}

const (
	opQueued = iota
	opTaken
	opAbandoned
)

// take claims o for the committer: false if its caller has gone with
// an answer already, and it must not run.
func (o *op) take() bool { return o.state.CompareAndSwap(opQueued, opTaken) }

// abandon tells the committer not to run o: false if it was taken (it
// may be made yet).
func (o *op) abandon() bool { return o.state.CompareAndSwap(opQueued, opAbandoned) }

// Open opens (creating it if needed) the store in dir. A directory held by
// another process, a store from a newer version and a damaged store are
// errors: the store never starts over silently.
func Open(dir string, opts Options) (*Store, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.LockTimeout == 0 {
		opts.LockTimeout = DefaultLockTimeout
	}
	if opts.MaxBatch == 0 {
		opts.MaxBatch = DefaultMaxBatch
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.CloseTimeout == 0 {
		opts.CloseTimeout = DefaultCloseTimeout
	}
	if opts.fs == nil {
		opts.fs = vfs.Default
	}
	if err := mkdirAllSynced(dir); err != nil {
		return nil, fmt.Errorf("pebblestore: %w", err)
	}
	if _, waits := opening.Load(openingKey(dir)); waits {
		return nil, fmt.Errorf("%w: an earlier start of the store in %s still waits for room on the disk to write its log's changes; free room on the disk, then start again", ErrDiskFull, dir)
	}
	// The data dir's lock comes first: a migration and a first store are
	// made by one broker, not by two at once.
	lock, err := lockDir(dir, opts.LockTimeout)
	if err != nil {
		return nil, err
	}
	opts.log = logsummary.New(opts.Logger, 0)
	// Until the store is open a write that finds no room fails: the
	// start stops, naming it.
	var s *Store
	opts.disk = newDisk(
		func(full bool, path string, err error) { s.diskChanged(full, path, err) },
		func(path string, err error) {
			s.logFaults.Add(1)
			s.fail(fmt.Errorf("the log %s: %w", path, err))
		})
	s, err = openLocked(dir, opts)
	var held *heldOpen
	if errors.As(err, &held) {
		// The database given up on holds the folder until it is done
		// (waiting for room): so does the data dir's lock, and a later
		// Open here is told why it waits.
		key := openingKey(dir)
		opening.Store(key, struct{}{})
		go func() {
			<-held.done
			opening.Delete(key)
			lock.Unlock()
			opts.log.Close()
		}()
		return nil, err
	}
	if err != nil {
		lock.Unlock()
		opts.log.Close()
		return nil, err
	}
	s.lock = lock
	s.disk.setLive()
	return s, nil
}

// opening holds the data dirs (openingKey) whose open was given up on a
// full disk and has not ended yet.
var opening sync.Map

// openingKey is dir's one name: absolute, its links resolved (it
// exists once Open has made it).
func openingKey(dir string) string {
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	if abs, err := filepath.Abs(dir); err == nil {
		return abs
	}
	return filepath.Clean(dir)
}

// heldOpen is Open's error err whose database is not done with the
// data dir yet: it waits for room on the disk, in the background, until
// done is closed. An open given up on (openWaiting), or the close of a
// store refused after it opened (closeOpened).
type heldOpen struct {
	err  error
	done <-chan struct{}
}

func (e *heldOpen) Error() string { return e.err.Error() }
func (e *heldOpen) Unwrap() error { return e.err }

// noRoomAtStart is a start's refusal on a full disk, where path found no
// room.
func noRoomAtStart(path string) error {
	return fmt.Errorf("%w: the store's start found no room to write %s; free room on the disk, then start again", ErrDiskFull, path)
}

// closeOpened closes a database Open opened and then refused (err): at
// once, unless its close waits for room on the disk; then in the
// background, and err says so (heldOpen).
func closeOpened(db *pebble.DB, d *disk, err error) error {
	done := make(chan struct{})
	go func() { // owned by heldOpen's done once Open returns
		defer close(done)
		_ = fatalAsError(db.Close)
	}()
	select {
	case <-done:
		return err
	case <-d.fullChan():
	}
	select {
	case <-done:
		return err
	default:
		return &heldOpen{err: err, done: done}
	}
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
	markPath := filepath.Join(dir, MarkerName)
	marked, next, held, err := readMarker(opts.fs, markPath)
	if err != nil {
		if !opts.AcceptDataLoss {
			return nil, fmt.Errorf("%w: %v, so the store cannot show that it holds every acknowledged change; start with --accept-data-loss to go on without that check", ErrDataLoss, err)
		}
		if opts.OnDataLoss != nil {
			opts.OnDataLoss(err.Error())
		}
		held = false
	}
	lost := false // a loss already accepted (and told)
	if held {
		if _, err := opts.fs.Stat(path); errors.Is(err, os.ErrNotExist) {
			problem := fmt.Sprintf("the data dir held a store (%s), and its folder %s is gone", markPath, path)
			if !opts.AcceptDataLoss {
				return nil, fmt.Errorf("%w: %s; restore it, or start with --accept-data-loss to begin a new store there", ErrDataLoss, problem)
			}
			if opts.OnDataLoss != nil {
				opts.OnDataLoss(problem)
			}
			lost = true
		}
	}
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
		if opts.OnDataLoss != nil && !lost {
			opts.OnDataLoss(problem)
		}
		lost = true
		if db, err = open(path, opts, false); err == nil {
			err = prepare(db, path)
		}
	}
	defer func() {
		if err != nil && db != nil {
			err = closeOpened(db, opts.disk, err)
		}
	}()
	if err != nil {
		return nil, err
	}
	counts, maxID, err := load(db, path)
	if err != nil {
		return nil, err
	}
	seq, err := lastCommit(db, path)
	if err != nil {
		return nil, err
	}
	reset := !held
	if held && seq < marked {
		problem := logLoss(seq, marked, markPath)
		if !opts.AcceptDataLoss {
			return nil, fmt.Errorf("%w: %s; restore the data dir from a backup, or start with --accept-data-loss to go on without them", ErrDataLoss, problem)
		}
		if opts.OnDataLoss != nil && !lost {
			opts.OnDataLoss(problem)
		}
		reset = true
	}
	if reset {
		marked, next = seq, 0
	}
	mark, err := openMarker(privateFS{opts.fs}, markPath, marked, next, reset)
	if isNoSpace(err) {
		return nil, noRoomAtStart(markPath)
	}
	if err != nil {
		return nil, fmt.Errorf("pebblestore: %w", err)
	}
	s = &Store{
		path: path, opts: opts, ops: make(chan *op, opts.MaxBatch), applied: make(chan *group, 64), max: opts.MaxBatch,
		disk: opts.disk, log: opts.log, brokenCh: make(chan struct{}),
		abandoned: make(chan struct{}), shut: make(chan struct{}),
		counts: counts, maxID: maxID,
		commitSeq: seq, mark: mark, markKick: make(chan struct{}, 1),
	}
	s.acked.Store(seq)
	s.db.Store(db)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Go(s.commit)
	s.wg.Go(s.sync)
	s.wg.Go(s.marking)
	return s, nil
}

// logLoss tells a log that ends at commit seq when commit acked was
// acknowledged: the marker at markPath says so.
func logLoss(seq, acked uint64, markPath string) string {
	return fmt.Sprintf("the store's log ends at commit %d, but commit %d was acknowledged (%s): the tail of its newest log is damaged or truncated, and %d acknowledged commits are lost",
		seq, acked, markPath, acked-seq)
}

// lastCommit reads the number of the last commit (marker.go): 0 in a
// store that has none yet.
func lastCommit(db *pebble.DB, path string) (uint64, error) {
	v, closer, err := db.Get(commitKey)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, corrupt(path, err)
	}
	defer closer.Close()
	if len(v) != 8 {
		return 0, corrupt(path, fmt.Errorf("the commit number is %d bytes", len(v)))
	}
	return binary.BigEndian.Uint64(v), nil
}

// markEvery is how often at most the marker is written (and synced)
// while commits go on: its sync, on the log's disk, must not delay the
// log's own. So a power cut that also damages the log's tail can lose
// the commits acknowledged in the last markEvery (and one marker sync)
// before it unseen; any earlier loss is refused.
var markEvery = 250 * time.Millisecond

// marking writes the number of the last acknowledged commit to the
// marker when the syncer kicks it, at most every markEvery, until the
// store closes; Close writes the last one. A marker that cannot be
// written lags (the check at the next start sees less); it fails
// nothing.
func (s *Store) marking() {
	wait := time.NewTimer(time.Hour)
	wait.Stop()
	defer wait.Stop()
	var last time.Time
	for {
		select {
		case <-s.markKick:
		case <-s.ctx.Done():
			return
		}
		if d := markEvery - time.Since(last); d > 0 {
			wait.Reset(d)
			select {
			case <-wait.C:
			case <-s.ctx.Done():
				return
			}
		}
		if err := s.mark.write(s.acked.Load()); err != nil {
			s.log.Warn("marker", "the marker of the last acknowledged commit could not be written; it lags", "error", err)
		}
		last = time.Now()
	}
}

// corrupt is Open's refusal of a damaged store, in one line: the cause
// and the folder, then what the operator can do. (Pebble's errors carry
// stack traces and detail lines: their first line is the cause; the
// rest goes to the debug log, through the DataCorruption listener.)
func corrupt(path string, err error) error {
	return fmt.Errorf("%w: %s: %s; restore the data dir from a backup, or move it aside to start with an empty one", ErrCorrupt, path, oneLine(err))
}

// oneLine is err's message up to its first line break.
func oneLine(err error) string {
	if err == nil {
		return ""
	}
	msg, _, _ := strings.Cut(err.Error(), "\n")
	return msg
}

// load checks an open database (check) and reads what the store keeps
// in memory: the open-task counts and the greatest task id.
func load(db *pebble.DB, path string) (map[string]uint64, string, error) {
	if err := check(db, path); err != nil {
		return nil, "", err
	}
	counts, err := loadCounts(db)
	if err != nil {
		return nil, "", corrupt(path, err)
	}
	maxID, err := lastID(db)
	if err != nil {
		return nil, "", corrupt(path, err)
	}
	return counts, maxID, nil
}

// open opens the database at path. mustExist refuses a folder without a
// database (pebble.ErrDBDoesNotExist). The caller holds the data dir's
// lock, so Pebble's own LOCK is free unless something else holds it.
func open(path string, opts Options, mustExist bool) (*pebble.DB, error) {
	log := opts.log
	if log == nil {
		log = logsummary.New(opts.Logger, 0)
	}
	fs := opts.fs
	if opts.disk != nil {
		fs = diskFS{FS: fs, d: opts.disk}
	}
	o := &pebble.Options{
		ErrorIfNotExists: mustExist,
		// The plain file system: Pebble's default wraps it in a disk
		// health check whose goroutine a failed Open leaves running.
		FS:                 privateFS{fs},
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             logger{log},
		EventListener: &pebble.EventListener{
			// Damage found by a read is an error for that read (and for
			// Open, which reads everything once): a warning here, not
			// Pebble's default, a fatal log.
			DataCorruption: func(info pebble.DataCorruptionInfo) {
				// One line; Pebble's detail (its stack traces) at debug.
				log.Warn(logsummary.Key("pebble: damaged data", info.Path), "pebble: damaged data", "path", info.Path, "error", oneLine(info.Details))
				log.Log(slog.LevelDebug, logsummary.Key("pebble: damaged data, in detail", info.Path), "pebble: damaged data, in detail", "path", info.Path, "detail", fmt.Sprintf("%+v", info.Details))
			},
			// Pebble tries a failed flush or compaction again at once:
			// a warning each time would be hundreds a second.
			BackgroundError: func(err error) {
				log.Warn(logsummary.Key("pebble: background error", err.Error()), "pebble: background error", "error", err)
			},
		},
	}
	// Compaction is most of a busy store's work: every flushed file spans
	// the whole key space (tasks and their index keys), so with Pebble's
	// defaults each compaction of level 0 rewrote all of the level below.
	// Flushes split into files of 256 KiB (not 4 MiB), which overlap
	// fewer files below, and level 0 compacts at 8 sub-levels deep rather
	// than 4, so each compaction carries more: fewer bytes written to disk
	// per byte logged, and more creates a second under many senders
	// (BenchmarkCreate measures it). Writes stop only at 24 deep
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
	var db *pebble.DB
	var err error
	if opts.disk != nil && mustExist && !opts.disk.isLive() {
		db, err = openWaiting(path, o, opts.disk)
	} else {
		db, err = pebble.Open(path, o)
	}
	var held *heldOpen
	switch {
	case err == nil:
		return db, nil
	case errors.As(err, &held):
		return nil, err
	case errors.Is(err, pebble.ErrDBDoesNotExist):
		return nil, err
	case isLocked(err):
		return nil, fmt.Errorf("%w: %s (its LOCK is held)", ErrLocked, filepath.Dir(path))
	case isSystemError(err):
		return nil, fmt.Errorf("pebblestore: open %s: %w", path, err)
	default:
		// A checksum, a malformed manifest, a log record damaged in the
		// middle: the store is not sound.
		return nil, corrupt(path, err)
	}
}

// openWaiting opens the existing database at path with o, whose writes
// go through d, and gives up on it as soon as a write finds the disk
// full (heldOpen: the start stops on the full disk). Pebble's Open writes what its log holds to
// tables before it returns, and would try a table that found no room
// again at once, for ever; here that write waits for room instead
// (disk.setOpening), in the background, and the start stops, naming
// the full disk.
func openWaiting(path string, o *pebble.Options, d *disk) (*pebble.DB, error) {
	d.setOpening(true)
	type opened struct {
		db  *pebble.DB
		err error
	}
	result := make(chan opened, 1)
	var (
		mu     sync.Mutex
		gaveUp bool
	)
	// Owned by the opener; once it gave up, by heldOpen's done: it
	// ends when Pebble's Open does, closing the database it opened.
	done := make(chan struct{})
	go func() {
		defer close(done)
		var r opened
		r.err = fatalAsError(func() (err error) {
			r.db, err = pebble.Open(path, o)
			return err
		})
		mu.Lock()
		lost := gaveUp
		if !lost {
			result <- r
		}
		mu.Unlock()
		if lost && r.db != nil {
			_ = fatalAsError(r.db.Close)
		}
	}()
	// An open database's writes go on waiting for room until the store
	// is live, when they wait as its own do.
	take := func(r opened) (*pebble.DB, error) {
		if r.err != nil {
			d.setOpening(false)
		}
		return r.db, r.err
	}
	select {
	case r := <-result:
		return take(r)
	case <-d.fullChan():
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case r := <-result: // opened all the same (a compaction found the disk full)
		return take(r)
	default:
	}
	// Its writes go on waiting for room (the disk stays opening).
	gaveUp = true
	d.mu.Lock()
	first := d.first.path
	d.mu.Unlock()
	return nil, &heldOpen{err: noRoomAtStart(first), done: done}
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

// syncDir makes a folder's entries durable (a new entry's name), on the
// operating system's file system. A variable, so that a test sees which
// folders are synced when.
var syncDir = func(dir string) error {
	if err := syncFolder(vfs.Default, dir); err != nil {
		return fmt.Errorf("pebblestore: sync %s: %w", dir, err)
	}
	return nil
}

// syncFolder makes dir's entries durable on fs. Where a folder cannot be
// synced (Windows), its entries are durable already, and Pebble's file
// system does nothing.
func syncFolder(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
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
		return corrupt(path, fmt.Errorf("no schema version: %s", oneLine(err)))
	}
	version, err := strconv.Atoi(string(v))
	closer.Close()
	if err != nil {
		return corrupt(path, errors.New("no schema version"))
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
		return corrupt(path, err)
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

// logger hands Pebble's messages to a Logger, which summarizes the
// repeated ones (numbers aside: a file's or a job's).
type logger struct{ l *logsummary.Logger }

func (l logger) Infof(format string, args ...any) {
	msg := "pebble: " + fmt.Sprintf(format, args...)
	l.l.Log(slog.LevelDebug, logsummary.Key(msg), msg)
}
func (l logger) Errorf(format string, args ...any) {
	msg := "pebble: " + fmt.Sprintf(format, args...)
	l.l.Warn(logsummary.Key(msg), msg)
}

// Fatalf is Pebble's report of an invariant it cannot go on without.
func (l logger) Fatalf(format string, args ...any) {
	msg := "pebble: " + fmt.Sprintf(format, args...)
	l.l.Error(msg, msg)
	panic(msg)
}

// commit runs the changes, in two stages that overlap. The committer
// applies each batch of queued changes at once, without waiting for the
// disk (Pebble makes a change visible before its log sync in any case);
// the syncer then waits for a sync of the log that follows every batch
// applied meanwhile, and only then answers their senders. So while one
// fdatasync runs, the next batches are built and applied, and a lone
// change waits for nothing but its own sync.
//
// The committer asks Pebble to sync the log as it applies a batch
// (Pebble's log writer then writes and syncs it at once, a sync for
// every batch written while the one before ran), unless the syncer may
// wait for company before its next sync: then the batch is applied
// without a sync, and the syncer syncs the log with a record of its own
// once it has waited (syncLog). A batch that writes nothing (updates
// refused, or tried again) asks for no sync: the syncer syncs for it.
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
		err := s.failed()
		if err != nil && s.isBroken() && s.reopenDue() {
			err = s.reopen()
		}
		if err != nil {
			for _, o := range batch {
				o.done <- err
			}
			continue
		}
		// A change whose caller went with an answer (the disk filled
		// while it was queued) is not made.
		batch = slices.DeleteFunc(batch, func(o *op) bool { return !o.take() })
		if len(batch) == 0 {
			continue
		}
		g := &group{ops: make([]*op, 0, len(batch)), results: make([]error, 0, len(batch))}
		var changed []*op // updates of tasks changed since they were read
		db := s.db.Load()
		t := &tx{Batch: db.NewIndexedBatch(), counts: s.counts, pending: map[string]uint64{}, maxID: s.maxID}
		for _, o := range batch {
			if err := o.fn(t); errors.Is(err, errChanged) {
				changed = append(changed, o)
			} else {
				g.ops, g.results = append(g.ops, o), append(g.results, err)
			}
		}
		if !t.Empty() {
			var n [8]byte
			binary.BigEndian.PutUint64(n[:], s.commitSeq+1)
			_ = t.Set(commitKey, n[:], nil) // into memory: fails only on a closed batch
			g.seq = s.commitSeq + 1
		}
		synced := !t.Empty() && !s.mayLinger.Load()
		g.applied = time.Now()
		s.wmu.Lock()
		err = s.failed()
		if err == nil {
			if err = fatalAsError(func() error {
				if synced {
					return db.ApplyNoSyncWait(t.Batch, pebble.Sync)
				}
				return t.Commit(pebble.NoSync)
			}); err != nil {
				// Not applied, or not known to be: the store stops
				// here until it is reopened from its log.
				err = s.fail(fmt.Errorf("commit: %w", err))
			}
		}
		s.wmu.Unlock()
		switch {
		case synced && err == nil:
			g.synced = t.Batch // the syncer's, to wait for and close
		case synced:
			// Pebble's now, maybe: not closed.
		default:
			t.Close()
		}
		// Raised even if the commit failed: a bound too high only costs
		// a lookup.
		s.maxID = t.maxID
		if err == nil && g.seq != 0 {
			s.commitSeq = g.seq
		}
		if err != nil {
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
		// An update that wrote nothing, for its task had changed, is
		// tried again at once: it waits for no sync.
		for _, o := range changed {
			o.done <- errChanged
		}
		if len(g.ops) > 0 {
			s.handed.Add(int64(len(g.ops)))
			s.applied <- g
		}
	}
}

// group is a batch applied and waiting for its sync; or, with barrier
// set and no ops, the committer's wait for the syncer to have finished
// with every group before it.
type group struct {
	ops     []*op
	results []error
	// synced is the batch, applied with a sync of the log that Pebble
	// runs (ApplyNoSyncWait), at applied; nil when the syncer is to sync
	// for it.
	synced  *pebble.Batch
	applied time.Time
	barrier chan struct{}
	// seq is the number of its commit; 0 when it wrote nothing.
	seq uint64
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
// waiting, and answers their senders: it waits for the sync that Pebble
// runs for the last of them, or, if that one asked for none, syncs the
// log itself. A failed sync leaves it unknown what reached the disk:
// the store fails every change from then on.
//
// Under load, the changes that arrive while one sync runs wait for the
// next, and senders that each wait for their change split into cohorts
// that each get a sync of their own, sharing it with only a part of the
// others. So after a sync of lingerMin changes or more, the syncer waits
// for as many as that sync carried, for at most lingerFor: the senders
// it has just answered are back within that, and the cohorts merge, for
// more creates a second at a lower median latency with many senders
// (BenchmarkCreate measures it). Where changes do not come from
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
		case lastSynced(groups) != nil:
			// Pebble syncs these already: a wait would hold their
			// answers, and bring no change into that sync.
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
		// A full disk or a failed store answers at once: the changes
		// applied are in memory (and maybe the log), and a later sync,
		// or the reopen, keeps them or not.
		err := s.failed()
		if err == nil && n > 0 {
			start := time.Now()
			if g := lastSynced(groups); g != nil {
				start = g.applied // Pebble's sync was asked for then
			}
			if err = s.syncGroups(groups); err == nil {
				took = time.Since(start)
			}
		}
		if err == nil {
			for _, g := range groups {
				if g.seq > s.acked.Load() {
					s.acked.Store(g.seq)
				}
			}
			select {
			case s.markKick <- struct{}{}:
			default:
			}
		}
		last = n
		// Before the answers: the senders answered come back to a
		// committer that knows whether this syncer may wait for them.
		s.mayLinger.Store(err == nil && last >= lingerMin && skip == 0)
		for _, g := range groups {
			for i, o := range g.ops {
				if err != nil {
					o.done <- err
				} else {
					o.done <- g.results[i]
				}
			}
			if g.barrier != nil {
				close(g.barrier)
			}
		}
	}
}

// lastSynced returns the last group with changes among groups if it
// was applied with a sync that Pebble runs, else nil.
func lastSynced(groups []*group) *group {
	for _, g := range slices.Backward(groups) {
		if len(g.ops) > 0 {
			if g.synced == nil {
				return nil
			}
			return g
		}
	}
	return nil
}

// syncGroups makes the groups applied durable: the sync Pebble runs for
// the last of them syncs every one before it too (a sync covers the
// whole log written before it), else the syncer syncs the log. The
// syncs Pebble runs for the others are over by then; each batch is
// closed once its own is. After a failure, the batches are left to
// Pebble, unclosed: a sync may wait for room on a full disk.
func (s *Store) syncGroups(groups []*group) error {
	var err error
	if lastSynced(groups) == nil {
		err = s.syncLog()
	}
	for _, g := range groups {
		b := g.synced
		if b == nil || err != nil {
			continue // a batch not waited for is Pebble's still: not closed
		}
		if err = b.SyncWait(); err != nil {
			err = s.fail(fmt.Errorf("sync: %w", err))
			continue
		}
		b.Close()
	}
	return err
}

// syncMark is the log record whose sync makes the batches before it
// durable. Pebble replays it as nothing.
var syncMark = []byte{0}

// syncLog syncs the log: a record of its own, synced, syncs every batch
// before it. The record is written as a commit is, under wmu unless the
// store has failed; the sync is waited for without it, so that the
// committer applies the next batches meanwhile. It returns the store's
// failure, if it fails.
func (s *Store) syncLog() error {
	s.wmu.Lock()
	if err := s.failed(); err != nil {
		s.wmu.Unlock()
		return err
	}
	db := s.db.Load()
	b := db.NewBatch()
	_ = b.LogData(syncMark, nil) // into memory: it fails only on a closed batch
	s.syncRecords.Add(1)
	err := fatalAsError(func() error { return db.ApplyNoSyncWait(b, pebble.Sync) })
	s.wmu.Unlock()
	if err != nil {
		return s.fail(fmt.Errorf("sync: %w", err)) // the batch is Pebble's now: not closed
	}
	err = b.SyncWait()
	b.Close()
	if err != nil {
		return s.fail(fmt.Errorf("sync: %w", err))
	}
	return nil
}

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

// failed returns why the store takes no change now: ErrFailed (with
// its cause) until a reopen, or ErrDiskFull while writes wait for room;
// nil when it takes changes.
func (s *Store) failed() error {
	s.fmu.Lock()
	err := s.broken
	s.fmu.Unlock()
	if err != nil {
		return err
	}
	if s.disk.isFull() {
		return ErrDiskFull
	}
	return nil
}

// failure is failed, or ErrFailed if the store is sound again: for a
// change that was waited for no longer when it failed.
func (s *Store) failure() error {
	if err := s.failed(); err != nil {
		return err
	}
	return ErrFailed
}

func (s *Store) isBroken() bool {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	return s.broken != nil
}

// fail fails the store for cause, unless it has failed already, and
// returns the store's failure.
func (s *Store) fail(cause error) error {
	s.fmu.Lock()
	if s.broken != nil {
		err := s.broken
		s.fmu.Unlock()
		return err
	}
	s.broken = fmt.Errorf("%w: %w", ErrFailed, cause)
	close(s.brokenCh)
	err := s.broken
	s.fmu.Unlock()
	s.log.Error(logsummary.Key("task store failed", cause.Error()), "the task store failed: it takes no change until it is reopened from its log, at the next change", "error", cause)
	return err
}

// brokenChan is closed while the store is failed.
func (s *Store) brokenChan() <-chan struct{} {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	return s.brokenCh
}

// diskChanged is told when the disk fills (a write found no room) and
// when the writes that waited are done.
func (s *Store) diskChanged(full bool, path string, err error) {
	s.fmu.Lock()
	since := s.fullAt
	if full {
		s.fullAt = time.Now()
	}
	s.fmu.Unlock()
	if full {
		s.log.Warn("disk full", "the disk is full: the task store takes no change until there is room; reads go on", "file", path, "error", err)
		return
	}
	s.log.Info("disk has room", "there is room on the disk again: the task store takes changes", "after", time.Since(since).Round(time.Millisecond))
}

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
// so run waits for the committer's answer: a change acknowledged is
// always on disk. It stops waiting, with the error, when the disk fills
// or the store fails meanwhile, and when Close gives up waiting for the
// disk: the change is then not made if the committer had not taken it,
// and may be made yet if it had (so may any change answered with an
// error of the store).
func (s *Store) run(ctx context.Context, fn func(t *tx) error) error {
	if s.disk.isFull() {
		s.qmu.RLock()
		closed := s.closed
		s.qmu.RUnlock()
		if closed {
			return store.ErrClosed
		}
		if !s.disk.retry() {
			// The writes waiting for room were tried again first:
			// still none.
			return ErrDiskFull
		}
	}
	o := &op{fn: fn, done: make(chan error, 1)}
	s.qmu.RLock()
	if s.closed {
		s.qmu.RUnlock()
		return store.ErrClosed
	}
	full, broken := s.disk.fullChan(), s.brokenChan()
	var reopening <-chan time.Time
	select {
	case <-broken:
		// The committer reopens the store with this change, if a try
		// is due; the change is answered at once otherwise.
		if !s.reopenDue() {
			s.qmu.RUnlock()
			return s.failed()
		}
		broken = nil
		t := time.NewTimer(reopenBound)
		defer t.Stop()
		reopening = t.C
	default:
	}
	select {
	case s.ops <- o:
	case <-ctx.Done():
		s.qmu.RUnlock()
		return ctx.Err()
	case <-full:
		s.qmu.RUnlock()
		return ErrDiskFull
	}
	s.qmu.RUnlock()
	select {
	case err := <-o.done:
		return err
	case <-full:
		return o.gaveUp(ErrDiskFull)
	case <-broken:
		return o.gaveUp(s.failure())
	case <-reopening:
		return o.gaveUp(s.failure())
	case <-s.abandoned:
		return o.gaveUp(store.ErrClosed)
	}
}

// gaveUp answers o with err, unless its answer is there.
func (o *op) gaveUp(err error) error {
	o.abandon()
	select {
	case e := <-o.done:
		return e
	default:
		return err
	}
}

// reader is what both a batch (inside a commit) and a snapshot read.
type reader interface {
	Get(key []byte) ([]byte, io.Closer, error)
	NewIter(o *pebble.IterOptions) (*pebble.Iterator, error)
}

// view runs fn on a consistent snapshot of the committed store.
func (s *Store) view(fn func(r reader) error) error {
	s.qmu.RLock() // Close and a reopen wait for the reads under way
	defer s.qmu.RUnlock()
	db, err := s.reading()
	if err != nil {
		return err
	}
	snap := db.NewSnapshot()
	defer snap.Close()
	return fn(snap)
}

// reading returns the database to read, under qmu held shared.
func (s *Store) reading() (*pebble.DB, error) {
	if s.closed {
		return nil, store.ErrClosed
	}
	if db := s.db.Load(); db != nil {
		return db, nil
	}
	return nil, s.failure() // being reopened
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
	db, err := s.reading()
	if err != nil {
		return nil, err
	}
	data, err := get(db, key(pTask, id))
	if err != nil {
		return nil, err
	}
	if data == nil {
		return nil, store.ErrNotFound
	}
	rec, err := s.decode(id, data)
	if err != nil {
		return nil, err
	}
	return rec.Clone(), nil
}

// FindSend implements store.Store.
func (s *Store) FindSend(_ context.Context, instance, key string) (*store.Record, error) {
	s.qmu.RLock()
	defer s.qmu.RUnlock()
	db, err := s.reading()
	if err != nil {
		return nil, err
	}
	id, err := get(db, memberKey(instance, roleSend, key))
	if err != nil {
		return nil, err
	}
	if id == nil {
		return nil, store.ErrNotFound
	}
	rec, err := getRecord(db, string(id))
	if err == nil && (rec.RequesterInstance != instance || rec.SendKey != key) {
		return nil, store.ErrNotFound // an entry left behind by an older broker's prune
	}
	return rec, err
}

// Update implements store.Store, optimistically: fn runs on the caller's
// goroutine, on the task as the store holds it now (applied, if not yet
// synced), and the committer stores the result only if the task's stored
// bytes are still the ones fn was given; else fn runs again on the new
// ones. The committer compares bytes and writes; it never decodes,
// encodes or runs the caller's code, which would hold up every other
// change. An update that writes nothing (fn failed, or there is no such
// task) is checked by the committer all the same, so that it is answered
// once what it read is synced, as a change would be.
func (s *Store) Update(ctx context.Context, id string, fn func(*store.Record) error) (*store.Record, error) {
	for {
		rec, err := s.update(ctx, id, fn)
		if !errors.Is(err, errChanged) {
			return rec, err
		}
	}
}

// errChanged aborts an update whose task changed after it was read: the
// update is tried again.
var errChanged = errors.New("pebblestore: the task changed meanwhile")

// update is one try of Update; errChanged when the task changed
// meanwhile.
func (s *Store) update(ctx context.Context, id string, fn func(*store.Record) error) (*store.Record, error) {
	data, err := s.current(id)
	if err != nil {
		return nil, err
	}
	var old, rec *store.Record
	var failed error // fn's
	var enc []byte   // what to write; nil for nothing
	if data != nil {
		if old, err = s.decode(id, data); err != nil { // shared: read only
			return nil, err
		}
		rec = old.Clone()
		if failed = fn(rec); failed == nil {
			if enc, err = rec.Encode(); err != nil {
				return nil, fmt.Errorf("pebblestore: encode task: %w", err)
			}
		}
	}
	err = s.run(ctx, func(t *tx) error {
		if same, err := t.holds(id, data); err != nil || !same {
			return cmp.Or(err, errChanged)
		}
		if enc == nil {
			return nil
		}
		return put(t, rec, enc, old)
	})
	switch {
	case err != nil:
		return nil, err
	case data == nil:
		return nil, store.ErrNotFound
	case failed != nil:
		return nil, failed
	}
	return rec, nil
}

// current returns the stored bytes of a task, nil when there is none.
func (s *Store) current(id string) ([]byte, error) {
	s.qmu.RLock()
	defer s.qmu.RUnlock()
	db, err := s.reading()
	if err != nil {
		return nil, err
	}
	return get(db, key(pTask, id))
}

// holds reports whether the task's stored bytes are data (nil: whether
// there is no such task), as the batch's earlier changes leave them.
func (t *tx) holds(id string, data []byte) (bool, error) {
	v, closer, err := t.Get(key(pTask, id))
	if errors.Is(err, pebble.ErrNotFound) {
		return data == nil, nil
	}
	if err != nil {
		return false, err
	}
	defer closer.Close()
	return data != nil && bytes.Equal(v, data), nil
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
// queued with store.ErrClosed, syncs the ones applied, and closes the
// database. It waits for the disk at most Options.CloseTimeout: then it
// returns ErrCloseAbandoned, the changes still waiting are answered
// ErrClosed (none of them was acknowledged), and the database closes in
// the background once the writes waiting for room are done; the data
// dir stays locked until then. Idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.qmu.Lock()
		s.closed = true
		s.qmu.Unlock()
		s.cancel()
		done := make(chan error, 1)
		// The closer is the store's last goroutine: it ends once the
		// database is closed, whatever Close waited for.
		go func() {
			defer close(s.shut)
			s.wg.Wait()
			// Every commit synced is acknowledged: the marker says so.
			merr := s.mark.write(s.acked.Load())
			if cerr := s.mark.close(); merr == nil {
				merr = cerr
			}
			err := s.closeDB()
			if err == nil && merr != nil {
				err = fmt.Errorf("pebblestore: the marker: %w", merr)
			}
			if uerr := s.lock.Unlock(); err == nil {
				err = uerr
			}
			s.log.Close()
			done <- err
		}()
		t := time.NewTimer(s.opts.CloseTimeout)
		defer t.Stop()
		select {
		case s.closeErr = <-done:
		case <-t.C:
			close(s.abandoned)
			waiting := s.disk.waiters()
			s.log.Warn("close abandoned", "closing the task store gave up waiting for the disk; every acknowledged change is on disk, the changes not acknowledged may be lost",
				"after", s.opts.CloseTimeout, "writesWaitingForRoom", waiting, "diskFull", s.disk.isFull())
			why := "the disk has not answered"
			if waiting > 0 {
				why = fmt.Sprintf("%d writes wait for room on the disk", waiting)
			}
			s.closeErr = fmt.Errorf("%w after %v (%s)", ErrCloseAbandoned, s.opts.CloseTimeout, why)
		}
	})
	return s.closeErr
}

// closeDB closes the database, and the one a reopen left closing.
func (s *Store) closeDB() error {
	if s.closing != nil {
		<-s.closing // a failed database's: its error was the failure's
		s.closing = nil
	}
	if db := s.db.Swap(nil); db != nil {
		return fatalAsError(db.Close)
	}
	return nil
}
