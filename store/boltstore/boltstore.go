// Package boltstore is the durable task store of earlier versions: one
// bbolt file in the data directory, ACID, fsync'd on every commit. The
// broker now keeps its tasks in store/pebblestore, which opens a data dir
// of this store once, with every check this package makes, and migrates
// its tasks. It remains a complete store.Tasks (a task store without registrations), and the benchmarks
// compare it with its successor.
package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/a2a-bus/a2a-bus/store"
)

// SchemaVersion is the version of the file layout this package writes.
const SchemaVersion = 1

// FileName is the name of the database file in the data directory.
const FileName = "tasks.db"

// Named errors of Open.
var (
	// ErrLocked: another running broker holds the data directory.
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

// Buckets. Keys of the index buckets end with the task id.
var (
	bMeta   = []byte("meta")    // "schema" -> version
	bTasks  = []byte("tasks")   // id -> record JSON
	bMember = []byte("member")  // instance \x00 role \x00 id -> state
	bOpen   = []byte("open")    // id -> requester's session (open tasks)
	bCount  = []byte("ctxopen") // session -> number of open tasks it requested (8 bytes)
	bEnded  = []byte("ended")   // updatedAt ms (8 bytes) id -> nil (terminal tasks)
)

const (
	roleRequester = 'r'
	roleAssignee  = 'a'
	roleSend      = 's' // instance \x00 's' \x00 SendKey -> id: FindSend's index
)

// Options configures Open. The zero value is the default.
type Options struct {
	// LockTimeout is how long Open waits for another process to let go of
	// the file. 0 means one second.
	LockTimeout time.Duration
	// MaxBatch bounds the changes that share one commit. 0 means 1000.
	MaxBatch int
	// AcceptDataLoss opens a file that cannot show that it holds every
	// acknowledged change, with what it holds; OnDataLoss hears why. By
	// default Open refuses such a file (ErrDataLoss).
	AcceptDataLoss bool
	OnDataLoss     func(problem string)
}

// Store is the durable store. It implements store.Tasks.
type Store struct {
	db  *bolt.DB
	ops chan *op
	max int

	qmu    sync.RWMutex // held shared to queue a change, exclusively to close
	closed bool

	ctx    context.Context // canceled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // the committer

	closeOnce sync.Once
}

var _ store.Tasks = (*Store)(nil)

// op is one change waiting for the committer. fn either fails without
// writing anything, or writes and succeeds: so a failing change does not
// spoil the others of its batch.
type op struct {
	fn   func(tx *bolt.Tx) error
	done chan error
}

// Open opens (creating it if needed) the store in dir. A directory held by
// another process, a file from a newer version and a corrupt file are
// errors: the store never starts over silently.
func Open(dir string, opts Options) (s *Store, err error) {
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = time.Second
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 1000
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("boltstore: %w", err)
	}
	path := filepath.Join(dir, FileName)
	if err := createIfMissing(path, opts.LockTimeout); err != nil {
		return nil, err
	}
	problem, err := dataProblem(path)
	if err != nil {
		return nil, fmt.Errorf("boltstore: %w", err)
	}
	if problem != "" {
		if !opts.AcceptDataLoss {
			return nil, errDataLoss(path, problem)
		}
		// bbolt makes an empty file a new store, and opens one with a
		// damaged meta page at the other.
		if opts.OnDataLoss != nil {
			opts.OnDataLoss(problem)
		}
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
	// The freelist is written with every commit (bbolt's default): with
	// NoFreelistSync, the first write would rebuild it by scanning the
	// whole file, in a goroutine that a damaged page crashes.
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: opts.LockTimeout, FreelistType: bolt.FreelistMapType})
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
	if err := prepare(db, path); err != nil {
		db.Close()
		return nil, err
	}
	s = &Store{db: db, ops: make(chan *op, opts.MaxBatch), max: opts.MaxBatch}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.commit()
	return s, nil
}

