package natsbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/time/rate"

	"github.com/a2a-bus/a2a-bus/natsbus/internal/admission"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// Defaults of Config's zero fields.
const (
	// DefaultMaxInFlight bounds the requests the broker side handles at
	// once.
	DefaultMaxInFlight = 1024
	// DefaultMaxInFlightPerSession bounds those of one session.
	DefaultMaxInFlightPerSession = 8
	// DefaultMaxWaitingPerSession bounds the requests of one session that
	// wait for their turn; past it, requests are answered A2A_BUSY.
	DefaultMaxWaitingPerSession = 1024
	// DefaultSessionRate bounds the requests per second the broker
	// serves to one session's credentials (with bursts of
	// DefaultSessionBurst): far more than delegates make, far less than a
	// flood that would take the machine's CPU from everyone else.
	DefaultSessionRate  = 10000
	DefaultSessionBurst = 1000
	// NoSessionRate, as Config.SessionRate, lifts the bound on requests
	// per second.
	NoSessionRate = math.MaxFloat64
)

// waitingBytesPerSession bounds the bytes of a session's requests that
// wait, in payload limits (with the defaults, 32 MiB).
const waitingBytesPerSession = 4

// hostKey is the fair queue's key of host requests: no session id has a
// control character.
const hostKey = "\x00host"

// Config configures the broker side. The zero value embeds a server on
// 127.0.0.1, with every bound at its default.
type Config struct {
	// URL of an existing NATS server or cluster to use instead of
	// embedding one ("nats://user:pass@host:4222"); its operator configures
	// the per-session permissions. "" embeds a server.
	URL string
	// CredsFile authenticates to URL with a NATS credentials file.
	CredsFile string
	// QueueGroup, with URL, makes every subscription on which the broker
	// takes requests (a2a.rpc.*, a2a.host.rpc, and the auth callout's)
	// a member of this queue group, so that the brokers sharing a
	// cluster and a group each take a share of the requests and each
	// request is served once. "" subscribes them plainly, as one broker
	// alone does.
	QueueGroup string
	// Callout issues session credentials on an external server, through
	// its auth callout (see CalloutConfig). The zero value leaves them to
	// the operator.
	Callout CalloutConfig
	// Server configures the embedded server.
	Server ServerConfig
	// MaxMessageBytes is the protocol's message limit, and the embedded
	// server's (New sets Server.MaxMessageBytes to it). 0 means
	// wire.DefaultMaxMessageBytes.
	MaxMessageBytes int
	// MaxInFlight bounds the requests handled at once. 0 means
	// DefaultMaxInFlight.
	MaxInFlight int
	// MaxInFlightPerSession bounds the requests of one session handled
	// at once; its others wait their turn, which comes round-robin among
	// the sessions that have requests waiting. 0 means
	// DefaultMaxInFlightPerSession.
	MaxInFlightPerSession int
	// MaxWaitingPerSession bounds the requests of one session that wait
	// (and their bytes, to four payload limits); past it, requests are
	// answered A2A_BUSY at once. 0 means DefaultMaxWaitingPerSession.
	MaxWaitingPerSession int
	// SessionRate bounds the requests per second served to one session;
	// the others wait their turn. Host requests (the token) have no such
	// bound. 0 means DefaultSessionRate, with bursts of
	// DefaultSessionBurst; NoSessionRate (or +Inf) lifts the bound.
	SessionRate float64
	// CloseGrace is how long Close lets the requests being served finish
	// before it cancels them. 0 means DefaultCloseGrace.
	CloseGrace time.Duration
	// Logger receives the bus's logs. nil discards them.
	Logger *slog.Logger
}

// DefaultCloseGrace is Close's wait for the requests being served.
const DefaultCloseGrace = 5 * time.Second

