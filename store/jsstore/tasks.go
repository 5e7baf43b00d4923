package jsstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/wire"
)

// Create implements store.Tasks: the record, its index entries and its
// session's count of open tasks in one atomic batch, whose
// compare-and-sets require the task id and the send key free and the
// count unchanged since it was read against maxOpen.
func (s *Store) Create(ctx context.Context, rec *store.Record, maxOpen int) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	data, err := rec.Encode()
	if err != nil {
		return fmt.Errorf("jsstore: encode task %s: %w", rec.Task.ID, err)
	}
	id, state, session := rec.Task.ID, rec.Task.Status.State, rec.Task.ContextID
	req, asg := rec.RequesterInstance, rec.AssigneeInstance
	b := s.tasks
	var taskRev, sendRev uint64 // the revisions that mean "absent"
	for try := 0; ; try++ {
		ops := []op{
			put(taskKey(id), data, int64(taskRev)),
			put(memberKey(req, true, id), nil, anyRev),
			put(memberKey(asg, false, id), nil, anyRev),
		}
		counted, count := -1, 0
		if state.Open() {
			n, rev, guessed, err := s.openCount(ctx, session)
			if err != nil {
				return err
			}
			if maxOpen > 0 && n >= maxOpen {
				if guessed {
					s.countGuesses.forget(session) // read it before refusing
					continue
				}
				return store.ErrLimit
			}
			count = n + 1
			counted = len(ops) + 2
			ops = append(ops,
				put(openKey(req, true, id), nil, anyRev),
				put(openKey(asg, false, id), nil, anyRev),
				put(sessionKey(session), []byte(strconv.Itoa(count)), int64(rev)))
		}
		if state.Terminal() {
			ops = append(ops, put(endedKey(rec.Task.UpdatedAt.Time, id), nil, anyRev))
		}
		if rec.SendKey != "" {
			ops = append(ops, put(sendKey(req, rec.SendKey), []byte(id), int64(sendRev)))
		}
		seq, err := b.write(ctx, ops...)
		if err == nil {
			s.keepTask(id, rec.Clone(), seq, 0, len(ops))
			if counted >= 0 {
				s.keepCount(session, count, seq, counted, len(ops))
			}
			return nil
		}
		s.countGuesses.forget(session)
		if !conflict(err) {
			return err
		}
		// Which compare-and-set failed: the task's, the send key's, or
		// the count's (which the next try reads again).
		t, err := b.get(ctx, taskKey(id))
		if err != nil {
			return err
		}
		if t.live() {
			return store.ErrExists
		}
		taskRev = t.absentRev()
		if rec.SendKey != "" {
			k, err := b.get(ctx, sendKey(req, rec.SendKey))
			if err != nil {
				return err
			}
			if k.live() {
				return ErrSendKeyTaken
			}
			sendRev = k.absentRev()
		}
		if err := backoff(ctx, try, "create task "+id); err != nil {
			return err
		}
	}
}

// revOf returns the revision of the i-th of n keys written in one change
// whose last message was stored at seq: a batch's messages are stored
// one after another. 0 when seq is not known.
func revOf(seq uint64, i, n int) uint64 {
	if seq == 0 {
		return 0
	}
	return seq - uint64(n-1-i)
}

// keepTask remembers rec (which no one may change from then on) as the
// i-th of n keys of a change stored at seq.
func (s *Store) keepTask(id string, rec *store.Record, seq uint64, i, n int) {
	if rev := revOf(seq, i, n); rev != 0 {
		s.taskGuesses.keep(id, rec, rev)
	} else {
		s.taskGuesses.forget(id)
	}
}

// keepCount remembers a session's count as the i-th of n keys of a change
// stored at seq.
func (s *Store) keepCount(session string, count int, seq uint64, i, n int) {
	if rev := revOf(seq, i, n); rev != 0 {
		s.countGuesses.keep(session, count, rev)
	} else {
		s.countGuesses.forget(session)
	}
}

