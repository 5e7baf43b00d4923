package jsevents_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/store/jsevents"
)

func TestAppendNumbersEachSessionDenselyAndPublishesWhatItStores(t *testing.T) {
	s := runServer(t)
	nc := connect(t, s.ClientURL())
	l := open(t, nc, jsevents.Config{})
	// A plain id, and one that needs the encoded subject token.
	sessions := []string{"chat-1", "chat.2 with spaces/é"}
	recs := map[string]*recorder{}
	for _, id := range sessions {
		recs[id] = record(t, nc, id)
	}
	for i := range 5 {
		for _, id := range sessions {
			if seq := appendID(t, l, id, fmt.Sprint(id, i)); seq != uint64(i+1) {
				t.Fatalf("session %q: append %d got seq %d", id, i, seq)
			}
		}
	}
	for _, id := range sessions {
		last, err := l.Last(testContext(t), id)
		if err != nil || last != 5 {
			t.Fatalf("session %q: last %d, %v; want 5", id, last, err)
		}
		stored, oldest, last := all(t, l, id, 0)
		if len(stored) != 5 || oldest != 1 || last != 5 {
			t.Fatalf("session %q: %d stored, oldest %d, last %d", id, len(stored), oldest, last)
		}
		for i, b := range stored {
			if e := decode(t, b); e.Seq != uint64(i+1) || e.ID != fmt.Sprint(id, i) {
				t.Fatalf("session %q: stored %d is %+v", id, i, e)
			}
		}
		got := recs[id].waitSeq(t, 5)
		if missed, repeated := checkLive(t, got, stored); missed != 0 || repeated != 0 || len(got) != 5 {
			t.Fatalf("session %q: live subscriber missed %d, repeated %d of %d", id, missed, repeated, len(got))
		}
	}
	if last, err := l.Last(testContext(t), "never-seen"); err != nil || last != 0 {
		t.Fatalf("last of an unknown session: %d, %v", last, err)
	}
}

func TestTheRepublishedMessageCarriesTheBodyAndTheSeq(t *testing.T) {
	s := runServer(t)
	nc := connect(t, s.ClientURL())
	l := open(t, nc, jsevents.Config{})
	rec := record(t, nc, "s")
	appendID(t, l, "s", "first")
	m := rec.waitSeq(t, 1)[0]
	if m.Subject != natsbus.EventsSubject("s") {
		t.Fatalf("subject %q", m.Subject)
	}
	if string(m.Data) != string(body(1, "first", "")) {
		t.Fatalf("body %s", m.Data)
	}
	for h, want := range map[string]string{
		jsevents.HeaderSeq:       "1",
		jetstream.StreamHeader:   jsevents.DefaultStream,
		jetstream.SubjectHeader:  jsevents.DefaultPrefix + ".s.e",
		jetstream.SequenceHeader: "1",
		"Nats-Last-Sequence":     "0",
	} {
		if got := m.Header.Get(h); got != want {
			t.Errorf("header %s: %q, want %q (all: %v)", h, got, want, m.Header)
		}
	}
}