// Validate reports the settings New refuses: ErrBadConfig for a negative
// bound, a message limit out of range (wire.Limits.Valid), a SessionRate
// that is negative or not a number, a Server.MaxMessageBytes other than
// MaxMessageBytes, a CredsFile, QueueGroup or Callout without URL, a
// QueueGroup with white space, a Callout.Seed that is not an account's
// seed; and, when the server is embedded, what Server.Validate reports.
func (c Config) Validate() error {
	errs := negatives(map[string]int64{
		"MaxMessageBytes": int64(c.MaxMessageBytes), "MaxInFlight": int64(c.MaxInFlight),
		"MaxInFlightPerSession": int64(c.MaxInFlightPerSession), "MaxWaitingPerSession": int64(c.MaxWaitingPerSession),
		"CloseGrace": int64(c.CloseGrace),
	})
	if err := validMessageBytes(c.MaxMessageBytes); err != nil {
		errs = append(errs, err)
	}
	if c.SessionRate < 0 || math.IsNaN(c.SessionRate) {
		errs = append(errs, fmt.Errorf("%w: SessionRate is %v; 0 means DefaultSessionRate, NoSessionRate lifts the bound", ErrBadConfig, c.SessionRate))
	}
	if c.Server.MaxMessageBytes != 0 && c.Server.MaxMessageBytes != c.MaxMessageBytes {
		errs = append(errs, fmt.Errorf("%w: Server.MaxMessageBytes is %d, MaxMessageBytes %d: set MaxMessageBytes only", ErrBadConfig, c.Server.MaxMessageBytes, c.MaxMessageBytes))
	}
	if c.QueueGroup != "" && (c.URL == "" || strings.ContainsAny(c.QueueGroup, " \t\r\n")) {
		errs = append(errs, fmt.Errorf("%w: QueueGroup %q: a queue group is for an external server (URL), and has no white space", ErrBadConfig, c.QueueGroup))
	}
	errs = append(errs, c.Callout.validate(c.URL != "")...)
	if c.URL == "" {
		if c.CredsFile != "" {
			errs = append(errs, fmt.Errorf("%w: CredsFile is for an external server (URL)", ErrBadConfig))
		}
		if err := c.Server.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// withDefaults returns c with its zero fields at their defaults.
func (c Config) withDefaults() Config {
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = wire.DefaultMaxMessageBytes
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.MaxInFlightPerSession == 0 {
		c.MaxInFlightPerSession = DefaultMaxInFlightPerSession
	}
	if c.MaxWaitingPerSession == 0 {
		c.MaxWaitingPerSession = DefaultMaxWaitingPerSession
	}
	if c.SessionRate == 0 {
		c.SessionRate = DefaultSessionRate
	}
	if c.CloseGrace == 0 {
		c.CloseGrace = DefaultCloseGrace
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Server.MaxMessageBytes = c.MaxMessageBytes
	if c.Server.Logger == nil {
		c.Server.Logger = c.Logger
	}
	return c
}

// Bus is the broker side over NATS. It implements transport.Bus and
// transport.HostMethodProvider (a2a.sessions.* when it embeds the server
// or answers an external server's auth callout).
type Bus struct {
	cfg    Config
	log    *slog.Logger
	server *Server // nil on an external server
	nc     *nats.Conn
	url    string

	// callout issues session credentials on an external server (nil
	// without Config.Callout).
	callout *callout

	ctx    context.Context // canceled by Close; handler calls run under it
	cancel context.CancelFunc

	mu      sync.Mutex
	serving bool
	closed  bool
	subs    []*nats.Subscription
	clients map[*Client]struct{} // in-process clients made by Connect
	fair    *admission.Queue
	svc     *service // the NATS service API's view of the broker
	payload int
	handler transport.Handler
	// served holds, per session with credentials, the broker's connection
	// that serves the session's requests (see sessionsAccount).
	served map[string]*servedSession
	// reserves counts the closes of served connections handled (tests).
	reserves atomic.Int64
	// reserving runs the replacement of a session's serving connection
	// that the server closed.
	reserving sync.WaitGroup

	closeOnce sync.Once
}

var (
	_ transport.Bus                = (*Bus)(nil)
	_ transport.HostMethodProvider = (*Bus)(nil)
	_ transport.SubscriberCounter  = (*Bus)(nil)
	_ transport.PayloadLimiter     = (*Bus)(nil)
	_ transport.SessionRevoker     = (*Bus)(nil)
)

// New starts the broker side: it embeds a server, or connects to cfg.URL.
// It refuses what cfg.Validate refuses.
func New(cfg Config) (*Bus, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	b := &Bus{cfg: cfg, log: cfg.Logger, clients: map[*Client]struct{}{}, served: map[string]*servedSession{},
		svc: newService(RPCPrefix+"*", HostRPC),
		fair: admission.NewQueue(admission.Limits{
			Total: cfg.MaxInFlight, PerKey: cfg.MaxInFlightPerSession,
			MaxWait: cfg.MaxWaitingPerSession, MaxBytes: waitingBytesPerSession * wire.NewLimits(cfg.MaxMessageBytes).Payload,
			Rate: sessionRate(cfg.SessionRate), Burst: DefaultSessionBurst,
		}, hostKey)}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	opts := []nats.Option{
		nats.Name("a2a-bus broker"),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			logAsync(b.log, err)
		}),
	}
	// The broker's connection is made again whenever it is lost, to the
	// embedded server too (which cuts a connection that falls behind):
	// nats.go subscribes it again, and the broker serves on.
	opts = append(opts, nats.MaxReconnects(-1), nats.CustomReconnectDelay(reconnectDelay),
		nats.PingInterval(pingInterval), nats.MaxPingsOutstanding(maxPingsOut),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				b.log.Warn("nats: the broker's connection was cut; reconnecting", "error", err)
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { b.log.Info("nats: the broker's connection is back") }))
	if cfg.URL == "" {
		srv, err := StartServer(cfg.Server)
		if err != nil {
			b.cancel()
			return nil, err
		}
		b.server = srv
		b.url = srv.URL()
		opts = append(opts, nats.InProcessServer(srv), nats.Token(srv.Token()))
	} else {
		b.url = cfg.URL
		if cfg.CredsFile != "" {
			opts = append(opts, nats.UserCredentials(cfg.CredsFile))
		}
	}
	nc, err := nats.Connect(b.url, opts...)
	if err != nil {
		b.cancel()
		if b.server != nil {
			b.server.Close()
		}
		return nil, fmt.Errorf("natsbus: connect to %s: %w", redact(b.url), err)
	}
	b.nc = nc
	b.payload = int(nc.MaxPayload())
	if cfg.Callout.Seed != "" {
		if b.callout, err = newCallout(cfg, nc); err != nil {
			b.cancel()
			nc.Close()
			return nil, err
		}
	}
	return b, nil
}

