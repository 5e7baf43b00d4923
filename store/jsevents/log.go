package jsevents

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/a2a-bus/a2a-bus/natsbus"
)

// Defaults of Config.
const (
	// DefaultStream is the stream's name when Config.Stream is empty.
	DefaultStream = "A2A_EVENTS"
	// DefaultPrefix is the subject prefix when Config.Prefix is empty.
	DefaultPrefix = "a2a.log"
	// DefaultWindow is how many notifications are kept per session when
	// Config.Window is zero, the broker's default replay window.
	DefaultWindow = 10000
)

// HeaderSeq is the header that carries a notification's seq (decimal), on
// the stored message and on the republished one; the body carries the
// same seq.
const HeaderSeq = "A2a-Seq"

// MetadataEpoch is the stream metadata key that holds the log's epoch.
const MetadataEpoch = "a2a-bus.epoch"

// Named errors.
var (
	// ErrClosed is returned by every method of a Log after Close, and by
	// a call under way when Close cuts its retries short.
	ErrClosed = errors.New("jsevents: log closed")
	// ErrGap is returned by Since when notifications after afterSeq are no
	// longer kept (evicted by the window, purged by the bytes bound, or
	// dropped by Forget).
	ErrGap = errors.New("jsevents: the notifications after that seq are no longer kept")
	// ErrMaybeStored wraps the error of an Append that gave up after an
	// attempt whose answer it never got: the notification may have been
	// stored (and published) under a seq Append could not learn.
	ErrMaybeStored = errors.New("jsevents: the notification may have been stored")
	// ErrIncompatible is returned by Open when the stream exists with a
	// configuration other than the one asked for (another window, replica
	// count, subjects or limits).
	ErrIncompatible = errors.New("jsevents: the stream exists with another configuration")
)

// Config says which stream holds the log and how. Its zero value is the
// defaults on a single server.
type Config struct {
	// Stream is the stream's name; "" is DefaultStream.
	Stream string
	// Prefix is the subject prefix the stream captures (<prefix>.*.*);
	// "" is DefaultPrefix. It must not overlap another stream's subjects.
	Prefix string
	// Replicas is the stream's replica count; 0 is 1. A cluster should
	// use 3: an acknowledged Append then survives the loss of one server.
	Replicas int
	// Window is how many notifications are kept per session, the oldest
	// dropped first (the stream's MaxMsgsPerSubject); 0 is DefaultWindow.
	// There is no age limit: see the package documentation.
	Window int
	// MaxBytes bounds the body bytes of a session's notifications that
	// this Log appended and that are kept: past it, the Log purges the
	// session's oldest notifications (whoever appended them), never its
	// last. 0 is no bound. Each Log bounds its own appends, so a session
	// keeps at most MaxBytes per Log that appends to it: see the package
	// documentation.
	MaxBytes int
}

func (c Config) withDefaults() (Config, error) {
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	switch {
	case c.Replicas < 1 || c.Replicas > 5:
		return c, fmt.Errorf("jsevents: replicas %d: must be 1 to 5", c.Replicas)
	case c.Window < 1:
		return c, fmt.Errorf("jsevents: window %d: must be at least 1", c.Window)
	case c.MaxBytes < 0:
		return c, fmt.Errorf("jsevents: max bytes %d: must not be negative", c.MaxBytes)
	case !validPrefix(c.Prefix):
		return c, fmt.Errorf("jsevents: prefix %q: not a literal subject", c.Prefix)
	}
	return c, nil
}

func validPrefix(p string) bool {
	if p == "" || p[0] == '.' || p[len(p)-1] == '.' {
		return false
	}
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '*' || c == '>' || c <= ' ' || c == 0x7f:
			return false
		case c == '.' && p[i-1] == '.':
			return false
		}
	}
	return true
}

