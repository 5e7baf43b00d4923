package natsbus_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// TestABusySessionIsToldWhichBoundItMet: a session whose requests wait
// behind a broker that serves none of them meets one of two bounds,
// the count of requests waiting or their bytes; the A2A_BUSY its client
// receives names the one it met, with the figures.
func TestABusySessionIsToldWhichBoundItMet(t *testing.T) {
	for _, tc := range []struct {
		name    string
		waiting int    // the bound of requests waiting
		big     bool   // each request as big as the server takes
		want    string // the message; for big ones, a format of the figures
	}{
		{"the count", 4, false, "the session has 4 requests waiting for the broker, the bound of requests waiting (1 in service); retry after a pause"},
		{"the bytes", 1024, true, "the session's %d requests waiting for the broker hold %d bytes; with this one's %d they would pass the bound of %d bytes waiting (1 in service); retry after a pause"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// On an external server a session's requests come by the
			// broker's own connection, which reads them all (the embedded
			// server's session links stop reading a session whose bound is
			// nearly met, so that its requests wait in the server instead).
			url, token := externalServer(t)
			withToken := strings.Replace(url, "nats://", fmt.Sprintf("nats://%s@", token), 1)
			b, err := natsbus.New(natsbus.Config{URL: withToken, MaxMessageBytes: testLimit, MaxInFlightPerSession: 1, MaxWaitingPerSession: tc.waiting, CloseGrace: testGrace})
			require.NoError(t, err)
			defer b.Close()
			release := make(chan struct{})
			defer close(release)
			require.NoError(t, b.Serve(transport.HandlerFunc(func(ctx context.Context, _ transport.Caller, raw []byte) []byte {
				select { // serves nothing until the test ends
				case <-release:
				case <-ctx.Done():
				}
				return wire.ErrorResponse(wire.PeekID(raw), wire.ErrInternal.Withf("released"))
			})))
			nc, err := nats.Connect(url, nats.Token(token))
			require.NoError(t, err)
			defer nc.Close()
			// One in service, as many waiting as the bound lets, and the
			// next is refused.
			n, size, filler := tc.waiting, 0, ""
			maxBytes := 4 * wire.NewLimits(testLimit).Payload // the bus's bound: four payload limits of its config
			if tc.big {
				body := `{"jsonrpc":"2.0","id":0000,"method":"a2a.agents.list","params":{"pad":""}}`
				filler = strings.Repeat("x", b.MaxPayload()-len(body)-1024)
				size = len(body) + len(filler)
				n = maxBytes / size
			}
			replies := make(chan *nats.Msg, n+2)
			_, err = nc.ChanSubscribe(natsbus.SessionInbox("s1")+".>", replies)
			require.NoError(t, err)
			for i := range n + 2 {
				body := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%04d,"method":"a2a.agents.list","params":{"pad":%q}}`, i, filler)
				require.NoError(t, nc.PublishRequest(natsbus.RPCSubject("s1"), fmt.Sprint(natsbus.SessionInbox("s1"), ".", i), body))
			}
			var m *nats.Msg
			select {
			case m = <-replies:
			case <-time.After(30 * time.Second):
				t.Fatal("no answer to a request past the bound")
			}
			assert.Equal(t, fmt.Sprint(natsbus.SessionInbox("s1"), ".", n+1), m.Subject, "the request past the bound is answered")
			var resp struct {
				Error *wire.Error `json:"error"`
			}
			require.NoError(t, json.Unmarshal(m.Data, &resp))
			require.NotNil(t, resp.Error)
			assert.ErrorIs(t, resp.Error, wire.ErrBusy)
			want := tc.want
			if tc.big {
				want = fmt.Sprintf(tc.want, n, n*size, size, maxBytes)
			}
			assert.Equal(t, want, resp.Error.Message)
		})
	}
}