// sessionRate is the fair queue's rate for Config.SessionRate (its
// default set).
func sessionRate(r float64) rate.Limit {
	if r >= NoSessionRate || math.IsInf(r, 1) {
		return rate.Inf
	}
	return rate.Limit(r)
}

// MaxPayload implements transport.PayloadLimiter: what the server
// carries (an external server's max_payload may be smaller than the
// message limit wants).
func (b *Bus) MaxPayload() int { return b.payload }

// URL returns the NATS server's URL, without credentials.
func (b *Bus) URL() string { return redact(b.url) }

// Server returns the embedded server, or nil on an external one.
func (b *Bus) Server() *Server { return b.server }

// Serve implements transport.Bus.
func (b *Bus) Serve(h transport.Handler) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.closed:
		return transport.ErrClosed
	case b.serving:
		return transport.ErrServing
	}
	for _, subj := range []string{RPCPrefix + "*", HostRPC} {
		sub, err := b.nc.QueueSubscribe(subj, b.cfg.QueueGroup, func(m *nats.Msg) {
			in := inbound{subject: m.Subject, reply: m.Reply, data: m.Data, publish: b.nc.Publish}
			if m.Header != nil {
				in.home = m.Header.Get(BrokerHeader)
			}
			b.dispatch(h, in, b.server == nil)
		})
		if err != nil {
			return fmt.Errorf("natsbus: subscribe %s: %w", subj, err)
		}
		b.subs = append(b.subs, sub)
	}
	if b.callout != nil {
		if err := b.callout.serve(b.nc, b.cfg.QueueGroup); err != nil {
			return err
		}
	}
	// The service API is not in the queue group: each broker is an
	// instance of the service, which answers PING, INFO and STATS for
	// itself.
	if err := b.svc.answer(b.nc); err != nil {
		b.svc.stop()
		return err
	}
	b.handler = h
	// The server has the interest once Flush returns: from then on a
	// request finds its responder.
	if err := b.nc.Flush(); err != nil {
		return fmt.Errorf("natsbus: flush: %w", err)
	}
	b.serving = true
	return nil
}

