package natsbus

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-bus/a2a-bus/internal/fanout"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// ClientConfig configures the session side. Give one credential: Token
// (the host's: any session, and host calls), User and Password with
// Session (a session credential from a2a.sessions.open), or CredsFile; or
// none, for a URL that carries one. The zero values of the other fields
// are their defaults.
type ClientConfig struct {
	// URL of the NATS server ("nats://127.0.0.1:4222").
	URL string
	// Token is the host credential.
	Token string
	// User and Password are a session credential; Session is the session
	// it belongs to, the only one the client can open.
	User, Password, Session string
	// CredsFile is a NATS credentials file, for an external server.
	CredsFile string
	// Broker names, on a cluster, the broker of this client's own host
	// (its --broker-name; the connection file's "broker"): every request
	// carries it in the A2A-Broker header, so that the agents registered
	// through this client belong to that broker, whichever broker serves
	// them, and are let go when it is gone for the orphan timeout, as the
	// host with it is taken for dead (docs/PROTOCOL.md §13). "" names
	// none: an agent then belongs to the broker that served its
	// registration.
	Broker string
	// MaxMessageBytes is the largest request Call sends; a larger one is
	// transport.ErrTooLarge. 0 means wire.DefaultMaxMessageBytes.
	MaxMessageBytes int
	// Buffer is each subscription's buffer; a receiver that falls further
	// behind loses notifications (it replays them). 0 means
	// transport.DefaultSubscriptionBuffer.
	Buffer int
	// NoReconnect makes a lost connection final instead of retried: for
	// a host that replaces a lost broker itself. Otherwise the client
	// reconnects for as long as it is open, in-process ones too (see
	// reconnectWait).
	NoReconnect bool
	// Logger receives the client's logs. nil discards them.
	Logger *slog.Logger

	inProcess nats.InProcessConnProvider
	// inbox and own, when positive, replace inboxSize and
	// ownSubscriptions (tests).
	inbox, own int
	// relinkWait, when set (tests), replaces relinkWait.
	relinkWait time.Duration
}

// Validate reports the settings Dial refuses (ErrBadConfig): more than
// one credential, a Password without a User, a session credential
// without its Session, a negative MaxMessageBytes or Buffer, a message
// limit out of range (wire.Limits.Valid).
func (c ClientConfig) Validate() error {
	errs := negatives(map[string]int64{"MaxMessageBytes": int64(c.MaxMessageBytes), "Buffer": int64(c.Buffer)})
	if err := validMessageBytes(c.MaxMessageBytes); err != nil {
		errs = append(errs, err)
	}
	given := 0
	for _, set := range []bool{c.Token != "", c.User != "", c.CredsFile != ""} {
		if set {
			given++
		}
	}
	if given > 1 {
		errs = append(errs, fmt.Errorf("%w: give one credential: Token, User and Password, or CredsFile", ErrBadConfig))
	}
	if c.Password != "" && c.User == "" {
		errs = append(errs, fmt.Errorf("%w: a Password needs its User", ErrBadConfig))
	}
	if c.User != "" && c.Session == "" {
		errs = append(errs, fmt.Errorf("%w: a session credential needs its Session", ErrBadConfig))
	}
	if c.Broker != "" && !ValidBrokerName(c.Broker) {
		errs = append(errs, fmt.Errorf("%w: Broker %q: 1 to 64 letters, digits, - or _", ErrBadConfig, c.Broker))
	}
	return errors.Join(errs...)
}

// flushTimeout bounds Subscribe's wait for the server when its context
// has no deadline.
const flushTimeout = 10 * time.Second

