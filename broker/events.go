package broker

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// eventLog numbers notifications per recipient session and keeps the last
// window of them for replay.
type eventLog struct {
	window   int
	maxBytes int

	mu       sync.Mutex
	sessions map[string]*sessionLog
}

// sessionLog is one session's numbered notifications. Its lock is held
// while a notification is numbered and kept, never while it is published:
// a notification is published once the one numbered before it is
// (published, a hand-off from each to the next), so that the session's
// notifications reach the bus in seq order without a lock held across
// the bus's I/O, and replays, sweeps and new notifications never wait
// for it.
//
// A session's log is kept until the host closes the session, or until it
// has had no agent and no subscriber for the orphan timeout; then its
// notifications go, but not its seq, which goes on from where it was for
// the whole epoch (a few dozen bytes per session id), so that a runtime
// still following it never takes a new event for an old one.
type sessionLog struct {
	mu    sync.Mutex
	seq   uint64   // the last seq given
	ring  [][]byte // the kept notifications, oldest first from head
	head  int      // index of the oldest
	n     int      // how many are kept
	bytes int      // their size
	// idleSince is when the session was first seen with no agent and no
	// subscriber, zero while it has either.
	idleSince time.Time
	// unsent is the seq of the oldest notification whose publish failed
	// and that the republisher has not published since; 0: none.
	unsent uint64

	// published is the seq of the latest notification handed to the bus.
	// It is stored after each publish, read without mu on the way to
	// one; waiters (counted in waiting, under mu) wait on turn for it.
	published atomic.Uint64
	waiting   atomic.Int32
	turn      sync.Cond // on mu
}

// notice is a notification numbered and kept, to be published after the
// one numbered before it. The zero notice publishes nothing.
type notice struct {
	log     *sessionLog
	session string
	seq     uint64
	msg     []byte
}

func (l *eventLog) init(window, maxBytes int) {
	l.window = window
	l.maxBytes = maxBytes
	l.sessions = map[string]*sessionLog{}
}

func (l *eventLog) session(id string, create bool) *sessionLog {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sessions[id]
	if s == nil && create {
		s = &sessionLog{}
		s.turn.L = &s.mu
		l.sessions[id] = s
	}
	return s
}

// all returns the session logs, to be visited without l.mu.
func (l *eventLog) all() map[string]*sessionLog {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.sessions)
}

// forget drops the kept notifications of a session, keeping its seq.
func (l *eventLog) forget(session string) {
	if s := l.session(session, false); s != nil {
		s.mu.Lock()
		s.drop()
		s.mu.Unlock()
	}
}

// drop forgets the kept notifications. s.mu is held.
func (s *sessionLog) drop() {
	clear(s.ring)
	s.ring, s.head, s.n, s.bytes = nil, 0, 0, 0
}

// sweepSessions drops the notifications of the sessions that have had no
// agent and no subscriber for the orphan timeout. A bus that cannot count
// subscribers (the pipe) counts none: there, a session's agents alone
// keep its notifications.
func (b *Broker) sweepSessions() {
	if b.cfg.OrphanTimeout == Forever {
		return
	}
	now := b.cfg.Now()
	counter, _ := b.bus.(transport.SubscriberCounter)
	for id, s := range b.events.all() {
		s.mu.Lock()
		kept, seq := s.n > 0, s.seq
		s.mu.Unlock()
		if !kept {
			continue
		}
		// Asked without the session's lock: the registry and the bus are
		// not taken under it.
		busy := b.reg.sessionLive(id)
		if !busy && counter != nil {
			n, _ := counter.Subscribers(id)
			busy = n > 0
		}
		s.mu.Lock()
		switch {
		case busy || s.seq != seq:
			// Live, or a notification came while the lock was let go:
			// not idle.
			s.idleSince = time.Time{}
		case s.idleSince.IsZero():
			s.idleSince = now
		case now.Sub(s.idleSince) >= b.cfg.OrphanTimeout:
			s.drop()
			s.idleSince = time.Time{}
		}
		s.mu.Unlock()
	}
}

// errTooLarge: a notification would not fit the bus's payload limit.
var errTooLarge = errors.New("notification over the payload limit")

// emit numbers, encodes once, keeps and publishes one notification to
// recipient in session (post, then publish).
func (b *Broker) emit(recipient, session, fromSession, method string, params func(wire.EventHead) any) error {
	n, err := b.post(recipient, session, fromSession, method, params)
	b.publish(n)
	return err
}

