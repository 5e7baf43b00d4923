package e2e_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/internal/natscluster"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/wire"
)

// The users of the callout cluster's config: the brokers and the hosts
// are in the account A2A and skip the auth callout; every other client
// is admitted, or not, by the brokers' answer to the callout, as a user
// of A2A with a session's permissions.
const (
	calloutBrokerUser, calloutBrokerPass = "broker", "broker-pw-0123456789abcdef"
	calloutHostUser, calloutHostPass     = "host", "host-pw-0123456789abcdef"
	calloutSysUser, calloutSysPass       = "sys", "sys-pw-0123456789abcdef"
)

// calloutServerConfig is what every nats-server of the cluster holds for
// session credentials issued by the brokers (docs/CLUSTER-AUTH.md):
// issuer is the public key of the brokers' --nats-callout-seed. The
// hosts' and the system user's permissions are the least each needs.
func calloutServerConfig(issuer string) string {
	return fmt.Sprintf(`accounts {
  A2A {
    jetstream: enabled
    users: [
      {user: %q, password: %q}
      {user: %q, password: %q, permissions: {
        publish: ["a2a.host.rpc", "a2a.rpc.*"]
        subscribe: ["a2a.session.*.events", "_INBOX.>"]
      }}
    ]
  }
  SYS {
    users: [
      {user: %q, password: %q, permissions: {
        publish: ["$SYS.REQ.SERVER.PING.CONNZ", "$SYS.REQ.SERVER.*.KICK"]
        subscribe: ["_INBOX.>"]
      }}
    ]
  }
}
system_account: SYS
authorization {
  timeout: 2
  auth_callout {
    issuer: %s
    account: A2A
    auth_users: [ %q, %q, %q ]
  }
}
`, calloutBrokerUser, calloutBrokerPass, calloutHostUser, calloutHostPass, calloutSysUser, calloutSysPass,
		issuer, calloutBrokerUser, calloutHostUser, calloutSysUser)
}

// withUser puts a user and password in a URL.
func withUser(url, user, password string) string {
	return strings.Replace(url, "nats://", "nats://"+user+":"+password+"@", 1)
}

// startCalloutCluster starts three nats-server processes clustered with
// JetStream whose session credentials come from the auth callout, and on
// each a broker (a2a-bus serve --state=jetstream --nats-callout-seed),
// joined to its own node as the brokers' user, with the system account
// on the same node for closing connections.
func startCalloutCluster(t *testing.T) *testCluster {
	t.Helper()
	kp, err := nkeys.CreateAccount()
	require.NoError(t, err)
	seed, err := kp.Seed()
	require.NoError(t, err)
	issuerKey, err := kp.PublicKey()
	require.NoError(t, err)
	seedFile := filepath.Join(t.TempDir(), "issuer.nk")
	require.NoError(t, os.WriteFile(seedFile, seed, 0o600))
	c := &testCluster{}
	c.joinArgs = func(i int) []string {
		return []string{"--nats-url", withUser(c.nats.URL(i), calloutBrokerUser, calloutBrokerPass),
			"--nats-callout-seed", seedFile,
			"--nats-system-url", withUser(c.nats.URL(i), calloutSysUser, calloutSysPass)}
	}
	c.start(t, natscluster.Options{Extra: calloutServerConfig(issuerKey),
		ProbeUser: calloutBrokerUser, ProbePassword: calloutBrokerPass})
	return c
}

// calloutHost dials node i as a host: the hosts' user.
func calloutHost(c *testCluster, i int) *natsbus.Client {
	t := c.t
	cl, err := natsbus.Dial(natsbus.ClientConfig{URL: withUser(c.nats.URL(i), calloutHostUser, calloutHostPass), Broker: fmt.Sprintf("host%d", i)})
	require.NoError(t, err)
	t.Cleanup(func() { cl.Close() })
	return cl
}

// openCredential asks for a session credential (a2a.sessions.open),
// which any broker may answer.
func openCredential(t *testing.T, host *natsbus.Client, session string) wire.SessionCredentials {
	t.Helper()
	res, err := host.CallHost(context.Background(), wire.MethodSessionOpen, wire.SessionParams{ContextID: session})
	require.NoError(t, err)
	var creds wire.SessionCredentials
	require.NoError(t, json.Unmarshal(res, &creds))
	return creds
}