// How a client keeps its connection, chosen for a desktop rather than a
// data centre: the server is on loopback or in the same process, so an
// attempt to reconnect costs next to nothing and fails or succeeds at
// once; what goes wrong there is a process that stops for a while (a
// debugger, SIGSTOP, a starved machine) and continues.
const (
	// reconnectWait is the pause between two attempts to reconnect, for
	// as long as the client is open, after a first attempt at once (see
	// reconnectDelay): a connection the server cut (a reader that fell
	// behind) is made again at once, and a broker restarted by its host
	// is found within a quarter of a second of being back.
	reconnectWait = 250 * time.Millisecond
	// pingInterval and maxPingsOut: a server that has answered none of
	// maxPingsOut pings sent pingInterval apart (60 to 90 s of silence)
	// is taken for gone, and the connection is made again. A server that
	// exits closes its sockets and is noticed at once; these are for one
	// that hangs. A server stopped up to a minute (SIGSTOP, a debugger)
	// keeps the connection, and the answers it owes on it, when it
	// continues; a client that was itself stopped sends one ping on
	// waking, which is answered. Each ping costs the server a wake-up
	// per idle connection, so they are as rare as that allows: nats.go's
	// 2 min x 2 would leave a hung server unnoticed for up to 6 minutes.
	pingInterval = 30 * time.Second
	maxPingsOut  = 2
	// relinkWait is how long a call made while the connection is being
	// made again waits for it, before it is ErrUnavailable: in-process
	// a cut then costs the calls under way, not the next ones.
	relinkWait = 2 * time.Second
)

// reconnectDelay is the wait before an attempt to reconnect (the first is
// 1): none before the first, reconnectWait before the others. (nats.go's
// ReconnectWait waits before the first too, when there is one server.)
func reconnectDelay(attempt int) time.Duration {
	if attempt <= 1 {
		return 0
	}
	return reconnectWait
}

// logAsync logs an error nats.go reports on its own. One that only says
// that the connection is closed (its flusher wrote to a connection the
// server had cut) is debug: the cut has its own line.
func logAsync(log *slog.Logger, err error, args ...any) {
	level := slog.LevelWarn
	if errors.Is(err, io.ErrClosedPipe) || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		level = slog.LevelDebug
	}
	log.Log(context.Background(), level, "nats: asynchronous error", append(args, "error", err)...)
}

// ErrWrongSession is returned by Client.Session for a session other than
// the one a session credential belongs to.
var ErrWrongSession = errors.New("natsbus: the credential belongs to another session")

// Client is the session side over NATS. It implements transport.Client and
// transport.HostCaller (host calls need the host credential).
type Client struct {
	cfg     ClientConfig
	nc      *nats.Conn
	header  nats.Header // every request's (read-only), or nil
	log     *slog.Logger
	onClose func()

	ctx    context.Context // canceled by Close
	cancel context.CancelFunc

	mu       sync.Mutex
	closed   bool // set by Close before it ends anything
	sessions map[*session]struct{}
	// link is canceled when the connection drops: a reply to a request
	// sent before cannot arrive any more (core NATS keeps nothing).
	link     context.Context
	linkDown context.CancelFunc
	// relinked, while the connection is down, is closed when it is made
	// again (nil while it is up); downSince is when it went down.
	relinked  chan struct{}
	downSince time.Time
	// closing, when set (tests), runs in Close once closed is set and
	// before anything ends.
	closing func()
	// relinkWaiters counts the calls waiting for the link (for tests).
	relinkWaiters atomic.Int32

	// inbox receives the notifications of every subscription; the
	// dispatcher hands each to the subscription it came by.
	inbox    chan *nats.Msg
	gone     chan struct{}
	goneOnce sync.Once
	rmu      sync.RWMutex
	routes   map[*nats.Subscription]*fanout.Sub
	// With a host credential, past ownSubscriptions sessions' events
	// come by one wildcard subscription (wild), routed by subject
	// (byEvents), so that any number of sessions get their events
	// within the server's cap on subscriptions per connection.
	wild     *nats.Subscription
	wildMu   sync.Mutex // held while wild is made
	byEvents map[string]map[*fanout.Sub]struct{}
	wg       sync.WaitGroup // the dispatcher
	// subMu is held from a subscription's SUB to the server's answer,
	// so that a refusal the server sends in between is this one's (see
	// refused); maxSubs, under it, is the server's cap on subscriptions
	// per connection once one refusal showed it, 0 before.
	subMu   sync.Mutex
	maxSubs int

	muxOnce sync.Once
	mux     *replyMux
	muxErr  error
}