func TestSinceReplaysPagesAndReportsTheWindow(t *testing.T) {
	s := runServer(t)
	nc := connect(t, s.ClientURL())
	l := open(t, nc, jsevents.Config{Window: 5})
	ctx := testContext(t)

	events, oldest, last, err := l.Since(ctx, "s", 0, 1<<20)
	if err != nil || len(events) != 0 || events == nil || oldest != 1 || last != 0 {
		t.Fatalf("empty session: %v, %d, %d, %v", events, oldest, last, err)
	}
	// Bodies of 100 bytes and more, seq 1..8: the window keeps 4..8.
	bodies := map[uint64][]byte{}
	for i := range 8 {
		seq, err := l.Append(ctx, "s", func(seq uint64) ([]byte, error) {
			b := body(seq, "x", strings.Repeat("p", 100+i))
			bodies[seq] = b
			return b, nil
		})
		if err != nil || seq != uint64(i+1) {
			t.Fatalf("append %d: %d, %v", i, seq, err)
		}
	}
	_, oldest, last, err = l.Since(ctx, "s", 0, 1<<20)
	if !errors.Is(err, jsevents.ErrGap) || oldest != 4 || last != 8 {
		t.Fatalf("since 0 past the window: oldest %d, last %d, %v; want ErrGap, 4, 8", oldest, last, err)
	}
	_, _, _, err = l.Since(ctx, "s", 2, 1<<20)
	if !errors.Is(err, jsevents.ErrGap) {
		t.Fatalf("since 2: %v, want ErrGap", err)
	}
	for after := uint64(3); after <= 10; after++ {
		events, oldest, last, err := l.Since(ctx, "s", after, 1<<20)
		if err != nil || oldest != 4 || last != 8 {
			t.Fatalf("since %d: oldest %d, last %d, %v", after, oldest, last, err)
		}
		want := max(0, 8-int(after))
		if len(events) != want {
			t.Fatalf("since %d: %d events, want %d", after, len(events), want)
		}
		for i, e := range events {
			if string(e) != string(bodies[after+1+uint64(i)]) {
				t.Fatalf("since %d, event %d: %s", after, i, e)
			}
		}
	}
	// Pages: each event counts its length plus one; the first comes
	// whatever its size.
	size := func(seq uint64) int { return len(bodies[seq]) + 1 }
	for _, tc := range []struct {
		maxBytes int
		want     int
	}{
		{0, 1},
		{size(4) - 1, 1},
		{size(4), 1},
		{size(4) + size(5) - 1, 1},
		{size(4) + size(5), 2},
		{size(4) + size(5) + size(6), 3},
		{1 << 20, 5},
	} {
		events, _, _, err := l.Since(ctx, "s", 3, tc.maxBytes)
		if err != nil || len(events) != tc.want {
			t.Errorf("since 3 with %d bytes: %d events, %v; want %d", tc.maxBytes, len(events), err, tc.want)
		}
	}
	// Paging through from 3 gets each once.
	var got []uint64
	for after := uint64(3); after < 8; {
		events, _, _, err := l.Since(ctx, "s", after, size(4)+size(5))
		if err != nil || len(events) == 0 {
			t.Fatalf("page after %d: %d, %v", after, len(events), err)
		}
		for _, e := range events {
			got = append(got, decode(t, e).Seq)
		}
		after += uint64(len(events))
	}
	if fmt.Sprint(got) != "[4 5 6 7 8]" {
		t.Fatalf("paged %v", got)
	}
}

// Since finds the first notification asked for among those of other
// sessions written in between, in any proportion.
func TestSinceFindsItsStartAmongOtherSessions(t *testing.T) {
	s := runServer(t)
	nc := connect(t, s.ClientURL())
	l := open(t, nc, jsevents.Config{Window: 40})
	r := rand.New(rand.NewPCG(1, 2))
	const n = 60
	for i := range n {
		appendID(t, l, "s", strconv.Itoa(i))
		for range r.IntN(6) {
			appendID(t, l, fmt.Sprint("other-", r.IntN(3)), "noise")
		}
	}
	for after := uint64(n - 40); after <= n; after++ {
		events, oldest, last, err := l.Since(testContext(t), "s", after, 1<<20)
		if err != nil || oldest != n-40+1 || last != n || len(events) != int(n-after) {
			t.Fatalf("since %d: %d events, oldest %d, last %d, %v", after, len(events), oldest, last, err)
		}
		for i, e := range events {
			if ev := decode(t, e); ev.Seq != after+1+uint64(i) || ev.ID != strconv.Itoa(int(ev.Seq-1)) {
				t.Fatalf("since %d, event %d: %+v", after, i, ev)
			}
		}
	}
}