// streamConfig is the stream a Log with c wants.
func (c Config) streamConfig(epoch string) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              c.Stream,
		Description:       "a2a-bus: each session's notifications, numbered per session",
		Subjects:          []string{c.Prefix + ".*.*"},
		Retention:         jetstream.LimitsPolicy,
		MaxMsgs:           -1,
		MaxBytes:          -1,
		MaxMsgsPerSubject: int64(c.Window),
		Discard:           jetstream.DiscardOld,
		Storage:           jetstream.FileStorage,
		Replicas:          c.Replicas,
		Duplicates:        dedupWindow,
		AllowDirect:       true,
		RePublish: &jetstream.RePublish{
			Source:      c.Prefix + ".*." + kindEvent,
			Destination: natsbus.EventsPrefix + "{{wildcard(1)}}" + natsbus.EventsSuffix,
		},
		Metadata: map[string]string{MetadataEpoch: epoch},
	}
}

// compatible reports how have differs from what a Log needs of want, nil
// when it does not.
func compatible(have, want jetstream.StreamConfig) error {
	var diffs []string
	if !slices.Equal(have.Subjects, want.Subjects) {
		diffs = append(diffs, fmt.Sprintf("subjects %q, want %q", have.Subjects, want.Subjects))
	}
	if have.RePublish == nil || *have.RePublish != *want.RePublish {
		diffs = append(diffs, fmt.Sprintf("republish %+v, want %+v", have.RePublish, *want.RePublish))
	}
	if have.MaxMsgsPerSubject != want.MaxMsgsPerSubject {
		diffs = append(diffs, fmt.Sprintf("window (max msgs per subject) %d, want %d", have.MaxMsgsPerSubject, want.MaxMsgsPerSubject))
	}
	if have.Replicas != want.Replicas {
		diffs = append(diffs, fmt.Sprintf("replicas %d, want %d", have.Replicas, want.Replicas))
	}
	if have.MaxAge != 0 || have.MaxMsgs > 0 || have.MaxBytes > 0 || have.Discard != jetstream.DiscardOld || have.Retention != jetstream.LimitsPolicy {
		diffs = append(diffs, "limits other than the per-subject one, which could drop a session's last seq")
	}
	if !have.AllowDirect || have.DenyPurge || have.Sealed {
		diffs = append(diffs, "direct get off, purge denied or sealed")
	}
	if have.Metadata[MetadataEpoch] == "" {
		diffs = append(diffs, "no epoch in its metadata")
	}
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: stream %s: %v", ErrIncompatible, want.Name, diffs)
}

// The two kinds of message of a session: its notifications, and the
// marker Forget leaves.
const (
	kindEvent  = "e"
	kindMarker = "m"
)

// Timing of the retries.
const (
	// attemptTimeout bounds one request to the stream; a request to a
	// leader that died gets no answer at all.
	attemptTimeout = 3 * time.Second
	// dedupWindow is the stream's duplicate window: how long a Nats-Msg-Id
	// is remembered.
	dedupWindow = 2 * time.Minute
	// maxAppend bounds an Append's retries, well inside dedupWindow, so
	// that a retry of an attempt that was stored is always recognised.
	maxAppend = time.Minute
	// Backoff between retries, doubled after each up to maxBackoff.
	minBackoff = 5 * time.Millisecond
	maxBackoff = 500 * time.Millisecond
)

// Log is the per-session notification log on one JetStream stream. Its
// methods are safe for concurrent use, by many goroutines and by many Logs
// on as many connections (brokers) over the same stream.
type Log struct {
	nc     *nats.Conn
	stream jetstream.Stream
	cfg    Config
	epoch  string
	// The JetStream API subjects of the stream's leader get and direct get.
	getSubj, directSubj string

	seed   maphash.Seed
	shards [numShards]shard

	stats struct {
		appends, conflicts, retries, unanswered, duplicates atomic.Uint64
		purges, purgeErrors                                 atomic.Uint64
	}

	done      chan struct{}
	closeOnce sync.Once
}