// post numbers, encodes once and keeps one notification to recipient in
// session, and returns it to be published. params builds the
// notification's params from its head. A notification over the payload
// limit is neither numbered nor sent (errTooLarge, and no notice): a task
// event never is one (the task limit sees to it), a push may be.
//
// The caller publishes the notice before it posts another, whatever
// happens: the session's later notifications wait for it. It may let go
// of its locks first, and should (see the lock order in doc.go).
func (b *Broker) post(recipient, session, fromSession, method string, params func(wire.EventHead) any) (notice, error) {
	if b.clustered() {
		// The cluster's log numbers, keeps and publishes it.
		return notice{}, b.appendShared(recipient, session, fromSession, method, params)
	}
	l := &b.events
	s := l.session(session, true)
	s.mu.Lock()
	defer s.mu.Unlock()
	head := wire.EventHead{
		Recipient:          recipient,
		RecipientContextID: session,
		ContextID:          fromSession,
		Seq:                s.seq + 1,
		Epoch:              b.epoch,
	}
	msg, err := wire.MarshalNotification(method, params(head))
	if err != nil {
		// Every field was validated on the way in; this is a bug.
		b.log.Error("encode notification", "method", method, "error", err)
		return notice{}, err
	}
	if len(msg) > b.limits.Item() {
		if method != wire.NotifyPush {
			b.log.Error("notification over the payload limit not sent", "method", method, "bytes", len(msg))
		}
		return notice{}, errTooLarge
	}
	s.seq++
	s.keep(msg, l.window, l.maxBytes)
	return notice{log: s, session: session, seq: s.seq, msg: msg}, nil
}

// publish hands n to the bus once the notification numbered before it in
// its session has been: so a session's notifications reach the bus in
// seq order, one Publish after the other, whichever goroutines post
// them. The zero notice publishes nothing.
//
// The common case, no notification of the session on its way to the bus,
// takes no lock and allocates nothing: only a publish that finds the one
// before it still going waits, on the session's turn.
func (b *Broker) publish(n notice) {
	s := n.log
	if s == nil {
		return
	}
	if s.published.Load() != n.seq-1 {
		s.mu.Lock()
		s.waiting.Add(1)
		for s.published.Load() != n.seq-1 {
			s.turn.Wait()
		}
		s.waiting.Add(-1)
		s.mu.Unlock()
	}
	if err := b.bus.Publish(n.session, n.msg); err != nil {
		// The notification is kept, and published again once the bus
		// takes it: nothing else would tell a waiting runtime of it.
		b.log.Warn("publish failed; the event stays in the replay log and is published again", "seq", n.seq, "error", err)
		b.republishLater(n.session, s, n.seq)
	}
	s.published.Store(n.seq)
	// A waiter counts itself under mu before it looks at published: either
	// it sees this store, or this load sees it and the broadcast, under
	// mu, finds it waiting.
	if s.waiting.Load() > 0 {
		s.mu.Lock()
		s.turn.Broadcast()
		s.mu.Unlock()
	}
}

// republisher publishes again the notifications whose publish failed (a
// cut link whose buffer was full, a bus closing under way), so that a
// runtime that waits learns of them from the bus, not from its next
// check. It runs only while a failure is pending.
type republisher struct {
	mu      sync.Mutex
	pending map[string]*sessionLog
	running bool
}

// republishBackoff is how long the republisher waits before it tries,
// doubled after each round with a failure, up to republishMaxBackoff.
const (
	republishBackoff    = 100 * time.Millisecond
	republishMaxBackoff = 5 * time.Second
)

// republishLater marks seq of session s as unsent and starts the
// republisher if it is not running.
func (b *Broker) republishLater(session string, s *sessionLog, seq uint64) {
	s.mu.Lock()
	if s.unsent == 0 || seq < s.unsent {
		s.unsent = seq
	}
	s.mu.Unlock()
	r := &b.republish
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pending == nil {
		r.pending = map[string]*sessionLog{}
	}
	r.pending[session] = s
	if r.running || b.ctx.Err() != nil {
		return
	}
	r.running = true
	b.wg.Go(b.republishLoop)
}

// republishLoop republishes until nothing is pending, or Close.
func (b *Broker) republishLoop() {
	r := &b.republish
	wait := republishBackoff
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-b.ctx.Done():
			r.mu.Lock()
			r.running = false
			r.mu.Unlock()
			return
		case <-timer.C:
		}
		r.mu.Lock()
		pending := r.pending
		r.pending = nil
		r.mu.Unlock()
		failed := false
		for session, s := range pending {
			if !b.republishSession(session, s) {
				failed = true
			}
		}
		r.mu.Lock()
		if len(r.pending) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		if failed {
			wait = min(2*wait, republishMaxBackoff)
		} else {
			wait = republishBackoff
		}
		timer.Reset(wait)
	}
}

