package natsbus_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/wire"
)

// brokerOn starts the real broker on an embedded bus.
func brokerOn(t *testing.T) *natsbus.Bus {
	t.Helper()
	b := newBus(t)
	br, err := broker.New(context.Background(), b, broker.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close(); br.Close() })
	return b
}

// rawRequest sends one JSON-RPC request with a plain nats.go connection.
func rawRequest(t *testing.T, nc *nats.Conn, subject, method string, params any) (json.RawMessage, error) {
	t.Helper()
	req, err := wire.EncodeRequest(1, method, params)
	require.NoError(t, err)
	msg, err := inboxRequest(nc, subject, req)
	if err != nil {
		return nil, err
	}
	return wire.DecodeResult(msg.Data)
}

// inboxRequest sends a request as a host must: on a session's subject
// a2a.rpc.<T>, with a reply subject in that session's inbox _INBOX.<T>.
func inboxRequest(nc *nats.Conn, subject string, data []byte) (*nats.Msg, error) {
	token, ok := strings.CutPrefix(subject, natsbus.RPCPrefix)
	if !ok {
		return nc.Request(subject, data, 5*time.Second)
	}
	reply := natsbus.InboxPrefix + token + "." + nats.NewInbox()[len(nats.InboxPrefix):]
	sub, err := nc.SubscribeSync(reply)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(subject, reply, data); err != nil {
		return nil, err
	}
	return sub.NextMsg(5 * time.Second)
}

// asyncErrors collects a connection's asynchronous errors.
func asyncErrors() (nats.Option, chan error) {
	c := make(chan error, 16)
	return nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case c <- err:
		default:
		}
	}), c
}

func TestAuthenticationIsRequired(t *testing.T) {
	b := brokerOn(t)
	creds := openSession(t, b, "s1")
	tests := []struct {
		name string
		opts []nats.Option
	}{
		{"no credential", nil},
		{"wrong token", []nats.Option{nats.Token(strings.Repeat("0", 64))}},
		{"token one character short", []nats.Option{nats.Token(b.Server().Token()[:63])}},
		{"unknown user", []nats.Option{nats.UserInfo("nobody", "nothing")}},
		{"wrong password", []nats.Option{nats.UserInfo(creds.User, creds.Password+"x")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nc, err := nats.Connect(b.URL(), append(tc.opts, nats.NoReconnect())...)
			if nc != nil {
				nc.Close()
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, nats.ErrAuthorization)
		})
	}
	t.Run("the host token over TCP", func(t *testing.T) {
		nc, err := nats.Connect(b.URL(), nats.Token(b.Server().Token()))
		require.NoError(t, err)
		nc.Close()
	})
}

func openSession(t *testing.T, b *natsbus.Bus, session string) wire.SessionCredentials {
	t.Helper()
	host, err := b.Connect(natsbus.ClientConfig{})
	require.NoError(t, err)
	defer host.Close()
	res, err := host.CallHost(context.Background(), wire.MethodSessionOpen, wire.SessionParams{ContextID: session})
	require.NoError(t, err)
	var creds wire.SessionCredentials
	require.NoError(t, json.Unmarshal(res, &creds))
	assert.Equal(t, b.URL(), creds.URL)
	assert.Regexp(t, "^[0-9a-f]{32}$", creds.User)
	assert.Regexp(t, "^[0-9a-f]{64}$", creds.Password)
	return creds
}

