package natsbus

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestChooseCuts: which session connections the watchdog closes, given
// what waits for each, whether each stopped reading, and what the
// connections it closed still hold.
func TestChooseCuts(t *testing.T) {
	const M = 1 << 20
	now := time.Now()
	lim := cutLimits{conn: 16 * M, session: 32 * M, all: 64 * M}
	// conn is a connection of session with pending bytes waiting; stuck
	// says for how long the server could write none of them (0: it
	// writes).
	conn := func(cid uint64, session string, pending int, stuck time.Duration) *watchedConn {
		c := &watchedConn{cid: cid, session: session, pending: pending}
		if stuck > 0 {
			c.stuck = now.Add(-stuck)
		}
		return c
	}
	held := func(session string, bytes int) heldBytes {
		return heldBytes{session: session, bytes: bytes, until: now.Add(time.Second)}
	}
	for _, tc := range []struct {
		name  string
		conns []*watchedConn
		held  []heldBytes
		want  []uint64
	}{
		{
			name:  "within every bound, a stalled connection stays",
			conns: []*watchedConn{conn(1, "a", 10*M, time.Second), conn(2, "b", 10*M, 0)},
		},
		{
			name:  "one over its own bound is cut, reading or not",
			conns: []*watchedConn{conn(1, "a", 17*M, 0), conn(2, "a", 10*M, time.Second)},
			want:  []uint64{1},
		},
		{
			name:  "a session over its bound loses its largest, and then, with what that one holds, the rest of its own",
			conns: []*watchedConn{conn(1, "a", 12*M, 0), conn(2, "a", 14*M, 0), conn(3, "a", 10*M, 0), conn(4, "a", stallBytes-1, 0), conn(5, "b", 15*M, 0)},
			want:  []uint64{2, 1, 3},
		},
		{
			name:  "all over their bound lose the largest until within",
			conns: []*watchedConn{conn(1, "a", 15*M, 0), conn(2, "b", 15*M, 0), conn(3, "c", 15*M, 0), conn(4, "d", 15*M, 0), conn(5, "e", 14*M, 0)},
			want:  []uint64{1},
		},
		{
			name:  "what a session's cut connections hold: its connections with stallBytes waiting go, others' stay",
			conns: []*watchedConn{conn(1, "a", M, time.Second), conn(2, "a", 2*M, 0), conn(3, "a", stallBytes-1, time.Second), conn(4, "b", M, time.Second)},
			held:  []heldBytes{held("a", 30*M)},
			want:  []uint64{2, 1},
		},
		{
			name:  "what all cut connections hold: every stalled one goes, whatever its session",
			conns: []*watchedConn{conn(1, "a", M, time.Second), conn(2, "b", 2*M, time.Second), conn(3, "c", 3*M, 0)},
			held:  []heldBytes{held("x", 20*M), held("y", 20*M), held("z", 20*M)},
			want:  []uint64{2, 1},
		},
		{
			name: "stalled is stallBytes waiting and none written for stallAfter",
			conns: []*watchedConn{
				conn(1, "a", stallBytes, stallAfter), conn(2, "b", stallBytes-1, time.Second),
				conn(3, "c", stallBytes, stallAfter-time.Millisecond), conn(4, "d", stallBytes, 0),
			},
			held: []heldBytes{held("x", 64*M)},
			want: []uint64{1},
		},
		{
			name:  "nothing waiting is never cut",
			conns: []*watchedConn{conn(1, "a", 0, time.Second)},
			held:  []heldBytes{held("a", 100*M)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hm := map[uint64]heldBytes{}
			for i, h := range tc.held {
				hm[uint64(1000+i)] = h
			}
			var got []uint64
			for _, c := range chooseCuts(slices.Clone(tc.conns), hm, lim, now) {
				got = append(got, c.cid)
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

// stalledSubscriber connects to s with a session's credential, subscribes
// to the session's events, and never reads again.
func stalledSubscriber(t *testing.T, s *Server, session string) {
	t.Helper()
	creds := s.OpenSession(session)
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL(), "nats://"))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	r := bufio.NewReader(conn)
	_, err = r.ReadString('\n') // INFO
	require.NoError(t, err)
	connect, err := json.Marshal(map[string]any{"user": creds.User, "pass": creds.Password, "verbose": false})
	require.NoError(t, err)
	_, err = fmt.Fprintf(conn, "CONNECT %s\r\nSUB %s 1\r\nPING\r\n", connect, EventsSubject(session))
	require.NoError(t, err)
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "PONG\r\n", line)
}

// subscribers counts the subscriptions on a session's events (with the
// server's own, that carry them from the host's account).
func subscribers(t *testing.T, s *Server, session string) int {
	t.Helper()
	sz, err := s.ns.Subsz(&server.SubszOptions{Subscriptions: true, Test: EventsSubject(session), Limit: 1 << 10})
	require.NoError(t, err)
	return len(sz.Subs)
}

// TestTheWatchdogCutsWhatStoppedReadingAndNothingElse: a session's
// connections that stopped reading are cut under a flood of large
// notifications, within the bounds counted with what they still hold;
// another session's reader on the same flood keeps its connection and
// gets every notification.
func TestTheWatchdogCutsWhatStoppedReadingAndNothingElse(t *testing.T) {
	s, err := StartServer(ServerConfig{SlowConsumerBytes: 4 << 20, SessionPendingBytes: 8 << 20, MaxSessionPending: 8 << 20})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	for range 4 {
		stalledSubscriber(t, s, "stalled")
	}
	creds := s.OpenSession("reader")
	reader, err := nats.Connect(s.URL(), nats.UserInfo(creds.User, creds.Password))
	require.NoError(t, err)
	t.Cleanup(reader.Close)
	heard, err := reader.SubscribeSync(EventsSubject("reader"))
	require.NoError(t, err)
	require.NoError(t, heard.SetPendingLimits(-1, -1))
	require.NoError(t, reader.Flush())
	readers := subscribers(t, s, "reader")
	host, err := nats.Connect(s.URL(), nats.Token(s.Token()))
	require.NoError(t, err)
	t.Cleanup(host.Close)

	msg := make([]byte, 256<<10)
	const n = 200 // 50 MB to each stalled connection: more than its socket takes
	for range n {
		for _, session := range []string{"stalled", "reader"} {
			require.NoError(t, host.Publish(EventsSubject(session), msg))
			s.published(len(msg))
		}
		require.NoError(t, host.Flush())
	}
	for i := range n {
		_, err := heard.NextMsg(10 * time.Second)
		require.NoError(t, err, "the reader's notification %d", i)
	}
	assert.Equal(t, nats.CONNECTED, reader.Status())
	assert.Zero(t, reader.Stats().Reconnects, "the reader was never cut")
	assert.Eventually(t, func() bool { return subscribers(t, s, "stalled") == 0 }, 10*time.Second, 10*time.Millisecond,
		"the stalled connections are cut")
	assert.Equal(t, readers, subscribers(t, s, "reader"))
}

// TestTheWatchdogIdlesWhileNothingIsDelivered: with session connections
// open and nothing delivered, the watchdog does not look at them; a
// delivery makes it look again.
func TestTheWatchdogIdlesWhileNothingIsDelivered(t *testing.T) {
	s, err := StartServer(ServerConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	stalledSubscriber(t, s, "idle")
	time.Sleep(2 * watchEvery) // the connection's own traffic is looked at once
	before := s.looks.Load()
	time.Sleep(10 * watchEvery)
	assert.Equal(t, before, s.looks.Load(), "ten ticks with nothing delivered: no look")
	host, err := nats.Connect(s.URL(), nats.Token(s.Token()))
	require.NoError(t, err)
	t.Cleanup(host.Close)
	require.NoError(t, host.Publish(EventsSubject("idle"), []byte("{}")))
	require.NoError(t, host.Flush())
	assert.Eventually(t, func() bool { return s.looks.Load() > before }, 10*watchEvery, watchEvery/10, "a delivery is looked at")
}
