package natsbus

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/a2a-bus/a2a-bus/internal/secret"
	"github.com/a2a-bus/a2a-bus/wire"
)

// Named errors of StartServer.
var (
	// ErrNotLoopback: a listen address off loopback without AllowRemote.
	ErrNotLoopback = errors.New("natsbus: listen address is not loopback (allow it explicitly)")
	// ErrBadListen: a listen address that is not host:port.
	ErrBadListen = errors.New("natsbus: bad listen address")
)

// ServerConfig configures the embedded NATS server. The zero value listens
// on 127.0.0.1 on a port the OS picks.
type ServerConfig struct {
	// Listen is the TCP address for clients in other processes, "host:port"
	// ("127.0.0.1:0" picks a free port). "" means 127.0.0.1 and a free port.
	Listen string
	// AllowRemote permits a Listen address off loopback. Off by default:
	// a broker on a desktop host has no business on the network.
	AllowRemote bool
	// MaxMessageBytes is the protocol's message limit. The server carries
	// payloads up to wire.NewLimits(MaxMessageBytes).Payload, so that the
	// broker itself answers an oversized request with -32600 and every
	// response fits. 0 means wire.DefaultMaxMessageBytes.
	MaxMessageBytes int
	// MaxConnectionsPerSession bounds the connections open at once with
	// the credentials of one session; more are refused at authentication.
	// 0 means DefaultMaxConnectionsPerSession.
	MaxConnectionsPerSession int
	// MaxSubscriptions bounds the subscriptions of one connection. 0
	// means DefaultMaxSubscriptions.
	MaxSubscriptions int
	// SlowConsumerBytes is how much may wait to be written to one
	// connection of a session credential before the server closes it (a
	// subscriber that stopped reading). 0 means twice the payload limit.
	SlowConsumerBytes int
	// SessionPendingBytes bounds what waits to be written to the
	// connections of one session together; past it, that session's
	// connections with the most waiting are closed first. 0 means four
	// times the payload limit.
	SessionPendingBytes int
	// MaxSessionPending bounds what waits to be written to all session
	// connections together; past it, the connections with the most
	// waiting are closed first. 0 means DefaultMaxSessionPending.
	MaxSessionPending int
	// StartTimeout bounds the wait for the server to accept connections.
	// 0 means 10 seconds.
	StartTimeout time.Duration
	// Logger receives the server's logs (its notices at debug level).
	// nil discards them.
	Logger *slog.Logger
}

// Defaults of ServerConfig's zero fields.
const (
	DefaultMaxConnectionsPerSession = 16
	DefaultMaxSubscriptions         = 4096
	DefaultMaxSessionPending        = 128 << 20
	// watchEvery is how often the server looks for session connections
	// that stopped reading.
	watchEvery = 100 * time.Millisecond
)

