package natsbus_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/wire"
)

func TestWebSocketOrigins(t *testing.T) {
	def := natsbus.DefaultWebSocketOrigins
	for _, tc := range []struct {
		list   []string
		origin string
		ok     bool
	}{
		// The default: Electron and local development, no web page.
		{def, "file://", true},
		{def, "app://bundle", true},
		{def, "myapp://main-window:8080", true},
		{def, "http://localhost:5173", true},
		{def, "http://LOCALHOST:3000", true},
		{def, "http://localhost", true},
		{def, "http://127.0.0.1:8080", true},
		{def, "http://[::1]:8080", true},
		{def, "https://localhost:5173", false},
		{def, "https://example.com", false},
		{def, "http://example.com", false},
		{def, "http://localhost.example.com:80", false},
		{def, "http://127.0.0.2:80", false},
		{def, "null", false}, // sandboxed frames of any site, and Chromium's file:// pages
		{def, "file:///etc/passwd", false},
		{def, "http://user@localhost:80", false},
		{def, "http://localhost:80/path", false},
		{def, "not an origin", false},
		{def, "://x", false},
		// Listed ones.
		{[]string{"app://bundle"}, "app://bundle", true},
		{[]string{"app://bundle"}, "app://other", false},
		{[]string{"app://bundle"}, "file://", false},
		{[]string{"https://app.example:8443"}, "https://app.example:8443", true},
		{[]string{"https://app.example:8443"}, "https://app.example", false},
		{[]string{"https://app.example"}, "https://app.example:443", true},
		{[]string{"https://app.example"}, "http://app.example", false},
		{[]string{"null"}, "null", true},
		{[]string{"*://*"}, "https://example.com", false}, // a scheme wildcard never means the web
		{[]string{"*://*"}, "http://localhost:1", false},
		{[]string{"*://*"}, "null", false},
		{[]string{"app://*"}, "app://x:81", true},
		{[]string{}, "http://localhost:1", false},
		{def, "file://host", false},                // "file://" is that origin exactly
		{def, "http://[0:0:0:0:0:0:0:1]:80", true}, // as a browser would not write it, but the same address
		{[]string{"http://[::1]:8080"}, "http://[0::1]:8080", true},
		{[]string{"http://xn--bcher-kva.example"}, "http://xn--bcher-kva.example", true},
	} {
		assert.Equal(t, tc.ok, natsbus.AllowedOrigin(tc.list, tc.origin), "%q with %q", tc.origin, tc.list)
	}
	for _, bad := range []string{"", "localhost", "http://", "http://*.example.com", "http://x/y", "http://x:port", "1http://x", "http://x:123456", "http://a:b:c",
		"null://x", "file://x", "http://[abc]", "http://[localhost]:*", "http://[127.0.0.1]", "http://x:0", "http://x:080", "http://x:99999",
		"http://bücher.example", "http://local host", "http://exa%41mple", "http://*", "https://*", "http://x.", "http://.x"} {
		err := natsbus.ServerConfig{WebSocketOrigins: []string{bad}}.Validate()
		assert.ErrorIs(t, err, natsbus.ErrBadOrigin, "%q", bad)
	}
	assert.ErrorIs(t, natsbus.ServerConfig{WebSocketListen: "0.0.0.0:0"}.Validate(), natsbus.ErrNotLoopback)
	assert.NoError(t, natsbus.ServerConfig{WebSocketListen: "0.0.0.0:0", AllowRemote: true}.Validate())
}

// wsBroker is a broker on a bus with a WebSocket listener.
func wsBroker(t *testing.T, origins ...string) *natsbus.Bus {
	t.Helper()
	cfg := natsbus.Config{MaxMessageBytes: testLimit, CloseGrace: testGrace,
		Server: natsbus.ServerConfig{WebSocketListen: "127.0.0.1:0", WebSocketOrigins: origins}}
	b, err := natsbus.New(cfg)
	require.NoError(t, err)
	br, err := broker.New(context.Background(), b, broker.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close(); br.Close() })
	return b
}