// closeSession closes a session (a2a.sessions.close), which any broker
// may answer.
func closeSession(t *testing.T, host *natsbus.Client, session string) wire.SessionCloseResult {
	t.Helper()
	res, err := host.CallHost(context.Background(), wire.MethodSessionClose, wire.SessionCloseParams{ContextID: session})
	require.NoError(t, err)
	var closed wire.SessionCloseResult
	require.NoError(t, json.Unmarshal(res, &closed))
	return closed
}

// issuer is the node whose broker issued creds: a broker gives its own
// --nats-url, without its user, in the credentials it issues.
func issuer(t *testing.T, c *testCluster, creds wire.SessionCredentials) int {
	t.Helper()
	for i := range c.nats.N() {
		if creds.URL == c.nats.URL(i) {
			return i
		}
	}
	t.Fatalf("a credential for %q, which is no node's URL", creds.URL)
	return -1
}

// sessionClient dials node i with a session credential, as a host's
// agent process does.
func sessionClient(t *testing.T, c *testCluster, i int, creds wire.SessionCredentials, session string, noReconnect bool) *natsbus.Client {
	t.Helper()
	cl, err := natsbus.Dial(natsbus.ClientConfig{URL: c.nats.URL(i), User: creds.User, Password: creds.Password, Session: session, NoReconnect: noReconnect,
		Broker: fmt.Sprintf("host%d", i)})
	require.NoError(t, err, "node %d refused the session credential", i)
	t.Cleanup(func() { cl.Close() })
	return cl
}

// rawSessionConn connects to node i with a session credential, as a
// client that would go beyond what the runtime does.
func rawSessionConn(t *testing.T, c *testCluster, i int, creds wire.SessionCredentials, session string, opts ...nats.Option) (*nats.Conn, error) {
	t.Helper()
	nc, err := nats.Connect(c.nats.URL(i), append([]nats.Option{nats.UserInfo(creds.User, creds.Password),
		nats.CustomInboxPrefix(natsbus.SessionInbox(session)),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})}, opts...)...)
	if err == nil {
		t.Cleanup(nc.Close)
	}
	return nc, err
}

// refusedEverywhere checks that no node admits creds.
func refusedEverywhere(t *testing.T, c *testCluster, creds wire.SessionCredentials, session string) {
	t.Helper()
	for i := range c.nats.N() {
		nc, err := nats.Connect(c.nats.URL(i), nats.UserInfo(creds.User, creds.Password),
			nats.CustomInboxPrefix(natsbus.SessionInbox(session)), nats.NoReconnect())
		if nc != nil {
			nc.Close()
		}
		assert.ErrorIs(t, err, nats.ErrAuthorization, "node %d admitted a closed session's credential", i)
	}
}

// watchClose returns an option that tells when a connection is closed
// for good.
func watchClose() (nats.Option, chan struct{}) {
	c := make(chan struct{})
	return nats.ClosedHandler(func(*nats.Conn) { close(c) }), c
}

// brokerSessionErrors sums, over the brokers that answer, the requests
// their session endpoint refused or answered with an error ($SRV.STATS),
// once want brokers have answered. The answers come on host's connection
// after whatever each broker published before it.
func brokerSessionErrors(t *testing.T, nc *nats.Conn, want int) int {
	t.Helper()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	require.NoError(t, err)
	defer sub.Unsubscribe()
	subj, err := micro.ControlSubject(micro.StatsVerb, natsbus.ServiceName, "")
	require.NoError(t, err)
	require.NoError(t, nc.PublishRequest(subj, inbox, nil))
	seen := map[string]bool{}
	total := 0
	for len(seen) < want {
		msg, err := sub.NextMsg(30 * time.Second)
		require.NoError(t, err, "%d of %d brokers answered $SRV.STATS", len(seen), want)
		var st micro.Stats
		require.NoError(t, json.Unmarshal(msg.Data, &st))
		if seen[st.ID] {
			continue
		}
		seen[st.ID] = true
		for _, ep := range st.Endpoints {
			if ep.Name == "session" {
				total += ep.NumErrors
			}
		}
	}
	return total
}

