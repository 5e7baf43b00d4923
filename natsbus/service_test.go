package natsbus_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// serviceRequest asks the NATS service API one verb on the host's
// connection and decodes the answer into v.
func serviceRequest(t *testing.T, nc *nats.Conn, subject string, v any) {
	t.Helper()
	msg, err := nc.Request(subject, nil, 5*time.Second)
	require.NoError(t, err, subject)
	require.NoError(t, json.Unmarshal(msg.Data, v), subject)
}

func TestTheBrokerAnswersTheServiceAPI(t *testing.T) {
	b := brokerOn(t)
	creds := openSession(t, b, "s1")
	sess, err := nats.Connect(creds.URL, nats.UserInfo(creds.User, creds.Password),
		nats.CustomInboxPrefix(natsbus.SessionInbox("s1")), nats.NoReconnect())
	require.NoError(t, err)
	defer sess.Close()
	_, err = rawRequest(t, sess, natsbus.RPCSubject("s1"), wire.MethodRegister, wire.RegisterParams{ContextID: "s1", Card: &wire.AgentCard{Name: "a"}})
	require.NoError(t, err)
	host, err := nats.Connect(b.URL(), nats.Token(b.Server().Token()))
	require.NoError(t, err)
	defer host.Close()
	// The counts land just after the answers are sent: stats reads them
	// until they are there.
	var stats micro.Stats
	statsOnceCounted := func(requests int) micro.EndpointStats {
		t.Helper()
		require.Eventually(t, func() bool {
			serviceRequest(t, host, "$SRV.STATS."+natsbus.ServiceName, &stats)
			return len(stats.Endpoints) == 2 && stats.Endpoints[0].NumRequests == requests
		}, 5*time.Second, 10*time.Millisecond, "%d requests on the session's endpoint", requests)
		return *stats.Endpoints[0]
	}
	// A request whose reply would leave the session's inbox is refused
	// without an answer, and counted as an error, with why.
	require.NoError(t, host.PublishRequest(natsbus.RPCSubject("s1"), "_INBOX.elsewhere.x", []byte(`{"jsonrpc":"2.0","id":1,"method":"a2a.agents.list"}`)))
	refused := statsOnceCounted(2)
	assert.Equal(t, 1, refused.NumErrors)
	assert.Contains(t, refused.LastError, "inbox", "the refusal says why")
	_, err = rawRequest(t, sess, natsbus.RPCSubject("s1"), "a2a.no.such.method", struct{}{})
	require.ErrorIs(t, err, wire.ErrMethodNotFound)
	// A notification is served, not answered: it counts, without an error.
	require.NoError(t, sess.PublishRequest(natsbus.RPCSubject("s1"), natsbus.SessionInbox("s1")+".x",
		[]byte(`{"jsonrpc":"2.0","method":"a2a.no.such.method"}`)))

	var ping micro.Ping
	serviceRequest(t, host, "$SRV.PING", &ping)
	assert.Equal(t, micro.PingResponseType, ping.Type)
	assert.Equal(t, natsbus.ServiceName, ping.Name)
	assert.NotEmpty(t, ping.ID)

	var info micro.Info
	serviceRequest(t, host, "$SRV.INFO."+natsbus.ServiceName+"."+ping.ID, &info)
	assert.Equal(t, micro.InfoResponseType, info.Type)
	require.Len(t, info.Endpoints, 2)
	assert.Equal(t, natsbus.RPCPrefix+"*", info.Endpoints[0].Subject)
	assert.Equal(t, natsbus.HostRPC, info.Endpoints[1].Subject)

	session := statsOnceCounted(4)
	assert.Equal(t, micro.StatsResponseType, stats.Type)
	hostEP := stats.Endpoints[1]
	assert.Equal(t, "session", session.Name)
	assert.Equal(t, 2, session.NumErrors, "the foreign reply subject and the unknown method")
	assert.Contains(t, session.LastError, "-32601", "the last error was the unknown method")
	assert.Positive(t, session.ProcessingTime)
	assert.Equal(t, session.ProcessingTime/4, session.AverageProcessingTime)
	assert.Equal(t, "host", hostEP.Name)
	assert.Equal(t, 1, hostEP.NumRequests, "a2a.sessions.open")
	assert.Zero(t, hostEP.NumErrors)
	assert.False(t, stats.Started.IsZero())
}

func TestAClosedBusStopsAnsweringTheServiceAPI(t *testing.T) {
	srv, err := natsbus.StartServer(natsbus.ServerConfig{})
	require.NoError(t, err)
	defer srv.Close()
	b, err := natsbus.New(natsbus.Config{URL: strings.Replace(srv.URL(), "nats://", "nats://"+srv.Token()+"@", 1)})
	require.NoError(t, err)
	require.NoError(t, b.Serve(transport.HandlerFunc(func(context.Context, transport.Caller, []byte) []byte { return nil })))
	host, err := nats.Connect(srv.URL(), nats.Token(srv.Token()))
	require.NoError(t, err)
	defer host.Close()
	_, err = host.Request("$SRV.PING", nil, 5*time.Second)
	require.NoError(t, err)
	require.NoError(t, b.Close())
	require.NoError(t, b.Close(), "Close is idempotent")
	_, err = host.Request("$SRV.PING", nil, time.Second)
	assert.ErrorIs(t, err, nats.ErrNoResponders)
}

// TestAnAnswerOverThePayloadLimitCountsAsAnError: what the caller gets
// (an error saying the result did not fit) is what the stats count.
func TestAnAnswerOverThePayloadLimitCountsAsAnError(t *testing.T) {
	b := newBus(t)
	require.NoError(t, b.Serve(transport.HandlerFunc(func(_ context.Context, _ transport.Caller, req []byte) []byte {
		// Just over the limit (the result's quotes and envelope): the
		// test encodes no more than it needs to, which under -race on a
		// busy machine took seconds at twice the limit.
		resp, _ := wire.EncodeResult(wire.PeekID(req), strings.Repeat("x", b.MaxPayload()))
		return resp
	})))
	host, err := nats.Connect(b.URL(), nats.Token(b.Server().Token()))
	require.NoError(t, err)
	defer host.Close()
	_, err = rawRequest(t, host, natsbus.HostRPC, "a2a.admin.status", struct{}{})
	require.ErrorIs(t, err, wire.ErrInternal)
	// The count lands just after the answer is sent.
	var stats micro.Stats
	require.Eventually(t, func() bool {
		serviceRequest(t, host, "$SRV.STATS", &stats)
		return len(stats.Endpoints) == 2 && stats.Endpoints[1].NumRequests == 1
	}, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, 1, stats.Endpoints[1].NumErrors)
	assert.Contains(t, stats.Endpoints[1].LastError, "payload limit")
}