// Server is an embedded NATS server with the project's authentication: a
// host token that may do anything, and per-session credentials that may
// use only their session's subjects.
type Server struct {
	ns    *server.Server
	token string
	url   string

	cfg      ServerConfig
	log      *slog.Logger
	payload  int
	sessions *server.Account // where session credentials and their servers are
	// servePass authenticates the broker's connections that serve the
	// sessions (user serveUser, in the sessions account).
	servePass string

	mu        sync.Mutex
	users     map[string]*credential            // by user
	bySession map[string]map[string]*credential // session -> user -> credential

	stop      chan struct{} // closed by Close: the watchdog returns
	kick      chan struct{} // wakes the watchdog early: much was published
	sent      atomic.Int64  // bytes published since the watchdog last looked
	lastCut   time.Time     // the watchdog's: when it last saw a backlog or a burst
	burst     int64         // the watchdog's: bytes published since it last gave memory back
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// credential is one issued session credential.
type credential struct {
	user     string
	password [32]byte // sha256 of the password
	session  string
	clients  map[uint64]bool // connections that authenticated with it
}

// StartServer starts the embedded server and waits until it accepts
// connections.
func StartServer(cfg ServerConfig) (*Server, error) {
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = wire.DefaultMaxMessageBytes
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	limits := wire.NewLimits(cfg.MaxMessageBytes)
	if cfg.MaxConnectionsPerSession <= 0 {
		cfg.MaxConnectionsPerSession = DefaultMaxConnectionsPerSession
	}
	if cfg.MaxSubscriptions <= 0 {
		cfg.MaxSubscriptions = DefaultMaxSubscriptions
	}
	if cfg.SlowConsumerBytes <= 0 {
		cfg.SlowConsumerBytes = 2 * limits.Payload
	}
	if cfg.SessionPendingBytes <= 0 {
		cfg.SessionPendingBytes = 4 * limits.Payload
	}
	if cfg.MaxSessionPending <= 0 {
		cfg.MaxSessionPending = DefaultMaxSessionPending
	}
	host, port, err := listenAddr(cfg.Listen, cfg.AllowRemote)
	if err != nil {
		return nil, err
	}
	s := &Server{token: secret.Hex(32), servePass: secret.Hex(32), cfg: cfg, log: cfg.Logger, payload: limits.Payload, users: map[string]*credential{},
		bySession: map[string]map[string]*credential{}, stop: make(chan struct{}), kick: make(chan struct{}, 1)}
	opts := &server.Options{
		ServerName:      "a2a-bus",
		Host:            host,
		Port:            port,
		NoSigs:          true,
		NoSystemAccount: true,
		MaxPayload:      int32(limits.Payload),
		MaxSubs:         cfg.MaxSubscriptions,
		// Session credentials live in an account of their own (see
		// sessionsAccount).
		Accounts: []*server.Account{server.NewAccount(sessionsAccount)},
		// What may wait to be written to one connection: room for a few
		// of the largest messages. A connection past it is closed as a
		// slow consumer; past three quarters of it, the server slows down
		// the producers that write to it (which is how a session's flood
		// is made to wait, see sessionsAccount). The watchdog cuts session
		// connections sooner still.
		MaxPending: int64(maxPending(limits)),
		// A write to a client that does not take it for this long closes
		// the client: on loopback, a reader that stops that long is gone
		// or stuck, and what waits for it is held until then.
		WriteDeadline:              writeDeadline,
		CustomClientAuthentication: s,
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsbus: configure server: %w", err)
	}
	ns.SetLoggerV2(serverLogger{cfg.Logger}, false, false, false)
	ns.Start()
	if !ns.ReadyForConnections(cfg.StartTimeout) {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, fmt.Errorf("natsbus: the NATS server did not accept connections on %s within %v (is the port in use?)",
			net.JoinHostPort(host, strconv.Itoa(port)), cfg.StartTimeout)
	}
	s.ns = ns
	if err := s.linkAccounts(); err != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, err
	}
	addr := ns.Addr().(*net.TCPAddr)
	s.url = "nats://" + net.JoinHostPort(addr.IP.String(), strconv.Itoa(addr.Port))
	s.wg.Go(s.watch)
	return s, nil
}

// writeDeadline is how long the server waits for a client to take a
// write.
const writeDeadline = 3 * time.Second

// maxPending is the server's per-connection bound on what waits to be
// written: four of the largest messages.
func maxPending(l wire.Limits) int { return 4 * l.Payload }

// sessionsAccount is the NATS account of every session credential, and
// of the broker's connections that serve them, one per open session.
// The host's connections (the token) and the broker's main connection are
// in the global account. So a session's requests reach the broker on a
// connection of their own: the server keeps a buffer per connection and
// slows down a producer whose consumer falls behind, which makes one
// session's flood wait behind itself, never in front of another
// session's requests. Notifications, published once in the global
// account, reach the session credentials through a stream import.
const sessionsAccount = "a2a-sessions"

// linkAccounts imports the notifications into the sessions account.
func (s *Server) linkAccounts() error {
	global := s.ns.GlobalAccount()
	sessions, err := s.ns.LookupAccount(sessionsAccount)
	if err != nil {
		return fmt.Errorf("natsbus: the sessions account: %w", err)
	}
	events := EventsPrefix + "*" + EventsSuffix
	if err := global.AddStreamExport(events, []*server.Account{sessions}); err != nil {
		return fmt.Errorf("natsbus: export the notifications: %w", err)
	}
	if err := sessions.AddStreamImport(global, events, ""); err != nil {
		return fmt.Errorf("natsbus: import the notifications: %w", err)
	}
	s.sessions = sessions
	return nil
}

// MaxPayload returns the server's payload limit.
func (s *Server) MaxPayload() int { return s.payload }

// kickEvery is how many published bytes wake the watchdog before its
// tick: a burst of large notifications is looked at as it lands, not a
// tick later.
const kickEvery = 1 << 20