// inboxSize is how many notifications wait for the dispatcher on a
// client that may hold many sessions (the host's); sessionInboxSize on one
// with a session credential, which holds one (a Node-shaped host opens
// one such client per session: the inbox's pointers were 512 KiB of each).
// Past it nats.go drops them, and the subscriptions they were for end, to
// be made again and replayed (cutSlow).
const (
	inboxSize        = 1 << 16
	sessionInboxSize = 1 << 10
)

// inboxSize is the size of the client's inbox.
func (cfg ClientConfig) inboxSize() int {
	switch {
	case cfg.inbox > 0:
		return cfg.inbox
	case cfg.Session != "":
		return sessionInboxSize
	}
	return inboxSize
}

// ownSubscriptions is how many sessions of a client with a host
// credential subscribe on subscriptions of their own; the others' events
// come by the wildcard (see Client.wild). Well within the server's 4,096
// subscriptions per connection, and high enough that a desktop host's
// sessions, and the gateway's, never pay for the others' events.
const ownSubscriptions = 1024

// wildcard reports whether this session subscription should go by the
// wildcard: the client has a host credential and ownSubscriptions
// sessions subscribed on their own. rmu is not held.
func (c *Client) wildcard() bool {
	if c.cfg.Token == "" {
		return false
	}
	c.rmu.RLock()
	defer c.rmu.RUnlock()
	return len(c.routes) >= cmp.Or(c.cfg.own, ownSubscriptions)
}

// ensureWild makes the wildcard subscription to every session's events,
// once, and waits until the server has it.
func (c *Client) ensureWild(ctx context.Context) error {
	c.wildMu.Lock()
	defer c.wildMu.Unlock()
	c.rmu.RLock()
	ok := c.wild != nil && c.wild.IsValid()
	c.rmu.RUnlock()
	if ok {
		return nil
	}
	ns, err := c.subscribe(ctx, EventsPrefix+"*"+EventsSuffix, nil)
	if err != nil {
		return err
	}
	c.rmu.Lock()
	c.wild = ns
	c.rmu.Unlock()
	return nil
}

// subscribe subscribes to subject into the client's inbox, and returns
// once the server has the interest (every later publish reaches it), or
// has refused it: transport.ErrRefused, wrapping nats.go's error. sub,
// when not nil, is routed what the subscription brings from before it
// can bring anything (and no longer if it fails).
func (c *Client) subscribe(ctx context.Context, subject string, sub *fanout.Sub) (_ *nats.Subscription, err error) {
	c.subMu.Lock()
	defer c.subMu.Unlock()
	if c.maxSubs > 0 && c.nc.NumSubscriptions() >= c.maxSubs {
		return nil, fmt.Errorf("%w: %s: %v (%d per connection)", transport.ErrRefused, subject, nats.ErrMaxSubscriptionsExceeded, c.maxSubs)
	}
	before := c.nc.LastError()
	ns, err := c.nc.ChanSubscribe(subject, c.inbox)
	if err != nil {
		return nil, fmt.Errorf("%w: subscribe: %v", transport.ErrUnavailable, err)
	}
	if sub != nil {
		c.route(ns, sub)
		defer func() {
			if err != nil {
				c.route(ns, nil)
			}
		}()
	}
	// nats.go wants a deadline for the flush.
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, flushTimeout)
		defer cancel()
	}
	if err := c.nc.FlushWithContext(ctx); err != nil {
		_ = ns.Unsubscribe()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: subscribe: %v", transport.ErrUnavailable, err)
	}
	if err := c.refused(before, subject); err != nil {
		_ = ns.Unsubscribe()
		return nil, err
	}
	return ns, nil
}

