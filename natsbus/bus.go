package natsbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// DefaultMaxInFlight bounds the requests the broker side handles at once.
const DefaultMaxInFlight = 1024

// Config configures the broker side. The zero value embeds a server on
// 127.0.0.1.
type Config struct {
	// URL of an existing NATS server or cluster to use instead of
	// embedding one ("nats://user:pass@host:4222"); its operator configures
	// the per-session permissions. "" embeds a server.
	URL string
	// CredsFile authenticates to URL with a NATS credentials file.
	CredsFile string
	// Server configures the embedded server.
	Server ServerConfig
	// MaxMessageBytes is the protocol's message limit. 0 means
	// wire.DefaultMaxMessageBytes.
	MaxMessageBytes int
	// MaxInFlight bounds the requests handled at once; past it the broker
	// stops taking requests off the connection until one finishes.
	// 0 means DefaultMaxInFlight.
	MaxInFlight int
	// Logger receives the bus's logs. nil means slog.Default().
	Logger *slog.Logger
}

// Bus is the broker side over NATS. It implements transport.Bus and
// transport.HostMethodProvider (a2a.sessions.* when it embeds the server).
type Bus struct {
	cfg    Config
	log    *slog.Logger
	server *Server // nil on an external server
	nc     *nats.Conn
	url    string

	ctx    context.Context // canceled by Close; handler calls run under it
	cancel context.CancelFunc

	mu       sync.Mutex
	serving  bool
	closed   bool
	subs     []*nats.Subscription
	clients  map[*Client]struct{} // in-process clients made by Connect
	handlers sync.WaitGroup
	sem      chan struct{}

	closeOnce sync.Once
}

var (
	_ transport.Bus                = (*Bus)(nil)
	_ transport.HostMethodProvider = (*Bus)(nil)
	_ transport.SubscriberCounter  = (*Bus)(nil)
)

// New starts the broker side: it embeds a server, or connects to cfg.URL.
func New(cfg Config) (*Bus, error) {
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = wire.DefaultMaxMessageBytes
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Server.MaxMessageBytes = cfg.MaxMessageBytes
	if cfg.Server.Logger == nil {
		cfg.Server.Logger = cfg.Logger
	}
	b := &Bus{cfg: cfg, log: cfg.Logger, clients: map[*Client]struct{}{}, sem: make(chan struct{}, cfg.MaxInFlight)}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	opts := []nats.Option{
		nats.Name("a2a-bus broker"),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			b.log.Warn("nats: asynchronous error", "error", err)
		}),
	}
	if cfg.URL == "" {
		srv, err := StartServer(cfg.Server)
		if err != nil {
			return nil, err
		}
		b.server = srv
		b.url = srv.URL()
		opts = append(opts, nats.InProcessServer(srv), nats.Token(srv.Token()), nats.NoReconnect())
	} else {
		b.url = cfg.URL
		opts = append(opts, nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond),
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
				if err != nil {
					b.log.Warn("nats: disconnected", "error", err)
				}
			}),
			nats.ReconnectHandler(func(*nats.Conn) { b.log.Info("nats: reconnected") }))
		if cfg.CredsFile != "" {
			opts = append(opts, nats.UserCredentials(cfg.CredsFile))
		}
	}
	nc, err := nats.Connect(b.url, opts...)
	if err != nil {
		if b.server != nil {
			b.server.Close()
		}
		return nil, fmt.Errorf("natsbus: connect to %s: %w", redact(b.url), err)
	}
	b.nc = nc
	return b, nil
}

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
		sub, err := b.nc.Subscribe(subj, func(m *nats.Msg) { b.dispatch(h, m) })
		if err != nil {
			return fmt.Errorf("natsbus: subscribe %s: %w", subj, err)
		}
		b.subs = append(b.subs, sub)
	}
	// The server has the interest once Flush returns: from then on a
	// request finds its responder.
	if err := b.nc.Flush(); err != nil {
		return fmt.Errorf("natsbus: flush: %w", err)
	}
	b.serving = true
	return nil
}