// published tells the watchdog that n bytes were published.
func (s *Server) published(n int) {
	if s.sent.Add(int64(n)) >= kickEvery {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// watch closes the session connections that stopped reading: one with
// more than SlowConsumerBytes waiting to be written, and, while all of
// them together have more than MaxSessionPending waiting, those with the
// most. The host's connections and the broker's are never cut here.
func (s *Server) watch() {
	tick := time.NewTicker(watchEvery)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		case <-s.kick:
		}
		sent := s.sent.Swap(0)
		s.burst += sent
		// Memory goes back to the system once a backlog (connections
		// holding more than a MiB in all, which this watchdog or the
		// server's write deadline cuts) or a burst (as much published as
		// all sessions may hold) is over.
		if cut, pending := s.cutSlowSessions(); cut || pending >= kickEvery || (sent > 0 && s.burst >= int64(s.cfg.MaxSessionPending)) {
			s.lastCut = time.Now()
		} else if !s.lastCut.IsZero() && time.Since(s.lastCut) >= time.Second {
			// What the cut connections and the burst held is garbage
			// now: once it is over, give it back to the system at once
			// rather than when the runtime gets round to it.
			s.lastCut, s.burst = time.Time{}, 0
			debug.FreeOSMemory()
		}
	}
}

// cutSlowSessions cuts what watch says. It reports whether it cut any,
// and the session connections' pending bytes it saw.
func (s *Server) cutSlowSessions() (bool, int) {
	s.mu.Lock()
	sessionOf := map[uint64]string{}
	for _, cred := range s.users {
		for id := range cred.clients {
			sessionOf[id] = cred.session
		}
	}
	s.mu.Unlock()
	if len(sessionOf) == 0 {
		return false, 0
	}
	// The connections with the most waiting, largest first.
	cz, err := s.ns.Connz(&server.ConnzOptions{Sort: server.ByPending, Limit: 256})
	if err != nil {
		return false, 0
	}
	total := 0
	bySession := map[string]int{}
	var slow []*server.ConnInfo
	for _, c := range cz.Conns {
		if session, ok := sessionOf[c.Cid]; ok && c.Pending > 0 {
			total += c.Pending
			bySession[session] += c.Pending
			slow = append(slow, c)
		}
	}
	seen := total
	cut := false
	for _, c := range slow { // largest first
		session := sessionOf[c.Cid]
		if c.Pending <= s.cfg.SlowConsumerBytes && bySession[session] <= s.cfg.SessionPendingBytes && total <= s.cfg.MaxSessionPending {
			continue
		}
		s.log.Warn("closing a session connection that stopped reading", "session", session, "pendingBytes", c.Pending)
		_ = s.ns.DisconnectClientByID(c.Cid)
		total -= c.Pending
		bySession[session] -= c.Pending
		cut = true
	}
	return cut, seen
}

// CheckListen reports whether a Listen setting would be accepted:
// ErrBadListen for an address that is not host:port, ErrNotLoopback for
// one off loopback without allowRemote. Commands check it before they
// start anything.
func CheckListen(listen string, allowRemote bool) error {
	_, _, err := listenAddr(listen, allowRemote)
	return err
}