// createIfMissing makes a new, empty store at path when there is none,
// whole or not at all: it is built under another name and linked into
// place, so that a crash during a first start never leaves an empty or
// half-made tasks.db, which the next start would rightly take for a lost
// one (dataProblem). A link, unlike a rename, never replaces a store that
// another broker made meanwhile.
func createIfMissing(path string, lockTimeout time.Duration) error {
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		return nil // there, or not ours to know: Open looks at it
	}
	tmp := path + ".new"
	os.Remove(tmp) // a crash's leftover: it never held an acknowledged change
	db, err := bolt.Open(tmp, 0o600, &bolt.Options{Timeout: lockTimeout, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return fmt.Errorf("boltstore: create %s: %w", path, err)
	}
	err = prepare(db, path)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Link(tmp, path)
		if errors.Is(err, os.ErrExist) {
			err = nil // another broker made it first
		}
	}
	os.Remove(tmp)
	if err != nil {
		return fmt.Errorf("boltstore: create %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

// syncDir makes a folder's entries durable (a new file's name). Where a
// folder cannot be synced (Windows), its entries are durable already.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("boltstore: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil && runtime.GOOS != "windows" {
		return fmt.Errorf("boltstore: sync %s: %w", dir, err)
	}
	return nil
}

// prepare checks the schema and the file's consistency, and creates the
// buckets of a new file.
func prepare(db *bolt.DB, path string) error {
	return db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bMeta)
		if meta != nil {
			v, err := strconv.Atoi(string(meta.Get([]byte("schema"))))
			if err != nil {
				return fmt.Errorf("%w: %s: no schema version", ErrCorrupt, path)
			}
			if v > SchemaVersion {
				return fmt.Errorf("%w: %s has schema %d, this broker knows up to %d", ErrNewerSchema, path, v, SchemaVersion)
			}
			// Read every page once, here: a damaged page then shows up
			// now, as an error (Open turns faults into panics it
			// recovers), not later in the middle of a request. bbolt's
			// own tx.Check walks in a goroutine of its own, where a fault
			// on the mapped file would kill the process.
			if err := walk(tx); err != nil {
				return fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
			}
			for _, b := range [][]byte{bTasks, bMember, bOpen, bCount, bEnded} {
				if tx.Bucket(b) == nil {
					return fmt.Errorf("%w: %s: bucket %s missing", ErrCorrupt, path, b)
				}
			}
			return nil
		}
		if tx.Bucket(bTasks) != nil {
			return fmt.Errorf("%w: %s: tasks without a schema version", ErrCorrupt, path)
		}
		for _, b := range [][]byte{bMeta, bTasks, bMember, bOpen, bCount, bEnded} {
			if _, err := tx.CreateBucket(b); err != nil {
				return err
			}
		}
		return tx.Bucket(bMeta).Put([]byte("schema"), []byte(strconv.Itoa(SchemaVersion)))
	})
}

// linger bounds how long a commit waits for the senders of the previous
// one to come back, so that they share it instead of splitting into
// alternating half-size commits.
const linger = 500 * time.Microsecond

// walk reads every key and value of every bucket.
func walk(tx *bolt.Tx) error {
	return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
		n := 0
		c := b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			n += len(k) + len(v)
		}
		if n < 0 {
			return fmt.Errorf("bucket %s: impossible size", name)
		}
		return nil
	})
}

// commit runs the changes: everything queued when a commit starts shares
// it, so concurrent senders pay one fsync together. A lone sender does not
// wait for company; after a commit of n changes, the next waits (briefly)
// for n.
func (s *Store) commit() {
	defer s.wg.Done()
	batch := make([]*op, 0, s.max)
	last := 1
	timer := time.NewTimer(linger)
	defer timer.Stop()
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
		if len(batch) < last {
			timer.Reset(linger)
		wait:
			for len(batch) < min(last, s.max) {
				select {
				case o := <-s.ops:
					batch = append(batch, o)
				case <-timer.C:
					break wait
				}
			}
			// Since Go 1.23 a stopped or reset timer delivers no stale
			// tick, so there is nothing to drain.
			timer.Stop()
		}
		last = len(batch)
		results := make([]error, len(batch))
		err := s.db.Update(func(tx *bolt.Tx) error {
			for i, o := range batch {
				results[i] = o.fn(tx)
				if isWriteFailure(results[i]) {
					return results[i]
				}
			}
			return nil
		})
		for i, o := range batch {
			if err != nil {
				o.done <- fmt.Errorf("boltstore: commit: %w", err)
			} else {
				o.done <- results[i]
			}
		}
	}
}