// refused reports whether the server refused the subscription to subject
// that subscribe just made, by the error it answered before the flush's
// PONG (a server sends a refusal before it reads the PING after the SUB,
// and nats.go records it as the connection's last error before it reads
// the PONG). before is the last error from before the SUB. c.subMu is
// held: no other SUB was in between.
//
// A permission refusal names the subject, and is a new error each time. A
// refusal for the cap is always the same error, so it is told apart only
// the first time; then the cap is learned (the subscriptions the server
// holds, this one not counted) and subscribe refuses past it without
// asking. The cap is forgotten when the connection is made again, as
// nats.go forgets the last error.
func (c *Client) refused(before error, subject string) error {
	after := c.nc.LastError()
	if after == nil || after == before {
		return nil
	}
	switch {
	case errors.Is(after, nats.ErrPermissionViolation) && strings.Contains(after.Error(), `"`+subject+`"`):
		return fmt.Errorf("%w: %s: %v", transport.ErrRefused, subject, after)
	case errors.Is(after, nats.ErrMaxSubscriptionsExceeded):
		c.maxSubs = c.nc.NumSubscriptions() - 1
		return fmt.Errorf("%w: %s: %v (%d per connection)", transport.ErrRefused, subject, after, c.maxSubs)
	}
	return nil
}

// cutSlow ends the subscriptions that ns brings events to, after nats.go
// dropped one of its messages (the inbox was full): their receivers
// subscribe again and replay at once, as after a lost connection, rather
// than find the loss at their next check.
func (c *Client) cutSlow(ns *nats.Subscription) {
	c.rmu.RLock()
	var subs []*fanout.Sub
	if ns == c.wild {
		for _, byEvents := range c.byEvents {
			for sub := range byEvents {
				subs = append(subs, sub)
			}
		}
	} else if sub := c.routes[ns]; sub != nil {
		subs = append(subs, sub)
	}
	c.rmu.RUnlock()
	if len(subs) > 0 {
		c.log.Warn("nats: events were dropped for a slow receiver; its subscriptions end, to be made again and replayed", "subscriptions", len(subs))
	}
	for _, sub := range subs {
		sub.Close()
	}
}

// routeEvents adds sub to (or, with add false, removes it from) what the
// wildcard brings for subject.
func (c *Client) routeEvents(subject string, sub *fanout.Sub, add bool) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	subs := c.byEvents[subject]
	if add {
		if subs == nil {
			subs = map[*fanout.Sub]struct{}{}
			c.byEvents[subject] = subs
		}
		subs[sub] = struct{}{}
		return
	}
	delete(subs, sub)
	if len(subs) == 0 {
		delete(c.byEvents, subject)
	}
}

func (c *Client) route(ns *nats.Subscription, sub *fanout.Sub) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if sub == nil {
		delete(c.routes, ns)
	} else {
		c.routes[ns] = sub
	}
}

func (c *Client) dispatch() {
	defer c.wg.Done()
	for {
		select {
		case m := <-c.inbox:
			c.rmu.RLock()
			if m.Sub != c.wild || c.wild == nil {
				sub := c.routes[m.Sub]
				c.rmu.RUnlock()
				if sub != nil {
					sub.Deliver(m.Data)
				}
				continue
			}
			var subs []*fanout.Sub
			for sub := range c.byEvents[m.Subject] {
				subs = append(subs, sub)
			}
			c.rmu.RUnlock()
			for _, sub := range subs {
				sub.Deliver(m.Data)
			}
		case <-c.ctx.Done():
			return
		}
	}
}

var (
	_ transport.Client     = (*Client)(nil)
	_ transport.HostCaller = (*Client)(nil)
)