// listenAddr resolves a Listen setting, refusing addresses off loopback
// unless allowed.
func listenAddr(listen string, allowRemote bool) (string, int, error) {
	if listen == "" {
		return "127.0.0.1", server.RANDOM_PORT, nil
	}
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, fmt.Errorf("%w %q: %v", ErrBadListen, listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("%w %q: bad port", ErrBadListen, listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT // the server takes 0 for its default 4222
	}
	if !allowRemote {
		ips, err := net.LookupIP(host)
		if host == "" || err != nil || len(ips) == 0 {
			return "", 0, fmt.Errorf("%w: %q", ErrNotLoopback, listen)
		}
		for _, ip := range ips {
			if !ip.IsLoopback() {
				return "", 0, fmt.Errorf("%w: %q", ErrNotLoopback, listen)
			}
		}
		if host == "localhost" {
			host = "127.0.0.1"
		}
	}
	return host, port, nil
}

// URL returns the server's client URL, without credentials.
func (s *Server) URL() string { return s.url }

// serveUser is the user of the broker's connections that serve sessions;
// session credentials' users are hex, so never this.
const serveUser = "a2a-bus-broker"

// Token returns the host credential. Keep it secret: it opens everything.
func (s *Server) Token() string { return s.token }

// InProcessConn implements nats.InProcessConnProvider: in-process clients
// connect without TCP.
func (s *Server) InProcessConn() (net.Conn, error) { return s.ns.InProcessConn() }

// Check implements server.Authentication.
func (s *Server) Check(c server.ClientAuthentication) bool {
	if c.Kind() != server.CLIENT {
		return false
	}
	opts := c.GetOpts()
	if opts.Token != "" {
		if subtle.ConstantTimeCompare([]byte(opts.Token), []byte(s.token)) == 1 {
			c.RegisterUser(&server.User{Username: "host"})
			return true
		}
		return false
	}
	if opts.Username == "" {
		return false
	}
	if opts.Username == serveUser {
		if subtle.ConstantTimeCompare([]byte(opts.Password), []byte(s.servePass)) == 1 {
			c.RegisterUser(&server.User{Username: serveUser, Account: s.sessions})
			return true
		}
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cred := s.users[opts.Username]
	h := sha256.Sum256([]byte(opts.Password))
	if cred == nil || subtle.ConstantTimeCompare(cred.password[:], h[:]) != 1 {
		return false
	}
	if n := s.liveClients(cred.session); n >= s.cfg.MaxConnectionsPerSession {
		s.log.Warn("session connection refused: too many open", "session", cred.session, "limit", s.cfg.MaxConnectionsPerSession)
		return false
	}
	cred.clients[c.GetID()] = true
	c.RegisterUser(&server.User{Username: cred.user, Permissions: sessionPermissions(cred.session), Account: s.sessions})
	return true
}

// liveClients counts the open connections of a session's credentials,
// forgetting those that closed. s.mu is held.
func (s *Server) liveClients(session string) int {
	n := 0
	for _, cred := range s.bySession[session] {
		for id := range cred.clients {
			if s.ns.GetClient(id) == nil {
				delete(cred.clients, id)
				continue
			}
			n++
		}
	}
	return n
}

// sessionPermissions are what a session credential may do: request on its
// rpc subject, receive its events and its replies, answer requests it
// receives. The server enforces them.
func sessionPermissions(session string) *server.Permissions {
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{RPCSubject(session)}},
		Subscribe: &server.SubjectPermission{Allow: []string{EventsSubject(session), SessionInbox(session) + ".>"}},
		Response:  &server.ResponsePermission{},
	}
}

// OpenSession issues a new credential for a session.
func (s *Server) OpenSession(session string) wire.SessionCredentials {
	user, password := secret.Hex(16), secret.Hex(32)
	cred := &credential{user: user, password: sha256.Sum256([]byte(password)), session: session, clients: map[uint64]bool{}}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users[user] = cred
	m := s.bySession[session]
	if m == nil {
		m = map[string]*credential{}
		s.bySession[session] = m
	}
	m[user] = cred
	return wire.SessionCredentials{URL: s.url, User: user, Password: password}
}

// CloseSession revokes every credential of a session and closes the
// connections made with them. A client of the session then sees its
// connection close, and its reconnects refused (authorization
// violation).
func (s *Server) CloseSession(session string) {
	s.mu.Lock()
	creds := s.bySession[session]
	delete(s.bySession, session)
	var clients []uint64
	for user, cred := range creds {
		delete(s.users, user)
		for id := range cred.clients {
			clients = append(clients, id)
		}
	}
	s.mu.Unlock()
	for _, id := range clients {
		_ = s.ns.DisconnectClientByID(id) // gone already: nothing to do
	}
}

// drain waits, for up to timeout, until the server has written to its
// clients everything it holds for them, and its clients have sent it
// nothing for a moment: the last answers of a broker that shuts down
// reach their callers, and a request still on its way is answered "no
// responders" rather than cut off with its connection. (A connection
// closed with a request unread is reset, and a reset can drop the
// answers its client had not read yet.)
func (s *Server) drain(timeout time.Duration) {
	const quiet = 20 * time.Millisecond
	deadline := time.Now().Add(timeout)
	lastIn := int64(-1)
	for time.Now().Before(deadline) {
		cz, err := s.ns.Connz(&server.ConnzOptions{Sort: server.ByPending, Limit: 1})
		if err != nil || len(cz.Conns) == 0 {
			return
		}
		vz, err := s.ns.Varz(nil)
		if err != nil {
			return
		}
		if cz.Conns[0].Pending == 0 && vz.InMsgs == lastIn {
			return
		}
		lastIn = vz.InMsgs
		time.Sleep(quiet)
	}
}

// Close shuts the server down and waits for it. Close clients first.
// Idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		close(s.stop)
		s.wg.Wait()
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
	})
	return nil
}