// Open opens the log on nc, creating its stream if it does not exist. It
// retries while JetStream is not ready (no meta leader yet) until ctx
// ends. A stream that exists with another configuration is
// ErrIncompatible: change it with the nats tool, or delete it (a new
// epoch), rather than have brokers disagree. The Log does not own nc.
func Open(ctx context.Context, nc *nats.Conn, cfg Config) (*Log, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jsevents: %w", err)
	}
	var b [16]byte
	_, _ = crand.Read(b[:])
	want := cfg.streamConfig(hex.EncodeToString(b[:]))
	var st jetstream.Stream
	backoff := minBackoff
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		st, err = js.CreateStream(actx, want)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			st, err = js.Stream(actx, cfg.Stream)
		}
		cancel()
		// Another Log's create of the stream, made at the same time, may
		// have taken the name and not yet made the stream: not found,
		// for a moment. A cluster just started may not yet have heard
		// from enough nodes to place the replicas: no peers, for a
		// moment.
		if err == nil || !(transient(err) || errors.Is(err, jetstream.ErrStreamNotFound) || noPeers(err)) || ctx.Err() != nil {
			break
		}
		if err := sleep(ctx, nil, &backoff); err != nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("jsevents: open stream %s: %w", cfg.Stream, err)
	}
	have := st.CachedInfo().Config
	if err := compatible(have, want); err != nil {
		return nil, err
	}
	l := &Log{
		nc:         nc,
		stream:     st,
		cfg:        cfg,
		epoch:      have.Metadata[MetadataEpoch],
		getSubj:    "$JS.API.STREAM.MSG.GET." + cfg.Stream,
		directSubj: "$JS.API.DIRECT.GET." + cfg.Stream,
		seed:       maphash.MakeSeed(),
		done:       make(chan struct{}),
	}
	for i := range l.shards {
		sh := &l.shards[i]
		sh.m = map[string]*session{}
		sh.idle.idlePrev, sh.idle.idleNext = &sh.idle, &sh.idle
	}
	return l, nil
}

// Stats counts what a Log's appends met since Open.
type Stats struct {
	// Appends is how many Appends succeeded.
	Appends uint64
	// Conflicts is how many attempts the stream refused because another
	// Log had numbered a notification of the session first.
	Conflicts uint64
	// Retries is how many attempts found no stream leader or a busy one.
	Retries uint64
	// Unanswered is how many attempts got no answer (timed out).
	Unanswered uint64
	// Duplicates is how many attempts were recognised as a repeat of an
	// unanswered one that had been stored.
	Duplicates uint64
	// Purges is how many times a session's oldest notifications were
	// purged to keep it within Config.MaxBytes.
	Purges uint64
	// PurgeErrors is how many of those purges failed; the session's next
	// Append tries again.
	PurgeErrors uint64
}

// Stats returns the counts so far.
func (l *Log) Stats() Stats {
	return Stats{
		Appends:     l.stats.appends.Load(),
		Conflicts:   l.stats.conflicts.Load(),
		Retries:     l.stats.retries.Load(),
		Unanswered:  l.stats.unanswered.Load(),
		Duplicates:  l.stats.duplicates.Load(),
		Purges:      l.stats.purges.Load(),
		PurgeErrors: l.stats.purgeErrors.Load(),
	}
}

// Epoch names the stream's numbering: 32 hex digits chosen when the
// stream was created, the same for every Log on it. A session's seq
// counts within it.
func (l *Log) Epoch() string { return l.epoch }

// Close stops the Log: calls under way stop retrying and later ones
// return ErrClosed. It does not close the connection. It is idempotent.
func (l *Log) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return nil
}

func (l *Log) closed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// subjects of one session.
type subjects struct {
	event, marker, all string
}

func (l *Log) subjects(session string) (subjects, error) {
	if session == "" {
		return subjects{}, errors.New("jsevents: empty session id")
	}
	base := l.cfg.Prefix + "." + natsbus.SubjectToken(session) + "."
	return subjects{event: base + kindEvent, marker: base + kindMarker, all: base + "*"}, nil
}