func TestSessionCredentialsAreEnforcedByTheServer(t *testing.T) {
	b := brokerOn(t)
	creds := openSession(t, b, "s1")
	errOpt, errs := asyncErrors()
	nc, err := nats.Connect(creds.URL, nats.UserInfo(creds.User, creds.Password),
		nats.CustomInboxPrefix(natsbus.SessionInbox("s1")), errOpt, nats.NoReconnect())
	require.NoError(t, err)
	defer nc.Close()

	expectViolation := func(t *testing.T, what string) {
		t.Helper()
		select {
		case err := <-errs:
			assert.ErrorIs(t, err, nats.ErrPermissionViolation, what)
		case <-time.After(5 * time.Second):
			t.Fatalf("the server did not refuse: %s", what)
		}
	}

	t.Run("its own rpc subject works", func(t *testing.T) {
		_, err := rawRequest(t, nc, natsbus.RPCSubject("s1"), wire.MethodRegister, wire.RegisterParams{ContextID: "s1", Card: &wire.AgentCard{Name: "a"}})
		require.NoError(t, err)
	})
	t.Run("its own events subject works", func(t *testing.T) {
		sub, err := nc.SubscribeSync(natsbus.EventsSubject("s1"))
		require.NoError(t, err)
		require.NoError(t, nc.Flush())
		// What the broker publishes there arrives: the subscription was
		// accepted, not refused asynchronously.
		require.NoError(t, b.Publish("s1", []byte(`{"jsonrpc":"2.0","method":"a2a.push","params":{"recipientContextId":"s1"}}`)))
		_, err = sub.NextMsg(5 * time.Second)
		require.NoError(t, err)
		require.NoError(t, sub.Unsubscribe())
		require.NoError(t, nc.Flush())
		select {
		case err := <-errs:
			t.Fatalf("unexpected refusal: %v", err)
		default:
		}
	})
	t.Run("another session's events", func(t *testing.T) {
		_, err := nc.SubscribeSync(natsbus.EventsSubject("s.2"))
		require.NoError(t, err, "the refusal comes asynchronously")
		expectViolation(t, "subscribe to another session's events")
	})
	t.Run("every session's events", func(t *testing.T) {
		_, err := nc.SubscribeSync("a2a.session.*.events")
		require.NoError(t, err)
		expectViolation(t, "subscribe to a wildcard")
	})
	t.Run("another session's rpc subject", func(t *testing.T) {
		require.NoError(t, nc.Publish(natsbus.RPCSubject("s.2"), []byte(`{}`)))
		expectViolation(t, "publish to another session's rpc subject")
	})
	t.Run("the host subject", func(t *testing.T) {
		require.NoError(t, nc.Publish(natsbus.HostRPC, []byte(`{}`)))
		expectViolation(t, "publish to a2a.host.rpc")
	})
	t.Run("the service API", func(t *testing.T) {
		require.NoError(t, nc.Publish("$SRV.STATS", []byte(`{}`)))
		expectViolation(t, "publish to $SRV.STATS")
	})
	t.Run("another inbox", func(t *testing.T) {
		_, err := nc.SubscribeSync("_INBOX.>")
		require.NoError(t, err)
		expectViolation(t, "subscribe to all inboxes")
	})
}

func TestTokenFromAnotherSessionsSubjectIsUnauthorized(t *testing.T) {
	b := brokerOn(t)
	host, err := nats.Connect(b.URL(), nats.Token(b.Server().Token()))
	require.NoError(t, err)
	defer host.Close()
	res, err := rawRequest(t, host, natsbus.RPCSubject("s1"), wire.MethodRegister, wire.RegisterParams{ContextID: "s1", Card: &wire.AgentCard{Name: "a"}})
	require.NoError(t, err)
	var reg wire.RegisterResult
	require.NoError(t, json.Unmarshal(res, &reg))
	_, err = rawRequest(t, host, natsbus.RPCSubject("s2"), wire.MethodListAgents, wire.TokenParams{Token: reg.Token})
	assert.ErrorIs(t, err, wire.ErrUnauthorized)
	_, err = rawRequest(t, host, natsbus.RPCSubject("s2"), wire.MethodRegister, wire.RegisterParams{ContextID: "s1", Card: &wire.AgentCard{Name: "b"}})
	assert.ErrorIs(t, err, wire.ErrUnauthorized, "register for another session")
	_, err = rawRequest(t, host, natsbus.RPCSubject("s1"), wire.MethodListAgents, wire.TokenParams{Token: reg.Token})
	assert.NoError(t, err)
}

func TestSubjectsServeOnlyTheirMethods(t *testing.T) {
	b := brokerOn(t)
	host, err := nats.Connect(b.URL(), nats.Token(b.Server().Token()))
	require.NoError(t, err)
	defer host.Close()
	_, err = rawRequest(t, host, natsbus.RPCSubject("s1"), wire.MethodSessionOpen, wire.SessionParams{ContextID: "s1"})
	assert.ErrorIs(t, err, wire.ErrMethodNotFound, "sessions.* on a session subject")
	_, err = rawRequest(t, host, natsbus.HostRPC, wire.MethodListAgents, wire.TokenParams{Token: "x"})
	assert.ErrorIs(t, err, wire.ErrMethodNotFound, "an agent method on the host subject")
	_, err = rawRequest(t, host, natsbus.HostRPC, wire.MethodSessionOpen, map[string]any{"contextId": 5})
	assert.ErrorIs(t, err, wire.ErrInvalidParams)
	for _, tok := range []string{"~YWJj", "~YS5i=", "~_w"} {
		_, err = rawRequest(t, host, natsbus.RPCPrefix+tok, wire.MethodRegister, wire.RegisterParams{ContextID: "abc", Card: &wire.AgentCard{Name: "a"}})
		assert.ErrorIs(t, err, wire.ErrInvalidRequest, "non-canonical token %q", tok)
	}
}