// upgrade sends a WebSocket upgrade request to addr with origin (none
// when "") and returns the status of the answer.
func upgrade(t *testing.T, addr, origin string) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	req := "GET / HTTP/1.1\r\nHost: " + addr + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
	if origin != "" {
		req += "Origin: " + origin + "\r\n"
	}
	_, err = c.Write([]byte(req + "\r\n"))
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

func TestWebSocketListenerChecksOrigins(t *testing.T) {
	b := wsBroker(t)
	ws := b.Server().WebSocketURL()
	require.True(t, strings.HasPrefix(ws, "ws://127.0.0.1:"), ws)
	creds := openSession(t, b, "s1")
	assert.Equal(t, ws, creds.WSURL, "a2a.sessions.open names the WebSocket listener")
	addr := strings.TrimPrefix(ws, "ws://")

	assert.Equal(t, http.StatusSwitchingProtocols, upgrade(t, addr, "http://localhost:5173"))
	assert.Equal(t, http.StatusSwitchingProtocols, upgrade(t, addr, "file://"))
	assert.Equal(t, http.StatusSwitchingProtocols, upgrade(t, addr, ""), "no Origin: not a browser, as a TCP client")
	assert.Equal(t, http.StatusForbidden, upgrade(t, addr, "https://evil.example"))
	assert.Equal(t, http.StatusForbidden, upgrade(t, addr, "null"))

	// The server's own listener, behind the gate, refuses every origin
	// a page can have: a page that finds its port gets nowhere.
	backend := strings.TrimPrefix(b.Server().WebSocketBackend(), "ws://")
	require.NotEqual(t, addr, backend)
	assert.Equal(t, http.StatusForbidden, upgrade(t, backend, "http://localhost:5173"))
	assert.Equal(t, http.StatusForbidden, upgrade(t, backend, "file://"))

	// Plain HTTP gets a word, not a hang.
	resp, err := http.Get("http://" + addr + "/")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUpgradeRequired, resp.StatusCode)

	// Listed origins replace the default.
	b2 := wsBroker(t, "app://bundle")
	addr2 := strings.TrimPrefix(b2.Server().WebSocketURL(), "ws://")
	assert.Equal(t, http.StatusSwitchingProtocols, upgrade(t, addr2, "app://bundle"))
	assert.Equal(t, http.StatusForbidden, upgrade(t, addr2, "http://localhost:5173"))
}

func TestNoWebSocketListenerByDefault(t *testing.T) {
	b := brokerOn(t)
	assert.Empty(t, b.Server().WebSocketURL())
	creds := openSession(t, b, "s1")
	assert.Empty(t, creds.WSURL)
}