// openCount returns the number of open tasks session requested, and the
// revision of that count (0 when the session has none): as last read or
// written by this store (guessed), or else read now.
func (s *Store) openCount(ctx context.Context, session string) (count int, rev uint64, guessed bool, err error) {
	if n, rev, ok := s.countGuesses.find(session); ok {
		return n, rev, true, nil
	}
	count, rev, err = s.readCount(ctx, session)
	return count, rev, false, err
}

// readCount reads the number of open tasks session requested, and its
// revision, from the stream leader.
func (s *Store) readCount(ctx context.Context, session string) (count int, rev uint64, err error) {
	e, err := s.tasks.get(ctx, sessionKey(session))
	if err != nil {
		return 0, 0, err
	}
	if e.live() {
		count, err = strconv.Atoi(string(e.data))
		if err != nil || count < 0 {
			return 0, 0, fmt.Errorf("%w: the open-task count of session %q is %q", ErrCorrupt, session, e.data)
		}
	}
	s.countGuesses.keep(session, count, e.rev)
	return count, e.rev, nil
}

// Get implements store.Tasks.
func (s *Store) Get(ctx context.Context, id string) (*store.Record, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	rec, _, err := s.getTask(ctx, id)
	return rec, err
}

// getTask reads a task from the stream leader, with its revision.
func (s *Store) getTask(ctx context.Context, id string) (*store.Record, uint64, error) {
	e, err := s.tasks.get(ctx, taskKey(id))
	if err != nil {
		return nil, 0, err
	}
	if !e.live() {
		s.taskGuesses.forget(id)
		return nil, e.rev, store.ErrNotFound
	}
	rec, err := decodeRecord(id, e.data)
	if err != nil {
		return nil, 0, err
	}
	s.taskGuesses.keep(id, rec.Clone(), e.rev)
	return rec, e.rev, nil
}

func decodeRecord(id string, data []byte) (*store.Record, error) {
	var rec store.Record
	if err := wire.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("%w: task %s: %w", ErrCorrupt, id, err)
	}
	if rec.Task.ID != id {
		return nil, fmt.Errorf("%w: task %s holds task %s", ErrCorrupt, id, rec.Task.ID)
	}
	return &rec, nil
}

// FindSend implements store.Tasks: the send index gives the id, and the
// task is returned only if it is there and has that requester and key.
func (s *Store) FindSend(ctx context.Context, instance, key string) (*store.Record, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	if key == "" {
		return nil, store.ErrNotFound
	}
	e, err := s.tasks.get(ctx, sendKey(instance, key))
	if err != nil {
		return nil, err
	}
	if !e.live() {
		return nil, store.ErrNotFound
	}
	rec, _, err := s.getTask(ctx, string(e.data))
	if err != nil {
		return nil, err
	}
	if rec.RequesterInstance != instance || rec.SendKey != key {
		return nil, store.ErrNotFound
	}
	return rec, nil
}

// errMembers is returned by Update when fn changed what it must not.
var errMembers = errors.New("jsstore: an update changed the task's id, members or session")