// isSystemError tells an error of the operating system (permissions,
// space, ...) from bbolt's judgement of the file's content.
func isSystemError(err error) bool {
	var pe *os.PathError
	var errno syscall.Errno
	return errors.As(err, &pe) || errors.As(err, &errno)
}

// writeFailure marks an error of bbolt while writing: the transaction is
// spoiled and must not commit.
type writeFailure struct{ err error }

func (w writeFailure) Error() string { return w.err.Error() }
func (w writeFailure) Unwrap() error { return w.err }

func isWriteFailure(err error) bool {
	var w writeFailure
	return errors.As(err, &w)
}

// run queues a change and waits until it is committed (on disk) or fails.
// Once queued, the change is committed or not whatever the caller does,
// so run waits for the committer's answer: a committed change is never
// reported as failed.
func (s *Store) run(ctx context.Context, fn func(tx *bolt.Tx) error) error {
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

func (s *Store) view(fn func(tx *bolt.Tx) error) error {
	if s.ctx.Err() != nil {
		return store.ErrClosed
	}
	return s.db.View(fn)
}

// Create implements store.Tasks.
func (s *Store) Create(ctx context.Context, rec *store.Record, maxOpen int) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("boltstore: encode task: %w", err)
	}
	id := []byte(rec.Task.ID)
	open := rec.Task.Status.State.Open()
	return s.run(ctx, func(tx *bolt.Tx) error {
		tasks := tx.Bucket(bTasks)
		if tasks.Get(id) != nil {
			return store.ErrExists
		}
		count := tx.Bucket(bCount)
		n := getCount(count, rec.Task.ContextID)
		if open && maxOpen > 0 && n >= uint64(maxOpen) {
			return store.ErrLimit
		}
		return writes(
			tasks.Put(id, data),
			indexRecord(tx, rec, nil),
		)
	})
}

// writes returns the first error of bbolt writes, marked as a write
// failure.
func writes(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return writeFailure{err}
		}
	}
	return nil
}

func getCount(b *bolt.Bucket, session string) uint64 {
	v := b.Get([]byte(session))
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

func putCount(b *bolt.Bucket, session string, n uint64) error {
	if n == 0 {
		return b.Delete([]byte(session))
	}
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], n)
	return b.Put([]byte(session), v[:])
}

func memberKey(instance string, role byte, id string) []byte {
	k := make([]byte, 0, len(instance)+len(id)+3)
	k = append(k, instance...)
	k = append(k, 0, role, 0)
	return append(k, id...)
}

func endedKey(rec *store.Record) []byte {
	k := make([]byte, 8, 8+len(rec.Task.ID))
	binary.BigEndian.PutUint64(k, uint64(rec.Task.UpdatedAt.UnixMilli()))
	return append(k, rec.Task.ID...)
}

// indexRecord brings the indexes from old (nil for a new task) to rec.
func indexRecord(tx *bolt.Tx, rec, old *store.Record) error {
	id := []byte(rec.Task.ID)
	state := []byte(rec.Task.Status.State)
	member := tx.Bucket(bMember)
	if err := member.Put(memberKey(rec.RequesterInstance, roleRequester, rec.Task.ID), state); err != nil {
		return err
	}
	if err := member.Put(memberKey(rec.AssigneeInstance, roleAssignee, rec.Task.ID), state); err != nil {
		return err
	}
	if old == nil && rec.SendKey != "" {
		if err := member.Put(memberKey(rec.RequesterInstance, roleSend, rec.SendKey), id); err != nil {
			return err
		}
	}
	wasOpen := old != nil && old.Task.Status.State.Open()
	isOpen := rec.Task.Status.State.Open()
	count := tx.Bucket(bCount)
	n := getCount(count, rec.Task.ContextID)
	switch {
	case isOpen && !wasOpen:
		if err := tx.Bucket(bOpen).Put(id, []byte(rec.Task.ContextID)); err != nil {
			return err
		}
		if err := putCount(count, rec.Task.ContextID, n+1); err != nil {
			return err
		}
	case !isOpen && wasOpen:
		if err := tx.Bucket(bOpen).Delete(id); err != nil {
			return err
		}
		if err := putCount(count, rec.Task.ContextID, n-min(n, 1)); err != nil {
			return err
		}
	}
	ended := tx.Bucket(bEnded)
	if old != nil && !old.Task.Status.State.Open() {
		if err := ended.Delete(endedKey(old)); err != nil {
			return err
		}
	}
	if !isOpen {
		return ended.Put(endedKey(rec), nil)
	}
	return nil
}