func TestForgetDropsTheNotificationsButKeepsTheSeq(t *testing.T) {
	s := runServer(t)
	nc := connect(t, s.ClientURL())
	l := open(t, nc, jsevents.Config{})
	ctx := testContext(t)
	rec := record(t, nc, "s")

	if err := l.Forget(ctx, "s"); err != nil {
		t.Fatalf("forget a session with nothing: %v", err)
	}
	for i := range 3 {
		appendID(t, l, "s", strconv.Itoa(i))
	}
	appendID(t, l, "other", "kept")
	for range 2 {
		if err := l.Forget(ctx, "s"); err != nil {
			t.Fatal(err)
		}
		if last, err := l.Last(ctx, "s"); err != nil || last != 3 {
			t.Fatalf("last after forget: %d, %v", last, err)
		}
		_, oldest, last, err := l.Since(ctx, "s", 0, 1<<20)
		if !errors.Is(err, jsevents.ErrGap) || oldest != 4 || last != 3 {
			t.Fatalf("since 0 after forget: oldest %d, last %d, %v; want ErrGap, 4, 3", oldest, last, err)
		}
		if events, _, _, err := l.Since(ctx, "s", 3, 1<<20); err != nil || len(events) != 0 {
			t.Fatalf("since 3 after forget: %d, %v", len(events), err)
		}
	}
	// Another Log, which never saw the session, numbers on too.
	l2 := open(t, connect(t, s.ClientURL()), jsevents.Config{})
	if seq := appendID(t, l2, "s", "3"); seq != 4 {
		t.Fatalf("append after forget: seq %d, want 4", seq)
	}
	if seq := appendID(t, l, "s", "4"); seq != 5 {
		t.Fatalf("append after forget: seq %d, want 5", seq)
	}
	events, oldest, last := all(t, l, "s", 3)
	if len(events) != 2 || oldest != 4 || last != 5 {
		t.Fatalf("after forget and two appends: %d events, oldest %d, last %d", len(events), oldest, last)
	}
	// Other sessions keep theirs; the live subscriber got 1..5 and no
	// marker.
	if events, _, _ := all(t, l, "other", 0); len(events) != 1 {
		t.Fatalf("other session: %d events", len(events))
	}
	got := rec.waitSeq(t, 5)
	stored := [][]byte{body(1, "0", ""), body(2, "1", ""), body(3, "2", ""), events[0], events[1]}
	if missed, repeated := checkLive(t, got, stored); missed != 0 || repeated != 0 || len(got) != 5 {
		t.Fatalf("live subscriber: %d messages, missed %d, repeated %d", len(got), missed, repeated)
	}
}

// A Log that numbers from a stale last seq is refused by the stream, and
// the refused body reaches no subscriber: only what is stored is
// published.
func TestAStaleAppendIsRefusedAndNeverPublished(t *testing.T) {
	s := runServer(t)
	a := open(t, connect(t, s.ClientURL()), jsevents.Config{})
	b := open(t, connect(t, s.ClientURL()), jsevents.Config{})
	rec := record(t, connect(t, s.ClientURL()), "s")

	appendID(t, b, "s", "b1") // b now believes 1 is the last
	appendID(t, a, "s", "a2")
	appendID(t, a, "s", "a3")
	var built []string
	seq, err := b.Append(testContext(t), "s", func(seq uint64) ([]byte, error) {
		id := fmt.Sprintf("b-attempt-%d-seq-%d", len(built)+1, seq)
		built = append(built, id)
		return body(seq, id, ""), nil
	})
	if err != nil || seq != 4 {
		t.Fatalf("stale append: seq %d, %v; want 4", seq, err)
	}
	if len(built) != 2 || built[0] != "b-attempt-1-seq-2" {
		t.Fatalf("attempts %v: want a refused attempt numbered 2, then 4", built)
	}
	appendID(t, a, "s", "a5") // published after anything before it
	stored, _, _ := all(t, a, "s", 0)
	got := rec.waitSeq(t, 5)
	if missed, repeated := checkLive(t, got, stored); missed != 0 || repeated != 0 || len(got) != 5 {
		t.Fatalf("live subscriber: %d messages, missed %d, repeated %d", len(got), missed, repeated)
	}
	for _, m := range got {
		if strings.Contains(string(m.Data), "b-attempt-1") {
			t.Fatalf("the refused attempt was published: %s", m.Data)
		}
	}
}