// dispatch serves one request. bySession keys a session's requests by
// the session in the fair queue: those that come on a session's own
// connection, and all of them on an external server; on the embedded
// server's main connection only the host's token can send, and its
// requests share the host's key.
func (b *Bus) dispatch(h transport.Handler, m inbound, bySession bool) {
	if m.reply == "" {
		b.log.Debug("request without a reply subject ignored", "subject", m.subject)
		return
	}
	received := time.Now()
	endpoint := endpointSession
	if m.subject == HostRPC {
		endpoint = endpointHost
	}
	answer := func(resp []byte) {
		sent := b.reply(m, resp)
		b.svc.done(endpoint, time.Since(received), sent, "")
	}
	refuse := func(why string) {
		b.log.Debug(why, "subject", m.subject)
		b.svc.done(endpoint, time.Since(received), nil, why)
	}
	// The broker's connection may publish anywhere, and the server checks
	// a session credential's publish subject but not its reply subject:
	// a session's requests are answered only in that session's inbox
	// (_INBOX.<T>.), host requests in some inbox, so that no request can
	// make the broker publish into another session's subjects.
	var from transport.Caller
	key := hostKey
	if endpoint == endpointHost {
		if !strings.HasPrefix(m.reply, InboxPrefix) {
			refuse("host request with a reply subject outside _INBOX. ignored")
			return
		}
		from = transport.Caller{Scope: transport.ScopeHost, HomeBroker: m.homeBroker()}
	} else {
		token := strings.TrimPrefix(m.subject, RPCPrefix)
		if !strings.HasPrefix(m.reply, InboxPrefix+token+".") {
			refuse("request with a reply subject outside its session's inbox ignored")
			return
		}
		session, err := SessionID(token)
		if err != nil {
			answer(wire.ErrorResponse(requestID(m.data), wire.ErrInvalidRequest.Withf("subject %q does not name a session canonically", m.subject)))
			return
		}
		from = transport.Caller{Scope: transport.ScopeSession, Session: session, HomeBroker: m.homeBroker()}
		if bySession {
			key = session
		}
	}
	err := b.fair.Submit(key, len(m.data), func(serve bool) {
		var resp []byte
		if serve {
			resp = h.ServeRPC(b.ctx, from, m.data)
		}
		if resp == nil && (!serve || b.ctx.Err() != nil) {
			// Cut short by Close, or never served: tell a waiting caller,
			// who would otherwise wait for its timeout, unless it expects
			// nothing.
			if req, _ := wire.ParseRequest(m.data, 0); req != nil && !req.IsNotification() {
				resp = wire.ErrorResponse(req.ID, wire.ErrInternal.Withf("the broker is shutting down"))
			}
		}
		if resp != nil {
			answer(resp)
		} else {
			b.svc.done(endpoint, time.Since(received), nil, "") // a notification: served, not answered
		}
	})
	var be *admission.BusyError
	switch {
	case errors.As(err, &be):
		// The flood's overflow: answered as cheaply as can be, so that
		// the subscription keeps up with it; past busyAnswers a second,
		// not answered at all (the flooder's calls time out).
		if b.fair.BusyAnswer(key, busyAnswers, time.Now()) {
			b.reply(m, busyAnswer(wire.PeekID(m.data), be))
			b.svc.done(endpoint, time.Since(received), nil, busyProblem)
		} else {
			b.svc.done(endpoint, time.Since(received), nil, busyProblem+", not answered: past the busy answers a second")
		}
	case err != nil:
		answer(wire.ErrorResponse(requestID(m.data), wire.ErrInternal.Withf("the broker is shutting down")))
	}
}

// busyAnswers is how many A2A_BUSY answers a second the broker sends to
// one session: beyond, a flood's overflow goes unanswered, so that
// answering it cannot cost more than serving everyone else.
const busyAnswers = 1000

// busyProblem is the error an A2A_BUSY answer counts as, without reading
// the answer back.
var busyProblem = fmt.Sprintf("%d %s", wire.ErrBusy.Code, wire.CodeBusy)

// busyAnswer returns the A2A_BUSY response to the request with this id,
// naming the bound the request met with its figures (docs/PROTOCOL.md
// §2.2).
func busyAnswer(id json.RawMessage, be *admission.BusyError) []byte {
	if id == nil {
		id = json.RawMessage("null")
	}
	var msg string
	if be.Bytes {
		msg = fmt.Sprintf("the session's %d requests waiting for the broker hold %d bytes; with this one's %d they would pass the bound of %d bytes waiting (%d in service); retry after a pause",
			be.Waiting, be.WaitingBytes, be.Size, be.MaxBytes, be.Running)
	} else {
		msg = fmt.Sprintf("the session has %d requests waiting for the broker, the bound of requests waiting (%d in service); retry after a pause",
			be.Waiting, be.Running)
	}
	e, _ := json.Marshal(wire.ErrBusy.Withf("%s", msg))
	out := make([]byte, 0, len(id)+len(e)+40)
	out = append(out, `{"jsonrpc":"2.0","id":`...)
	out = append(out, id...)
	out = append(out, `,"error":`...)
	out = append(out, e...)
	return append(out, '}')
}

