package jsevents_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/store/jsevents"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(testbin.Exit))
}

// deadline bounds every wait of these tests: generous, it only turns a
// hang into a failure.
const deadline = 60 * time.Second

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	t.Cleanup(cancel)
	return ctx
}

// runServer starts an embedded single JetStream server on a loopback port.
func runServer(t testing.TB) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{
		ServerName: "single",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		NoSigs:     true,
		NoLog:      true,
		JetStream:  true,
		StoreDir:   t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("embedded server not ready")
	}
	return s
}

// connect opens a connection closed at the end of the test. Its error
// handler fails the test on a slow consumer: a dropped message would
// make the delivery checks meaningless.
func connect(t testing.TB, urls string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(urls,
		nats.DontRandomize(),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50*time.Millisecond),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrSlowConsumer) {
				t.Errorf("slow consumer on %s: %v", sub.Subject, err)
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func open(t testing.TB, nc *nats.Conn, cfg jsevents.Config) *jsevents.Log {
	t.Helper()
	l, err := jsevents.Open(testContext(t), nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// event is the body the tests append: a seq, who appended it, and padding
// to give it a size.
type event struct {
	Seq uint64 `json:"seq"`
	ID  string `json:"id"`
	Pad string `json:"pad,omitempty"`
}

func body(seq uint64, id, pad string) []byte {
	b, err := json.Marshal(event{Seq: seq, ID: id, Pad: pad})
	if err != nil {
		panic(err)
	}
	return b
}

func decode(t testing.TB, b []byte) event {
	t.Helper()
	var e event
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("body %q: %v", b, err)
	}
	return e
}

// appendID appends an event with id and returns its seq.
func appendID(t testing.TB, l *jsevents.Log, session, id string) uint64 {
	t.Helper()
	seq, err := l.Append(testContext(t), session, func(seq uint64) ([]byte, error) {
		return body(seq, id, ""), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

// all reads every kept notification of session after afterSeq, page by
// page.
func all(t testing.TB, l *jsevents.Log, session string, afterSeq uint64) (events [][]byte, oldest, last uint64) {
	t.Helper()
	ctx := testContext(t)
	for {
		page, o, l2, err := l.Since(ctx, session, afterSeq, 1<<20)
		if err != nil {
			t.Fatalf("since %d: %v", afterSeq, err)
		}
		oldest, last = o, l2
		for _, e := range page {
			events = append(events, e)
		}
		afterSeq += uint64(len(page))
		if len(page) == 0 || afterSeq >= last {
			return events, oldest, last
		}
	}
}

// recorder is a live subscriber on a session's event subject.
type recorder struct {
	mu     sync.Mutex
	msgs   []*nats.Msg
	signal chan struct{}
	sub    *nats.Subscription
}

func record(t testing.TB, nc *nats.Conn, session string) *recorder {
	t.Helper()
	r := &recorder{signal: make(chan struct{}, 1)}
	sub, err := nc.Subscribe(natsbus.EventsSubject(session), func(m *nats.Msg) {
		r.mu.Lock()
		r.msgs = append(r.msgs, m)
		r.mu.Unlock()
		select {
		case r.signal <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	r.sub = sub
	// The subscription must be known to every server before appends.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return r
}

func (r *recorder) got() []*nats.Msg {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

// waitFor waits until cond holds of the messages received, or fails.
func (r *recorder) waitFor(t testing.TB, what string, cond func([]*nats.Msg) bool) []*nats.Msg {
	t.Helper()
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	for {
		msgs := r.got()
		if cond(msgs) {
			return msgs
		}
		select {
		case <-r.signal:
		case <-timer.C:
			t.Fatalf("live subscriber: %s never came; got %d messages", what, len(msgs))
		}
	}
}

// waitSeq waits for the message of seq.
func (r *recorder) waitSeq(t testing.TB, seq uint64) []*nats.Msg {
	t.Helper()
	return r.waitFor(t, fmt.Sprintf("seq %d", seq), func(msgs []*nats.Msg) bool {
		for _, m := range msgs {
			if m.Header.Get(jsevents.HeaderSeq) == strconv.FormatUint(seq, 10) {
				return true
			}
		}
		return false
	})
}

// checkLive checks what a live subscriber got against the stored
// notifications (stored[i] is seq i+1): every message is one of them,
// byte for byte, with its seq in the header and the body; a seq comes
// for the first time only after every seq it got before (so in order),
// and again only as a repeat of the same notification. It returns how
// many were missed and repeated.
func checkLive(t testing.TB, got []*nats.Msg, stored [][]byte) (missed, repeated int) {
	t.Helper()
	seen := map[uint64]bool{}
	var high uint64
	for i, m := range got {
		seq, err := strconv.ParseUint(m.Header.Get(jsevents.HeaderSeq), 10, 64)
		if err != nil || seq == 0 || seq > uint64(len(stored)) {
			t.Fatalf("live message %d: header seq %q, %d stored", i, m.Header.Get(jsevents.HeaderSeq), len(stored))
		}
		if string(m.Data) != string(stored[seq-1]) {
			t.Fatalf("live message %d, seq %d: body %s, stored %s", i, seq, m.Data, stored[seq-1])
		}
		if e := decode(t, m.Data); e.Seq != seq {
			t.Fatalf("live message %d: header seq %d, body seq %d", i, seq, e.Seq)
		}
		switch {
		case seen[seq]:
			repeated++
		case seq < high:
			t.Fatalf("live message %d: seq %d first came after seq %d", i, seq, high)
		default:
			seen[seq] = true
			high = seq
		}
	}
	return len(stored) - len(seen), repeated
}
