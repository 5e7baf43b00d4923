package jsevents_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/a2a-bus/a2a-bus/internal/natscluster"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/store/jsevents"
)

// appendBody appends a notification of session with id and pad (as body
// would make it, without its cost for a big pad) and returns its seq and
// size.
func appendBody(t testing.TB, l *jsevents.Log, session, id, pad string) (seq uint64, size int) {
	t.Helper()
	seq, err := l.Append(testContext(t), session, func(seq uint64) ([]byte, error) {
		b := fmt.Appendf(nil, `{"seq":%d,"id":%q,"pad":"`, seq, id)
		b = append(append(b, pad...), `"}`...)
		size = len(b)
		return b, nil
	})
	if err != nil {
		t.Fatalf("append %s to %q: %v", id, session, err)
	}
	return seq, size
}

// head decodes the seq and id of a notification appendBody made, without
// reading its pad.
func head(t testing.TB, b []byte) event {
	t.Helper()
	var e event
	dec := json.NewDecoder(bytes.NewReader(b))
	tok := func() json.Token {
		tk, err := dec.Token()
		if err != nil {
			t.Fatalf("notification %.80q: %v", b, err)
		}
		return tk
	}
	if tok() != json.Delim('{') || tok() != "seq" {
		t.Fatalf("notification %.80q: no seq first", b)
	}
	if err := dec.Decode(&e.Seq); err != nil || tok() != "id" || dec.Decode(&e.ID) != nil {
		t.Fatalf("notification %.80q: no seq and id", b)
	}
	return e
}

// kept reads back every kept notification of session, checks that their
// seqs run from oldest to last, and returns them decoded with their
// total size. A replay from the start must get the gap when the oldest
// is not 1, and only then.
func kept(t testing.TB, l *jsevents.Log, session string) (events []event, size int, oldest, last uint64) {
	t.Helper()
	_, oldest, last, err := l.Since(testContext(t), session, 0, 1<<20)
	if gap := errors.Is(err, jsevents.ErrGap); (err != nil && !gap) || gap != (oldest > 1) {
		t.Fatalf("session %q: since 0: oldest %d, %v", session, oldest, err)
	}
	// One page: a page ends before a notification over its bytes.
	raw, _, _, err := l.Since(testContext(t), session, oldest-1, 1<<30)
	if err != nil {
		t.Fatalf("session %q: since %d: %v", session, oldest-1, err)
	}
	for i, b := range raw {
		e := head(t, b)
		if e.Seq != oldest+uint64(i) {
			t.Fatalf("session %q: kept notification %d has seq %d, oldest %d", session, i, e.Seq, oldest)
		}
		events = append(events, e)
		size += len(b)
	}
	if uint64(len(events)) != last+1-oldest {
		t.Fatalf("session %q: %d kept, oldest %d, last %d", session, len(events), oldest, last)
	}
	return events, size, oldest, last
}

// storedOn returns how many messages the stream holds on the session's
// notification subject, and the stream's bytes (every session's, with
// subjects and headers).
func storedOn(t testing.TB, nc *nats.Conn, session string) (msgs, streamBytes uint64) {
	t.Helper()
	ctx := testContext(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, jsevents.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	subject := jsevents.DefaultPrefix + "." + natsbus.SubjectToken(session) + ".e"
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subject], info.State.Bytes
}

