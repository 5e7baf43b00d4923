package natsbus_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// A client that names its host's broker has every request carry it, and
// the broker's side hears it; a request that names none, or a header
// that is not a broker's name, names none.
func TestAClientNamesItsHostsBroker(t *testing.T) {
	url, token := externalServer(t)
	withToken := strings.Replace(url, "nats://", fmt.Sprintf("nats://%s@", token), 1)
	b, err := natsbus.New(natsbus.Config{URL: withToken, QueueGroup: "a2a-bus"})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	var mu sync.Mutex
	var heard []string
	require.NoError(t, b.Serve(transport.HandlerFunc(func(_ context.Context, from transport.Caller, req []byte) []byte {
		mu.Lock()
		heard = append(heard, from.Scope.String()+":"+from.HomeBroker)
		mu.Unlock()
		r, _ := wire.ParseRequest(req, 0)
		resp, _ := wire.EncodeResult(r.ID, map[string]any{})
		return resp
	})))
	last := func() string {
		mu.Lock()
		defer mu.Unlock()
		return heard[len(heard)-1]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	homed, err := natsbus.Dial(natsbus.ClientConfig{URL: url, Token: token, Broker: "laptop"})
	require.NoError(t, err)
	t.Cleanup(func() { homed.Close() })
	s, err := homed.Session(ctx, "s1")
	require.NoError(t, err)
	_, err = s.Call(ctx, wire.MethodListAgents, nil)
	require.NoError(t, err)
	assert.Equal(t, "session:laptop", last())
	_, err = homed.CallHost(ctx, wire.MethodAdminInfo, nil)
	require.NoError(t, err)
	assert.Equal(t, "host:laptop", last())

	plain, err := natsbus.Dial(natsbus.ClientConfig{URL: url, Token: token})
	require.NoError(t, err)
	t.Cleanup(func() { plain.Close() })
	s, err = plain.Session(ctx, "s1")
	require.NoError(t, err)
	_, err = s.Call(ctx, wire.MethodListAgents, nil)
	require.NoError(t, err)
	assert.Equal(t, "session:", last())

	nc, err := nats.Connect(url, nats.Token(token))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	for _, bad := range []string{"", "a.b", "a b", strings.Repeat("x", 65), "naïve"} {
		msg := &nats.Msg{Subject: natsbus.HostRPC, Header: nats.Header{natsbus.BrokerHeader: []string{bad}},
			Data: []byte(`{"jsonrpc":"2.0","id":1,"method":"a2a.admin.info"}`)}
		_, err := nc.RequestMsgWithContext(ctx, msg)
		require.NoError(t, err)
		assert.Equal(t, "host:", last(), "header %q", bad)
	}
}

func TestABrokerNameIsChecked(t *testing.T) {
	for _, name := range []string{"a.b", "a b", strings.Repeat("x", 65), "*", ">"} {
		err := natsbus.ClientConfig{URL: "nats://127.0.0.1:1", Broker: name}.Validate()
		assert.ErrorIs(t, err, natsbus.ErrBadConfig, "Broker %q", name)
	}
	for _, name := range []string{"laptop", "host-2", "A_b-9", strings.Repeat("x", 64)} {
		assert.True(t, natsbus.ValidBrokerName(name), name)
		assert.NoError(t, natsbus.ClientConfig{URL: "nats://127.0.0.1:1", Broker: name}.Validate())
	}
}
