package natsbus

import (
	"cmp"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
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
	// that stopped reading, if anything was delivered meanwhile (and at
	// once after a burst of publishes).
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

	stop chan struct{} // closed by Close: the watchdog returns
	kick chan struct{} // wakes the watchdog early: much was published
	sent atomic.Int64  // bytes published since the watchdog last looked
	// collecting is set while a collection the watchdog started runs.
	collecting atomic.Bool
	looks      atomic.Int64 // the watchdog's looks at the connections
	wg         sync.WaitGroup
	closeOnce  sync.Once
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
		PingInterval:               serverPingInterval,
		MaxPingsOut:                serverMaxPingsOut,
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
	// serverPingInterval and serverMaxPingsOut: a client that answers
	// none of 4 pings 30 s apart (silent 2 to 2.5 min) is taken for stuck
	// and closed, and what it held is freed. A client stopped 15 s, or a
	// minute at a breakpoint, keeps its connection. (nats-server's own
	// 2 min x 2 waits up to 6 min; a data centre's seconds would cut
	// every host a debugger holds.)
	serverPingInterval = 30 * time.Second
	serverMaxPingsOut  = 4
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

// MaxPayload returns the server's payload limit.
func (s *Server) MaxPayload() int { return s.payload }

// kickEvery is how many published bytes wake the watchdog before its
// tick, and kickSize how large one publish must be to wake it by itself:
// a burst of large notifications is looked at as it lands, not a tick
// later.
const (
	kickEvery = 1 << 20
	kickSize  = 64 << 10
)

// published tells the watchdog that n bytes were published.
func (s *Server) published(n int) {
	if s.sent.Add(int64(n)) >= kickEvery || n >= kickSize {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// How the watchdog tells a connection that stopped reading, and how long
// it counts what a cut connection held.
const (
	// stallAfter: a session connection with at least stallBytes waiting,
	// of which the server could write none for this long, has stopped
	// reading. One that reads takes what waits at loopback speed, and a
	// few notifications fit in its socket; one that holds less than
	// stallBytes is left to the other bounds.
	stallAfter = 100 * time.Millisecond
	stallBytes = 64 << 10
	// holdFor: the server lets go of a cut connection's bytes only when
	// its last write gives up (a cut flushes first, and a reader that
	// stopped takes nothing): at its write deadline. They count as still
	// waiting that long, and a little more.
	holdFor = writeDeadline + time.Second
)

// watch closes the session connections that stopped reading, so that
// what waits to be written to them stays within the bounds
// (SlowConsumerBytes, SessionPendingBytes, MaxSessionPending; see
// chooseCuts), what cut ones still hold counted in (for holdFor). The
// host's connections and the broker's are never cut here.
//
// It looks at every tick and at once after a burst of publishes (see
// published); a look at a server that has delivered nothing since the
// last one reads two counters and nothing more.
//
// While session connections hold a backlog, or cut ones their bytes, it
// also keeps the heap near what is live (see collect), and once that is
// over it gives the memory back to the system.
func (s *Server) watch() {
	tick := time.NewTicker(watchEvery)
	defer tick.Stop()
	w := &watchdog{conns: map[uint64]*watchedConn{}, held: map[uint64]heldBytes{}, delivered: -1}
	for {
		kicked := false
		select {
		case <-s.stop:
			return
		case <-tick.C:
		case <-s.kick:
			kicked = true
		}
		now := time.Now()
		sent := s.sent.Swap(0)
		w.burst += sent
		w.expire(now)
		if d := s.delivered(); kicked || d < 0 || d != w.delivered {
			w.delivered = d
			cuts, waiting := s.look(w, now)
			w.waiting = waiting
			if cuts > 0 || (sent > 0 && w.burst >= int64(s.cfg.MaxSessionPending)) {
				w.busy = now
			}
		}
		if held := w.heldBytes(); held > 0 || w.waiting >= kickEvery {
			w.busy = now
			if slack := s.cfg.MaxSessionPending / 8; held+w.waiting >= slack {
				s.collect(uint64(slack))
			}
		}
		if !w.busy.IsZero() && now.Sub(w.busy) >= time.Second {
			// What the cut connections and the burst held is garbage
			// now: once it is over, give it back to the system at once
			// rather than when the runtime gets round to it.
			w.busy, w.burst = time.Time{}, 0
			debug.FreeOSMemory()
		}
	}
}

// watchdog is what watch remembers from one look to the next.
type watchdog struct {
	conns     map[uint64]*watchedConn // the session connections, by client id
	held      map[uint64]heldBytes    // cut connections whose bytes the server may still hold
	waiting   int                     // bytes waiting for the session connections, at the last look
	delivered int64                   // the server's deliveries at the last look
	busy      time.Time               // when it last saw a cut, a backlog or a burst
	burst     int64                   // bytes published since it last gave memory back
}

// heldBytes returns what the cut connections still hold.
func (w *watchdog) heldBytes() int {
	n := 0
	for _, h := range w.held {
		n += h.bytes
	}
	return n
}

// collect starts a collection if the heap has grown by slack over what
// was live after the last one, and none is under way. While stalled
// connections hold a backlog, or cut ones their bytes, those bytes are
// live, and the collector's own pace (GOGC=100) would let the heap grow
// to twice them before it collects: the bound on what waits would hold
// for what is live, not for the process.
func (s *Server) collect(slack uint64) {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 || sample[1].Value.Kind() != metrics.KindUint64 ||
		sample[1].Value.Uint64() <= sample[0].Value.Uint64()+slack || !s.collecting.CompareAndSwap(false, true) {
		return
	}
	// On a goroutine of its own: the watchdog goes on looking meanwhile.
	s.wg.Go(func() {
		defer s.collecting.Store(false)
		runtime.GC()
	})
}

// watchedConn is a session connection as the watchdog last saw it.
type watchedConn struct {
	cid     uint64
	session string
	pending int   // bytes waiting to be written
	written int64 // bytes delivered to it less those waiting
	// stuck is since when bytes have waited and the server wrote none;
	// zero while nothing waits or it writes.
	stuck time.Time
}

// stalled reports whether c has stopped reading, as seen at now.
func (c *watchedConn) stalled(now time.Time) bool {
	return c.pending >= stallBytes && !c.stuck.IsZero() && now.Sub(c.stuck) >= stallAfter
}

// heldBytes is what a cut connection held, counted until.
type heldBytes struct {
	session string
	bytes   int
	until   time.Time
}

// expire forgets what cut connections held once the server has let go of
// it.
func (w *watchdog) expire(now time.Time) {
	for cid, h := range w.held {
		if !now.Before(h.until) {
			delete(w.held, cid)
		}
	}
}

// delivered returns a count that changes whenever the server delivers a
// message to a client of the accounts whose publishers can reach a
// session: the host's (the notifications) and the sessions' (the
// replies). It is -1 if the server cannot tell.
func (s *Server) delivered() int64 {
	sz, err := s.ns.AccountStatz(&server.AccountStatzOptions{Accounts: []string{server.DEFAULT_GLOBAL_ACCOUNT, sessionsAccount}, IncludeUnused: true})
	if err != nil {
		return -1
	}
	n := int64(0)
	for _, a := range sz.Accounts {
		n += a.Sent.Msgs
	}
	return n
}

// look updates w from the server's connections and cuts what watch says.
// It returns how many it cut, and the bytes waiting for the session
// connections it left.
func (s *Server) look(w *watchdog, now time.Time) (int, int) {
	s.mu.Lock()
	sessionOf := map[uint64]string{}
	for _, cred := range s.users {
		for id := range cred.clients {
			sessionOf[id] = cred.session
		}
	}
	s.mu.Unlock()
	if len(sessionOf) == 0 && len(w.conns) == 0 {
		return 0, 0
	}
	s.looks.Add(1)
	// All of the account's connections (the limit only cuts the list
	// short); those that are not a session credential's are the broker's.
	cz, err := s.ns.Connz(&server.ConnzOptions{Account: sessionsAccount, Limit: math.MaxInt32})
	if err != nil {
		return 0, 0
	}
	seen := make(map[uint64]*watchedConn, len(sessionOf))
	var conns []*watchedConn
	waiting := 0
	for _, ci := range cz.Conns {
		session, ok := sessionOf[ci.Cid]
		if !ok {
			continue
		}
		// What was written: what was delivered less what waits. (What
		// waits also counts each message's header, so a delivery alone
		// makes this go down, never up.)
		written := ci.OutBytes - int64(ci.Pending)
		c := w.conns[ci.Cid]
		switch {
		case c == nil:
			c = &watchedConn{cid: ci.Cid, session: session}
		case ci.Pending == 0 || written > c.written:
			c.stuck = time.Time{}
		case c.stuck.IsZero():
			c.stuck = now
		}
		c.pending, c.written = ci.Pending, written
		seen[ci.Cid] = c
		conns = append(conns, c)
		waiting += ci.Pending
	}
	// A connection gone since the last look, with bytes waiting, was
	// closed by the server (its bound, its write deadline) or by its
	// client: what it held counts as held.
	for cid, c := range w.conns {
		if _, ok := seen[cid]; !ok && c.pending > 0 {
			w.held[cid] = heldBytes{session: c.session, bytes: c.pending, until: now.Add(holdFor)}
		}
	}
	w.conns = seen
	cuts := chooseCuts(conns, w.held, cutLimits{conn: s.cfg.SlowConsumerBytes, session: s.cfg.SessionPendingBytes, all: s.cfg.MaxSessionPending}, now)
	for _, c := range cuts {
		s.log.Warn("closing a session connection that stopped reading", "session", c.session, "pendingBytes", c.pending)
		_ = s.ns.DisconnectClientByID(c.cid)
		w.held[c.cid] = heldBytes{session: c.session, bytes: c.pending, until: now.Add(holdFor)}
		delete(w.conns, c.cid)
		waiting -= c.pending
	}
	return len(cuts), waiting
}

// cutLimits are the watchdog's bounds on bytes waiting to be written: to
// one session connection, to one session's, to all of them.
type cutLimits struct{ conn, session, all int }

// chooseCuts returns the connections to cut, largest first:
//   - one with more than lim.conn waiting;
//   - while what waits for its session's connections, or for all of them,
//     is over their bound by itself: the largest, until it is within;
//   - while its session, with what its cut connections still hold, is
//     over its bound: one with stallBytes waiting (its session's own
//     connections are what holds it);
//   - while all sessions, with what cut connections still hold, are over
//     their bound: one that stopped reading (it would only add to it).
//
// Cutting moves what a connection waits for to what cut ones hold, so a
// bound passed with what they hold stays passed until the server lets go
// of it.
func chooseCuts(conns []*watchedConn, held map[uint64]heldBytes, lim cutLimits, now time.Time) []*watchedConn {
	live, kept := map[string]int{}, map[string]int{}
	liveAll, keptAll := 0, 0
	for _, c := range conns {
		live[c.session] += c.pending
		liveAll += c.pending
	}
	for _, h := range held {
		kept[h.session] += h.bytes
		keptAll += h.bytes
	}
	slices.SortStableFunc(conns, func(a, b *watchedConn) int { return cmp.Compare(b.pending, a.pending) })
	var cuts []*watchedConn
	for _, c := range conns {
		if c.pending == 0 {
			break
		}
		s := c.session
		cut := c.pending > lim.conn || live[s] > lim.session || liveAll > lim.all ||
			(c.pending >= stallBytes && live[s]+kept[s] > lim.session) ||
			(c.stalled(now) && liveAll+keptAll > lim.all)
		if !cut {
			continue
		}
		cuts = append(cuts, c)
		live[s] -= c.pending
		liveAll -= c.pending
		kept[s] += c.pending
		keptAll += c.pending
	}
	return cuts
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