func (b *Bus) dispatch(h transport.Handler, m *nats.Msg) {
	if m.Reply == "" {
		b.log.Warn("request without a reply subject ignored", "subject", m.Subject)
		return
	}
	// The broker's connection may publish anywhere, and the server checks
	// a session credential's publish subject but not its reply subject: a
	// reply outside the inboxes would let a session make the broker
	// publish into another session's events.
	if !strings.HasPrefix(m.Reply, InboxPrefix) {
		b.log.Warn("request with a reply subject outside _INBOX. ignored", "subject", m.Subject)
		return
	}
	var from transport.Caller
	if m.Subject == HostRPC {
		from = transport.Caller{Scope: transport.ScopeHost}
	} else {
		session, err := SessionID(strings.TrimPrefix(m.Subject, RPCPrefix))
		if err != nil {
			b.reply(m, wire.ErrorResponse(nil, wire.ErrInvalidRequest.Withf("subject %q does not name a session canonically", m.Subject)))
			return
		}
		from = transport.Caller{Scope: transport.ScopeSession, Session: session}
	}
	select {
	case b.sem <- struct{}{}:
	case <-b.ctx.Done():
		return
	}
	// Add under the lock that Close takes before it waits, never after.
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		<-b.sem
		return
	}
	b.handlers.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.handlers.Done()
		defer func() { <-b.sem }()
		resp := h.ServeRPC(b.ctx, from, m.Data)
		if resp == nil && b.ctx.Err() != nil {
			// Cut short by Close: tell a waiting caller, who would
			// otherwise wait for its timeout, unless it expects nothing.
			if req, _ := wire.ParseRequest(m.Data, 0); req != nil && !req.IsNotification() {
				resp = wire.ErrorResponse(req.ID, wire.ErrInternal.Withf("the broker is shutting down"))
			}
		}
		if resp != nil {
			b.reply(m, resp)
		}
	}()
}

func (b *Bus) reply(m *nats.Msg, resp []byte) {
	err := m.Respond(resp)
	if errors.Is(err, nats.ErrMaxPayload) {
		req, _ := wire.ParseRequest(m.Data, 0)
		var id json.RawMessage
		if req != nil {
			id = req.ID
		}
		err = m.Respond(wire.ErrorResponse(id, wire.ErrInternal.Withf("the response of %d bytes is over the server's payload limit", len(resp))))
	}
	if err != nil && b.ctx.Err() == nil {
		b.log.Warn("nats: reply failed", "error", err)
	}
}

// Subscribers implements transport.SubscriberCounter: the embedded
// server counts the subscriptions that match the session's subject
// (wildcards included); on an external server the bus cannot tell.
func (b *Bus) Subscribers(session string) (int, bool) {
	if b.server == nil {
		return 0, false
	}
	sz, err := b.server.ns.Subsz(&server.SubszOptions{Subscriptions: true, Test: EventsSubject(session), Limit: 1 << 20})
	if err != nil {
		return 0, false
	}
	return len(sz.Subs), true
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
	return nil
}

// HostMethods implements transport.HostMethodProvider: a2a.sessions.open
// and .close, when the server is embedded. On an external server the
// operator owns the credentials and these methods do not exist.
func (b *Bus) HostMethods() map[string]transport.HostMethod {
	if b.server == nil {
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
		wire.MethodSessionOpen: func(_ context.Context, params json.RawMessage) (any, error) {
			session, err := decode(params)
			if err != nil {
				return nil, err
			}
			return b.server.OpenSession(session), nil
		},
		wire.MethodSessionClose: func(_ context.Context, params json.RawMessage) (any, error) {
			session, err := decode(params)
			if err != nil {
				return nil, err
			}
			b.server.CloseSession(session)
			return struct{}{}, nil
		},
	}
}

// Connect returns an in-process client with the host credential: no TCP.
// Only for an embedded server. Bus.Close closes it too.
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

// Close implements transport.Bus: it stops taking requests, cancels and
// waits for running handlers, closes the in-process clients and the
// broker's connection, then shuts the embedded server down. Idempotent.
func (b *Bus) Close() error {
	b.closeOnce.Do(func() {
		b.mu.Lock()
		b.closed = true
		subs := b.subs
		clients := b.clients
		b.clients = map[*Client]struct{}{}
		b.mu.Unlock()
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
		b.cancel()
		b.handlers.Wait()
		for c := range clients {
			c.Close()
		}
		b.nc.Close()
		if b.server != nil {
			b.server.Close()
		}
	})
	return nil
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
