package pebblestore

import (
	"os"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// disk is the store's side of a full disk: Pebble's writes that find no
// room wait here, and are tried again until there is room, instead of
// failing inside Pebble. While any waits, the disk is full: the store
// takes no change (ErrDiskFull) and reads go on.
//
// Why the writes wait rather than fail: Pebble cannot go on from a
// failed write. A failed write of its log fails every later commit, and
// the commit that meets that error first panics with Pebble's commit
// lock held, so that the database can then be neither used nor closed;
// a failed write of a table (a flush) is retried at once, for ever, with
// a warning each time (hundreds a second), while changes pile up in
// memory until Pebble stops every write, with no way out but room on the
// disk; a failed write of its manifest ends the process. A write that
// found no room wrote nothing, or a part it reports (the rest is written
// when it is tried again): trying it again once there is room is what
// Pebble's own vfs.OnDiskFull does. A failed sync is never tried again:
// what reached the disk is then unknown (that fails the store, which is
// reopened from its log).
//
// The log's other failures (a failed sync, a write failing otherwise)
// fail the store at once, before Pebble hears of them: Pebble keeps such
// an error, and the next commit that meets it panics with its commit
// lock held; the store checks for its failure, under its own lock,
// before every commit, so that no commit meets it.
type disk struct {
	// onChange is told, under mu, when the disk fills (the write that
	// found no room) and when it has room again.
	onChange func(full bool, path string, err error)
	// onLogFault is told of a failed write or sync of the log, before
	// Pebble is.
	onLogFault func(path string, err error)

	mu      sync.Mutex
	waiting []*waiter
	full    chan struct{} // closed while writes wait; a new one when they are done
	live    bool          // the store is open: writes that find no room wait, a log's fault fails it
	opening bool          // an existing database opens: writes that find no room wait (untold)
	first   struct {      // the write that found the disk full while opening, told once live
		path string
		err  error
	}
	probing bool // the retrier runs

	round sync.Mutex // one round of retries at a time
}

// waiter is a write waiting for room: try writes what is left.
type waiter struct {
	path string
	try  func() error
	done chan error
}

// retryEvery is how often the writes waiting for room are tried again,
// when no change tries them first.
var retryEvery = 500 * time.Millisecond

func newDisk(onChange func(full bool, path string, err error), onLogFault func(path string, err error)) *disk {
	return &disk{onChange: onChange, onLogFault: onLogFault, full: make(chan struct{})}
}

// fullChan is closed while the disk is full.
func (d *disk) fullChan() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.full
}

func (d *disk) isFull() bool {
	select {
	case <-d.fullChan():
		return true
	default:
		return false
	}
}

// waiters is how many writes wait for room.
func (d *disk) waiters() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.waiting)
}

// setLive says the store is open: until then, while Open runs, a write
// that finds no room fails (the start stops, naming it), and nothing is
// told; but see setOpening. Writes still waiting from the open (a
// compaction Pebble began as it opened) are told now.
func (d *disk) setLive() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.live = true
	if len(d.waiting) > 0 {
		d.onChange(true, d.first.path, d.first.err)
	}
}

// setOpening says whether an existing database is being opened. Pebble
// then writes the changes its log holds to tables (a flush) before its
// Open returns, and tries a flush that found no room again at once, for
// ever: so while opening, a write that finds no room waits, as it does
// in an open store, and the opener, seeing the disk full, gives up on
// that open (openWaiting).
func (d *disk) setOpening(on bool) {
	d.mu.Lock()
	d.opening = on
	d.mu.Unlock()
}

func (d *disk) isLive() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.live
}

// logFault tells of a failed write or sync of the log file path.
func (d *disk) logFault(path string, err error) {
	if err != nil && isLog(path) && d.isLive() {
		d.onLogFault(path, err)
	}
}

// isLog tells the write-ahead log's files (Pebble's NNNNNN.log).
func isLog(path string) bool { return strings.HasSuffix(path, ".log") }

// do runs a write; where it finds no room, it waits until there is, and
// returns the result of the try that did not find the disk full.
func (d *disk) do(path string, op func() error) error {
	err := op()
	if err == nil || !isNoSpace(err) {
		return err
	}
	w := &waiter{path: path, try: op, done: make(chan error, 1)}
	d.mu.Lock()
	if !d.live && !d.opening {
		d.mu.Unlock()
		return err
	}
	d.waiting = append(d.waiting, w)
	if len(d.waiting) == 1 {
		close(d.full)
		if d.live {
			d.onChange(true, path, err)
		} else {
			d.first.path, d.first.err = path, err
		}
	}
	if !d.probing {
		d.probing = true
		go d.retrier()
	}
	d.mu.Unlock()
	return <-w.done
}