// requestID returns the id of a request as sent, nil (null) when it
// cannot be read: JSON-RPC keeps the id whenever it can.
func requestID(data []byte) json.RawMessage {
	if req, _ := wire.ParseRequest(data, len(data)); req != nil {
		return req.ID
	}
	return nil
}

// reply sends resp, or, if it is over the payload limit, an error that
// says so; it returns what it sent.
func (b *Bus) reply(m inbound, resp []byte) []byte {
	err := m.publish(m.reply, resp)
	if errors.Is(err, nats.ErrMaxPayload) {
		resp = wire.ErrorResponse(requestID(m.data), wire.ErrInternal.Withf("the response of %d bytes is over the server's payload limit", len(resp)))
		err = m.publish(m.reply, resp)
	}
	if err != nil && b.ctx.Err() == nil {
		b.log.Warn("nats: reply failed", "error", err)
	}
	if err == nil && b.server != nil && m.subject != HostRPC {
		// It may wait for a session's reader. (A host's reply goes to
		// the host's connection, which the watchdog does not watch: the
		// host's health check every 10 s would make it look at every
		// session connection each time.)
		b.server.published(len(resp))
	}
	return resp
}

// Subscribers implements transport.SubscriberCounter: the embedded
// server counts the subscriptions that match the session's subject
// (wildcards included); on an external server the bus cannot tell.
func (b *Bus) Subscribers(session string) (int, bool) {
	if b.server == nil {
		return 0, false
	}
	n, err := b.server.subscribers(session)
	if err != nil {
		return 0, false
	}
	return n, true
}

// Publish implements transport.Bus: the notification goes to the
// recipient session's subject.
func (b *Bus) Publish(session string, msg []byte) error {
	if b.ctx.Err() != nil {
		return transport.ErrClosed
	}
	if err := b.nc.Publish(EventsSubject(session), msg); err != nil {
		if errors.Is(err, nats.ErrConnectionClosed) {
			return transport.ErrClosed
		}
		return fmt.Errorf("natsbus: publish: %w", err)
	}
	if b.server != nil {
		b.server.published(len(msg))
	}
	return nil
}

// HostMethods implements transport.HostMethodProvider: a2a.sessions.open,
// when the server is embedded or Config.Callout is set. Otherwise, on an
// external server, the operator owns the credentials and this method does
// not exist. (a2a.sessions.close is the broker's, which deregisters the
// session's agents after RevokeSession.)
func (b *Bus) HostMethods() map[string]transport.HostMethod {
	if b.server == nil && b.callout == nil {
		return nil
	}
	decode := func(params json.RawMessage) (string, error) {
		var p wire.SessionParams
		if err := wire.DecodeParams(params, &p); err != nil {
			return "", err
		}
		if err := wire.ValidateID("contextId", p.ContextID); err != nil {
			return "", wire.ErrInvalidParams.Withf("%v", err)
		}
		return p.ContextID, nil
	}
	return map[string]transport.HostMethod{
		wire.MethodSessionOpen: func(ctx context.Context, params json.RawMessage) (any, error) {
			session, err := decode(params)
			if err != nil {
				return nil, err
			}
			if b.server == nil {
				return b.callout.issue(ctx, session)
			}
			if err := b.serveSession(session, nil); err != nil {
				return nil, err
			}
			return b.server.OpenSession(session), nil
		},
	}
}

// serveSession makes sure that the session's requests in the sessions
// account are served, on a connection of their own (a link). replacing,
// when not nil, is that link, which the server closed: it is replaced
// only while it is still the session's (the session was not revoked
// meanwhile). The link is made without holding b.mu.
func (b *Bus) serveSession(session string, replacing *sessionLink) error {
	due := func() bool { // b.mu is held
		cur := b.served[session]
		if replacing == nil {
			return cur == nil
		}
		return cur != nil && cur.link == replacing
	}
	b.mu.Lock()
	closed, ok := b.closed, due()
	b.mu.Unlock()
	if closed {
		return transport.ErrClosed
	}
	if !ok {
		return nil
	}
	ss, err := b.dialSession(session)
	if err != nil {
		return err
	}
	b.mu.Lock()
	ok = !b.closed && due()
	if ok {
		b.served[session] = ss
	}
	b.mu.Unlock()
	if !ok {
		ss.link.Close() // another made it first, or it was revoked
	}
	return nil
}