// TestClusterSessionCredentialsAcrossHosts: on three nats-servers whose
// auth callout the three brokers answer, a session credential any broker
// issued is admitted on every node with a session's permissions only,
// which the servers enforce; a2a.sessions.close on any broker revokes it
// on every node and closes its connections wherever they are; and a
// credential outlives the broker that issued it until its session is
// closed.
func TestClusterSessionCredentialsAcrossHosts(t *testing.T) {
	c := startCalloutCluster(t)
	ctx := context.Background()
	tap := c.tap(withUser(c.nats.URL(0), calloutHostUser, calloutHostPass))
	host0, host1 := calloutHost(c, 0), calloutHost(c, 1)

	// Any broker answers a2a.sessions.open: host 0's requests spread over
	// the three, and each credential names its broker's node. (A third
	// of the answers each: 200 tries all miss one broker with a
	// probability under 1e-34.)
	byIssuer := map[int]wire.SessionCredentials{}
	for try := 0; len(byIssuer) < 3 && try < 200; try++ {
		creds := openCredential(t, host0, "alpha")
		byIssuer[issuer(t, c, creds)] = creds
	}
	require.Len(t, byIssuer, 3, "a2a.sessions.open is not answered by every broker")

	// A credential broker 0 issued, used on host 2's node: its agent
	// works a task with an agent of another session on host 1's node.
	alpha := byIssuer[0]
	beta := openCredential(t, host1, "beta")
	alphaClient := sessionClient(t, c, 2, alpha, "alpha", false)
	betaClient := sessionClient(t, c, 1, beta, "beta", false)
	asker := c.delegate(alphaClient, "alpha", "asker")
	worker := c.delegate(betaClient, "beta", "worker")
	task, err := asker.Send(ctx, "worker", clusterText("work across hosts"), nil)
	require.NoError(t, err)
	assert.Equal(t, "beta", task.AgentContextID)
	workTask(t, asker, worker, task.ID)

	t.Run("the servers refuse what a session may not do", func(t *testing.T) {
		errs := make(chan error, 64)
		nc, err := rawSessionConn(t, c, 2, alpha, "alpha", nats.NoReconnect(),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
		require.NoError(t, err)
		refused := func(t *testing.T, what, subject string) {
			t.Helper()
			select {
			case err := <-errs:
				assert.ErrorIs(t, err, nats.ErrPermissionViolation)
				assert.Contains(t, err.Error(), fmt.Sprintf("%s to %q", what, subject))
			case <-time.After(10 * time.Second):
				t.Fatalf("the server did not refuse the %s to %s", what, subject)
			}
		}
		credKey := "$KV.a2a_credentials." + base64.RawURLEncoding.EncodeToString([]byte("alpha"))
		for _, subject := range []string{
			natsbus.RPCSubject("beta"), // another session's requests
			natsbus.HostRPC,            // the host's methods
			"a2a.log.beta.e",           // another session's notifications, before they are stored
			"a2a.log.alpha.e",          // its own
			"a2a.log.alpha.m",
			credKey,                             // its own credentials' generation
			"$KV.a2a_agents.x",                  // the registrations
			"$KV.a2a_tasks.x",                   // the tasks
			"$JS.API.INFO",                      // the JetStream API
			"$JS.API.STREAM.MSG.GET.A2A_EVENTS", // the events stream, read through its leader
			"$JS.API.DIRECT.GET.A2A_EVENTS.a2a.log.beta.e",
			"$JS.API.STREAM.PURGE.A2A_EVENTS",
			"$SYS.REQ.USER.AUTH", // the auth callout
		} {
			require.NoError(t, nc.Publish(subject, []byte(`{}`)))
			refused(t, "Publish", subject)
		}
		for _, subject := range []string{
			natsbus.EventsSubject("beta"),       // another session's events
			"a2a.session.*.events",              // every session's
			"a2a.log.>",                         // the events stream's subjects
			"$KV.>",                             // the buckets'
			"$JS.API.>",                         // the JetStream API's answers
			"_INBOX.>",                          // every inbox
			natsbus.SessionInbox("beta") + ".>", // another session's replies
			natsbus.RPCSubject("beta"),          // another session's requests
		} {
			_, err := nc.SubscribeSync(subject)
			require.NoError(t, err, "the refusal comes asynchronously")
			refused(t, "Subscription", subject)
		}

		// Nor can a session have the brokers publish for it: a request on
		// its own subject whose reply subject is elsewhere is dropped, not
		// answered there. A spy of the brokers' account listens where the
		// answers would go; the brokers' counts of refused requests tell
		// when every one has been dealt with, and come after whatever
		// each broker published before.
		replies := []string{"a2a.log.beta.e", natsbus.EventsSubject("beta"), credKey, "$JS.API.STREAM.PURGE.A2A_EVENTS",
			natsbus.HostRPC, natsbus.SessionInbox("beta") + ".x", "_INBOX.elsewhere"}
		spy, err := nats.Connect(withUser(c.nats.URL(0), calloutBrokerUser, calloutBrokerPass))
		require.NoError(t, err)
		defer spy.Close()
		leaked := make(chan *nats.Msg, 1024)
		for _, reply := range replies {
			_, err = spy.ChanSubscribe(reply, leaked)
			require.NoError(t, err)
		}
		require.NoError(t, spy.Flush())
		before := brokerSessionErrors(t, spy, 3)
		const marker = 987654321
		req, err := wire.EncodeRequest(marker, wire.MethodListAgents, nil)
		require.NoError(t, err)
		for _, reply := range replies {
			require.NoError(t, nc.PublishRequest(natsbus.RPCSubject("alpha"), reply, req))
		}
		require.NoError(t, nc.Flush())
		require.Eventually(t, func() bool {
			return brokerSessionErrors(t, spy, 3)-before >= len(replies)
		}, 30*time.Second, 50*time.Millisecond, "the brokers never dealt with the requests")
	drain:
		for {
			select {
			case m := <-leaked:
				if strings.Contains(string(m.Data), fmt.Sprint(marker)) {
					t.Errorf("a broker answered a session's request on %s: %s", m.Subject, m.Data)
				}
			default:
				break drain
			}
		}
		select {
		case err := <-errs:
			t.Errorf("an unexpected refusal: %v", err)
		default:
		}
	})

	// a2a.sessions.close on whichever broker answers host 1 revokes the
	// credential on every node: its connections on nodes 0 and 2 are
	// closed, their reconnects refused, and a new connection refused
	// everywhere; the other session's go on.
	onNode0, closed0 := watchClose()
	live0, err := rawSessionConn(t, c, 0, alpha, "alpha", onNode0, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	require.NoError(t, err)
	res := closeSession(t, host1, "alpha")
	assert.Equal(t, []string{"asker"}, res.Deregistered)
	for what, gone := range map[string]<-chan struct{}{"node 0's connection": closed0, "node 2's client": alphaClient.Gone()} {
		select {
		case <-gone:
		case <-time.After(30 * time.Second):
			t.Fatalf("the closed session's %s is still open", what)
		}
	}
	assert.ErrorIs(t, live0.LastError(), nats.ErrAuthorization, "node 0 admitted the reconnect")
	for _, creds := range byIssuer {
		refusedEverywhere(t, c, creds, "alpha")
	}
	_, err = worker.Peers(ctx)
	require.NoError(t, err, "the other session's agent")

	// A credential that broker 1 issued outlives broker 1 (kill -9): the
	// others admit it on every node, serve its agent, and revoke it.
	var gamma wire.SessionCredentials
	for try := 0; try < 200; try++ {
		if gamma = openCredential(t, host0, "gamma"); issuer(t, c, gamma) == 1 {
			break
		}
	}
	require.Equal(t, 1, issuer(t, c, gamma), "broker 1 never answered")
	c.killBroker(1)
	var lives []<-chan struct{}
	for i := range c.nats.N() {
		require.Eventually(t, func() bool {
			onClose, closed := watchClose()
			if _, err := rawSessionConn(t, c, i, gamma, "gamma", onClose, nats.NoReconnect()); err != nil {
				return false
			}
			lives = append(lives, closed)
			return true
		}, 30*time.Second, 50*time.Millisecond, "node %d refused a credential of a killed broker", i)
	}
	survivor := c.delegate(sessionClient(t, c, 1, gamma, "gamma", true), "gamma", "survivor")
	peers, err := survivor.Peers(ctx)
	require.NoError(t, err)
	var names []string
	for _, p := range peers {
		names = append(names, p.AgentID)
	}
	assert.Contains(t, names, "worker")
	res = closeSession(t, host0, "gamma")
	assert.Equal(t, []string{"survivor"}, res.Deregistered)
	for i, closed := range lives {
		select {
		case <-closed:
		case <-time.After(30 * time.Second):
			t.Fatalf("the closed session's connection on node %d is still open", i)
		}
	}
	refusedEverywhere(t, c, gamma, "gamma")

	tap.mu.Lock()
	defer tap.mu.Unlock()
	assert.Empty(t, tap.wrong, "a notification on another session's subject")
}
