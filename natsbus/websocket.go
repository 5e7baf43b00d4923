package natsbus

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The WebSocket listener (ServerConfig.WebSocketListen) lets web pages,
// Electron's renderers above all, reach the server: they cannot open a
// TCP socket. The NATS server speaks WebSocket itself, but it matches
// origins only exactly (no port wildcard for a dev server, no custom
// scheme, no file://). So the listener the pages see is a gate of ours:
// it checks the Origin header against the allowed patterns, then hands
// the upgrade on to the server's own WebSocket listener, which is on
// loopback on a port of its own. That one refuses every origin a browser
// can send (it allows only wsSentinelOrigin, a host that does not
// resolve): a page that finds its port is refused there too. The gate
// drops the Origin header of what it admits, so the server takes it as a
// client that is not a browser. Authentication is the server's, as on
// TCP: the host token, or a session's credential with that session's
// rights.

// DefaultWebSocketOrigins are the origins allowed when
// ServerConfig.WebSocketOrigins is nil: what an Electron app and local
// development use, and no web page.
var DefaultWebSocketOrigins = []string{"file://", "*://*", "http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"}

// wsSentinelOrigin is the only origin the server's own WebSocket
// listener allows: no page has it. Port 1 is on every browser's list of
// blocked ports, so not even a network that resolves .invalid can serve
// a page of that origin.
const wsSentinelOrigin = "http://a2a-bus.invalid:1"

// ErrBadOrigin: a WebSocketOrigins pattern that is not one.
var ErrBadOrigin = errors.New("natsbus: bad allowed origin")

// originPattern is one allowed origin:
//
//   - "null": the opaque origin (sandboxed frames of any site, data: URLs,
//     and Chromium's file:// pages), only when listed;
//   - "file://": Electron's file:// pages (the origin "file://" exactly);
//   - "scheme://host", "scheme://host:port", "scheme://host:*",
//     "scheme://*" (any host and port). The scheme "*" is any scheme but
//     http, https, file and null: an app's custom scheme (app://…), never
//     a web page, whose origin is http, https or null. "http://*" and
//     "https://*" are refused: they would admit every web site.
//
// Schemes and hosts compare without case; a host is an ASCII name
// (browsers send IDNs as punycode), an IPv4 address or a bracketed IPv6
// one; a port is 1 to 65535 without leading zeros; a pattern without a
// port matches the origin without one or with the scheme's default port.
type originPattern struct {
	raw          string
	scheme, host string
	port         string // "" none or the default; "*" any
}

func parseOrigins(list []string) ([]originPattern, error) {
	out := make([]originPattern, 0, len(list))
	for _, raw := range list {
		p, err := parseOrigin(strings.TrimSpace(raw))
		if err != nil {
			return nil, fmt.Errorf("%w %q: %v", ErrBadOrigin, raw, err)
		}
		out = append(out, p)
	}
	return out, nil
}