// dialSession connects and subscribes the broker's link serving a
// session.
func (b *Bus) dialSession(session string) (*servedSession, error) {
	c, err := b.server.InProcessConn()
	if err != nil {
		return nil, fmt.Errorf("natsbus: serve session: %w", err)
	}
	gate := &gatedConn{Conn: c, fair: b.fair, key: session}
	user, password := b.server.serveCredential()
	h := b.handler
	l, err := dialLink(gate, linkConfig{
		user: user, password: password, name: "a2a-bus broker: " + SubjectToken(session),
		subject: RPCSubject(session), payload: b.payload,
		handle: func(m inbound) { b.dispatch(h, m, true) },
		ended: func(l *sessionLink, closed bool) {
			switch {
			case b.ctx.Err() != nil: // the bus's own Close
			case closed: // revoked, or replaced
				b.reserves.Add(1)
			default:
				b.reserving.Go(func() { b.reserve(session, l) })
			}
		},
	})
	if err != nil {
		return nil, err
	}
	return &servedSession{link: l, gate: gate}, nil
}

// gatedConn is the broker's end of a session's link: it reads only while
// the session has room for more requests waiting (Queue.Wait), or once
// it is closed.
type gatedConn struct {
	net.Conn
	fair    *admission.Queue
	key     string
	ungated atomic.Bool // closed, or the bus is closing: read at once
}

func (c *gatedConn) Read(p []byte) (int, error) {
	c.fair.Wait(c.key, &c.ungated)
	return c.Conn.Read(p)
}

// ungate makes Read read at once from now on.
func (c *gatedConn) ungate() {
	c.ungated.Store(true)
	c.fair.Wake()
}

func (c *gatedConn) Close() error {
	c.ungate()
	return c.Conn.Close()
}

// reserve replaces a session's link that the server closed while the
// session is still served (the server cut it as a slow consumer: the
// session flooded it). What it held is lost: that session's requests
// time out.
func (b *Bus) reserve(session string, closed *sessionLink) {
	defer b.reserves.Add(1)
	b.mu.Lock()
	cur := b.served[session]
	b.mu.Unlock()
	if cur == nil || cur.link != closed {
		return // revoked (a2a.sessions.close) or replaced: nothing to serve anew
	}
	b.log.Warn("the server closed a session's connection to the broker; serving it anew", "session", session, "error", closed.err())
	if err := b.serveSession(session, closed); err != nil && !errors.Is(err, transport.ErrClosed) {
		b.log.Error("serving a session anew failed", "session", session, "error", err)
	}
}

// servedSession is the broker's link serving one session.
type servedSession struct {
	link *sessionLink
	gate *gatedConn
}

// RevokeSession implements transport.SessionRevoker, when the server is
// embedded or Config.Callout is set: on an external server the
// revocation holds for every broker that shares the Revocations, and the
// session's connections are closed on every server (with
// Callout.SystemURL) or when their user JWT ends.
func (b *Bus) RevokeSession(ctx context.Context, session string) error {
	if b.server == nil {
		if b.callout == nil {
			return errors.New("natsbus: session credentials need the embedded server or an auth callout")
		}
		if err := b.callout.revoke(ctx, session); err != nil {
			return err
		}
		b.fair.Forget(session)
		return nil
	}
	b.server.CloseSession(session)
	b.mu.Lock()
	ss := b.served[session]
	delete(b.served, session)
	b.mu.Unlock()
	if ss != nil {
		ss.link.Close()
	}
	b.fair.Forget(session)
	return nil
}

// Connect returns an in-process client with the host credential (cfg
// gives none): no TCP. Only for an embedded server. Bus.Close closes it too. Unless
// cfg.NoReconnect, the client makes its connection again when the server
// cuts it (a reader that fell behind), as a client over TCP does.
func (b *Bus) Connect(cfg ClientConfig) (*Client, error) {
	if b.server == nil {
		return nil, errors.New("natsbus: in-process clients need the embedded server")
	}
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return nil, transport.ErrClosed
	}
	cfg.Token = b.server.Token()
	cfg.inProcess = b.server
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = b.cfg.MaxMessageBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = b.log
	}
	c, err := Dial(cfg)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		c.Close()
		return nil, transport.ErrClosed
	}
	b.clients[c] = struct{}{}
	c.onClose = func() {
		b.mu.Lock()
		delete(b.clients, c)
		b.mu.Unlock()
	}
	return c, nil
}