func TestSessionsCloseRevokesCredentials(t *testing.T) {
	b := brokerOn(t)
	creds := openSession(t, b, "s1")
	other := openSession(t, b, "s2")
	closed := make(chan struct{})
	nc, err := nats.Connect(creds.URL, nats.UserInfo(creds.User, creds.Password), nats.NoReconnect(),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	require.NoError(t, err)
	defer nc.Close()
	host, err := b.Connect(natsbus.ClientConfig{})
	require.NoError(t, err)
	defer host.Close()
	_, err = host.CallHost(context.Background(), wire.MethodSessionClose, wire.SessionParams{ContextID: "s1"})
	require.NoError(t, err)
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the session's connection stayed open")
	}
	_, err = nats.Connect(creds.URL, nats.UserInfo(creds.User, creds.Password), nats.NoReconnect())
	assert.ErrorIs(t, err, nats.ErrAuthorization, "the credential is revoked")
	nc2, err := nats.Connect(other.URL, nats.UserInfo(other.User, other.Password), nats.NoReconnect())
	require.NoError(t, err, "other sessions' credentials stay")
	nc2.Close()
}

func TestListenIsLoopbackUnlessAllowed(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", "192.0.2.1:4222", ":0", "example.invalid:0"} {
		_, err := natsbus.StartServer(natsbus.ServerConfig{Listen: addr})
		assert.True(t, errors.Is(err, natsbus.ErrNotLoopback), "%s: %v", addr, err)
	}
	for _, addr := range []string{"127.0.0.1:0", "localhost:0", "[::1]:0"} {
		s, err := natsbus.StartServer(natsbus.ServerConfig{Listen: addr})
		if addr == "[::1]:0" && err != nil && !errors.Is(err, natsbus.ErrNotLoopback) {
			t.Logf("no IPv6 loopback here: %v", err)
			continue
		}
		require.NoError(t, err, addr)
		assert.True(t, strings.HasPrefix(s.URL(), "nats://127.0.0.1:") || strings.HasPrefix(s.URL(), "nats://[::1]:"), s.URL())
		s.Close()
	}
	s, err := natsbus.StartServer(natsbus.ServerConfig{Listen: "0.0.0.0:0", AllowRemote: true})
	require.NoError(t, err, "explicitly allowed")
	s.Close()
}

func TestExternalServerHasNoSessionsMethods(t *testing.T) {
	url, token := externalServer(t)
	b, err := natsbus.New(natsbus.Config{URL: strings.Replace(url, "nats://", "nats://"+token+"@", 1)})
	require.NoError(t, err)
	br, err := broker.New(context.Background(), b, broker.Config{})
	require.NoError(t, err)
	defer func() { b.Close(); br.Close() }()
	assert.NotContains(t, b.URL(), token, "the URL shown carries no credential")
	c, err := natsbus.Dial(natsbus.ClientConfig{URL: url, Token: token})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.CallHost(context.Background(), wire.MethodSessionOpen, wire.SessionParams{ContextID: "s1"})
	assert.ErrorIs(t, err, wire.ErrMethodNotFound)
}

