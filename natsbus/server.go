package natsbus

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

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
	// MaxMessageBytes is the protocol's message limit. The server accepts
	// payloads well above it, so that the broker itself answers an
	// oversized request with -32600 and large responses fit. 0 means
	// wire.DefaultMaxMessageBytes.
	MaxMessageBytes int
	// StartTimeout bounds the wait for the server to accept connections.
	// 0 means 10 seconds.
	StartTimeout time.Duration
	// Logger receives the server's logs (its notices at debug level).
	// nil means slog.Default().
	Logger *slog.Logger
}

// Server is an embedded NATS server with the project's authentication: a
// host token that may do anything, and per-session credentials that may
// use only their session's subjects.
type Server struct {
	ns    *server.Server
	token string
	url   string

	mu        sync.Mutex
	users     map[string]*credential            // by user
	bySession map[string]map[string]*credential // session -> user -> credential

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
		cfg.Logger = slog.Default()
	}
	host, port, err := listenAddr(cfg.Listen, cfg.AllowRemote)
	if err != nil {
		return nil, err
	}
	s := &Server{token: randomHex(32), users: map[string]*credential{}, bySession: map[string]map[string]*credential{}}
	opts := &server.Options{
		ServerName:                 "a2a-bus",
		Host:                       host,
		Port:                       port,
		NoSigs:                     true,
		NoSystemAccount:            true,
		MaxPayload:                 int32(maxPayload(cfg.MaxMessageBytes)),
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
	addr := ns.Addr().(*net.TCPAddr)
	s.url = "nats://" + net.JoinHostPort(addr.IP.String(), strconv.Itoa(addr.Port))
	return s, nil
}

// maxPayload is the server's payload limit for a protocol message limit:
// room for an oversized request to reach the broker, and for responses
// larger than one request.
func maxPayload(limit int) int {
	return min(max(8*limit, 8<<20), 64<<20)
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
	s.mu.Lock()
	defer s.mu.Unlock()
	cred := s.users[opts.Username]
	h := sha256.Sum256([]byte(opts.Password))
	if cred == nil || subtle.ConstantTimeCompare(cred.password[:], h[:]) != 1 {
		return false
	}
	cred.clients[c.GetID()] = true
	c.RegisterUser(&server.User{Username: cred.user, Permissions: sessionPermissions(cred.session)})
	return true
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
	user, password := randomHex(16), randomHex(32)
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
// connections made with them.
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

// Close shuts the server down and waits for it. Close clients first.
// Idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
	})
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("natsbus: no randomness: " + err.Error())
	}
	return hex.EncodeToString(b)
}