// Append numbers one notification to session and stores it; the stream
// then publishes it on the session's event subject. build makes the
// notification's body for a seq; it may be called more than once (once
// per attempt, when other brokers number the session's notifications at
// the same time), and only the body of the last call is stored. An error
// from build ends Append with it (wrapped); that attempt stores nothing.
//
// Append returns the seq the notification got: one more than the
// session's last, whichever Log numbered that one. An error other than
// build's or ErrClosed before any attempt wraps ErrMaybeStored when an
// attempt went unanswered: the notification may then be stored, and
// published, under a seq Append could not learn. Append retries for at
// most a minute, less if ctx ends first.
func (l *Log) Append(ctx context.Context, session string, build func(seq uint64) ([]byte, error)) (uint64, error) {
	subj, err := l.subjects(session)
	if err != nil {
		return 0, err
	}
	if l.closed() {
		return 0, ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, maxAppend)
	defer cancel()
	s := l.acquire(session)
	defer l.release(session, s)

	id := nuid.Next()
	maybe := false // an attempt went unanswered
	fail := func(err error) (uint64, error) {
		if maybe {
			err = fmt.Errorf("%w: %w", ErrMaybeStored, err)
		}
		return 0, fmt.Errorf("jsevents: append to session %q: %w", session, err)
	}
	backoff := minBackoff
	for {
		if !s.known {
			last, _, err := l.lastOf(ctx, subj.all)
			if err != nil {
				return fail(err)
			}
			s.known, s.seq, s.sseq = true, last.seq, last.sseq
		}
		seq := s.seq + 1
		body, err := build(seq)
		if err != nil {
			return fail(fmt.Errorf("build notification %d: %w", seq, err))
		}
		m := nats.NewMsg(subj.event)
		m.Data = body
		m.Header.Set(HeaderSeq, strconv.FormatUint(seq, 10))
		m.Header.Set(jetstream.MsgIDHeader, id)
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(s.sseq, 10))
		m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, subj.all)
		ack, err := l.publish(ctx, m)
		if err == nil {
			if ack.Duplicate {
				// An earlier attempt that went unanswered was stored: its
				// seq is in its header.
				l.stats.duplicates.Add(1)
				s.known = false
				got, err := l.getSeq(ctx, ack.Seq)
				if err != nil {
					return fail(fmt.Errorf("stored at stream sequence %d, not read back: %w", ack.Seq, err))
				}
				l.stats.appends.Add(1)
				l.count(ctx, s, subj.event, ack.Seq, len(got.data))
				return got.seq, nil
			}
			s.seq, s.sseq = seq, ack.Seq
			l.stats.appends.Add(1)
			l.count(ctx, s, subj.event, ack.Seq, len(body))
			return seq, nil
		}
		if errors.Is(err, errUnanswered) {
			maybe = true
		}
		switch classify(err) {
		case conflict:
			// Another broker numbered one first: read again, at once
			// when the last seq was stale, after a pause when a write
			// was in flight (10164), which would only be refused again.
			l.stats.conflicts.Add(1)
			s.known = false
			if code(err) != jetstream.JSErrCodeStreamWrongLastSequenceConstant {
				backoff = minBackoff
				continue
			}
		case uncertain:
			l.stats.unanswered.Add(1)
			maybe = true
			s.known = false
		case retry, pending:
			l.stats.retries.Add(1)
		default:
			return fail(err)
		}
		if err := sleep(ctx, l.done, &backoff); err != nil {
			return fail(err)
		}
	}
}

// Last returns the seq of session's latest notification (0 when it never
// had one), kept or forgotten.
func (l *Log) Last(ctx context.Context, session string) (uint64, error) {
	subj, err := l.subjects(session)
	if err != nil {
		return 0, err
	}
	if l.closed() {
		return 0, ErrClosed
	}
	last, _, err := l.lastOf(ctx, subj.all)
	if err != nil {
		return 0, fmt.Errorf("jsevents: last seq of session %q: %w", session, err)
	}
	return last.seq, nil
}

// maxBatch bounds the notifications asked for in one direct get.
const maxBatch = 1024

// Since returns session's kept notifications after seq afterSeq, in seq
// order and byte for byte as appended: the first whatever its size, then
// as many as fit maxBytes counting each one's length plus one (a replay
// page). It also returns oldest, the seq of the oldest kept notification
// (last+1 when none is kept), and last, the session's latest seq, both as
// the stream's leader saw them when Since began; notifications appended
// since are not returned. An afterSeq at or beyond last returns none. An
// afterSeq before oldest-1 is ErrGap (wrapped), with oldest and last set.
func (l *Log) Since(ctx context.Context, session string, afterSeq uint64, maxBytes int) (events []json.RawMessage, oldest, last uint64, err error) {
	subj, err := l.subjects(session)
	if err != nil {
		return nil, 0, 0, err
	}
	if l.closed() {
		return nil, 0, 0, ErrClosed
	}
	// A Forget or an eviction between the reads below can leave them out
	// of step; Since then starts again.
	for range 5 {
		events, oldest, last, err = l.since(ctx, subj, afterSeq, maxBytes)
		if !errors.Is(err, errMoved) {
			break
		}
	}
	if err != nil {
		err = fmt.Errorf("jsevents: notifications of session %q after %d: %w", session, afterSeq, err)
	}
	return events, oldest, last, err
}