// A session flooded with notifications of nearly 1 MiB keeps the newest
// that fit MaxBytes, as on one host: the stream holds no more, a replay
// from the start gets the gap, the seq goes on, and other sessions keep
// theirs. Without the purge, the stream would hold all eight.
func TestMaxBytesBoundsAFloodedSessionAndItsSeqGoesOn(t *testing.T) {
	const limit = 2 << 20
	url := startServer(t)
	if _, err := jsevents.Open(testContext(t), connect(t, url), jsevents.Config{MaxBytes: -1}); err == nil {
		t.Fatal("a negative MaxBytes was accepted")
	}
	nc := connect(t, url)
	l := open(t, nc, jsevents.Config{MaxBytes: limit})
	pad := strings.Repeat("p", 900<<10)

	appendID(t, l, "calm", "c1")
	var size int
	for i := range 8 {
		var seq uint64
		seq, size = appendBody(t, l, "flood", fmt.Sprint("f", i+1), pad)
		if seq != uint64(i+1) {
			t.Fatalf("append %d got seq %d", i+1, seq)
		}
	}
	appendID(t, l, "calm", "c2")

	fit := limit / size
	events, bytes, oldest, last := kept(t, l, "flood")
	if last != 8 || len(events) != fit || oldest != uint64(8-fit+1) || bytes > limit {
		t.Fatalf("flood: %d kept (%d bytes), oldest %d, last %d; want the newest %d (%d bytes each) within %d bytes",
			len(events), bytes, oldest, last, fit, size, limit)
	}
	msgs, streamBytes := storedOn(t, nc, "flood")
	if msgs != uint64(fit) || streamBytes > limit+64<<10 {
		t.Fatalf("stream: %d messages on the flood's subject, %d bytes in all; want %d and at most about %d",
			msgs, streamBytes, fit, limit)
	}
	if seq, _ := appendBody(t, l, "flood", "f9", pad); seq != 9 {
		t.Fatalf("append after the purges: seq %d, want 9", seq)
	}
	if msgs, _ := storedOn(t, nc, "flood"); msgs != uint64(fit) {
		t.Fatalf("after one more: %d messages on the flood's subject, want %d", msgs, fit)
	}
	if events, _, oldest, last := kept(t, l, "calm"); len(events) != 2 || oldest != 1 || last != 2 {
		t.Fatalf("calm session: %d kept, oldest %d, last %d; want both", len(events), oldest, last)
	}
	if st := l.Stats(); st.Purges != uint64(9-fit) || st.PurgeErrors != 0 {
		t.Fatalf("stats: %+v; want %d purges", st, 9-fit)
	}
}

// Two Logs (two brokers) appending in turn to one session each keep what
// they appended within MaxBytes; the newest of each is kept, and the
// session holds at most twice MaxBytes.
func TestTwoLogsOnOneSessionEachBoundTheirOwn(t *testing.T) {
	const limit = 512 << 10
	url := startServer(t)
	logs := map[string]*jsevents.Log{
		"a": open(t, connect(t, url), jsevents.Config{MaxBytes: limit}),
		"b": open(t, connect(t, url), jsevents.Config{MaxBytes: limit}),
	}
	pad := strings.Repeat("p", 150<<10)
	var seq uint64
	var size int
	for round := range 10 {
		for _, name := range []string{"a", "b"} {
			var got uint64
			got, size = appendBody(t, logs[name], "shared", fmt.Sprintf("%s%02d", name, round), pad)
			if seq++; got != seq {
				t.Fatalf("%s's append in round %d: seq %d, want %d", name, round, got, seq)
			}
		}
	}
	events, total, _, last := kept(t, logs["a"], "shared")
	count, bytes := map[string]int{}, map[string]int{}
	for _, e := range events {
		count[e.ID[:1]]++
		bytes[e.ID[:1]] += size
	}
	fit := limit / size
	t.Logf("kept %d bytes: %v", total, count)
	switch {
	case last != seq || events[len(events)-1].ID != "b09":
		t.Fatalf("the last notification (%d, b09) is not kept: last %d, newest kept %+v", seq, last, events[len(events)-1].ID)
	case bytes["a"] > limit || bytes["b"] > limit || total > 2*limit:
		t.Fatalf("kept %d bytes of a's, %d of b's, %d in all; want each within %d", bytes["a"], bytes["b"], total, limit)
	case count["b"] != fit || count["a"] == 0:
		// b appended last: its newest that fit are kept, and a's newest.
		t.Fatalf("kept %v; want %d of b's and some of a's", count, fit)
	}
	for name, l := range logs {
		if st := l.Stats(); st.Purges == 0 || st.PurgeErrors != 0 {
			t.Fatalf("%s's stats: %+v", name, st)
		}
	}
}

