package natsbus

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/a2a-bus/a2a-bus/internal/secret"
	"github.com/a2a-bus/a2a-bus/natsbus/internal/admission"
	"github.com/a2a-bus/a2a-bus/wire"
)

// This file and server_*.go are the embedded server: its settings, its
// accounts, the credentials it issues (server_credentials.go), and how it
// hands its session connections to the watchdog (package
// natsbus/internal/admission). The bus (bus.go) and its clients
// (client.go) use it through its methods only, never its fields.

// Named errors of StartServer.
var (
	// ErrNotLoopback: a listen address off loopback without AllowRemote.
	ErrNotLoopback = errors.New("natsbus: listen address is not loopback (allow it explicitly)")
	// ErrBadListen: a listen address that is not host:port.
	ErrBadListen = errors.New("natsbus: bad listen address")
)

// ErrBadConfig is returned by the Validate methods, and so by New,
// StartServer and Dial, for a setting out of its range.
var ErrBadConfig = errors.New("natsbus: bad configuration")

// ServerConfig configures the embedded NATS server. The zero value listens
// on 127.0.0.1 on a port the OS picks, with every bound at its default.
type ServerConfig struct {
	// Listen is the TCP address for clients in other processes, "host:port"
	// ("127.0.0.1:0" picks a free port). "" means 127.0.0.1 and a free port.
	Listen string
	// AllowRemote permits a Listen or WebSocketListen address off
	// loopback. Off by default: a broker on a desktop host has no
	// business on the network.
	AllowRemote bool
	// WebSocketListen, when set, is the address of a WebSocket listener
	// for web pages (Electron's renderers), "host:port" ("127.0.0.1:0"
	// picks a free port); see websocket.go. "" means none.
	WebSocketListen string
	// WebSocketOrigins are the origins a page may connect from (the
	// patterns of originPattern); a page of any other is refused at the
	// upgrade. nil means DefaultWebSocketOrigins.
	WebSocketOrigins []string
	// MaxMessageBytes is the protocol's message limit. The server carries
	// payloads up to wire.NewLimits(MaxMessageBytes).Payload, so that the
	// broker itself answers an oversized request with -32600 and every
	// response fits. 0 means wire.DefaultMaxMessageBytes. (New sets it to
	// Config.MaxMessageBytes.)
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
	// connections of one session together, counting what the server
	// still holds for those of them it closed (until their write
	// deadline passes); past it, that session's connections with 64 KiB
	// or more waiting are closed, largest first. 0 means four times the
	// payload limit.
	SessionPendingBytes int
	// MaxSessionPending bounds the same for all session connections
	// together; past it, those that stopped reading (64 KiB or more
	// waiting, of which nothing could be written for a tenth of a
	// second) are closed, and, while what waits for the others is over
	// it by itself, the others with the most waiting. 0 means
	// DefaultMaxSessionPending.
	MaxSessionPending int
	// ReturnMemory gives the memory that cut connections and bursts held
	// back to the operating system at once when such an episode is over
	// (debug.FreeOSMemory, which affects the whole process: it stops it
	// for a moment). Off by default: the garbage is collected then, and
	// the Go runtime returns the memory at its own pace.
	ReturnMemory bool
	// StartTimeout bounds the wait for the server to accept connections.
	// 0 means DefaultStartTimeout.
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
	DefaultStartTimeout             = 10 * time.Second
)