// Close implements transport.Bus: it stops taking requests, answers those
// waiting that they were not served, lets the running ones finish for up
// to CloseGrace before it cancels them, sends every answer on its way,
// closes the in-process clients and the broker's connections, and lets
// the embedded server deliver what it holds for its clients (for up to a
// second) before it shuts down. Idempotent.
func (b *Bus) Close() error {
	b.closeOnce.Do(func() {
		b.mu.Lock()
		b.closed = true
		subs := b.subs
		clients := b.clients
		b.clients = map[*Client]struct{}{}
		served := b.served
		b.served = map[string]*servedSession{}
		b.mu.Unlock()
		b.svc.stop() // no longer announced as serving
		if b.callout != nil {
			b.callout.close() // another broker of the group answers
		}
		// One grace for all that follows: taking in what was sent, and
		// letting what runs finish.
		graceEnd := time.Now().Add(b.cfg.CloseGrace)
		for _, ss := range served {
			// What a session sent is read now, whatever it has waiting:
			// it waits its turn or is answered busy, then shutting down.
			ss.gate.ungate()
		}
		var links sync.WaitGroup
		links.Go(func() {
			eachServed(served, func(ss *servedSession) { _ = ss.link.drain(time.Until(graceEnd)) })
		})
		b.drain(subs, graceEnd)
		links.Wait()
		// What runs may finish, for a while: a clean shutdown answers it
		// with its result. Then it is cut short (-32603, shutting down).
		finished := make(chan struct{})
		var grace sync.WaitGroup
		grace.Go(func() {
			select {
			case <-finished:
			case <-time.After(time.Until(graceEnd)):
			}
			b.cancel()
		})
		b.fair.Close() // answers what waits, waits for what runs
		close(finished)
		grace.Wait()
		// The answers leave the broker's connections, then the server
		// hands them to their clients before it shuts down.
		eachServed(served, func(ss *servedSession) {
			_ = ss.link.flush(flushTimeout)
			ss.link.Close()
		})
		b.reserving.Wait()
		_ = b.nc.FlushTimeout(flushTimeout)
		for c := range clients {
			c.Close()
		}
		b.nc.Close()
		if b.server != nil {
			b.server.drain(time.Second)
			b.server.Close()
		}
	})
	return nil
}

// eachServed runs fn for each served session, all at once, and returns
// when every call has.
func eachServed(served map[string]*servedSession, fn func(*servedSession)) {
	var wg sync.WaitGroup
	for _, ss := range served {
		wg.Go(func() { fn(ss) })
	}
	wg.Wait()
}

// drain stops the subscriptions taking requests and hands every request
// they had already received to the fair queue: a plain Unsubscribe would
// drop those the client held but had not dispatched, and their callers,
// whose request the server had delivered, would wait for their timeout.
// A subscription not drained by the deadline is unsubscribed; one whose
// connection closed meanwhile (nats.go then reports no status) is done.
func (b *Bus) drain(subs []*nats.Subscription, deadline time.Time) {
	var draining []*nats.Subscription
	var closed []<-chan nats.SubStatus
	for _, sub := range subs {
		c := sub.StatusChanged(nats.SubscriptionClosed)
		if err := sub.Drain(); err != nil {
			_ = sub.Unsubscribe()
			continue
		}
		draining = append(draining, sub)
		closed = append(closed, c)
	}
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for i, c := range closed {
	wait:
		for {
			select {
			case <-c:
				break wait
			case <-tick.C:
				if !draining[i].IsValid() {
					break wait
				}
			case <-timeout.C:
				for _, sub := range draining[i:] {
					_ = sub.Unsubscribe()
				}
				return
			}
		}
	}
}

// redact removes the user info from a URL list, for logs and files. A
// URL without a scheme is read as nats.go reads it (nats:// added).
func redact(urls string) string {
	var out []string
	for _, u := range strings.Split(urls, ",") {
		u = strings.TrimSpace(u)
		if !strings.Contains(u, "://") {
			u = "nats://" + u
		}
		parsed, err := url.Parse(u)
		if err != nil {
			out = append(out, "(unreadable URL)")
			continue
		}
		parsed.User = nil
		out = append(out, parsed.String())
	}
	return strings.Join(out, ",")
}
