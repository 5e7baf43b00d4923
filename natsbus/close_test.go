package natsbus_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// TestCloseAnswersEveryRequestItReceived: requests the server delivered
// to the broker before Close are each answered, served or "shutting
// down", even those its client had received but not yet dispatched.
func TestCloseAnswersEveryRequestItReceived(t *testing.T) {
	const n = 5000
	b, err := natsbus.New(natsbus.Config{MaxMessageBytes: testLimit, MaxWaitingPerSession: n})
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.Serve(transport.HandlerFunc(func(_ context.Context, _ transport.Caller, req []byte) []byte {
		resp, _ := wire.EncodeResult(wire.PeekID(req), struct{}{})
		return resp
	})))
	dial := func(opts ...nats.Option) (*nats.Conn, error) {
		return nats.Connect(b.URL(), append(opts, nats.Token(b.Server().Token()))...)
	}
	answered := sendThenClose(t, b, n, dial, natsbus.HostRPC, "_INBOX.close", "a2a.admin.status")
	assert.Equal(t, n, answered, "every request the broker received is answered")
}

// TestCloseAnswersASessionsBacklog: a session whose requests wait behind
// a handler that never returns by itself has the rest of what it sent
// read and answered at Close (busy, or shutting down), not left unread
// behind its gate.
func TestCloseAnswersASessionsBacklog(t *testing.T) {
	const n = 50
	b, err := natsbus.New(natsbus.Config{MaxMessageBytes: testLimit, MaxInFlightPerSession: 1, MaxWaitingPerSession: 8, CloseGrace: testGrace})
	require.NoError(t, err)
	defer b.Close()
	open := b.HostMethods()[wire.MethodSessionOpen]
	require.NoError(t, b.Serve(transport.HandlerFunc(func(ctx context.Context, from transport.Caller, raw []byte) []byte {
		if from.Scope == transport.ScopeHost { // a2a.sessions.open
			req, _ := wire.ParseRequest(raw, 0)
			res, err := open(ctx, req.Params)
			if err != nil {
				return wire.ErrorResponse(req.ID, wire.ErrInternal.Withf("%v", err))
			}
			resp, _ := wire.EncodeResult(req.ID, res)
			return resp
		}
		<-ctx.Done() // until Close cuts it short
		return nil
	})))
	creds := openSession(t, b, "s1")
	dial := func(opts ...nats.Option) (*nats.Conn, error) {
		return nats.Connect(creds.URL, append(opts, nats.UserInfo(creds.User, creds.Password), nats.CustomInboxPrefix(natsbus.SessionInbox("s1")))...)
	}
	answered := sendThenClose(t, b, n, dial, natsbus.RPCSubject("s1"), natsbus.SessionInbox("s1"), "a2a.agents.list")
	assert.Equal(t, n, answered, "every request the session sent before Close is answered")
}

// sendThenClose sends n requests from a connection dialled by dial (it
// passes the options it needs), each with its own reply subject under
// inbox, closes the bus, and returns how many were answered by the time
// the server, shut down with the bus, closed the connection.
func sendThenClose(t *testing.T, b *natsbus.Bus, n int, dial func(...nats.Option) (*nats.Conn, error), subject, inbox, method string) int {
	t.Helper()
	gone := make(chan struct{})
	nc, err := dial(nats.NoReconnect(), nats.ClosedHandler(func(*nats.Conn) { close(gone) }))
	require.NoError(t, err)
	defer nc.Close()
	replies := make(chan *nats.Msg, n)
	_, err = nc.ChanSubscribe(inbox+".>", replies)
	require.NoError(t, err)
	for i := range n {
		body := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%d,"method":%q,"params":{}}`, i, method)
		require.NoError(t, nc.PublishRequest(subject, fmt.Sprint(inbox, ".", i), body))
	}
	// Once the server has answered the flush, it has routed every request
	// to the broker's connection.
	require.NoError(t, nc.Flush())
	require.NoError(t, b.Close())
	// The server shut down with the bus: once the client's connection is
	// closed, everything it received is in replies.
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the client's connection outlived the server")
	}
	answered := map[string]bool{}
	for len(replies) > 0 {
		answered[(<-replies).Subject] = true
	}
	return len(answered)
}
