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
	gone := make(chan struct{})
	nc, err := nats.Connect(b.URL(), nats.Token(b.Server().Token()), nats.NoReconnect(),
		nats.ClosedHandler(func(*nats.Conn) { close(gone) }))
	require.NoError(t, err)
	defer nc.Close()
	replies := make(chan *nats.Msg, n)
	_, err = nc.ChanSubscribe("_INBOX.close.>", replies)
	require.NoError(t, err)
	for i := range n {
		body := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%d,"method":"a2a.admin.status"}`, i)
		require.NoError(t, nc.PublishRequest(natsbus.HostRPC, fmt.Sprint("_INBOX.close.", i), body))
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
	assert.Equal(t, n, len(answered), "every request the broker received is answered")
}