// errMoved: the session's notifications changed under a read.
var errMoved = errors.New("the session's notifications changed during the read; try again")

func (l *Log) since(ctx context.Context, subj subjects, afterSeq uint64, maxBytes int) ([]json.RawMessage, uint64, uint64, error) {
	lastMsg, found, err := l.lastOf(ctx, subj.all)
	if err != nil {
		return nil, 0, 0, err
	}
	if !found {
		return []json.RawMessage{}, 1, 0, nil
	}
	last := lastMsg.seq
	first, found, err := l.leaderGet(ctx, msgGetRequest{NextFor: subj.event})
	if err != nil {
		return nil, 0, 0, err
	}
	oldest := last + 1
	if found {
		oldest = first.seq
	}
	if afterSeq >= last {
		return []json.RawMessage{}, oldest, last, nil
	}
	if afterSeq+1 < oldest {
		return nil, oldest, last, ErrGap
	}
	want := afterSeq + 1
	at, err := l.locate(ctx, subj.event, want, first, lastMsg)
	if err != nil {
		return nil, oldest, last, err
	}
	events := []json.RawMessage{}
	size := 0
	for want <= last {
		n := min(last-want+1, maxBatch)
		// Ask the server for a little more than the page: it counts
		// subjects and headers too.
		msgs, derr := l.direct(ctx, directRequest{Seq: at, NextFor: subj.event, Batch: int(n), MaxBytes: max(maxBytes-size, 0) + int(n)*256})
		if derr != nil || len(msgs) == 0 || msgs[0].seq != want {
			// A replica behind the leader, or none that answers:
			// take the next one from the leader.
			m, found, err := l.leaderGet(ctx, msgGetRequest{Seq: at, NextFor: subj.event})
			if err != nil {
				return nil, oldest, last, err
			}
			msgs = msgs[:0]
			if found {
				msgs = append(msgs, m)
			}
		}
		if len(msgs) == 0 || msgs[0].seq != want {
			// Dropped under us (Forget, or the window moved on).
			return nil, oldest, last, errMoved
		}
		for _, m := range msgs {
			if m.seq != want {
				break
			}
			if size += len(m.data) + 1; size > maxBytes && len(events) > 0 {
				return events, oldest, last, nil
			}
			events = append(events, m.data)
			want++
			at = m.sseq + 1
			if want > last {
				break
			}
		}
	}
	return events, oldest, last, nil
}

// locate returns the stream sequence of the session's notification
// numbered want, given its first kept notification and its last message.
// A session's notifications have dense seqs and increasing stream
// sequences, so notification want lies between first.sseq+(want-first.seq)
// and last.sseq-(last.seq-want): it is found by probing that range with
// leader gets, the first probe at the low end (exact when no other session
// wrote in between), then by halving.
func (l *Log) locate(ctx context.Context, subject string, want uint64, first, last stored) (uint64, error) {
	if want == first.seq {
		return first.sseq, nil
	}
	if last.seq < want || last.seq-want >= last.sseq {
		return 0, errMoved // reads out of step
	}
	lo := first.sseq + (want - first.seq)
	hi := last.sseq - (last.seq - want)
	probe := lo
	for lo <= hi {
		m, found, err := l.leaderGet(ctx, msgGetRequest{Seq: probe, NextFor: subject})
		if err != nil {
			return 0, err
		}
		switch {
		case !found:
			hi = probe - 1
		case m.seq == want:
			return m.sseq, nil
		case m.seq < want:
			lo = max(lo, m.sseq+(want-m.seq))
		default:
			// The first notification at or after probe comes after
			// want: want is before probe.
			hi = min(hi, probe-1)
			if d := m.seq - want; m.sseq > d {
				hi = min(hi, m.sseq-d)
			}
		}
		probe = lo + (hi-lo)/2
	}
	return 0, errMoved
}