func parseOrigin(s string) (originPattern, error) {
	switch s {
	case "null":
		return originPattern{raw: s, scheme: "null"}, nil
	case "file://":
		return originPattern{raw: s, scheme: "file"}, nil
	case "":
		return originPattern{}, errors.New("empty")
	}
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok || scheme == "" || rest == "" {
		return originPattern{}, errors.New(`want scheme://host[:port|:*], "file://" or "null"`)
	}
	scheme = strings.ToLower(scheme)
	switch {
	case scheme == "file" || scheme == "null":
		return originPattern{}, errors.New(`the file and null origins are written "file://" and "null"`)
	case scheme != "*" && !validScheme(scheme):
		return originPattern{}, errors.New("bad scheme")
	}
	if rest == "*" {
		if scheme == "http" || scheme == "https" {
			return originPattern{}, errors.New("it would admit every web site: list the sites")
		}
		return originPattern{raw: s, scheme: scheme, host: "*", port: "*"}, nil
	}
	if strings.ContainsAny(rest, "/?#@") {
		return originPattern{}, errors.New("an origin has no path, query, fragment or user")
	}
	host, port := rest, ""
	bracketed := strings.HasPrefix(rest, "[")
	if h, p, err := net.SplitHostPort(rest); err == nil {
		host, port = h, p
		if port != "*" && !validPort(port) {
			return originPattern{}, errors.New("bad port: 1 to 65535, no leading zero")
		}
	} else if bracketed && strings.HasSuffix(rest, "]") {
		host = rest[1 : len(rest)-1]
	} else if strings.Contains(rest, ":") {
		return originPattern{}, errors.New("bad host:port")
	}
	switch {
	case strings.Contains(host, "*"):
		return originPattern{}, errors.New(`a host wildcard is the whole of it: scheme://*`)
	case bracketed:
		if ip := net.ParseIP(host); ip == nil || ip.To4() != nil || strings.Contains(host, "%") {
			return originPattern{}, errors.New("bad IPv6 address")
		}
		host = net.ParseIP(host).String() // as a browser writes it
	case !validHost(host):
		return originPattern{}, errors.New("bad host: ASCII letters, digits, - and . (an IDN as punycode), or [IPv6]")
	}
	return originPattern{raw: s, scheme: scheme, host: strings.ToLower(host), port: defaultPort(scheme, port)}, nil
}

// allowedOrigin reports whether an Origin header value matches one of
// the patterns.
func allowedOrigin(pats []originPattern, origin string) bool {
	var scheme, host, port string
	switch origin {
	case "null":
		scheme = "null"
	case "file://":
		scheme = "file"
	default:
		u, err := url.Parse(origin)
		if err != nil || u.Scheme == "" || u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
			return false
		}
		scheme, host = strings.ToLower(u.Scheme), strings.ToLower(u.Hostname())
		if scheme == "file" || scheme == "null" {
			return false // only "file://" and "null" exactly
		}
		if ip := net.ParseIP(host); ip != nil && strings.Contains(host, ":") {
			host = ip.String()
		}
		port = defaultPort(scheme, u.Port())
	}
	for _, p := range pats {
		switch {
		case p.scheme == "*":
			if scheme == "http" || scheme == "https" || scheme == "null" || scheme == "file" {
				continue
			}
		case p.scheme != scheme:
			continue
		}
		if scheme == "null" || scheme == "file" {
			return true
		}
		if p.host != "*" && p.host != host {
			continue
		}
		if p.port == "*" || p.port == port {
			return true
		}
	}
	return false
}

func defaultPort(scheme, port string) string {
	switch {
	case scheme == "http" && port == "80", scheme == "https" && port == "443":
		return ""
	}
	return port
}