// Dial connects a client. It refuses what cfg.Validate refuses.
func Dial(cfg ClientConfig) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = wire.DefaultMaxMessageBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Client{cfg: cfg, log: cfg.Logger, sessions: map[*session]struct{}{},
		inbox: make(chan *nats.Msg, cfg.inboxSize()), routes: map[*nats.Subscription]*fanout.Sub{},
		byEvents: map[string]map[*fanout.Sub]struct{}{}, gone: make(chan struct{})}
	if cfg.Broker != "" {
		c.header = nats.Header{BrokerHeader: []string{cfg.Broker}}
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.link, c.linkDown = context.WithCancel(c.ctx)
	opts := []nats.Option{
		nats.Name("a2a-bus client"),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			logAsync(c.log, err)
			if errors.Is(err, nats.ErrSlowConsumer) && sub != nil {
				c.cutSlow(sub)
			}
		}),
	}
	switch {
	case cfg.Token != "":
		opts = append(opts, nats.Token(cfg.Token))
	case cfg.User != "":
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password), nats.CustomInboxPrefix(SessionInbox(cfg.Session)))
	case cfg.CredsFile != "":
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	if cfg.inProcess != nil {
		opts = append(opts, nats.InProcessServer(cfg.inProcess))
	}
	if cfg.NoReconnect {
		opts = append(opts, nats.NoReconnect())
	} else {
		opts = append(opts, nats.MaxReconnects(-1), nats.CustomReconnectDelay(reconnectDelay))
	}
	opts = append(opts, nats.PingInterval(pingInterval), nats.MaxPingsOutstanding(maxPingsOut))
	// A connection that is closed for good ends every subscription.
	opts = append(opts, nats.ClosedHandler(func(*nats.Conn) {
		c.linkLost()
		c.endSubscriptions()
		c.goneOnce.Do(func() { close(c.gone) })
	}))
	opts = append(opts, nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
		if err != nil {
			if cfg.NoReconnect {
				c.log.Warn("nats: the connection was cut", "error", err)
			} else {
				c.log.Warn("nats: the connection was cut; reconnecting", "error", err)
			}
		}
		c.linkLost()
	}))
	opts = append(opts, nats.ReconnectHandler(func(*nats.Conn) {
		c.subMu.Lock()
		c.maxSubs = 0 // nats.go forgot the last error: see refused
		c.subMu.Unlock()
		down := c.relink()
		c.log.Info("nats: reconnected", "after", down.Round(time.Millisecond))
		// What was published meanwhile is lost to the subscriptions:
		// each ends, as on a lost connection, so that its receiver
		// subscribes again at once and replays what passed (the runtime
		// does; PROTOCOL.md §5). Ended now rather than at the cut: a
		// receiver that subscribed again while the connection was down
		// would only retry.
		c.endSubscriptions()
	}))
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("natsbus: connect to %s: %w", redact(cfg.URL), err)
	}
	c.nc = nc
	c.wg.Add(1)
	go c.dispatch()
	return c, nil
}

// linkLost ends the link: the requests under way cannot be answered.
func (c *Client) linkLost() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.markDown()
}

// markDown ends the link and starts waiting for the next. c.mu is held.
func (c *Client) markDown() {
	c.linkDown()
	if c.relinked == nil {
		c.relinked, c.downSince = make(chan struct{}), time.Now()
	}
}

// relink starts a new link on a connection made again, and returns how
// long it was down.
func (c *Client) relink() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.linkDown()
	c.link, c.linkDown = context.WithCancel(c.ctx)
	if c.relinked == nil {
		return 0
	}
	close(c.relinked)
	c.relinked = nil
	return time.Since(c.downSince)
}

// currentLink returns the link a request goes on: the connection's, or,
// while it is being made again, the next one's, for up to relinkWait.
func (c *Client) currentLink(ctx, scope context.Context) (context.Context, error) {
	c.mu.Lock()
	if c.relinked == nil && c.nc != nil && c.nc.Status() == nats.RECONNECTING {
		// nats.go tells of a cut on a goroutine of its own, which may lag
		// (a starved process): the connection is down before linkLost
		// runs, and a request sent now would be lost with the link it
		// ends. Take the cut as told. The reconnect it has not made yet
		// is told after the cut (nats.go tells them in order, and relink
		// needs c.mu, held here), so the link comes back with it.
		c.markDown()
	}
	link, relinked := c.link, c.relinked
	c.mu.Unlock()
	if relinked == nil {
		return link, nil
	}
	patience := relinkWait
	if c.cfg.relinkWait > 0 {
		patience = c.cfg.relinkWait
	}
	wait := time.NewTimer(patience)
	defer wait.Stop()
	c.relinkWaiters.Add(1)
	defer c.relinkWaiters.Add(-1)
	select {
	case <-relinked:
	case <-scope.Done():
	case <-ctx.Done():
	case <-c.gone:
	case <-wait.C:
	}
	// What ended the wait is read in request's order, whichever of them
	// the select took.
	switch {
	case scope.Err() != nil || c.isClosed():
		return nil, transport.ErrClosed
	case ctx.Err() != nil:
		return nil, ctx.Err()
	}
	c.mu.Lock()
	link, relinked = c.link, c.relinked
	c.mu.Unlock()
	if relinked == nil {
		return link, nil
	}
	return nil, fmt.Errorf("%w: the connection to NATS was lost", transport.ErrUnavailable)
}

