package natsbus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// issuer makes an account key for auth_callout's issuer: its seed (the
// brokers') and its public key (the server's).
func issuer(t *testing.T) (seed, public string) {
	t.Helper()
	kp, err := nkeys.CreateAccount()
	require.NoError(t, err)
	s, err := kp.Seed()
	require.NoError(t, err)
	p, err := kp.PublicKey()
	require.NoError(t, err)
	return string(s), p
}

// calloutAuth is the authorization an operator configures for the
// brokers: the brokers' and hosts' users in an account of their own, a
// system account, and the auth callout for everyone else, answered by
// the brokers.
func calloutAuth(issuerKey string) string {
	return fmt.Sprintf(`accounts {
	A2A { users: [ {user: broker, password: brokerpw}, {user: host, password: hostpw} ] }
	SYS { users: [ {user: sys, password: syspw} ] }
}
system_account: SYS
authorization {
	timeout: 2
	auth_callout { issuer: %s, account: A2A, auth_users: [ broker, host, sys ] }
}
`, issuerKey)
}

// calloutConf configures a server alone with calloutAuth.
func calloutConf(name, issuerKey string) string {
	return fmt.Sprintf("listen: \"127.0.0.1:-1\"\nserver_name: %s\n", name) + calloutAuth(issuerKey)
}

// as puts a user and password in a URL.
func as(url, user, password string) string {
	return strings.Replace(url, "nats://", "nats://"+user+":"+password+"@", 1)
}

// calloutBus starts a bus on url with cfg as its callout, in group,
// serving requests with an answer that names the bus and the calling
// session.
func calloutBus(t *testing.T, url, group, name string, cfg natsbus.CalloutConfig) *natsbus.Bus {
	t.Helper()
	b, err := natsbus.New(natsbus.Config{URL: as(url, "broker", "brokerpw"), QueueGroup: group, Callout: cfg, CloseGrace: testGrace})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	require.NoError(t, b.Serve(transport.HandlerFunc(func(_ context.Context, from transport.Caller, raw []byte) []byte {
		req, _ := wire.ParseRequest(raw, 0)
		resp, _ := wire.EncodeResult(req.ID, map[string]string{"by": name, "session": from.Session})
		return resp
	})))
	return b
}

// issue opens a session credential through the bus's a2a.sessions.open.
func issue(t *testing.T, b *natsbus.Bus, session string) wire.SessionCredentials {
	t.Helper()
	open := b.HostMethods()[wire.MethodSessionOpen]
	require.NotNil(t, open, "a2a.sessions.open with a callout")
	params, _ := json.Marshal(wire.SessionParams{ContextID: session})
	res, err := open(context.Background(), params)
	require.NoError(t, err)
	creds, ok := res.(wire.SessionCredentials)
	require.True(t, ok, "%T", res)
	return creds
}

// sessionConn connects with a session credential, as a host must: with
// the session's inbox prefix.
func sessionConn(t *testing.T, url string, creds wire.SessionCredentials, session string, opts ...nats.Option) (*nats.Conn, error) {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.UserInfo(creds.User, creds.Password),
		nats.CustomInboxPrefix(natsbus.SessionInbox(session))}, opts...)...)
	if err == nil {
		t.Cleanup(nc.Close)
	}
	return nc, err
}

// whoAnswers sends a request on the session's subject and returns which
// bus answered, for which session.
func whoAnswers(t *testing.T, nc *nats.Conn, session string) (by, as string, err error) {
	t.Helper()
	req, _ := wire.EncodeRequest(1, "test.who", nil)
	msg, err := inboxRequest(nc, natsbus.RPCSubject(session), req)
	if err != nil {
		return "", "", err
	}
	res, err := wire.DecodeResult(msg.Data)
	if err != nil {
		return "", "", err
	}
	var got struct{ By, Session string }
	err = json.Unmarshal(res, &got)
	return got.By, got.Session, err
}

// closedOnce returns an option that tells when the connection is closed
// for good.
func closedOnce() (nats.Option, <-chan struct{}) {
	c := make(chan struct{})
	return nats.ClosedHandler(func(*nats.Conn) { close(c) }), c
}