// Notifications each larger than MaxBytes: whichever Log appends, the
// session's last one is kept (so the seq never starts again), and each
// Log keeps only its newest. After a Forget the Log counts from zero, and
// the seq goes on.
func TestTheLastNotificationIsNeverPurged(t *testing.T) {
	const limit = 1000
	s := runServer(t)
	nc := connect(t, s.ClientURL())
	a := open(t, nc, jsevents.Config{MaxBytes: limit})
	b := open(t, connect(t, s.ClientURL()), jsevents.Config{MaxBytes: limit})
	big := strings.Repeat("p", 3*limit)
	var seq uint64
	for i, name := range []string{"a", "a", "b", "a", "b", "b", "a"} {
		l := map[string]*jsevents.Log{"a": a, "b": b}[name]
		got, _ := appendBody(t, l, "s", fmt.Sprintf("%s%d", name, i), big)
		if seq++; got != seq {
			t.Fatalf("append %d by %s: seq %d, want %d", i, name, got, seq)
		}
		events, _, _, last := kept(t, a, "s")
		if last != seq || events[len(events)-1].Seq != seq {
			t.Fatalf("after append %d by %s: last %d, kept %+v", i, name, last, events)
		}
		count := map[string]int{}
		for _, e := range events {
			if count[e.ID[:1]]++; count[e.ID[:1]] > 1 {
				t.Fatalf("after append %d by %s: more than one of %s's kept: %+v", i, name, e.ID[:1], events)
			}
		}
	}
	if msgs, _ := storedOn(t, nc, "s"); msgs > 2 {
		t.Fatalf("%d messages on the session's subject", msgs)
	}

	// Forget: the seq is kept, and a counts from zero: notifications
	// that fit the bound together are all kept, with no purge.
	ctx := testContext(t)
	if err := a.Forget(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	purges := a.Stats().Purges
	small := strings.Repeat("p", 200)
	for i := range 3 {
		if got, _ := appendBody(t, a, "s", fmt.Sprint("small", i), small); got != seq+uint64(i)+1 {
			t.Fatalf("append %d after forget: seq %d, want %d", i, got, seq+uint64(i)+1)
		}
	}
	if events, bytes, oldest, last := kept(t, a, "s"); len(events) != 3 || oldest != seq+1 || bytes > limit {
		t.Fatalf("after forget: %d kept (%d bytes), oldest %d, last %d; want all 3 from %d", len(events), bytes, oldest, last, seq+1)
	}
	if st := a.Stats(); st.Purges != purges || st.PurgeErrors != 0 {
		t.Fatalf("purges after forget: %d, before %d (%+v)", st.Purges, purges, st)
	}
}

// A Log remembers the sessions it used last, IdlePerShard in each shard:
// a session used again is kept, the one used least recently goes.
func TestALogRemembersTheSessionsItUsedLast(t *testing.T) {
	s := runServer(t)
	l := open(t, connect(t, s.ClientURL()), jsevents.Config{MaxBytes: 1 << 20})
	shard := l.ShardOf("s0")
	var ids []string
	for i := 0; len(ids) < jsevents.IdlePerShard+1; i++ {
		if id := fmt.Sprint("s", i); l.ShardOf(id) == shard {
			ids = append(ids, id)
		}
	}
	for _, id := range ids[:jsevents.IdlePerShard] {
		appendID(t, l, id, "1")
	}
	if kept, n := l.Remembers(ids[0]); !kept || n != jsevents.IdlePerShard {
		t.Fatalf("after %d sessions: first remembered %v, %d in the shard", jsevents.IdlePerShard, kept, n)
	}
	appendID(t, l, ids[0], "2")
	appendID(t, l, ids[jsevents.IdlePerShard], "1")
	for i, want := range map[int]bool{0: true, 1: false, 2: true, jsevents.IdlePerShard: true} {
		if kept, n := l.Remembers(ids[i]); kept != want || n != jsevents.IdlePerShard {
			t.Errorf("session %d of the shard: remembered %v, want %v; %d in the shard", i, kept, want, n)
		}
	}
}

// startServer starts one nats-server process with JetStream (built
// without the race detector, so that big messages cost the tests little)
// and returns its URL. It is killed and waited for at the end.
func startServer(t testing.TB) string {
	t.Helper()
	return natscluster.Start(t, 1, natscluster.Options{}).URL(0)
}