// isClosed reports whether Close was called.
func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func (c *Client) endSubscriptions() {
	c.mu.Lock()
	sessions := make([]*session, 0, len(c.sessions))
	for s := range c.sessions {
		sessions = append(sessions, s)
	}
	c.mu.Unlock()
	for _, s := range sessions {
		s.endSubscriptions()
	}
}

// Gone is closed when the connection is closed for good (a client with
// NoReconnect lost it, or Close).
func (c *Client) Gone() <-chan struct{} { return c.gone }

// Conn returns the underlying NATS connection.
func (c *Client) Conn() *nats.Conn { return c.nc }

// Session implements transport.Client.
func (c *Client) Session(ctx context.Context, id string) (transport.Session, error) {
	if err := wire.ValidateID("session id", id); err != nil {
		return nil, err
	}
	if c.cfg.Session != "" && id != c.cfg.Session {
		return nil, ErrWrongSession
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, transport.ErrClosed
	}
	s := &session{c: c, id: id, rpc: RPCSubject(id), events: EventsSubject(id), inbox: SessionInbox(id)}
	s.ctx, s.cancel = context.WithCancel(c.ctx)
	c.sessions[s] = struct{}{}
	return s, nil
}

// CallHost implements transport.HostCaller.
func (c *Client) CallHost(ctx context.Context, method string, params any) (json.RawMessage, error) {
	inbox := "" // nats.go's own
	if c.cfg.Session != "" {
		inbox = SessionInbox(c.cfg.Session)
	}
	return c.request(ctx, c.ctx, HostRPC, inbox, method, params)
}

// requestBuffers keeps the buffers requests are encoded into: nats.go
// copies a request as it sends it, and the buffer serves the next one.
var requestBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// maxKeptRequestBuffer bounds the buffers kept for the next request: one
// grown by a large request goes.
const maxKeptRequestBuffer = 64 << 10

// request sends one request on subject and waits for its reply, which
// comes in inbox (a session's: see roundTrip), or in nats.go's own when
// inbox is "".
func (c *Client) request(ctx, scope context.Context, subject, inbox, method string, params any) (json.RawMessage, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if scope.Err() != nil {
		return nil, transport.ErrClosed
	}
	buf := requestBuffers.Get().(*[]byte)
	req, err := wire.AppendRequest((*buf)[:0], 1, method, params)
	defer func() {
		if cap(req) <= maxKeptRequestBuffer {
			*buf = req[:0]
			requestBuffers.Put(buf)
		}
	}()
	if err != nil {
		return nil, err
	}
	if len(req) > c.cfg.MaxMessageBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", transport.ErrTooLarge, len(req), c.cfg.MaxMessageBytes)
	}
	// The request ends when the session or client closes, or the
	// connection drops.
	link, err := c.currentLink(ctx, scope)
	if err != nil {
		return nil, err
	}
	msg, err := c.roundTrip(ctx, scope, link, subject, inbox, req)
	switch {
	case err == nil:
		return wire.DecodeResult(msg.Data)
	case scope.Err() != nil || c.isClosed():
		// Close sets closed before it ends the scope or the link, which
		// end in no fixed order (siblings under the client's context):
		// a call woken by either is ErrClosed once Close has begun.
		return nil, transport.ErrClosed
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case link.Err() != nil:
		return nil, fmt.Errorf("%w: the connection to NATS was lost", transport.ErrUnavailable)
	case errors.Is(err, nats.ErrMaxPayload):
		return nil, fmt.Errorf("%w: %v", transport.ErrTooLarge, err)
	case errors.Is(err, nats.ErrNoResponders):
		return nil, fmt.Errorf("%w: no broker serves %s", transport.ErrUnavailable, subject)
	default:
		return nil, fmt.Errorf("%w: %v", transport.ErrUnavailable, err)
	}
}

