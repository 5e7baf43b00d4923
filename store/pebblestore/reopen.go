package pebblestore

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/a2a-bus/a2a-bus/internal/logsummary"
)

// Reopening a failed store. A failed commit or log sync leaves it
// unknown what reached the disk, and Pebble fails every commit after
// it; the failed sync is never tried again. The store is reopened from
// its log instead, as a restart would: the database is closed and
// opened again on the same folder, the data dir's lock held throughout.
// The log is the truth: every change acknowledged is in it, and a change
// answered with the failure may be too.
//
// The committer reopens, with the first change that comes once a try is
// due (at once after the failure, then at most every reopenEvery): it
// alone writes, so nothing commits meanwhile. The changes that come
// between tries are answered ErrFailed at once; reads go on until the
// old database is closed, and fail (ErrFailed) until the new one is
// open.
var (
	// reopenEvery is the least time between two tries.
	reopenEvery = time.Second
	// reopenWait bounds each of a try's waits: for the syncer to finish
	// with the old database, and for the old database to close. A try
	// that runs out gives up; the next one goes on waiting.
	reopenWait = time.Second
	// reopenBound bounds a change's wait for the try it starts.
	reopenBound = 2*reopenWait + time.Second
)

// reopenDue reports whether a try to reopen is due.
func (s *Store) reopenDue() bool { return time.Now().UnixNano() >= s.nextReopen.Load() }

// reopen tries to reopen the failed store; nil once it takes changes
// again. The committer's.
func (s *Store) reopen() (err error) {
	s.nextReopen.Store(time.Now().Add(reopenEvery).UnixNano())
	defer func() {
		if err != nil {
			s.log.Warn(logsummary.Key("reopen failed", err.Error()), "reopening the task store failed: it takes no change; the next change tries again", "error", err)
		}
	}()
	if s.disk.isFull() {
		return ErrDiskFull
	}
	// The syncer has finished with every group before the barrier: it
	// syncs nothing more on the old database (the store is failed).
	if s.barrier == nil {
		b := make(chan struct{})
		select {
		case s.applied <- &group{barrier: b}:
			s.barrier = b
		case <-time.After(reopenWait):
			return fmt.Errorf("%w (the log's last sync has not ended)", s.failed())
		}
	}
	select {
	case <-s.barrier:
		s.barrier = nil
	case <-time.After(reopenWait):
		return fmt.Errorf("%w (the log's last sync has not ended)", s.failed())
	}
	// The old database closes, once no read uses it (none is left after
	// a try that failed to open the new one).
	s.qmu.Lock()
	old := s.db.Swap(nil)
	s.qmu.Unlock()
	if old != nil {
		done := make(chan error, 1)
		// Owned by the committer (or, after it, Close's closer), which
		// waits for it before it opens the store again or closes.
		go func() { done <- fatalAsError(old.Close) }()
		s.closing = done
	}
	if s.closing != nil {
		select {
		case <-s.closing: // the failure's own error, as a rule
			s.closing = nil
		case <-time.After(reopenWait):
			return fmt.Errorf("%w (the failed database has not closed yet)", s.failed())
		}
	}
	faults := s.logFaults.Load()
	var db *pebble.DB
	err = fatalAsError(func() (err error) {
		db, err = open(s.path, s.opts, true)
		return err
	})
	if err != nil {
		return fmt.Errorf("%w: reopen: %w", s.failed(), err)
	}
	counts, maxID, err := load(db, s.path)
	var seq uint64
	if err == nil {
		seq, err = lastCommit(db, s.path)
	}
	if acked := s.acked.Load(); err == nil && seq < acked {
		// The log lost acknowledged commits while the store was failed:
		// refused as a start would refuse it, and the store stays failed
		// (its marker keeps the last acknowledged commit, for that start).
		// A loss accepted at the start (AcceptDataLoss) was that one; this
		// one is new, and a start must accept it anew.
		err = fmt.Errorf("%w: %s; restore the data dir from a backup, or start the broker again with --accept-data-loss to go on without them",
			ErrDataLoss, logLoss(seq, acked, filepath.Join(filepath.Dir(s.path), MarkerName)))
	}
	if err == nil && s.logFaults.Load() != faults {
		err = errors.New("the new log failed too")
	}
	if err != nil {
		_ = fatalAsError(db.Close)
		return fmt.Errorf("%w: reopen: %w", s.failed(), err)
	}
	s.cmu.Lock()
	s.counts = counts
	s.cmu.Unlock()
	s.maxID = maxID
	s.commitSeq = seq
	s.qmu.Lock()
	s.db.Store(db)
	s.qmu.Unlock()
	s.fmu.Lock()
	cause := s.broken
	s.broken, s.brokenCh = nil, make(chan struct{})
	s.fmu.Unlock()
	s.log.Info("task store reopened", "the task store was reopened from its log after a failure, and takes changes again", "failure", cause)
	return nil
}