// Validate reports the settings StartServer refuses: ErrBadConfig for a
// negative bound or a message limit out of range (wire.Limits.Valid),
// ErrBadListen or ErrNotLoopback for the Listen address (CheckListen).
func (c ServerConfig) Validate() error {
	errs := negatives(map[string]int64{
		"MaxMessageBytes": int64(c.MaxMessageBytes), "MaxConnectionsPerSession": int64(c.MaxConnectionsPerSession),
		"MaxSubscriptions": int64(c.MaxSubscriptions), "SlowConsumerBytes": int64(c.SlowConsumerBytes),
		"SessionPendingBytes": int64(c.SessionPendingBytes), "MaxSessionPending": int64(c.MaxSessionPending),
		"StartTimeout": int64(c.StartTimeout),
	})
	if err := validMessageBytes(c.MaxMessageBytes); err != nil {
		errs = append(errs, err)
	}
	if c.MaxSubscriptions > math.MaxInt32 {
		errs = append(errs, fmt.Errorf("%w: MaxSubscriptions %d is over %d", ErrBadConfig, c.MaxSubscriptions, math.MaxInt32))
	}
	if err := CheckListen(c.Listen, c.AllowRemote); err != nil {
		errs = append(errs, err)
	}
	if c.WebSocketListen != "" {
		if err := CheckListen(c.WebSocketListen, c.AllowRemote); err != nil {
			errs = append(errs, fmt.Errorf("WebSocketListen: %w", err))
		}
	}
	if _, err := parseOrigins(c.WebSocketOrigins); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// withDefaults returns c with its zero fields at their defaults.
func (c ServerConfig) withDefaults() ServerConfig {
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = wire.DefaultMaxMessageBytes
	}
	limits := wire.NewLimits(c.MaxMessageBytes)
	if c.StartTimeout == 0 {
		c.StartTimeout = DefaultStartTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxConnectionsPerSession == 0 {
		c.MaxConnectionsPerSession = DefaultMaxConnectionsPerSession
	}
	if c.MaxSubscriptions == 0 {
		c.MaxSubscriptions = DefaultMaxSubscriptions
	}
	if c.SlowConsumerBytes == 0 {
		c.SlowConsumerBytes = 2 * limits.Payload
	}
	if c.SessionPendingBytes == 0 {
		c.SessionPendingBytes = 4 * limits.Payload
	}
	if c.MaxSessionPending == 0 {
		c.MaxSessionPending = DefaultMaxSessionPending
	}
	if c.WebSocketOrigins == nil {
		c.WebSocketOrigins = DefaultWebSocketOrigins
	}
	return c
}

// Server is an embedded NATS server with the project's authentication: a
// host token that may do anything, and per-session credentials that may
// use only their session's subjects.
type Server struct {
	ns    *server.Server
	token string
	url   string
	ws    *wsGate // the WebSocket listener, when configured

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

	// watch bounds what waits for the session connections.
	watch *admission.Watchdog
	// notePublished, when set (tests), is told of each publish the
	// watchdog is told of.
	notePublished atomic.Pointer[func(int)]
	closeOnce     sync.Once
}

// StartServer starts the embedded server and waits until it accepts
// connections.
func StartServer(cfg ServerConfig) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	limits := wire.NewLimits(cfg.MaxMessageBytes)
	host, port, err := listenAddr(cfg.Listen, cfg.AllowRemote)
	if err != nil {
		return nil, err
	}
	s := &Server{token: secret.Hex(32), servePass: secret.Hex(32), cfg: cfg, log: cfg.Logger, payload: limits.Payload, users: map[string]*credential{},
		bySession: map[string]map[string]*credential{}}
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
		PingInterval:               serverPingInterval,
		MaxPingsOut:                serverMaxPingsOut,
		CustomClientAuthentication: s,
	}
	var gateLn net.Listener
	var origins []originPattern
	if cfg.WebSocketListen != "" {
		origins, _ = parseOrigins(cfg.WebSocketOrigins) // checked by Validate
		whost, wport, err := listenAddr(cfg.WebSocketListen, cfg.AllowRemote)
		if err != nil {
			return nil, err
		}
		if wport == server.RANDOM_PORT {
			wport = 0
		}
		gateLn, err = net.Listen("tcp", net.JoinHostPort(whost, strconv.Itoa(wport)))
		if err != nil {
			return nil, fmt.Errorf("natsbus: the WebSocket listener: %w", err)
		}
		// The server's own WebSocket listener, behind the gate.
		opts.Websocket = server.WebsocketOpts{
			Host:             "127.0.0.1",
			Port:             server.RANDOM_PORT,
			NoTLS:            true, // loopback, behind the gate
			AllowedOrigins:   []string{wsSentinelOrigin},
			HandshakeTimeout: wsHandshakeTimeout,
		}
	}
	ns, err := server.NewServer(opts)
	if err != nil && gateLn != nil {
		gateLn.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("natsbus: configure server: %w", err)
	}
	ns.SetLoggerV2(serverLogger{cfg.Logger}, false, false, false)
	ns.Start()
	if !ns.ReadyForConnections(cfg.StartTimeout) {
		if gateLn != nil {
			gateLn.Close()
		}
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, fmt.Errorf("natsbus: the NATS server did not accept connections on %s within %v (is the port in use?)",
			net.JoinHostPort(host, strconv.Itoa(port)), cfg.StartTimeout)
	}
	s.ns = ns
	if err := s.linkAccounts(); err != nil {
		if gateLn != nil {
			gateLn.Close()
		}
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, err
	}
	addr := ns.Addr().(*net.TCPAddr)
	s.url = "nats://" + net.JoinHostPort(addr.IP.String(), strconv.Itoa(addr.Port))
	if gateLn != nil {
		backend := strings.TrimPrefix(ns.WebsocketURL(), "ws://")
		s.ws = startWSGate(gateLn, backend, origins, cfg.Logger)
	}
	s.watch = admission.StartWatchdog(watched{s}, admission.WatchConfig{
		Conn: cfg.SlowConsumerBytes, Session: cfg.SessionPendingBytes, All: cfg.MaxSessionPending,
		HoldFor: holdFor, ReturnMemory: cfg.ReturnMemory,
	})
	return s, nil
}