// republishSession publishes again what is kept of session's notifications
// from its oldest unsent one on, in order; a failure marks the rest unsent
// again. It reports whether every publish succeeded. A notification no
// longer kept is not published: a replay of it is A2A_REPLAY_GAP, which
// the runtime handles.
func (b *Broker) republishSession(session string, s *sessionLog) bool {
	s.mu.Lock()
	from := s.unsent
	s.unsent = 0
	var msgs []json.RawMessage
	if from > 0 {
		from = max(from, s.oldest())
		msgs = s.since(from-1, math.MaxInt)
	}
	s.mu.Unlock()
	for i, msg := range msgs {
		if err := b.bus.Publish(session, msg); err != nil {
			b.log.Debug("publish again failed; will retry", "seq", from+uint64(i), "error", err)
			b.republishLater(session, s, from+uint64(i))
			return false
		}
	}
	if len(msgs) > 0 {
		b.log.Info("published again the events whose publish failed", "session", session, "count", len(msgs))
	}
	return true
}

// keep adds msg as the newest, dropping the oldest beyond window
// notifications or maxBytes bytes (the newest is always kept).
func (s *sessionLog) keep(msg []byte, window, maxBytes int) {
	if s.n == len(s.ring) && len(s.ring) < window {
		// Grow: unroll the ring into a larger slice.
		grown := make([][]byte, s.n, min(window, max(16, 2*s.n)))
		for i := range s.n {
			grown[i] = s.ring[(s.head+i)%len(s.ring)]
		}
		s.ring = grown[:cap(grown)]
		s.head = 0
	}
	for s.n > 0 && (s.n == len(s.ring) || s.bytes+len(msg) > maxBytes) {
		s.bytes -= len(s.ring[s.head])
		s.ring[s.head] = nil
		s.head = (s.head + 1) % len(s.ring)
		s.n--
	}
	s.ring[(s.head+s.n)%len(s.ring)] = msg
	s.n++
	s.bytes += len(msg)
}

// oldest returns the seq of the oldest kept notification; seq+1 when none
// is kept.
func (s *sessionLog) oldest() uint64 { return s.seq - uint64(s.n) + 1 }

// since returns the kept notifications after seq afterSeq, in order, as
// many as fit maxBytes (the first always); nil when some of them are no
// longer kept. s.mu is held.
func (s *sessionLog) since(afterSeq uint64, maxBytes int) []json.RawMessage {
	oldest := s.oldest()
	if afterSeq+1 < oldest {
		return nil
	}
	if afterSeq >= s.seq {
		return []json.RawMessage{}
	}
	skip := int(afterSeq + 1 - oldest)
	events := make([]json.RawMessage, 0, s.n-skip)
	size := 0
	for i := skip; i < s.n; i++ {
		ev := s.ring[(s.head+i)%len(s.ring)]
		if size += len(ev) + 1; size > maxBytes && len(events) > 0 {
			break
		}
		events = append(events, ev)
	}
	return events
}

func (b *Broker) replay(ctx context.Context, from transport.Caller, req *wire.Request) (any, *wire.Error) {
	var p wire.ReplayParams
	shapeErr := req.DecodeParams(&p)
	if claimsOtherSession(from, req.Params) {
		return nil, wire.ErrUnauthorized.Withf("replay of another session than the caller's")
	}
	if shapeErr != nil {
		return nil, shapeErr
	}
	if err := wire.ValidateID("contextId", p.ContextID); err != nil {
		return nil, wire.ErrInvalidParams.Withf("%v", err)
	}
	// Neither epoch nor afterSeq asks where the session stands: a runtime
	// that starts following it learns the epoch and the last seq, and
	// replays nothing.
	where := p.Epoch == nil && p.AfterSeq == nil
	if p.Epoch == nil && !where {
		return nil, wire.ErrInvalidParams.Withf(`epoch: required with afterSeq (send "" when none is known)`)
	}
	if p.AfterSeq == nil && !where {
		return nil, wire.ErrInvalidParams.Withf("afterSeq: required with epoch")
	}
	if b.clustered() {
		return b.replayShared(ctx, &p, where)
	}
	res := wire.ReplayResult{Epoch: b.epoch, Events: []json.RawMessage{}}
	s := b.events.session(p.ContextID, false)
	var oldest uint64 = 1
	if s != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		res.LastSeq = s.seq
		oldest = s.oldest()
	}
	gap := func(why string) *wire.Error {
		e := wire.ErrReplayGap.Withf("%s; re-read your tasks with a2a.tasks.list", why)
		e.Data.Epoch = b.epoch
		e.Data.OldestSeq = oldest
		return e
	}
	if where {
		return res, nil
	}
	if *p.Epoch != b.epoch {
		return nil, gap("the epoch is not the current one")
	}
	if s == nil || *p.AfterSeq >= res.LastSeq {
		// Nothing after it: no events (also for an afterSeq beyond the
		// last, which lastSeq lets the caller see).
		return res, nil
	}
	events := s.since(*p.AfterSeq, b.limits.Page())
	if events == nil {
		return nil, gap("the events after that seq are no longer kept")
	}
	res.Events = events
	return res, nil
}
