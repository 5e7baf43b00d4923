package e2e_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/wire"
)

// TestStalledSubscribersStayWithinTheMemoryBound: session connections that
// subscribe to their session's events and never read, then a flood of
// 800 KB pushes to those sessions. The broker's resident memory grows by
// no more than docs/RELIABILITY.md says ("Memory under stalled
// subscribers"), the stalled connections are cut, and the other sessions
// go on: the sender is answered, and a bystander hears every push to it
// on the one connection it started with.
//
// The figures are logged; run one case with
// go test -run 'TestStalledSubscribersStayWithinTheMemoryBound/256' ./e2e
func TestStalledSubscribersStayWithinTheMemoryBound(t *testing.T) {
	const size = 800_000 // a push's message
	for _, tc := range []struct {
		name                  string
		sessions, conns, subs int
		pushes                int
	}{
		{"128 subscribers: 8 sessions of 16 connections", 8, 16, 1, 250},
		{"256 subscribers: 16 sessions of 16 connections", 16, 16, 1, 250},
		{"128 subscribers: one session of 16 connections of 8", 1, 16, 8, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startSidecar(t)
			sender := s.open("sender")
			token, _ := sender.register("source", nil)
			// Each push is encoded once (client.encode), and sent again as
			// it is.
			push := func(to string, size int) []byte {
				return sender.encode(wire.MethodSend, wire.SendParams{Token: token, To: to, Oneway: true, Message: textMessage(strings.Repeat("z", size))})
			}
			var pushes [][]byte
			var sessions []string
			for i := range tc.sessions {
				session := fmt.Sprint("stalled-", i)
				sessions = append(sessions, session)
				c := s.open(session)
				_, id := c.register(fmt.Sprint("sink-", i), nil)
				c.nc.Close() // the agent stays; its connection's place goes to a stalled one
				pushes = append(pushes, push(id, size))
				// The broker keeps each session's last notifications (4 MiB,
				// its replay window): filled before the baseline, they are not
				// what is measured.
				for range 6 {
					_, err := sender.request(wire.MethodSend, pushes[i])
					require.NoError(t, err)
				}
			}
			bystander := s.open("bystander")
			_, bid := bystander.register("listener", nil)
			heard := bystander.events()
			small := push(bid, 1_000)
			for _, session := range sessions {
				raw, err := s.hostCall(wire.MethodSessionOpen, wire.SessionParams{ContextID: session})
				require.NoError(t, err)
				var creds wire.SessionCredentials
				require.NoError(t, json.Unmarshal(raw, &creds))
				for range tc.conns {
					stalledConn(t, s.url, creds, session, tc.subs)
				}
			}
			before, _ := s.memory()
			s.resetPeak()
			cpu := s.cpu()
			start := time.Now()
			said, cutBy := 0, -1
			for i := range tc.pushes {
				_, err := sender.request(wire.MethodSend, pushes[i%len(pushes)])
				require.NoError(t, err, "push %d", i)
				if i%10 == 0 {
					_, err := sender.request(wire.MethodSend, small)
					require.NoError(t, err, "push %d to the bystander", i)
					said++
					if cutBy < 0 && s.subscribers(sessions...) == 0 {
						cutBy = i
					}
				}
			}
			flood := time.Since(start)
			_, peak := s.memory()
			cpu = s.cpu() - cpu
			_, err := sender.call(wire.MethodListAgents, wire.ListAgentsParams{Token: token})
			require.NoError(t, err)
			for n := range said {
				msg, err := heard.NextMsg(10 * time.Second)
				require.NoError(t, err, "the bystander's push %d of %d", n+1, said)
				_, err = wire.DecodeEvent(msg.Data)
				require.NoError(t, err)
			}
			assert.Equal(t, nats.CONNECTED, bystander.nc.Status())
			assert.Zero(t, bystander.nc.Stats().Reconnects, "the bystander was never cut")
			assert.Zero(t, sender.nc.Stats().Reconnects, "the sender was never cut")
			assert.Zero(t, s.subscribers(sessions...), "the stalled subscribers were cut")

			stalled := tc.sessions * tc.conns * tc.subs
			// docs/RELIABILITY.md, "Memory under stalled subscribers": what
			// waits for session connections, counted with what the server
			// still holds for those it cut (the all-sessions bound); one
			// notification for each stalled subscription, which is how it
			// is seen to have stopped reading; the garbage the broker lets
			// build meanwhile (an eighth of the bound); and what the
			// broker does with the push in flight (about ten copies of its
			// message: the request read, decoded and checked, the event
			// encoded, kept and published).
			bound := int64(natsbus.DefaultMaxSessionPending)*9/8 + int64(stalled+10)*size
			t.Logf("%d stalled subscribers (%d sessions × %d connections × %d subscriptions), %d pushes of 800 KB in %v (the broker's CPU %v), all cut by push %d: resident %d MiB before, peak %d MiB (+%d MiB, bound +%d MiB)",
				stalled, tc.sessions, tc.conns, tc.subs, tc.pushes, flood.Round(time.Millisecond), cpu, cutBy, before>>20, peak>>20, (peak-before)>>20, bound>>20)
			assert.Less(t, peak-before, bound, "the broker's memory grew by more than its bound")
		})
	}
}

// stalledConn is a raw NATS connection with a session's credential that
// subscribes subs times to the session's events and then never reads
// again.
func stalledConn(t *testing.T, url string, creds wire.SessionCredentials, session string, subs int) {
	t.Helper()
	u, err := neturl.Parse(url)
	require.NoError(t, err)
	conn, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	r := bufio.NewReader(conn)
	_, err = r.ReadString('\n') // INFO
	require.NoError(t, err)
	connect, err := json.Marshal(map[string]any{"user": creds.User, "pass": creds.Password, "verbose": false, "pedantic": false})
	require.NoError(t, err)
	var b strings.Builder
	fmt.Fprintf(&b, "CONNECT %s\r\n", connect)
	for i := range subs {
		fmt.Fprintf(&b, "SUB %s %d\r\n", natsbus.EventsSubject(session), i+1)
	}
	b.WriteString("PING\r\n")
	_, err = conn.Write([]byte(b.String()))
	require.NoError(t, err)
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "PONG\r\n", line, "the server accepts the stalled connection")
}

// subscribers counts the subscribers of the sessions, as a2a.admin.sessions
// reports them.
func (s *sidecar) subscribers(sessions ...string) int {
	raw, err := s.hostCall(wire.MethodAdminSessions, nil)
	require.NoError(s.t, err)
	var r wire.AdminSessions
	require.NoError(s.t, json.Unmarshal(raw, &r))
	n := 0
	for _, row := range r.Sessions {
		for _, session := range sessions {
			if row.ContextID == session && row.Subscribers != nil {
				n += *row.Subscribers
			}
		}
	}
	return n
}

// cpu returns the CPU time the broker process has used (Linux).
func (s *sidecar) cpu() time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.pid))
	require.NoError(s.t, err)
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	utime, err := strconv.Atoi(f[11])
	require.NoError(s.t, err)
	stime, err := strconv.Atoi(f[12])
	require.NoError(s.t, err)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}