// Forget drops session's kept notifications but not its seq: the next
// Append numbers on from the last one, so a runtime still following the
// session never takes a new notification for an old one. Notifications
// appended while Forget runs may be kept. Forgetting a session with no
// notifications does nothing; forgetting twice is harmless.
func (l *Log) Forget(ctx context.Context, session string) error {
	subj, err := l.subjects(session)
	if err != nil {
		return err
	}
	if l.closed() {
		return ErrClosed
	}
	s := l.acquire(session)
	defer l.release(session, s)
	fail := func(err error) error {
		return fmt.Errorf("jsevents: forget session %q: %w", session, err)
	}
	id := nuid.Next()
	backoff := minBackoff
	for {
		last, found, err := l.lastOf(ctx, subj.all)
		if err != nil {
			return fail(err)
		}
		if !found {
			return nil
		}
		marker := last.sseq
		if last.subject != subj.marker {
			// Leave the last seq in a marker first, so that it outlives
			// the purge whatever happens after.
			m := nats.NewMsg(subj.marker)
			m.Header.Set(HeaderSeq, strconv.FormatUint(last.seq, 10))
			m.Header.Set(jetstream.MsgIDHeader, id)
			m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(last.sseq, 10))
			m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, subj.all)
			ack, err := l.publish(ctx, m)
			if err != nil {
				switch classify(err) {
				case conflict, uncertain, retry, pending:
					s.known = false
					if err := sleep(ctx, l.done, &backoff); err != nil {
						return fail(err)
					}
					continue
				default:
					return fail(err)
				}
			}
			marker = ack.Seq
		}
		// Everything of the session before the marker: its notifications
		// and older markers.
		if _, err := l.purge(ctx, subj.all, marker); err != nil {
			return fail(fmt.Errorf("the seq is kept, the notifications not dropped: %w", err))
		}
		s.known, s.seq, s.sseq = true, last.seq, marker
		s.uncount()
		return nil
	}
}

func (l *Log) purge(ctx context.Context, filter string, before uint64) (struct{}, error) {
	backoff := minBackoff
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		err := l.stream.Purge(actx, jetstream.WithPurgeSubject(filter), jetstream.WithPurgeSequence(before))
		cancel()
		if err == nil || !transient(err) {
			return struct{}{}, err
		}
		if err := sleep(ctx, l.done, &backoff); err != nil {
			return struct{}{}, err
		}
	}
}

// pubAck is JetStream's answer to a publish.
type pubAck struct {
	Stream    string              `json:"stream"`
	Seq       uint64              `json:"seq"`
	Duplicate bool                `json:"duplicate,omitempty"`
	Error     *jetstream.APIError `json:"error,omitempty"`
}

// publish sends m to the stream and waits for its answer, once.
func (l *Log) publish(ctx context.Context, m *nats.Msg) (pubAck, error) {
	actx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	resp, err := l.nc.RequestMsgWithContext(actx, m)
	if err != nil {
		if ctx.Err() != nil {
			// The caller's deadline, not the attempt's.
			return pubAck{}, errors.Join(ctx.Err(), errUnanswered)
		}
		return pubAck{}, err
	}
	var ack pubAck
	if err := json.Unmarshal(resp.Data, &ack); err != nil {
		return pubAck{}, fmt.Errorf("unreadable publish ack %q: %w", resp.Data, err)
	}
	if ack.Error != nil {
		return pubAck{}, ack.Error
	}
	if ack.Stream == "" || ack.Seq == 0 {
		return pubAck{}, fmt.Errorf("publish ack without stream or sequence: %q", resp.Data)
	}
	return ack, nil
}

// errUnanswered marks a publish cut short by the caller's context.
var errUnanswered = errors.New("publish unanswered")

// What to do after an error.
type outcome int

const (
	fatal     outcome = iota
	conflict          // the compare-and-set failed: read again
	retry             // nothing was stored: try again
	uncertain         // no answer: it may have been stored
	pending           // the same Nats-Msg-Id is being stored: ask again
)