// TestReplySubjectsStayInTheInboxes: a session credential cannot make the
// broker answer on another session's events subject.
// TestRepliesStayInTheirSessionsInbox: a session's request is answered
// only in that session's inbox (_INBOX.<T>.): a forged reply subject, be
// it another session's events or its inbox, gets nothing published there.
func TestRepliesStayInTheirSessionsInbox(t *testing.T) {
	b := brokerOn(t)
	creds := openSession(t, b, "s1")
	victim := openSession(t, b, "s2")
	// The victim session listens where a forged reply would land.
	spy, err := nats.Connect(victim.URL, nats.UserInfo(victim.User, victim.Password), nats.CustomInboxPrefix(natsbus.SessionInbox("s2")))
	require.NoError(t, err)
	defer spy.Close()
	events, err := spy.SubscribeSync(natsbus.EventsSubject("s2"))
	require.NoError(t, err)
	inbox, err := spy.SubscribeSync(natsbus.SessionInbox("s2") + ".>")
	require.NoError(t, err)
	require.NoError(t, spy.Flush())

	nc, err := nats.Connect(creds.URL, nats.UserInfo(creds.User, creds.Password), nats.CustomInboxPrefix(natsbus.SessionInbox("s1")))
	require.NoError(t, err)
	defer nc.Close()
	for _, forged := range []string{natsbus.EventsSubject("s2"), natsbus.SessionInbox("s2") + ".x", "_INBOX.other"} {
		req, _ := wire.EncodeRequest(1, wire.MethodRegister, wire.RegisterParams{ContextID: "s1", Card: &wire.AgentCard{Name: "a"}})
		require.NoError(t, nc.PublishRequest(natsbus.RPCSubject("s1"), forged, req))
	}
	require.NoError(t, nc.Flush())
	// A proper request afterwards is answered: the forged ones were seen
	// first and ignored.
	_, err = rawRequest(t, nc, natsbus.RPCSubject("s1"), wire.MethodRegister, wire.RegisterParams{ContextID: "s1", Card: &wire.AgentCard{Name: "b"}})
	require.NoError(t, err)
	_, err = events.NextMsg(200 * time.Millisecond)
	assert.ErrorIs(t, err, nats.ErrTimeout, "nothing was published on s2's events")
	_, err = inbox.NextMsg(50 * time.Millisecond)
	assert.ErrorIs(t, err, nats.ErrTimeout, "nothing was published in s2's inbox")
}

// TestABadSubjectTokenIsAnsweredWithTheRequestsID: JSON-RPC keeps the id
// whenever it can be read.
func TestABadSubjectTokenIsAnsweredWithTheRequestsID(t *testing.T) {
	b := brokerOn(t)
	host, err := nats.Connect(b.URL(), nats.Token(b.Server().Token()))
	require.NoError(t, err)
	defer host.Close()
	req, _ := wire.EncodeRequest(42, wire.MethodListAgents, wire.TokenParams{Token: "x"})
	msg, err := inboxRequest(host, natsbus.RPCPrefix+"~YS5i=", req)
	require.NoError(t, err)
	var resp wire.Response
	require.NoError(t, json.Unmarshal(msg.Data, &resp))
	assert.JSONEq(t, "42", string(resp.ID))
	require.NotNil(t, resp.Error)
	assert.Equal(t, wire.ErrInvalidRequest.Code, resp.Error.Code)
}

func TestURLsAreShownWithoutCredentials(t *testing.T) {
	for in, want := range map[string]string{
		"nats://u:s3cr3t@127.0.0.1:4222":  "nats://127.0.0.1:4222",
		"u:s3cr3t@127.0.0.1:4222":         "nats://127.0.0.1:4222",
		"tok3n@host:1,nats://a:b@other:2": "nats://host:1,nats://other:2",
		"nats://127.0.0.1:4222":           "nats://127.0.0.1:4222",
	} {
		got := natsbus.Redact(in)
		assert.Equal(t, want, got)
		assert.NotContains(t, got, "s3cr3t")
	}
}

// warnings records the messages logged at WARN or above.
type warnings struct {
	mu  sync.Mutex
	got []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler           { return w }
func (w *warnings) WithGroup(string) slog.Handler                { return w }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.got = append(w.got, r.Message)
	return nil
}

// TestClosingASessionIsNotAWarning: a2a.sessions.close closes the
// broker's own connection serving the session; that is the close asked
// for, not a connection the server cut, so it is neither served anew nor
// logged as a warning.
func TestClosingASessionIsNotAWarning(t *testing.T) {
	var w warnings
	b, err := natsbus.New(natsbus.Config{MaxMessageBytes: testLimit, CloseGrace: testGrace, Logger: slog.New(&w)})
	require.NoError(t, err)
	br, err := broker.New(context.Background(), b, broker.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close(); br.Close() })
	openSession(t, b, "s1")
	host, err := b.Connect(natsbus.ClientConfig{})
	require.NoError(t, err)
	defer host.Close()
	_, err = host.CallHost(context.Background(), wire.MethodSessionClose, wire.SessionCloseParams{ContextID: "s1"})
	require.NoError(t, err)
	// The served connection's close handler runs on its own goroutine:
	// wait until it has run and any replacement is done.
	require.Eventually(t, func() bool { return b.Reserves() == 1 }, 5*time.Second, 10*time.Millisecond)
	w.mu.Lock()
	defer w.mu.Unlock()
	assert.Empty(t, w.got)
}