// Update implements store.Tasks: a compare-and-set on the task's
// revision, alone when the task stays open or stays closed at the same
// time, else in one atomic batch with its index entries and its
// session's count of open tasks. A failed compare-and-set reads the task
// again and applies fn again.
func (s *Store) Update(ctx context.Context, id string, fn func(*store.Record) error) (*store.Record, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	b := s.tasks
	for try := 0; ; try++ {
		old, rev, guessed := s.taskGuesses.find(id)
		if guessed {
			old = old.Clone()
		} else {
			var err error
			if old, rev, err = s.getTask(ctx, id); err != nil {
				return nil, err
			}
		}
		rec := old.Clone()
		if err := fn(rec); err != nil {
			if guessed {
				// Judged again on the task as the leader has it now.
				s.taskGuesses.forget(id)
				continue
			}
			// old was read from the stream leader, which holds only what
			// a quorum has: it is as durable as a change.
			return nil, err
		}
		if rec.Task.ID != old.Task.ID || rec.RequesterInstance != old.RequesterInstance ||
			rec.AssigneeInstance != old.AssigneeInstance || rec.Task.ContextID != old.Task.ContextID {
			return nil, errMembers
		}
		data, err := rec.Encode()
		if err != nil {
			return nil, fmt.Errorf("jsstore: encode task %s: %w", id, err)
		}
		ops := []op{put(taskKey(id), data, int64(rev))}
		ops, counted, count, err := s.indexChanges(ctx, ops, old, rec)
		if err != nil {
			return nil, err
		}
		seq, err := b.write(ctx, ops...)
		if err == nil {
			s.keepTask(id, rec.Clone(), seq, 0, len(ops))
			if counted >= 0 {
				s.keepCount(old.Task.ContextID, count, seq, counted, len(ops))
			}
			s.dropEndedMarkers(ctx, ops, seq)
			return rec, nil
		}
		s.taskGuesses.forget(id)
		s.countGuesses.forget(old.Task.ContextID)
		if !conflict(err) {
			return nil, err
		}
		if guessed {
			continue // a stale guess: read it now
		}
		if err := backoff(ctx, try, "update task "+id); err != nil {
			return nil, err
		}
	}
}

// dropEndedMarkers removes at once the markers a change stored at seq
// left in the terminal index (an ended task reopened or changed), which
// Prune would otherwise count as terminal tasks until they expire. A
// marker left by a failure here expires in markerTTL all the same.
func (s *Store) dropEndedMarkers(ctx context.Context, ops []op, seq uint64) {
	for i, o := range ops {
		rev := revOf(seq, i, len(ops))
		if !o.remove || !strings.HasPrefix(o.key, "e.") || rev == 0 {
			continue
		}
		// Only messages before rev+1 on the key: never a later entry.
		_ = s.tasks.str.Purge(ctx, jetstream.WithPurgeSubject(s.tasks.pre+o.key), jetstream.WithPurgeSequence(rev+1))
	}
}

// indexChanges adds to ops what changes with old becoming rec: the open
// index and the session's count when it opens or ends (counted is the
// count's place in ops, -1 when it does not change), the terminal index
// when it ends, opens, or changes its time while ended.
func (s *Store) indexChanges(ctx context.Context, ops []op, old, rec *store.Record) (_ []op, counted, count int, _ error) {
	id, req, asg := old.Task.ID, old.RequesterInstance, old.AssigneeInstance
	wasOpen, isOpen := old.Task.Status.State.Open(), rec.Task.Status.State.Open()
	counted = -1
	if wasOpen != isOpen {
		var rev uint64
		var err error
		count, rev, _, err = s.openCount(ctx, old.Task.ContextID)
		if err != nil {
			return nil, 0, 0, err
		}
		if isOpen {
			count++
		} else {
			count = max(count-1, 0)
		}
		countOp := put(sessionKey(old.Task.ContextID), []byte(strconv.Itoa(count)), int64(rev))
		if count == 0 {
			countOp = remove(sessionKey(old.Task.ContextID), int64(rev))
		}
		if isOpen {
			ops = append(ops, put(openKey(req, true, id), nil, anyRev), put(openKey(asg, false, id), nil, anyRev))
		} else {
			ops = append(ops, remove(openKey(req, true, id), anyRev), remove(openKey(asg, false, id), anyRev))
		}
		counted = len(ops)
		ops = append(ops, countOp)
	}
	wasEnded, isEnded := old.Task.Status.State.Terminal(), rec.Task.Status.State.Terminal()
	oldKey, newKey := endedKey(old.Task.UpdatedAt.Time, id), endedKey(rec.Task.UpdatedAt.Time, id)
	if wasEnded && (!isEnded || oldKey != newKey) {
		ops = append(ops, remove(oldKey, anyRev))
	}
	if isEnded && (!wasEnded || oldKey != newKey) {
		ops = append(ops, put(newKey, nil, anyRev))
	}
	return ops, counted, count, nil
}