func getRecord(tx *bolt.Tx, id []byte) (*store.Record, error) {
	data := tx.Bucket(bTasks).Get(id)
	if data == nil {
		return nil, store.ErrNotFound
	}
	return decodeRecord(id, data)
}

func decodeRecord(id, data []byte) (*store.Record, error) {
	var rec store.Record
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("%w: task %s: %v", ErrCorrupt, id, err)
	}
	return &rec, nil
}

// Get implements store.Tasks.
func (s *Store) Get(_ context.Context, id string) (*store.Record, error) {
	var rec *store.Record
	err := s.view(func(tx *bolt.Tx) error {
		var err error
		rec, err = getRecord(tx, []byte(id))
		return err
	})
	return rec, err
}

// FindSend implements store.Tasks.
func (s *Store) FindSend(_ context.Context, instance, key string) (*store.Record, error) {
	var rec *store.Record
	err := s.view(func(tx *bolt.Tx) error {
		id := tx.Bucket(bMember).Get(memberKey(instance, roleSend, key))
		if id == nil {
			return store.ErrNotFound
		}
		var err error
		rec, err = getRecord(tx, id)
		return err
	})
	return rec, err
}

// Update implements store.Tasks. fn runs inside the commit and may run
// again if the commit is retried; it must only change the record.
func (s *Store) Update(ctx context.Context, id string, fn func(*store.Record) error) (*store.Record, error) {
	var out *store.Record
	err := s.run(ctx, func(tx *bolt.Tx) error {
		old, err := getRecord(tx, []byte(id))
		if err != nil {
			return err
		}
		rec := old.Clone()
		if err := fn(rec); err != nil {
			return err
		}
		data, err := json.Marshal(rec)
		if err != nil {
			return fmt.Errorf("boltstore: encode task: %w", err)
		}
		if err := writes(tx.Bucket(bTasks).Put([]byte(id), data), indexRecord(tx, rec, old)); err != nil {
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

// List implements store.Tasks, from the indexes: by member instance
// (with the state kept in the index, so that only selected tasks are
// read, and the two roles merged in id order), or the open tasks; only a
// query of neither reads every task. It reads the tasks of the page, and
// the size of the first one past it.
func (s *Store) List(_ context.Context, q store.Query) ([]*store.Record, bool, error) {
	out := []*store.Record{}
	more := false
	err := s.view(func(tx *bolt.Tx) error {
		var page store.Pager
		tasks := tx.Bucket(bTasks)
		// take adds the task id to the page; it reports false once the
		// page is full.
		take := func(id []byte, check bool) (bool, error) {
			data := tasks.Get(id)
			if data == nil {
				return true, nil // an index entry without its task: not listed
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
			return s.listMember(tx, q, take)
		case q.OpenOnly && q.State == "":
			c := tx.Bucket(bOpen).Cursor()
			for k, _ := seekAfter(c, nil, q.After); k != nil; k, _ = c.Next() {
				if ok, err := take(k, false); !ok || err != nil {
					return err
				}
			}
		default:
			c := tasks.Cursor()
			for k, _ := seekAfter(c, nil, q.After); k != nil; k, _ = c.Next() {
				if ok, err := take(k, true); !ok || err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return out, more, nil
}

// listMember walks an instance's member index, one cursor per role,
// merged in id order, and takes the tasks whose indexed state q selects.
func (s *Store) listMember(tx *bolt.Tx, q store.Query, take func(id []byte, check bool) (bool, error)) error {
	type walk struct {
		c      *bolt.Cursor
		prefix []byte
		k, v   []byte
	}
	var walks []*walk
	for _, role := range []byte{roleRequester, roleAssignee} {
		if (q.Role == store.Requester && role != roleRequester) || (q.Role == store.Assignee && role != roleAssignee) {
			continue
		}
		w := &walk{c: tx.Bucket(bMember).Cursor(), prefix: memberKey(q.Instance, role, "")}
		w.k, w.v = seekAfter(w.c, w.prefix, q.After)
		walks = append(walks, w)
	}
	for {
		// The walk whose next id is smallest goes first.
		var next *walk
		for _, w := range walks {
			if w.k == nil {
				continue
			}
			if next == nil || bytes.Compare(w.k[len(w.prefix):], next.k[len(next.prefix):]) < 0 {
				next = w
			}
		}
		if next == nil {
			return nil
		}
		id, state := next.k[len(next.prefix):], next.v
		next.k, next.v = next.c.Next()
		if next.k != nil && !bytes.HasPrefix(next.k, next.prefix) {
			next.k = nil
		}
		if (q.State != "" && string(state) != string(q.State)) || (q.OpenOnly && !stateOpen(state)) {
			continue
		}
		if ok, err := take(id, false); !ok || err != nil {
			return err
		}
	}
}

// seekAfter positions c on the first key with prefix whose rest sorts
// after after, and returns it and its value (nil when there is none).
func seekAfter(c *bolt.Cursor, prefix []byte, after string) ([]byte, []byte) {
	start := append(bytes.Clone(prefix), after...)
	k, v := c.Seek(start)
	if k != nil && after != "" && bytes.Equal(k, start) {
		k, v = c.Next()
	}
	if k == nil || !bytes.HasPrefix(k, prefix) {
		return nil, nil
	}
	return k, v
}

// OpenCount implements store.Tasks: the sum of the per-session counts.
func (s *Store) OpenCount(context.Context) (int, error) {
	n := 0
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bCount).ForEach(func(_, v []byte) error {
			if len(v) == 8 {
				n += int(binary.BigEndian.Uint64(v))
			}
			return nil
		})
	})
	return n, err
}

func stateOpen(v []byte) bool {
	switch string(v) {
	case "submitted", "working", "input-required":
		return true
	}
	return false
}

// Prune implements store.Tasks, walking the terminal tasks oldest first.
// It counts them in the same transaction, so it sees what earlier changes
// of a shared commit did.
func (s *Store) Prune(ctx context.Context, r store.Retention, now time.Time) (int, error) {
	var pruned int
	err := s.run(ctx, func(tx *bolt.Tx) error {
		pruned = 0
		ended := tx.Bucket(bEnded)
		total := 0
		c := ended.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			total++
		}
		cutoff := uint64(0)
		if r.MaxAge > 0 {
			cutoff = uint64(now.Add(-r.MaxAge).UnixMilli())
		}
		var doomed [][]byte
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			tooOld := r.MaxAge > 0 && binary.BigEndian.Uint64(k[:8]) < cutoff
			tooMany := r.MaxTerminal > 0 && total-len(doomed) > r.MaxTerminal
			if !tooOld && !tooMany {
				break
			}
			doomed = append(doomed, bytes.Clone(k))
		}
		for _, k := range doomed {
			id := k[8:]
			rec, err := getRecord(tx, id)
			if err == nil && rec.Task.Status.State.Open() {
				continue // never: an open task is not in this index
			}
			deletes := []error{ended.Delete(k), tx.Bucket(bTasks).Delete(id)}
			if err == nil {
				deletes = append(deletes,
					tx.Bucket(bMember).Delete(memberKey(rec.RequesterInstance, roleRequester, rec.Task.ID)),
					tx.Bucket(bMember).Delete(memberKey(rec.AssigneeInstance, roleAssignee, rec.Task.ID)))
				if rec.SendKey != "" {
					deletes = append(deletes, tx.Bucket(bMember).Delete(memberKey(rec.RequesterInstance, roleSend, rec.SendKey)))
				}
			}
			// An entry without a readable task is dropped too, so that
			// pruning does not stop at it for ever.
			if err := writes(deletes...); err != nil {
				return err
			}
			pruned++
		}
		return nil
	})
	return pruned, err
}

// Close implements store.Tasks: it stops taking changes, fails those still
// queued with store.ErrClosed, and closes the file. Idempotent.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		// No change is queued from now on; the committer finishes its
		// batch, fails what remains queued, and stops.
		s.qmu.Lock()
		s.closed = true
		s.qmu.Unlock()
		s.cancel()
		s.wg.Wait()
		err = s.db.Close()
	})
	return err
}