func TestAnErrorFromBuildStoresNothingAndTakesNoSeq(t *testing.T) {
	s := runServer(t)
	l := open(t, connect(t, s.ClientURL()), jsevents.Config{})
	appendID(t, l, "s", "one")
	boom := errors.New("too large")
	if _, err := l.Append(testContext(t), "s", func(uint64) ([]byte, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("append with a failing build: %v", err)
	}
	if seq := appendID(t, l, "s", "two"); seq != 2 {
		t.Fatalf("next seq %d, want 2", seq)
	}
}

func TestOpenJoinsTheStreamAndRefusesAnotherShape(t *testing.T) {
	s := runServer(t)
	nc := connect(t, s.ClientURL())
	a := open(t, nc, jsevents.Config{Window: 7})
	b := open(t, connect(t, s.ClientURL()), jsevents.Config{Window: 7})
	if len(a.Epoch()) != 32 || a.Epoch() != b.Epoch() {
		t.Fatalf("epochs %q and %q: want one of 32 hex digits", a.Epoch(), b.Epoch())
	}
	if _, err := jsevents.Open(testContext(t), nc, jsevents.Config{Window: 8}); !errors.Is(err, jsevents.ErrIncompatible) {
		t.Fatalf("open with another window: %v", err)
	}
	for _, bad := range []jsevents.Config{{Window: -1}, {Replicas: 6}, {Prefix: "a.*"}, {Prefix: "a..b"}, {Prefix: "a b"}} {
		if _, err := jsevents.Open(testContext(t), nc, bad); err == nil {
			t.Errorf("open with %+v: no error", bad)
		}
	}
	// A deleted stream comes back with a new epoch.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(testContext(t), jsevents.DefaultStream); err != nil {
		t.Fatal(err)
	}
	// The server removes the old stream's files after it answers the
	// delete: a create in between can find them still there (10049).
	var c *jsevents.Log
	waitUntil(t, "the stream made again", func() bool {
		c, err = jsevents.Open(testContext(t), nc, jsevents.Config{Window: 7})
		var api *jetstream.APIError
		if errors.As(err, &api) && api.ErrorCode == 10049 {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		return true
	})
	t.Cleanup(func() { _ = c.Close() })
	if c.Epoch() == a.Epoch() || len(c.Epoch()) != 32 {
		t.Fatalf("epoch of a new stream %q, old %q", c.Epoch(), a.Epoch())
	}
}

func TestCloseIsIdempotentAndEndsEveryMethod(t *testing.T) {
	s := runServer(t)
	l := open(t, connect(t, s.ClientURL()), jsevents.Config{})
	appendID(t, l, "s", "x")
	for range 2 {
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	ctx := testContext(t)
	build := func(seq uint64) ([]byte, error) { return body(seq, "y", ""), nil }
	if _, err := l.Append(ctx, "s", build); !errors.Is(err, jsevents.ErrClosed) {
		t.Errorf("append: %v", err)
	}
	if _, _, _, err := l.Since(ctx, "s", 0, 1); !errors.Is(err, jsevents.ErrClosed) {
		t.Errorf("since: %v", err)
	}
	if _, err := l.Last(ctx, "s"); !errors.Is(err, jsevents.ErrClosed) {
		t.Errorf("last: %v", err)
	}
	if err := l.Forget(ctx, "s"); !errors.Is(err, jsevents.ErrClosed) {
		t.Errorf("forget: %v", err)
	}
}

// Many goroutines of one Log, and two Logs, append to a few sessions at
// once: each session's seqs are exactly 1..N, each notification has its
// own, and its subscriber gets them all in order.
func TestConcurrentAppendsOnOneServerStayDense(t *testing.T) {
	s := runServer(t)
	logs := []*jsevents.Log{
		open(t, connect(t, s.ClientURL()), jsevents.Config{}),
		open(t, connect(t, s.ClientURL()), jsevents.Config{}),
	}
	sessions := []string{"a", "b", "c"}
	recs := map[string]*recorder{}
	sub := connect(t, s.ClientURL())
	for _, id := range sessions {
		recs[id] = record(t, sub, id)
	}
	const perWriter = 25
	res := appendConcurrently(t, "w", logs, sessions, 4, perWriter, nil)
	for _, id := range sessions {
		checkDense(t, logs[0], id, res[id], recs[id], true)
	}
}

// appendConcurrently runs writers goroutines per Log per session, each
// appending n events with ids of its own (starting with tag), and returns per session the id
// each successful Append got its seq for. While running, after every
// append it calls tick (if not nil) with the count of successes so far.
// An Append that fails is allowed only with ErrMaybeStored, and only when
// failures are allowed (tick not nil); it is retried with a new id.
func appendConcurrently(t *testing.T, tag string, logs []*jsevents.Log, sessions []string, writers, n int, tick func(int64)) map[string]map[uint64]string {
	t.Helper()
	type result struct {
		session, id string
		seq         uint64
	}
	results := make(chan result, len(logs)*len(sessions)*writers*n)
	var ok atomic.Int64
	ctx := testContext(t)
	errs := make(chan error, len(logs)*len(sessions)*writers)
	for li, l := range logs {
		for _, session := range sessions {
			for w := range writers {
				go func() {
					for i := 0; i < n; {
						id := fmt.Sprintf("%s-log%d-w%d-%d", tag, li, w, i)
						seq, err := l.Append(ctx, session, func(seq uint64) ([]byte, error) {
							return body(seq, id, ""), nil
						})
						if err != nil {
							if tick == nil || !errors.Is(err, jsevents.ErrMaybeStored) && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
								errs <- fmt.Errorf("%s: %w", id, err)
								return
							}
							t.Logf("%s: %v", id, err)
							// Counted as tried; the next one has a new id.
							i++
							continue
						}
						results <- result{session, id, seq}
						if tick != nil {
							tick(ok.Add(1))
						}
						i++
					}
					errs <- nil
				}()
			}
		}
	}
	for range len(logs) * len(sessions) * writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	close(results)
	out := map[string]map[uint64]string{}
	for _, s := range sessions {
		out[s] = map[uint64]string{}
	}
	for r := range results {
		if prev, dup := out[r.session][r.seq]; dup {
			t.Fatalf("session %q: seq %d given to %s and to %s", r.session, r.seq, prev, r.id)
		}
		out[r.session][r.seq] = r.id
	}
	return out
}

// checkDense checks a session's stored notifications against the appends
// that succeeded (seq → id): the stored seqs are exactly 1..last, each
// body carries its seq, each id is stored once, every successful append is
// stored at the seq it returned; when exact, nothing else is stored (no
// append failed). Then it checks what the live subscriber got: with
// exact, all of them, once each, in order.
func checkDense(t *testing.T, l *jsevents.Log, session string, appended map[uint64]string, rec *recorder, exact bool) [][]byte {
	t.Helper()
	stored, oldest, last := all(t, l, session, 0)
	if oldest != 1 || last != uint64(len(stored)) {
		t.Fatalf("session %q: oldest %d, last %d, %d stored", session, oldest, last, len(stored))
	}
	ids := map[string]uint64{}
	for i, b := range stored {
		e := decode(t, b)
		if e.Seq != uint64(i+1) {
			t.Fatalf("session %q: stored #%d carries seq %d", session, i+1, e.Seq)
		}
		if prev, dup := ids[e.ID]; dup {
			t.Fatalf("session %q: %s stored twice, as %d and %d", session, e.ID, prev, e.Seq)
		}
		ids[e.ID] = e.Seq
	}
	for seq, id := range appended {
		if ids[id] != seq {
			t.Fatalf("session %q: %s appended as %d, stored as %d", session, id, seq, ids[id])
		}
	}
	if exact && len(appended) != len(stored) {
		t.Fatalf("session %q: %d appended, %d stored", session, len(appended), len(stored))
	}
	got := rec.waitSeq(t, last)
	missed, repeated := checkLive(t, got, stored)
	if exact && (missed != 0 || repeated != 0) {
		t.Fatalf("session %q: live subscriber missed %d, repeated %d of %d", session, missed, repeated, len(stored))
	}
	t.Logf("session %q: %d stored, live subscriber missed %d, repeated %d", session, len(stored), missed, repeated)
	return stored
}

// An attempt whose answer is lost but that was stored is recognised when
// Append tries again (by its Nats-Msg-Id): the notification is stored once
// and Append returns the seq it was stored under.
func TestAnUnansweredAppendThatWasStoredIsNotStoredTwice(t *testing.T) {
	s := runServer(t)
	p := startProxy(t, s.Addr().String())
	l := open(t, connect(t, "nats://"+p.addr()), jsevents.Config{})
	other := open(t, connect(t, s.ClientURL()), jsevents.Config{})
	appendID(t, l, "s", "first")

	p.hold() // the server's answers to l wait in the proxy
	done := make(chan error, 1)
	var seq uint64
	var builds atomic.Int32
	go func() {
		var err error
		seq, err = l.Append(testContext(t), "s", func(seq uint64) ([]byte, error) {
			builds.Add(1)
			return body(seq, "held", ""), nil
		})
		done <- err
	}()
	// Stored, unanswered: release once the Log has given up on the attempt.
	waitUntil(t, "the attempt stored", func() bool {
		last, err := other.Last(testContext(t), "s")
		return err == nil && last == 2
	})
	waitUntil(t, "the attempt timed out", func() bool { return l.Stats().Unanswered > 0 })
	p.release()
	if err := <-done; err != nil || seq != 2 {
		t.Fatalf("append: seq %d, %v; want 2", seq, err)
	}
	stored, _, last := all(t, other, "s", 0)
	if last != 2 || len(stored) != 2 || decode(t, stored[1]).ID != "held" {
		t.Fatalf("stored %d, last %d", len(stored), last)
	}
	if st := l.Stats(); st.Duplicates != 1 || builds.Load() < 2 {
		t.Fatalf("stats %+v, %d builds: want the retry recognised as a duplicate", st, builds.Load())
	}
}

// waitUntil polls cond until it holds, or fails the test.
func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-timer.C:
			t.Fatalf("%s: never", what)
		case <-tick.C:
		}
	}
}

// proxy forwards one TCP connection to a server, and can hold back what
// the server sends (without losing it) until released.
type proxy struct {
	l    net.Listener
	wg   sync.WaitGroup
	mu   sync.Mutex
	held bool
	gate *sync.Cond
	// conns to close at the end
	conns []net.Conn
}

func startProxy(t testing.TB, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l}
	p.gate = sync.NewCond(&p.mu)
	p.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			p.wg.Go(func() { _, _ = io.Copy(s, c); _ = s.Close() })
			p.wg.Go(func() {
				buf := make([]byte, 32<<10)
				for {
					n, err := s.Read(buf)
					p.mu.Lock()
					for p.held {
						p.gate.Wait()
					}
					p.mu.Unlock()
					if n > 0 {
						if _, werr := c.Write(buf[:n]); werr != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				_ = c.Close()
			})
		}
	})
	t.Cleanup(func() {
		_ = l.Close()
		p.release()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) addr() string { return p.l.Addr().String() }

func (p *proxy) hold() {
	p.mu.Lock()
	p.held = true
	p.mu.Unlock()
}

func (p *proxy) release() {
	p.mu.Lock()
	p.held = false
	p.gate.Broadcast()
	p.mu.Unlock()
}