func waitFor(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatalf("still waiting: %s", what)
	}
}

// TestCalloutCredentialsAreEnforcedByTheServer: on a server the broker
// does not embed, a2a.sessions.open issues credentials that its auth
// callout admits with the embedded server's session permissions, which
// the server enforces; anything else is refused.
func TestCalloutCredentialsAreEnforcedByTheServer(t *testing.T) {
	seed, pub := issuer(t)
	srv := runNATS(t, calloutConf("n1", pub))
	b := calloutBus(t, srv.url, "", "b1", natsbus.CalloutConfig{Seed: seed})
	creds := issue(t, b, "s1")
	assert.Equal(t, srv.url, creds.URL, "the server's URL, without the broker's user")
	again := issue(t, b, "s1")
	assert.NotEqual(t, creds.User, again.User, "a new credential on every call")
	assert.NotEqual(t, creds.Password, again.Password)

	errOpt, errs := asyncErrors()
	nc, err := sessionConn(t, creds.URL, creds, "s1", errOpt, nats.NoReconnect())
	require.NoError(t, err)
	expectViolation := func(t *testing.T, what string) {
		t.Helper()
		select {
		case err := <-errs:
			assert.ErrorIs(t, err, nats.ErrPermissionViolation, what)
		case <-time.After(5 * time.Second):
			t.Fatalf("the server did not refuse: %s", what)
		}
	}

	t.Run("its own rpc subject", func(t *testing.T) {
		by, session, err := whoAnswers(t, nc, "s1")
		require.NoError(t, err)
		assert.Equal(t, "b1", by)
		assert.Equal(t, "s1", session)
	})
	t.Run("its own events", func(t *testing.T) {
		sub, err := nc.SubscribeSync(natsbus.EventsSubject("s1"))
		require.NoError(t, err)
		require.NoError(t, nc.Flush())
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
	t.Run("the auth callout", func(t *testing.T) {
		require.NoError(t, nc.Publish("$SYS.REQ.USER.AUTH", []byte(`{}`)))
		expectViolation(t, "publish to $SYS.REQ.USER.AUTH")
	})
	t.Run("another inbox", func(t *testing.T) {
		_, err := nc.SubscribeSync("_INBOX.>")
		require.NoError(t, err)
		expectViolation(t, "subscribe to all inboxes")
	})

	t.Run("refused", func(t *testing.T) {
		token, rest, _ := strings.Cut(creds.User, ".")
		gen, nonce, _ := strings.Cut(rest, ".")
		for _, tc := range []struct {
			name string
			opts []nats.Option
		}{
			{"no credential", nil},
			{"a wrong password", []nats.Option{nats.UserInfo(creds.User, creds.Password[:63]+"x")}},
			{"another session's user with the password", []nats.Option{nats.UserInfo("s2."+gen+"."+nonce, creds.Password)}},
			{"another generation with the password", []nats.Option{nats.UserInfo(token+".0000000000000000."+nonce, creds.Password)}},
			{"an unknown user", []nats.Option{nats.UserInfo("nobody", "nothing")}},
			{"a token", []nats.Option{nats.Token(creds.Password)}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				nc, err := nats.Connect(srv.url, append(tc.opts, nats.NoReconnect())...)
				if nc != nil {
					nc.Close()
				}
				assert.ErrorIs(t, err, nats.ErrAuthorization)
			})
		}
	})

	t.Run("the session client", func(t *testing.T) {
		c, err := natsbus.Dial(natsbus.ClientConfig{URL: creds.URL, User: again.User, Password: again.Password, Session: "s1", NoReconnect: true})
		require.NoError(t, err)
		defer c.Close()
		s, err := c.Session(context.Background(), "s1")
		require.NoError(t, err)
		res, err := s.Call(context.Background(), "test.who", struct{}{})
		require.NoError(t, err)
		assert.JSONEq(t, `{"by":"b1","session":"s1"}`, string(res))
	})
}

// TestCalloutSessionsCloseRevokes: a2a.sessions.close revokes the
// session's credentials: its connections are closed and every reconnect
// is refused, while the other sessions' credentials, and a credential
// opened anew, work. With the system account the broker closes them at
// once; without, they end with their user JWT, which a live session's
// connection outlives by reconnecting.
func TestCalloutSessionsCloseRevokes(t *testing.T) {
	seed, pub := issuer(t)
	srv := runNATS(t, calloutConf("n1", pub))

	t.Run("with the system account", func(t *testing.T) {
		b := calloutBus(t, srv.url, "", "b1", natsbus.CalloutConfig{Seed: seed, SystemURL: as(srv.url, "sys", "syspw")})
		creds, other := issue(t, b, "s1"), issue(t, b, "s2")
		closed, isClosed := closedOnce()
		_, err := sessionConn(t, srv.url, creds, "s1", closed, nats.NoReconnect())
		require.NoError(t, err)
		require.NoError(t, b.RevokeSession(context.Background(), "s1"))
		waitFor(t, isClosed, "the revoked session's connection to close")
		_, err = sessionConn(t, srv.url, creds, "s1", nats.NoReconnect())
		assert.ErrorIs(t, err, nats.ErrAuthorization, "the credential is revoked")

		nc, err := sessionConn(t, srv.url, other, "s2", nats.NoReconnect())
		require.NoError(t, err, "other sessions' credentials stay")
		_, session, err := whoAnswers(t, nc, "s2")
		require.NoError(t, err)
		assert.Equal(t, "s2", session)
		anew := issue(t, b, "s1")
		nc, err = sessionConn(t, srv.url, anew, "s1", nats.NoReconnect())
		require.NoError(t, err, "a credential opened after the close")
		_, session, err = whoAnswers(t, nc, "s1")
		require.NoError(t, err)
		assert.Equal(t, "s1", session)
	})

	t.Run("when the user JWT ends", func(t *testing.T) {
		b := calloutBus(t, srv.url, "", "b1", natsbus.CalloutConfig{Seed: seed, UserTTL: time.Second})
		creds, other := issue(t, b, "s1"), issue(t, b, "s2")
		reconnected := make(chan struct{}, 1)
		live, err := sessionConn(t, srv.url, other, "s2", nats.MaxReconnects(-1), nats.ReconnectWait(10*time.Millisecond),
			nats.ReconnectHandler(func(*nats.Conn) {
				select {
				case reconnected <- struct{}{}:
				default:
				}
			}))
		require.NoError(t, err)
		closed, isClosed := closedOnce()
		revoked, err := sessionConn(t, srv.url, creds, "s1", closed, nats.MaxReconnects(-1), nats.ReconnectWait(10*time.Millisecond))
		require.NoError(t, err)

		// The live session's user JWT ends: the server closes its
		// connection, and the reconnect is admitted again.
		waitFor(t, reconnected, "the live session to reconnect when its user JWT ends")
		_, session, err := whoAnswers(t, live, "s2")
		require.NoError(t, err)
		assert.Equal(t, "s2", session)

		require.NoError(t, b.RevokeSession(context.Background(), "s1"))
		waitFor(t, isClosed, "the revoked session's connection to end with its user JWT, its reconnects refused")
		assert.ErrorIs(t, revoked.LastError(), nats.ErrAuthorization)
	})
}

// TestABrokerStartedAnewRefusesTheLastOnesCredentials: with its
// revocations in memory, a broker restarted on the same seed refuses the
// credentials the last one issued, as the embedded server does: it
// cannot know which of them were revoked.
func TestABrokerStartedAnewRefusesTheLastOnesCredentials(t *testing.T) {
	seed, pub := issuer(t)
	srv := runNATS(t, calloutConf("n1", pub))
	first := calloutBus(t, srv.url, "", "b1", natsbus.CalloutConfig{Seed: seed})
	creds := issue(t, first, "s1")
	_, err := sessionConn(t, srv.url, creds, "s1", nats.NoReconnect())
	require.NoError(t, err)
	require.NoError(t, first.Close())
	again := calloutBus(t, srv.url, "", "b2", natsbus.CalloutConfig{Seed: seed})
	_, err = sessionConn(t, srv.url, creds, "s1", nats.NoReconnect())
	assert.ErrorIs(t, err, nats.ErrAuthorization)
	_, err = sessionConn(t, srv.url, issue(t, again, "s1"), "s1", nats.NoReconnect())
	assert.NoError(t, err, "its own credential")
}

func TestMemoryRevocationsMoveASessionToANewGeneration(t *testing.T) {
	ctx := context.Background()
	r := natsbus.NewMemoryRevocations()
	g1, err := r.Current(ctx, "s1")
	require.NoError(t, err)
	other, err := r.Current(ctx, "s2")
	require.NoError(t, err)
	ended, err := r.Revoke(ctx, "s1")
	require.NoError(t, err)
	assert.Equal(t, g1, ended)
	g2, err := r.Current(ctx, "s1")
	require.NoError(t, err)
	assert.NotEqual(t, g1, g2)
	ended, err = r.Revoke(ctx, "s1")
	require.NoError(t, err)
	assert.Equal(t, g2, ended)
	g3, _ := r.Current(ctx, "s1")
	assert.NotContains(t, []uint64{g1, g2}, g3, "never an earlier generation")
	again, _ := r.Current(ctx, "s2")
	assert.Equal(t, other, again, "another session's stays")
	fresh, _ := natsbus.NewMemoryRevocations().Current(ctx, "s2")
	assert.NotEqual(t, other, fresh, "another run starts elsewhere")
}

// TestCalloutCredentialsHoldAcrossBrokers: in a cluster, a credential one
// broker issued is admitted when another broker, on another server,
// answers the callout; a revocation by one holds for the other (they
// share their Revocations) and closes the session's connections on
// every server.
func TestCalloutCredentialsHoldAcrossBrokers(t *testing.T) {
	seed, pub := issuer(t)
	n1, n2 := twoNodes(t, calloutAuth(pub))
	waitRouted(t, connect(t, as(n1.url, "host", "hostpw")), connect(t, as(n2.url, "host", "hostpw")))
	revs := natsbus.NewMemoryRevocations()
	b1 := calloutBus(t, n1.url, "brokers", "b1", natsbus.CalloutConfig{Seed: seed, Revocations: revs, SystemURL: as(n1.url, "sys", "syspw")})
	b2 := calloutBus(t, n2.url, "brokers", "b2", natsbus.CalloutConfig{Seed: seed, Revocations: revs, SystemURL: as(n2.url, "sys", "syspw")})

	creds := issue(t, b1, "s1")
	// While both serve, the group's callouts go to either: every connect
	// is admitted.
	for range 10 {
		nc, err := sessionConn(t, n1.url, creds, "s1", nats.NoReconnect())
		require.NoError(t, err)
		nc.Close()
	}
	// With b1 gone, b2 (on n2) answers the callouts of n1 across the
	// route, and the requests.
	require.NoError(t, b1.Close())
	closed, isClosed := closedOnce()
	var nc *nats.Conn
	require.Eventually(t, func() bool {
		var err error
		nc, err = sessionConn(t, n1.url, creds, "s1", closed, nats.NoReconnect())
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "b2 never admitted b1's credential")
	require.Eventually(t, func() bool {
		by, _, err := whoAnswers(t, nc, "s1")
		return err == nil && by == "b2"
	}, 10*time.Second, 10*time.Millisecond)

	// b2 revokes: the connection on n1 is closed, and no server admits
	// the credential again.
	require.NoError(t, b2.RevokeSession(context.Background(), "s1"))
	waitFor(t, isClosed, "the revoked session's connection on the other server to close")
	for _, url := range []string{n1.url, n2.url} {
		_, err := sessionConn(t, url, creds, "s1", nats.NoReconnect())
		assert.ErrorIs(t, err, nats.ErrAuthorization, url)
	}
}

// TestBrokerSessionsOnAnExternalServer: with a callout, the broker serves
// a2a.sessions.open and a2a.sessions.close on a server it does not
// embed, as on its own.
func TestBrokerSessionsOnAnExternalServer(t *testing.T) {
	seed, pub := issuer(t)
	srv := runNATS(t, calloutConf("n1", pub))
	b, err := natsbus.New(natsbus.Config{URL: as(srv.url, "broker", "brokerpw"), CloseGrace: testGrace,
		Callout: natsbus.CalloutConfig{Seed: seed, SystemURL: as(srv.url, "sys", "syspw")}})
	require.NoError(t, err)
	br, err := broker.New(context.Background(), b, broker.Config{})
	require.NoError(t, err)
	defer func() { b.Close(); br.Close() }()

	host, err := natsbus.Dial(natsbus.ClientConfig{URL: as(srv.url, "host", "hostpw")})
	require.NoError(t, err)
	defer host.Close()
	res, err := host.CallHost(context.Background(), wire.MethodSessionOpen, wire.SessionParams{ContextID: "s1"})
	require.NoError(t, err)
	var creds wire.SessionCredentials
	require.NoError(t, json.Unmarshal(res, &creds))

	c, err := natsbus.Dial(natsbus.ClientConfig{URL: creds.URL, User: creds.User, Password: creds.Password, Session: "s1", NoReconnect: true})
	require.NoError(t, err)
	defer c.Close()
	s, err := c.Session(context.Background(), "s1")
	require.NoError(t, err)
	_, err = s.Call(context.Background(), wire.MethodRegister, wire.RegisterParams{ContextID: "s1", Card: &wire.AgentCard{Name: "a"}})
	require.NoError(t, err)

	res, err = host.CallHost(context.Background(), wire.MethodSessionClose, wire.SessionCloseParams{ContextID: "s1"})
	require.NoError(t, err)
	var closed wire.SessionCloseResult
	require.NoError(t, json.Unmarshal(res, &closed))
	assert.Len(t, closed.Deregistered, 1)
	require.Eventually(t, func() bool {
		_, err := s.Call(context.Background(), wire.MethodListAgents, struct{}{})
		return errors.Is(err, transport.ErrUnavailable) || errors.Is(err, transport.ErrClosed)
	}, 10*time.Second, 10*time.Millisecond, "the closed session's client still calls")
	_, err = sessionConn(t, srv.url, creds, "s1", nats.NoReconnect())
	assert.ErrorIs(t, err, nats.ErrAuthorization)
}

// TestCalloutSettingsAreChecked: New refuses callout and queue settings
// that cannot work.
func TestCalloutSettingsAreChecked(t *testing.T) {
	seed, _ := issuer(t)
	user, err := nkeys.CreateUser()
	require.NoError(t, err)
	userSeed, _ := user.Seed()
	const url = "nats://127.0.0.1:4222"
	for _, tc := range []struct {
		name string
		cfg  natsbus.Config
	}{
		{"a callout without URL", natsbus.Config{Callout: natsbus.CalloutConfig{Seed: seed}}},
		{"a queue group without URL", natsbus.Config{QueueGroup: "brokers"}},
		{"a queue group with a space", natsbus.Config{URL: url, QueueGroup: "my brokers"}},
		{"a seed that is not one", natsbus.Config{URL: url, Callout: natsbus.CalloutConfig{Seed: "SAxyz"}}},
		{"a user's seed", natsbus.Config{URL: url, Callout: natsbus.CalloutConfig{Seed: string(userSeed)}}},
		{"a user TTL under a second", natsbus.Config{URL: url, Callout: natsbus.CalloutConfig{Seed: seed, UserTTL: 500 * time.Millisecond}}},
		{"a negative user TTL", natsbus.Config{URL: url, Callout: natsbus.CalloutConfig{Seed: seed, UserTTL: -time.Second}}},
		{"a system creds file without its URL", natsbus.Config{URL: url, Callout: natsbus.CalloutConfig{Seed: seed, SystemCredsFile: "sys.creds"}}},
		{"callout settings without a seed", natsbus.Config{URL: url, Callout: natsbus.CalloutConfig{SystemURL: url}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.ErrorIs(t, tc.cfg.Validate(), natsbus.ErrBadConfig)
			_, err := natsbus.New(tc.cfg)
			assert.ErrorIs(t, err, natsbus.ErrBadConfig)
		})
	}
	assert.NoError(t, natsbus.Config{URL: url, QueueGroup: "brokers", Callout: natsbus.CalloutConfig{Seed: seed, UserTTL: time.Second}}.Validate())
}