// The server's settings for its clients, chosen for a desktop, where
// every client is on loopback or in this process and what goes wrong is
// a process that stops for a while (a debugger, SIGSTOP, a closed lid, a
// starved machine) and goes on, rather than a network that drops.
const (
	// writeDeadline is how long the server waits for a client to take a
	// write. On loopback the kernel takes several MB for a reader before
	// a write waits at all, so a write that waits 3 s is to a reader that
	// stopped with that much unread; in this process (no kernel buffer)
	// it is a reader that did not run for 3 s. Cutting it frees what
	// waits for it soon (see holdFor), and costs it little: every link
	// rejoins and replays what passed (PROTOCOL.md §5). A longer deadline
	// would hold a stuck reader's bytes that much longer.
	writeDeadline = 3 * time.Second
	// serverPingInterval and serverMaxPingsOut: the server pings a client
	// it has heard nothing from for a minute (a client's own pings count:
	// it does not ping the Go clients, which ping every 30 s), and a
	// client that answers neither of 2 such pings (silent 2 to 3 min) is
	// taken for stuck and closed, and what it held is freed. A client
	// stopped a minute at a breakpoint keeps its connection. Each ping
	// wakes the server for an idle connection, the broker's link of every
	// open session included, so they are no more frequent than that
	// takes. (nats-server's own 2 min x 2 waits up to 6 min; a data
	// centre's seconds would cut every host a debugger holds.)
	serverPingInterval = 60 * time.Second
	serverMaxPingsOut  = 2
	// holdFor: the server lets go of a cut connection's bytes only when
	// its last write gives up (a cut flushes first, and a reader that
	// stopped takes nothing): at its write deadline. The watchdog counts
	// them as still waiting that long, and a little more.
	holdFor = writeDeadline + time.Second
)

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

// Keepalive is how one side of a connection pings an idle peer: every
// Interval, and a peer that leaves MaxOut pings unanswered is taken for
// stuck.
type Keepalive struct {
	Interval time.Duration
	MaxOut   int
}

// Keepalives returns how the Go client and the embedded server ping
// (PROTOCOL.md §2.2): what a host's own client should do, and what a
// measure of a bare server's floor should set.
func Keepalives() (client, server Keepalive) {
	return Keepalive{pingInterval, maxPingsOut}, Keepalive{serverPingInterval, serverMaxPingsOut}
}

// MaxPayload returns the server's payload limit.
func (s *Server) MaxPayload() int { return s.payload }

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

// WebSocketURL is the WebSocket listener's URL ("ws://host:port"), or ""
// when there is none.
func (s *Server) WebSocketURL() string {
	if s.ws == nil {
		return ""
	}
	return s.ws.url
}

// InProcessConn implements nats.InProcessConnProvider: in-process clients
// connect without TCP.
func (s *Server) InProcessConn() (net.Conn, error) { return s.ns.InProcessConn() }

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
		s.watch.Close()
		if s.ws != nil {
			s.ws.close()
		}
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
	})
	return nil
}

// published tells the watchdog that the bus published n bytes that may
// be delivered to session connections: a notification, a reply.
func (s *Server) published(n int) {
	s.watch.Published(n)
	if note := s.notePublished.Load(); note != nil {
		(*note)(n)
	}
}

// subscribers counts the subscriptions that match a session's events
// subject (wildcards, and the server's own that carry them from the
// host's account, included).
func (s *Server) subscribers(session string) (int, error) {
	sz, err := s.ns.Subsz(&server.SubszOptions{Subscriptions: true, Test: EventsSubject(session), Limit: 1 << 20})
	if err != nil {
		return 0, err
	}
	// A session credential's subscription is listed twice: in the
	// sessions account, and as the shadow the stream import of the
	// notifications keeps in the global account. One per client's sid.
	type sub struct {
		cid uint64
		sid string
	}
	seen := make(map[sub]struct{}, len(sz.Subs))
	for _, d := range sz.Subs {
		seen[sub{d.Cid, d.Sid}] = struct{}{}
	}
	return len(seen), nil
}

// watched is the server as its watchdog sees it: the connections of
// session credentials (the broker's own connections in the sessions
// account, and the host's, are never cut).
type watched struct{ s *Server }

// SessionConns implements admission.Server.
func (w watched) SessionConns() []admission.Conn {
	s := w.s
	s.mu.Lock()
	sessionOf := map[uint64]string{}
	for _, cred := range s.users {
		for id := range cred.clients {
			sessionOf[id] = cred.session
		}
	}
	s.mu.Unlock()
	if len(sessionOf) == 0 {
		return nil
	}
	// All of the account's connections (the limit only cuts the list
	// short); those that are not a session credential's are the broker's.
	cz, err := s.ns.Connz(&server.ConnzOptions{Account: sessionsAccount, Limit: math.MaxInt32})
	if err != nil {
		return nil
	}
	conns := make([]admission.Conn, 0, len(sessionOf))
	for _, ci := range cz.Conns {
		if session, ok := sessionOf[ci.Cid]; ok {
			conns = append(conns, admission.Conn{ID: ci.Cid, Session: session, Pending: ci.Pending, Out: ci.OutBytes})
		}
	}
	return conns
}

// Cut implements admission.Server.
func (w watched) Cut(c admission.Conn) {
	w.s.log.Warn("closing a session connection that stopped reading", "session", c.Session, "pendingBytes", c.Pending)
	_ = w.s.ns.DisconnectClientByID(c.ID) // gone already: nothing to do
}
