package natsbus

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

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
	n, err := s.subscribers(session)
	require.NoError(t, err)
	return n
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

// TestTheWatchdogLooksAtWhatTheBusDelivers: the notifications and the
// replies the bus sends arm the watchdog, which looks at the session
// connections and, with nothing waiting, goes back to waiting for the
// next (how it idles: admission's TestTheWatchdogIdlesUntilSomethingIsPublished).
func TestTheWatchdogLooksAtWhatTheBusDelivers(t *testing.T) {
	b, err := New(Config{MaxMessageBytes: 8192})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	s := b.server
	require.NoError(t, b.Serve(transport.HandlerFunc(func(_ context.Context, _ transport.Caller, req []byte) []byte {
		resp, _ := wire.EncodeResult(wire.PeekID(req), struct{}{})
		return resp
	})))
	stalledSubscriber(t, s, "idle")
	idle := func() bool { return s.watch.Idle() }
	require.Eventually(t, idle, 5*time.Second, time.Millisecond, "nothing published: idle")
	looks := s.watch.Looks()

	require.NoError(t, b.Publish("idle", []byte("{}")))
	require.Eventually(t, func() bool { return s.watch.Looks() > looks }, 5*time.Second, time.Millisecond, "a notification is looked at")
	require.Eventually(t, idle, 5*time.Second, time.Millisecond, "and then it idles")
	looks = s.watch.Looks()

	res, err := b.HostMethods()[wire.MethodSessionOpen](context.Background(), json.RawMessage(`{"contextId":"caller"}`))
	require.NoError(t, err)
	creds := res.(wire.SessionCredentials)
	c, err := Dial(ClientConfig{URL: creds.URL, User: creds.User, Password: creds.Password, Session: "caller"})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	sess, err := c.Session(context.Background(), "caller")
	require.NoError(t, err)
	_, err = sess.Call(context.Background(), wire.MethodListAgents, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return s.watch.Looks() > looks }, 5*time.Second, time.Millisecond, "a reply is looked at")
	require.Eventually(t, idle, 5*time.Second, time.Millisecond, "and then it idles")
	looks = s.watch.Looks()

	// A host's reply goes to no session connection: the host's health
	// check must not make the watchdog look at all of them. The service's
	// count of host requests is raised once the reply has been sent and
	// the watchdog told of it, or not.
	var told atomic.Int64
	note := func(int) { told.Add(1) }
	s.notePublished.Store(&note)
	host, err := Dial(ClientConfig{URL: b.URL(), Token: s.Token()})
	require.NoError(t, err)
	t.Cleanup(func() { host.Close() })
	_, err = host.CallHost(context.Background(), wire.MethodAdminInfo, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.svc.stats().Endpoints[endpointHost].NumRequests == 1 }, 5*time.Second, time.Millisecond, "the host's request is counted")
	assert.Zero(t, told.Load(), "a host's reply is not told to the watchdog")
	assert.Equal(t, looks, s.watch.Looks())
	// A session's reply is, by the same count.
	_, err = sess.Call(context.Background(), wire.MethodListAgents, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.svc.stats().Endpoints[endpointSession].NumRequests == 2 }, 5*time.Second, time.Millisecond, "the session's request is counted")
	assert.Equal(t, int64(1), told.Load(), "a session's reply is told to the watchdog")
}