// roundTrip sends one request and waits for its reply, until ctx, scope
// or link ends. The broker answers a session's request only in that
// session's inbox (_INBOX.<T>.): a session credential's connection may
// read only there, all its requests' replies come there; a client that
// may act for any session (the host's) reads every session's replies to
// its own requests through one wildcard subscription. A request of the
// host's own (inbox "") goes through nats.go's request, in an inbox no
// session can read.
func (c *Client) roundTrip(ctx, scope, link context.Context, subject, inbox string, data []byte) (*nats.Msg, error) {
	if inbox == "" {
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(scope, cancel)
		defer stop()
		stopLink := context.AfterFunc(link, cancel)
		defer stopLink()
		if c.header != nil {
			return c.nc.RequestMsgWithContext(rctx, &nats.Msg{Subject: subject, Header: c.header, Data: data})
		}
		return c.nc.RequestWithContext(rctx, subject, data)
	}
	replies, err := c.replyMux()
	if err != nil {
		return nil, err
	}
	return replies.request(ctx, scope, link, c.nc, subject, inbox, c.header, data)
}

func (c *Client) replyMux() (*replyMux, error) {
	c.muxOnce.Do(func() {
		c.mux, c.muxErr = newReplyMux(c.nc, c.cfg.Session)
	})
	return c.mux, c.muxErr
}

// Close implements transport.Client. Idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	sessions := c.sessions
	c.sessions = nil
	c.mu.Unlock()
	if c.closing != nil {
		c.closing()
	}
	c.cancel()
	for s := range sessions {
		s.close()
	}
	c.nc.Close()
	c.wg.Wait()
	if c.onClose != nil {
		c.onClose()
	}
	return nil
}

type session struct {
	c           *Client
	id          string
	rpc, events string
	inbox       string // its replies' (SessionInbox)
	ctx         context.Context
	cancel      context.CancelFunc

	mu   sync.Mutex
	subs map[*fanout.Sub]*nats.Subscription
}

func (s *session) ID() string { return s.id }

func (s *session) Call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	return s.c.request(ctx, s.ctx, s.rpc, s.inbox, method, params)
}

func (s *session) Subscribe(ctx context.Context) (transport.Subscription, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return nil, transport.ErrClosed
	}
	if s.subs == nil {
		s.subs = map[*fanout.Sub]*nats.Subscription{}
	}
	var sub *fanout.Sub
	if s.c.wildcard() {
		if err := s.c.ensureWild(ctx); err != nil {
			return nil, err
		}
		sub = fanout.NewSub(s.c.cfg.Buffer, func() {
			s.mu.Lock()
			delete(s.subs, sub)
			s.mu.Unlock()
			s.c.routeEvents(s.events, sub, false)
		})
		s.c.routeEvents(s.events, sub, true)
		s.subs[sub] = nil // no subscription of its own
		return sub, nil
	}
	var ns *nats.Subscription
	sub = fanout.NewSub(s.c.cfg.Buffer, func() {
		s.mu.Lock()
		delete(s.subs, sub)
		s.mu.Unlock()
		s.c.route(ns, nil)
		_ = ns.Unsubscribe()
	})
	// Every subscription of the client delivers into one channel, read by
	// one goroutine: no goroutine per subscription, however many sessions.
	ns, err := s.c.subscribe(ctx, s.events, sub)
	if err != nil {
		return nil, err
	}
	s.subs[sub] = ns
	return sub, nil
}

func (s *session) Close() error {
	s.c.mu.Lock()
	delete(s.c.sessions, s)
	s.c.mu.Unlock()
	s.close()
	return nil
}

func (s *session) close() {
	s.cancel()
	s.endSubscriptions()
}

func (s *session) endSubscriptions() {
	s.mu.Lock()
	subs := s.subs
	s.subs = nil
	s.mu.Unlock()
	for sub, ns := range subs {
		if ns == nil {
			s.c.routeEvents(s.events, sub, false)
		} else {
			s.c.route(ns, nil)
			_ = ns.Unsubscribe()
		}
		sub.End()
	}
}