// TestSessionCredentialsOverWebSocket: over WebSocket a session
// credential has exactly the rights it has over TCP, and calls work.
func TestSessionCredentialsOverWebSocket(t *testing.T) {
	b := wsBroker(t)
	creds := openSession(t, b, "s1")
	errOpt, errs := asyncErrors()
	nc, err := nats.Connect(creds.WSURL, nats.UserInfo(creds.User, creds.Password),
		nats.CustomInboxPrefix(natsbus.SessionInbox("s1")), errOpt, nats.NoReconnect())
	require.NoError(t, err)
	defer nc.Close()
	res, err := rawRequest(t, nc, natsbus.RPCSubject("s1"), wire.MethodRegister, wire.RegisterParams{ContextID: "s1", Card: &wire.AgentCard{Name: "a"}})
	require.NoError(t, err)
	var reg wire.RegisterResult
	require.NoError(t, json.Unmarshal(res, &reg))
	assert.Equal(t, "a", reg.AgentID)

	_, err = nc.SubscribeSync(natsbus.EventsSubject("s2"))
	require.NoError(t, err, "the refusal comes asynchronously")
	select {
	case err := <-errs:
		assert.ErrorIs(t, err, nats.ErrPermissionViolation)
	case <-time.After(5 * time.Second):
		t.Fatal("the server did not refuse another session's events over WebSocket")
	}
	require.NoError(t, nc.Publish(natsbus.HostRPC, []byte(`{}`)))
	select {
	case err := <-errs:
		assert.ErrorIs(t, err, nats.ErrPermissionViolation)
	case <-time.After(5 * time.Second):
		t.Fatal("the server did not refuse the host subject over WebSocket")
	}

	assert.ErrorIs(t, connectRefused(t, creds.WSURL, nats.UserInfo(creds.User, "wrong")), nats.ErrAuthorization, "a wrong password over WebSocket")

	// Revoking the session closes its WebSocket connections too.
	host, err := b.Connect(natsbus.ClientConfig{})
	require.NoError(t, err)
	defer host.Close()
	_, err = host.CallHost(context.Background(), wire.MethodSessionClose, wire.SessionCloseParams{ContextID: "s1"})
	require.NoError(t, err)
	require.Eventually(t, nc.IsClosed, 10*time.Second, 10*time.Millisecond, "a2a.sessions.close closes the session's WebSocket connection")
}

// TestWebSocketConnectionsEndAtClose: closing the bus ends the
// connections the listener carries (and its goroutines: goleak checks).
func TestWebSocketConnectionsEndAtClose(t *testing.T) {
	b := wsBroker(t)
	creds := openSession(t, b, "s1")
	closed := make(chan struct{})
	nc, err := nats.Connect(creds.WSURL, nats.UserInfo(creds.User, creds.Password),
		nats.CustomInboxPrefix(natsbus.SessionInbox("s1")), nats.NoReconnect(),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	require.NoError(t, err)
	defer nc.Close()
	require.NoError(t, nc.Flush())
	require.NoError(t, b.Close())
	require.NoError(t, b.Close(), "idempotent")
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the WebSocket client was not cut at close")
	}
}

// TestTheWebSocketGateLetsGoOfWhatTheServerCut: a connection the server
// ended (here: no CONNECT within its auth timeout) is closed at the gate
// too, and forgotten, although its client never closes its side.
func TestTheWebSocketGateLetsGoOfWhatTheServerCut(t *testing.T) {
	b := wsBroker(t)
	addr := strings.TrimPrefix(b.Server().WebSocketURL(), "ws://")
	var conns []net.Conn
	for range 20 {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		require.NoError(t, err)
		conns = append(conns, c)
		defer c.Close()
		_, err = c.Write([]byte("GET / HTTP/1.1\r\nHost: " + addr + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"))
		require.NoError(t, err)
	}
	for _, c := range conns {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(30*time.Second)))
		_, err := io.Copy(io.Discard, c) // until the server's end reaches it
		require.NoError(t, err, "the gate closed the connection")
	}
	require.Eventually(t, func() bool { return b.Server().WebSocketConns() == 0 }, 10*time.Second, 10*time.Millisecond,
		"the gate let go of every connection the server ended")
}

// stallConn is a connection whose reads block once stalled.
type stallConn struct {
	net.Conn
	stall, release chan struct{}
}

func (c *stallConn) Read(p []byte) (int, error) {
	select {
	case <-c.stall:
		<-c.release // a reader that stopped; the gate must give up on it
		return 0, net.ErrClosed
	default:
	}
	return c.Conn.Read(p)
}

type stallDialer struct{ conn *stallConn }

func (d *stallDialer) Dial(network, addr string) (net.Conn, error) {
	c, err := net.Dial(network, addr)
	if err != nil {
		return nil, err
	}
	d.conn = &stallConn{Conn: c, stall: make(chan struct{}), release: make(chan struct{})}
	return d.conn, nil
}