// retrier tries the waiting writes again every retryEvery, until none
// waits. It is the disk's own goroutine: it ends when no write waits,
// also after the store is closed (a Close that gave up waiting for
// room leaves the writes waiting, and the database closes once they
// are done).
func (d *disk) retrier() {
	t := time.NewTimer(retryEvery)
	defer t.Stop()
	for {
		<-t.C
		d.retry()
		d.mu.Lock()
		if len(d.waiting) == 0 {
			d.probing = false
			d.mu.Unlock()
			return
		}
		d.mu.Unlock()
		t.Reset(retryEvery)
	}
}

// retry tries every waiting write once, in the caller's goroutine: a
// write that no longer finds the disk full is done (well or not) and
// its writer goes on. It reports whether the disk has room now.
func (d *disk) retry() bool {
	d.round.Lock()
	defer d.round.Unlock()
	d.mu.Lock()
	ws := append([]*waiter(nil), d.waiting...)
	d.mu.Unlock()
	var done []*waiter
	for _, w := range ws {
		err := w.try()
		if err != nil && isNoSpace(err) {
			continue
		}
		done = append(done, w)
		w.done <- err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.waiting = removeAll(d.waiting, done)
	roomy := len(d.waiting) == 0
	if roomy && len(ws) > 0 {
		d.full = make(chan struct{})
		if d.live {
			d.onChange(false, "", nil)
		}
	}
	return roomy
}

func removeAll(ws, gone []*waiter) []*waiter {
	out := ws[:0]
	for _, w := range ws {
		keep := true
		for _, g := range gone {
			if w == g {
				keep = false
				break
			}
		}
		if keep {
			out = append(out, w)
		}
	}
	clear(ws[len(out):])
	return out
}

// diskFS makes Pebble's writes that find no room wait on a disk.
type diskFS struct {
	vfs.FS
	d *disk
}

func (fs diskFS) Unwrap() vfs.FS { return fs.FS }

func (fs diskFS) Create(name string, c vfs.DiskWriteCategory) (f vfs.File, err error) {
	err = fs.d.do(name, func() error {
		f, err = fs.FS.Create(name, c)
		return err
	})
	return fs.file(f, name, err)
}

func (fs diskFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (f vfs.File, err error) {
	err = fs.d.do(name, func() error {
		f, err = fs.FS.OpenReadWrite(name, c, opts...)
		return err
	})
	return fs.file(f, name, err)
}

func (fs diskFS) ReuseForWrite(old, name string, c vfs.DiskWriteCategory) (f vfs.File, err error) {
	err = fs.d.do(name, func() error {
		f, err = fs.FS.ReuseForWrite(old, name, c)
		return err
	})
	return fs.file(f, name, err)
}

func (fs diskFS) Link(old, name string) error {
	return fs.d.do(name, func() error { return fs.FS.Link(old, name) })
}

func (fs diskFS) Rename(old, name string) error {
	return fs.d.do(name, func() error { return fs.FS.Rename(old, name) })
}

func (fs diskFS) MkdirAll(dir string, perm os.FileMode) error {
	return fs.d.do(dir, func() error { return fs.FS.MkdirAll(dir, perm) })
}

func (fs diskFS) file(f vfs.File, name string, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	return &diskFile{File: f, d: fs.d, name: name}, nil
}

// diskFile makes a file's writes that find no room wait, and tells the
// disk of the log's other failures. Its syncs are the file's own: a
// failed one is never tried again.
type diskFile struct {
	vfs.File
	d    *disk
	name string
}

func (f *diskFile) Write(p []byte) (int, error) {
	n := 0
	err := f.d.do(f.name, func() error {
		m, err := f.File.Write(p[n:])
		n += m
		return err
	})
	f.d.logFault(f.name, err)
	return n, err
}

func (f *diskFile) WriteAt(p []byte, off int64) (int, error) {
	n := 0
	err := f.d.do(f.name, func() error {
		m, err := f.File.WriteAt(p[n:], off+int64(n))
		n += m
		return err
	})
	f.d.logFault(f.name, err)
	return n, err
}

func (f *diskFile) Sync() error {
	err := f.File.Sync()
	f.d.logFault(f.name, err)
	return err
}

func (f *diskFile) SyncData() error {
	err := f.File.SyncData()
	f.d.logFault(f.name, err)
	return err
}

func (f *diskFile) SyncTo(length int64) (bool, error) {
	full, err := f.File.SyncTo(length)
	f.d.logFault(f.name, err)
	return full, err
}