func code(err error) jetstream.ErrorCode {
	var api *jetstream.APIError
	if errors.As(err, &api) {
		return api.ErrorCode
	}
	return 0
}

func classify(err error) outcome {
	var api *jetstream.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode {
		case jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant:
			return conflict
		case 10158: // duplicate message id is in process
			return pending
		}
		if api.Code == 503 {
			// No leader, cluster busy, a new leader not ready for
			// expected-sequence checks (10163), ...
			return retry
		}
		return fatal
	}
	switch {
	case errors.Is(err, errUnanswered):
		return fatal
	case errors.Is(err, nats.ErrNoResponders):
		return retry
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return uncertain
	}
	return fatal
}

// noPeers reports whether err is JetStream's "no suitable peers for
// placement": fewer servers known than the stream's replicas.
func noPeers(err error) bool {
	var a *jetstream.APIError
	return errors.As(err, &a) && a.ErrorCode == 10005
}

// transient reports whether a read or an admin request may succeed if
// asked again.
func transient(err error) bool {
	switch classify(err) {
	case retry, uncertain, pending:
		return true
	}
	return false
}

// sleep waits the backoff, drawn between half and all of it, and doubles
// it; it returns early with ctx's error or ErrClosed when done closes.
func sleep(ctx context.Context, done <-chan struct{}, backoff *time.Duration) error {
	d := *backoff/2 + rand.N(*backoff/2+1)
	*backoff = min(2**backoff, maxBackoff)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-done:
		return ErrClosed
	case <-t.C:
		return nil
	}
}

// Per-session state of one Log: a lock so that its own appends to a
// session take turns (racing each other's compare-and-set would only make
// them retry), the session's last seq and stream sequence as last seen,
// so that an Append needs no read while no other Log wrote, and the bytes
// it appended there (Config.MaxBytes).
const (
	numShards = 64
	// maxIdle bounds the sessions remembered while no call uses them:
	// beyond it, the one used least recently is forgotten (its last seq
	// read again on its next Append, its bytes counted from zero). Each
	// shard keeps maxIdle/numShards.
	maxIdle = 4096
)

type shard struct {
	mu sync.Mutex
	m  map[string]*session
	// idle lists the sessions no call uses, least recently used first.
	idle session
}

type session struct {
	id string
	// Under the shard's mu: the calls using the session, and its place
	// in the shard's idle list while there are none.
	refs               int
	idlePrev, idleNext *session

	// Held by the call that uses the fields below.
	mu    sync.Mutex
	known bool
	seq   uint64 // the session's last seq
	sseq  uint64 // the stream sequence of its last message
	// This Log's appends to the session still counted against
	// Config.MaxBytes, oldest first, and their bytes.
	tallies []tally
	bytes   int
}

func (l *Log) shard(id string) *shard {
	return &l.shards[maphash.String(l.seed, id)%numShards]
}

func (sh *shard) unlinkIdle(s *session) {
	s.idlePrev.idleNext, s.idleNext.idlePrev = s.idleNext, s.idlePrev
	s.idlePrev, s.idleNext = nil, nil
}

func (l *Log) acquire(id string) *session {
	sh := l.shard(id)
	sh.mu.Lock()
	s := sh.m[id]
	switch {
	case s == nil:
		s = &session{id: id}
		sh.m[id] = s
	case s.refs == 0:
		sh.unlinkIdle(s)
	}
	s.refs++
	sh.mu.Unlock()
	s.mu.Lock()
	return s
}

func (l *Log) release(id string, s *session) {
	s.mu.Unlock()
	sh := l.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if s.refs--; s.refs == 0 {
		s.idlePrev, s.idleNext = sh.idle.idlePrev, &sh.idle
		s.idlePrev.idleNext, sh.idle.idlePrev = s, s
	}
	// Over the bound: forget the idle ones used least recently.
	for len(sh.m) > maxIdle/numShards && sh.idle.idleNext != &sh.idle {
		old := sh.idle.idleNext
		sh.unlinkIdle(old)
		delete(sh.m, old.id)
	}
}