func validScheme(s string) bool {
	for i, c := range s {
		switch {
		case c >= 'a' && c <= 'z':
		case i > 0 && (c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return s != ""
}

// validPort: 1 to 65535, as a browser writes it (no leading zero).
func validPort(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n >= 1 && n <= 65535 && strconv.Itoa(n) == s
}

// validHost: an ASCII host name or IPv4 address, as a browser sends it.
func validHost(s string) bool {
	if s == "" || len(s) > 253 || s[0] == '.' || s[len(s)-1] == '.' || strings.Contains(s, "..") {
		return false
	}
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '.':
		default:
			return false
		}
	}
	return true
}

// wsGate is the listener pages reach: it admits an upgrade from an
// allowed origin and proxies it to the server's own WebSocket listener.
type wsGate struct {
	ln      net.Listener
	url     string
	srv     *http.Server
	origins []originPattern
	proxy   *httputil.ReverseProxy
	log     *slog.Logger

	mu     sync.Mutex
	conns  map[*gateConn]struct{} // every connection accepted and not yet closed
	closed bool
	wg     sync.WaitGroup // the accept loop and the handlers
	once   sync.Once
}

// wsHandshakeTimeout bounds how long a client may take to send its
// upgrade request.
const wsHandshakeTimeout = 5 * time.Second

// gateConn is a connection the gate accepted. It has no CloseWrite, so
// that the proxy closes it as soon as either side ends (with one, the
// proxy half-closes it and waits for the client to hang up: a client
// the server cut would hold both sockets as long as it liked). A write
// to it that the client does not take within the server's write
// deadline fails, which ends the proxying: the server's rule that a
// client that does not take a write for 3 s is cut holds through the
// gate.
type gateConn struct {
	net.Conn
	g    *wsGate
	once sync.Once
}

func (c *gateConn) Write(p []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(time.Now().Add(writeDeadline)); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

// Close closes the connection and forgets it. Idempotent.
func (c *gateConn) Close() error {
	err := net.ErrClosed
	c.once.Do(func() {
		c.g.mu.Lock()
		delete(c.g.conns, c)
		c.g.mu.Unlock()
		err = c.Conn.Close()
	})
	return err
}

// gateListener hands out gateConns, counted so that close ends them.
type gateListener struct {
	net.Listener
	g *wsGate
}

func (l gateListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		gc := &gateConn{Conn: c, g: l.g}
		l.g.mu.Lock()
		closed := l.g.closed
		if !closed {
			l.g.conns[gc] = struct{}{}
		}
		l.g.mu.Unlock()
		if closed {
			c.Close()
			continue
		}
		return gc, nil
	}
}

func startWSGate(ln net.Listener, backend string, origins []originPattern, log *slog.Logger) *wsGate {
	target := &url.URL{Scheme: "http", Host: backend}
	g := &wsGate{ln: ln, origins: origins, log: log, conns: map[*gateConn]struct{}{}}
	g.url = "ws://" + ln.Addr().String()
	g.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = target.Host
			// Admitted here; the server refuses every browser origin.
			pr.Out.Header.Del("Origin")
			pr.Out.Header.Del("Sec-Websocket-Origin")
		},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			log.Debug("websocket: the server did not take an upgrade", "err", err)
			http.Error(w, "a2a-bus: the broker is not accepting WebSocket connections", http.StatusBadGateway)
		},
	}
	g.srv = &http.Server{
		Handler:           g,
		ReadHeaderTimeout: wsHandshakeTimeout,
		IdleTimeout:       wsHandshakeTimeout,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	// One upgrade per connection: an answer that is not one closes it.
	g.srv.SetKeepAlivesEnabled(false)
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := g.srv.Serve(gateListener{ln, g}); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("websocket: the listener stopped", "err", err)
		}
	}()
	return g
}

func (g *wsGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		http.Error(w, "a2a-bus: the broker is shutting down", http.StatusServiceUnavailable)
		return
	}
	g.wg.Add(1)
	g.mu.Unlock()
	defer g.wg.Done()
	if !headerHas(r.Header, "Connection", "upgrade") || !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		http.Error(w, "a2a-bus: this address serves NATS over WebSocket only (docs/PROTOCOL.md §2.2)", http.StatusUpgradeRequired)
		return
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		origin = r.Header.Get("Sec-Websocket-Origin")
	}
	// No Origin: not a browser, which could send anything it likes; it
	// is taken as a TCP client is.
	if origin != "" && !allowedOrigin(g.origins, origin) {
		g.log.Info("websocket: refused a page of an origin that is not allowed (serve --ws-origins)", "origin", origin)
		http.Error(w, fmt.Sprintf("a2a-bus: origin %q is not allowed (serve --ws-origins)", origin), http.StatusForbidden)
		return
	}
	// The proxy hijacks the connection and copies both ways until either
	// side ends (see gateConn); close ends it.
	g.proxy.ServeHTTP(w, r)
}

// headerHas reports whether a comma-separated header holds token.
func headerHas(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// close stops the listener, ends every connection it accepted (those
// the proxy carries too) and waits for its goroutines. Idempotent.
func (g *wsGate) close() {
	g.once.Do(func() {
		g.mu.Lock()
		g.closed = true
		conns := make([]*gateConn, 0, len(g.conns))
		for c := range g.conns {
			conns = append(conns, c)
		}
		g.mu.Unlock()
		_ = g.srv.Close() // the listener, and the connections it still serves
		for _, c := range conns {
			c.Close()
		}
		g.wg.Wait()
	})
}