// TestTheWebSocketGateCutsAReaderThatStopped: a page that stops reading
// is cut by the server after its write deadline, and by the gate too:
// what waits for it is let go, as on TCP.
func TestTheWebSocketGateCutsAReaderThatStopped(t *testing.T) {
	b := wsBroker(t)
	creds := openSession(t, b, "s1")
	d := &stallDialer{}
	nc, err := nats.Connect(creds.WSURL, nats.UserInfo(creds.User, creds.Password), nats.SetCustomDialer(d),
		nats.CustomInboxPrefix(natsbus.SessionInbox("s1")), nats.NoReconnect())
	require.NoError(t, err)
	defer close(d.conn.release)
	defer nc.Close()
	_, err = nc.Subscribe(natsbus.EventsSubject("s1"), func(*nats.Msg) {})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	require.Equal(t, 1, b.Server().WebSocketConns())
	close(d.conn.stall)
	payload := []byte(`{"jsonrpc":"2.0","method":"a2a.push","params":{"recipientContextId":"s1","pad":"` + strings.Repeat("x", 64<<10) + `"}}`)
	// 32 MiB: past every buffer on the way (the kernel's, the gate's, the
	// server's slow-consumer bound), so that a write to the reader
	// blocks, whichever side meets it first.
	for range 512 {
		require.NoError(t, b.Publish("s1", payload))
	}
	require.Eventually(t, func() bool { return b.Server().WebSocketConns() == 0 }, 60*time.Second, 10*time.Millisecond,
		"the gate still holds a reader that stopped")
}

// TestASessionSubscriptionCountsOnce: a2a.admin.sessions' subscribers
// count each subscription to a session's events once, whether a session
// credential (over TCP or WebSocket) or the host token made it.
func TestASessionSubscriptionCountsOnce(t *testing.T) {
	b := wsBroker(t)
	count := func() int {
		t.Helper()
		n, ok := b.Subscribers("s1")
		require.True(t, ok)
		return n
	}
	base := count() // the broker's own, if any
	for i, url := range []string{"tcp", "ws"} {
		creds := openSession(t, b, "s1")
		if url == "ws" {
			url = creds.WSURL
		} else {
			url = creds.URL
		}
		nc, err := nats.Connect(url, nats.UserInfo(creds.User, creds.Password),
			nats.CustomInboxPrefix(natsbus.SessionInbox("s1")), nats.NoReconnect())
		require.NoError(t, err)
		defer nc.Close()
		_, err = nc.SubscribeSync(natsbus.EventsSubject("s1"))
		require.NoError(t, err)
		require.NoError(t, nc.Flush())
		assert.Equal(t, base+i+1, count(), "after the %s subscription", url)
	}
	host, err := nats.Connect(b.URL(), nats.Token(b.Server().Token()), nats.NoReconnect())
	require.NoError(t, err)
	defer host.Close()
	_, err = host.SubscribeSync("a2a.session.*.events")
	require.NoError(t, err)
	require.NoError(t, host.Flush())
	assert.Equal(t, base+3, count(), "and the host's wildcard")
}

// connectRefused connects to url with opt, which the server refuses, and
// returns the error the client reports. nats.go (through v1.55.0) writes
// CONNECT and PING over WebSocket as separate writes: now and then the
// server's close after its -ERR meets the second, and the client reports
// the write's EPIPE or ECONNRESET instead of the server's error
// (nats-io/nats.go#2024). Such a try is made again, a few times; any
// other answer is returned.
func connectRefused(t *testing.T, url string, opt nats.Option) error {
	t.Helper()
	var err error
	for range 5 {
		var nc *nats.Conn
		nc, err = nats.Connect(url, opt, nats.NoReconnect())
		if nc != nil {
			nc.Close()
		}
		if !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
			return err
		}
		t.Logf("the client lost the server's answer (nats.go#2024): %v", err)
	}
	return err
}
