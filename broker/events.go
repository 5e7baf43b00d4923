package broker

import (
	"context"
	"encoding/json"
	"sync"

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
// while a notification is numbered, kept and published, so the session's
// notifications are published in seq order.
type sessionLog struct {
	mu    sync.Mutex
	seq   uint64   // the last seq given
	ring  [][]byte // the kept notifications, oldest first from head
	head  int      // index of the oldest
	n     int      // how many are kept
	bytes int      // their size
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
		l.sessions[id] = s
	}
	return s
}

// forget drops the kept notifications of a session left without live
// agents, keeping its seq. The check is made under the session's lock,
// which emit holds while it keeps: an agent registering meanwhile keeps
// its events.
func (l *eventLog) forget(b *Broker, session string) {
	s := l.session(session, false)
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if b.reg.sessionLive(session) {
		return
	}
	s.drop()
}

// drop forgets the kept notifications. s.mu is held.
func (s *sessionLog) drop() {
	clear(s.ring)
	s.ring, s.head, s.n, s.bytes = nil, 0, 0, 0
}

// notification is the encoded shape of every notification; params is
// encoded in the same pass.
type notification struct {
	JSONRPC string `json:"jsonrpc"`
	Method  string `json:"method"`
	Params  any    `json:"params"`
}

// emit numbers, encodes once, keeps and publishes one notification to
// recipient in session. params builds the notification's params from its
// head.
func (l *eventLog) emit(b *Broker, recipient, session, fromSession, method string, params func(wire.EventHead) any) {
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
	msg, err := json.Marshal(notification{JSONRPC: wire.Version, Method: method, Params: params(head)})
	if err != nil {
		// Every field was validated on the way in; this is a bug.
		b.log.Error("encode notification", "method", method, "error", err)
		return
	}
	s.seq++
	// Kept for replay only while the session has someone to replay it:
	// events for a session without live agents (the closing of a departed
	// agent's tasks, say) are published, not kept.
	if b.reg.sessionLive(session) {
		s.keep(msg, l.window, l.maxBytes)
	}
	if err := b.bus.Publish(session, msg); err != nil {
		// The notification is kept: the recipient's runtime replays it.
		b.log.Warn("publish failed; the event stays in the replay log", "seq", head.Seq, "error", err)
	}
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

// since returns the kept notifications after seq afterSeq, in order; nil
// when some of them are no longer kept. s.mu is held.
func (s *sessionLog) since(afterSeq uint64) []json.RawMessage {
	oldest := s.oldest()
	if afterSeq+1 < oldest {
		return nil
	}
	if afterSeq >= s.seq {
		return []json.RawMessage{}
	}
	skip := int(afterSeq + 1 - oldest)
	events := make([]json.RawMessage, 0, s.n-skip)
	for i := skip; i < s.n; i++ {
		events = append(events, s.ring[(s.head+i)%len(s.ring)])
	}
	return events
}

func (b *Broker) replay(ctx context.Context, from transport.Caller, params json.RawMessage) (any, *wire.Error) {
	var p wire.ReplayParams
	shapeErr := wire.DecodeParams(params, &p)
	if claimsOtherSession(from, params) {
		return nil, wire.ErrUnauthorized.Withf("replay of another session than the caller's")
	}
	if shapeErr != nil {
		return nil, shapeErr
	}
	if err := wire.ValidateID("contextId", p.ContextID); err != nil {
		return nil, wire.ErrInvalidParams.Withf("%v", err)
	}
	if p.Epoch == nil {
		return nil, wire.ErrInvalidParams.Withf(`epoch: required (send "" when none is known)`)
	}
	if p.AfterSeq == nil {
		return nil, wire.ErrInvalidParams.Withf("afterSeq: required")
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
	if *p.Epoch != b.epoch {
		return nil, gap("the epoch is not the current one")
	}
	if s == nil || *p.AfterSeq >= res.LastSeq {
		// Nothing after it: no events (also for an afterSeq beyond the
		// last, which lastSeq lets the caller see).
		return res, nil
	}
	events := s.since(*p.AfterSeq)
	if events == nil {
		return nil, gap("the events after that seq are no longer kept")
	}
	res.Events = events
	return res, nil
}
