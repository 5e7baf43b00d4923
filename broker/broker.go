package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/a2a-bus/a2a-bus/internal/logsummary"
	"github.com/a2a-bus/a2a-bus/internal/secret"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// Defaults of Config's zero fields.
const (
	DefaultMaxTasksPerContext  = 32
	DefaultReplayWindow        = 10000
	DefaultReplayBytes         = 4 << 20
	DefaultMaxAgents           = 20000
	DefaultMaxAgentsPerSession = 64
	DefaultOrphanTimeout       = 10 * time.Minute
	// housekeepingEvery is how often the broker prunes terminal tasks,
	// and at most how long it waits to look for idle sessions.
	housekeepingEvery = time.Minute
)

// DefaultRetention keeps terminal tasks for 30 days, and at most 100,000
// of them.
var DefaultRetention = store.Retention{MaxAge: 30 * 24 * time.Hour, MaxTerminal: 100000}

// Forever is the OrphanTimeout that never runs out.
const Forever time.Duration = math.MaxInt64

// ErrInvalidConfig is returned by Config.Validate, and so by New, for a
// field out of its range.
var ErrInvalidConfig = errors.New("broker: invalid config")

// Config configures a Broker. The zero value is the default everywhere
// (DefaultConfig spells it out); no field is turned off by a sign: a
// negative value is invalid (Validate).
type Config struct {
	// Store holds the tasks. nil means a new store.Memory: nothing
	// survives the broker. The broker does not close it.
	Store store.Store
	// MaxTasksPerContext caps the open tasks a session may have requested,
	// so that one runaway session cannot fill the store. 0 means
	// DefaultMaxTasksPerContext.
	MaxTasksPerContext int
	// MaxMessageBytes is the largest request the broker reads; larger
	// ones are answered -32600. Every other size bound derives from it
	// (wire.NewLimits), and from the bus's payload limit when the bus has
	// a smaller one. 0 means wire.DefaultMaxMessageBytes.
	MaxMessageBytes int
	// ReplayWindow is how many notifications per session are kept for
	// a2a.events.replay: the longest outage a runtime can bridge without
	// re-reading its tasks. 0 means DefaultReplayWindow.
	ReplayWindow int
	// MaxAgents caps the live agents on the host, each with its card in
	// memory. 0 means DefaultMaxAgents.
	MaxAgents int
	// MaxAgentsPerSession caps the live agents of one session, so that no
	// session can take the whole host's MaxAgents. 0 means
	// DefaultMaxAgentsPerSession.
	MaxAgentsPerSession int
	// MaxTaskBytes lowers the task limit below what the limits allow
	// (wire.Limits.Task); a larger value has no effect. 0 means no lower
	// cap.
	MaxTaskBytes int
	// ReplayBytes caps the bytes of the notifications kept per session, so
	// that large messages cannot make the replay window hold gigabytes;
	// the oldest go first. 0 means DefaultReplayBytes.
	ReplayBytes int
	// OrphanTimeout is how long, after start, the registrations and open
	// tasks found in the store wait for their agents to register again:
	// until then each agent's name and instance id are held for it, then
	// they are let go and its open tasks closed as if it had
	// deregistered. It is also how long a session with no agent and no
	// subscriber keeps its notifications for replay. 0 means
	// DefaultOrphanTimeout; Forever holds names and tasks until their
	// agents come back or their sessions close, and keeps notifications
	// until the host closes the session.
	OrphanTimeout time.Duration
	// Retention bounds the terminal tasks kept in the store; open tasks
	// are always kept. nil means DefaultRetention; otherwise it is the
	// bound, a zero field setting none (as in store.Retention), so that
	// &store.Retention{} keeps every task.
	Retention *store.Retention
	// BusName names the bus for a2a.admin.info ("nats", "pipe", ...).
	BusName string
	// Logger receives the broker's logs. nil discards them: a library
	// logs only where its caller says.
	Logger *slog.Logger
	// Now is the clock, for tests. nil means time.Now.
	Now func() time.Time

	// HiddenSessions are sessions whose agents no delegate sees: they are
	// not in a2a.agents.list, and a send without to never chooses them
	// (the A2A gateway's own session, which acts for outside clients).
	// They are agents like any other to everything else. They are the
	// broker's own: a2a.sessions.open refuses them, so that no session
	// credential is ever made for one. The sessions under one (its id,
	// "/", anything: the gateway's clients') are hidden too.
	HiddenSessions []string
	// OwnedInstances are the instance ids of the broker's own agents (the
	// A2A gateway's): they register only in a hidden session, so that no
	// session can take such an agent's place or read its tasks, whether
	// the agent is running or not. The ids under one (its id, "/",
	// anything) are owned too.
	OwnedInstances []string
	// Cluster shares the broker's state with the other brokers of a
	// cluster (see Cluster); nil: the broker is alone, as on one host.
	// Store must then be the cluster's store.
	Cluster *Cluster

	// HostMethods are host-only methods the embedder serves beside the
	// broker's (the A2A gateway's a2a.gateway.clients.*), dispatched as
	// the bus's own host methods are. A name the broker or the bus has
	// already is an error at New.
	HostMethods map[string]transport.HostMethod
}

// Broker is the A2A broker. It implements transport.Handler.
type Broker struct {
	cfg     Config
	limits  wire.Limits
	bus     transport.Bus
	store   store.Store
	log     *slog.Logger
	epoch   string
	started time.Time

	reg     registry
	events  eventLog
	taskIDs taskIDs
	stripes [taskStripes]sync.Mutex
	// instances serialize the registrations and departures of one
	// instance id: a departure's closing of its tasks never meets a new
	// registration of the same instance halfway.
	instances [instanceStripes]sync.Mutex
	// sendLocks serialize the keyed sends of one (instance, messageId);
	// pushes remembers the keys of oneway pushes.
	sendLocks [sendStripes]sync.Mutex
	pushes    pushWindow

	methods map[string]method

	// ctx is canceled by Close; the broker's own goroutines run under it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // the orphan sweeper, the republisher

	republish republisher

	// mirrorState is, in a cluster, the registrations whose changes the
	// registry has yet to copy.
	mirrorState mirrorState
	// live is, in a cluster, the brokers whose leases held at the last
	// look; lapsed, the brokers of agents here whose leases did not hold
	// at the last two looks (one look may predate a broker's start).
	live, lapsed atomic.Pointer[map[string]bool]
	// catching shares the registry's catch-ups with the cluster.
	catching catchUps

	// failures logs the store's failures and the requests they fail
	// once, then a count a minute, not once a request (a full disk fails
	// every change).
	failures *logsummary.Logger
}

var _ transport.Handler = (*Broker)(nil)

// method is one served method. host marks the host-only ones.
type method struct {
	host  bool
	serve func(ctx context.Context, from transport.Caller, req *wire.Request) (any, *wire.Error)
}

// DefaultConfig returns the config that the zero value stands for, each
// default spelled out but for Store, Logger and Now, whose nil is the
// default: a new memory store, no logs, the system's clock.
func DefaultConfig() Config {
	r := DefaultRetention
	return Config{
		MaxTasksPerContext:  DefaultMaxTasksPerContext,
		MaxMessageBytes:     wire.DefaultMaxMessageBytes,
		ReplayWindow:        DefaultReplayWindow,
		MaxAgents:           DefaultMaxAgents,
		MaxAgentsPerSession: DefaultMaxAgentsPerSession,
		ReplayBytes:         DefaultReplayBytes,
		OrphanTimeout:       DefaultOrphanTimeout,
		Retention:           &r,
	}
}

// Validate reports the first field of cfg out of its range
// (ErrInvalidConfig): a negative count, size or duration, or a message
// limit that the wire's limits refuse.
func (cfg Config) Validate() error {
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"MaxTasksPerContext", int64(cfg.MaxTasksPerContext)},
		{"MaxMessageBytes", int64(cfg.MaxMessageBytes)},
		{"ReplayWindow", int64(cfg.ReplayWindow)},
		{"MaxAgents", int64(cfg.MaxAgents)},
		{"MaxAgentsPerSession", int64(cfg.MaxAgentsPerSession)},
		{"MaxTaskBytes", int64(cfg.MaxTaskBytes)},
		{"ReplayBytes", int64(cfg.ReplayBytes)},
		{"OrphanTimeout", int64(cfg.OrphanTimeout)},
	} {
		if f.v < 0 {
			return fmt.Errorf("%w: %s must not be negative (got %d)", ErrInvalidConfig, f.name, f.v)
		}
	}
	if cfg.MaxMessageBytes != 0 {
		if err := wire.NewLimits(cfg.MaxMessageBytes).Valid(); err != nil {
			return fmt.Errorf("%w: MaxMessageBytes: %v", ErrInvalidConfig, err)
		}
	}
	if r := cfg.Retention; r != nil && (r.MaxAge < 0 || r.MaxTerminal < 0) {
		return fmt.Errorf("%w: Retention must not be negative (got %+v); a zero field sets no bound", ErrInvalidConfig, *r)
	}
	return nil
}

// withDefaults fills in the zero fields of cfg, which is valid.
func (cfg Config) withDefaults() Config {
	d := DefaultConfig()
	if cfg.Store == nil {
		cfg.Store = store.NewMemory()
	}
	for _, f := range []struct{ v, d *int }{
		{&cfg.MaxTasksPerContext, &d.MaxTasksPerContext},
		{&cfg.MaxMessageBytes, &d.MaxMessageBytes},
		{&cfg.ReplayWindow, &d.ReplayWindow},
		{&cfg.MaxAgents, &d.MaxAgents},
		{&cfg.MaxAgentsPerSession, &d.MaxAgentsPerSession},
		{&cfg.ReplayBytes, &d.ReplayBytes},
	} {
		if *f.v == 0 {
			*f.v = *f.d
		}
	}
	if cfg.OrphanTimeout == 0 {
		cfg.OrphanTimeout = d.OrphanTimeout
	}
	if cfg.Retention == nil {
		cfg.Retention = d.Retention
	} else {
		r := *cfg.Retention // the caller's to change
		cfg.Retention = &r
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return cfg
}

// New starts a broker on bus: it calls bus.Serve with itself. ctx bounds
// the start (the store's reading of open tasks). Whoever made bus closes
// it, before closing the broker. When New fails, it has stopped what it
// started.
func New(ctx context.Context, bus transport.Bus, cfg Config) (*Broker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	limits, err := limitsFor(bus, cfg)
	if err != nil {
		return nil, err
	}
	b := &Broker{
		cfg:     cfg,
		limits:  limits,
		bus:     bus,
		store:   cfg.Store,
		log:     cfg.Logger,
		epoch:   secret.Hex(16),
		started: cfg.Now(),
	}
	b.failures = logsummary.New(b.log, 0)
	b.ctx, b.cancel = context.WithCancel(context.Background())
	if limits.Message < cfg.MaxMessageBytes {
		b.log.Warn("the bus carries less than the message limit allows: limits lowered to fit it",
			"maxMessageBytes", limits.Message, "maxTaskBytes", limits.Task, "payload", limits.Payload)
	}
	b.reg.init()
	b.events.init(cfg.ReplayWindow, cfg.ReplayBytes)
	b.methods = map[string]method{
		wire.MethodRegister:   {serve: b.register},
		wire.MethodDeregister: {serve: b.deregister},
		wire.MethodListAgents: {serve: b.listAgents},
		wire.MethodSend:       {serve: b.send},
		wire.MethodGetTask:    {serve: b.getTask},
		wire.MethodListTasks:  {serve: b.listTasks},
		wire.MethodUpdateTask: {serve: b.updateTask},
		wire.MethodCancelTask: {serve: b.cancelTask},
		wire.MethodReplay:     {serve: b.replay},
	}
	for name, m := range b.adminMethods() {
		b.methods[name] = m
	}
	if p, ok := bus.(transport.HostMethodProvider); ok {
		for name, fn := range p.HostMethods() {
			if _, taken := b.methods[name]; taken {
				b.cancel()
				return nil, fmt.Errorf("broker: bus method %q clashes with a broker method", name)
			}
			if name == wire.MethodSessionOpen {
				fn = b.refuseHidden(fn)
			}
			b.methods[name] = method{host: true, serve: hostMethod(fn)}
		}
	}
	for name, fn := range cfg.HostMethods {
		if _, taken := b.methods[name]; taken {
			b.cancel()
			return nil, fmt.Errorf("broker: host method %q clashes with a broker or bus method", name)
		}
		b.methods[name] = method{host: true, serve: hostMethod(fn)}
	}
	if cfg.Cluster != nil {
		c := cfg.Cluster
		if c.Registry == nil || c.Events == nil || c.Leases == nil || c.Epoch == "" || c.Broker == "" || c.LeaseEvery < 0 {
			b.cancel()
			return nil, fmt.Errorf("%w: Cluster needs its Broker, Epoch, Registry, Events and Leases", ErrInvalidConfig)
		}
		b.epoch = c.Epoch
		if err := b.startMirror(ctx); err != nil {
			b.cancel()
			return nil, err
		}
		if err := b.startLeases(ctx); err != nil {
			b.Close()
			return nil, err
		}
	} else if err := b.startOrphanSweep(ctx); err != nil {
		b.cancel()
		return nil, err
	}
	b.startHousekeeping()
	if err := bus.Serve(b); err != nil {
		b.Close()
		return nil, fmt.Errorf("broker: serve: %w", err)
	}
	b.log.Info("broker started", "epoch", b.epoch)
	return b, nil
}

// hiddenSession reports whether session is one of Config.HiddenSessions
// or under one.
func (b *Broker) hiddenSession(session string) bool { return under(b.cfg.HiddenSessions, session) }

// under reports whether id is one of ids, or under one: the id, "/",
// anything.
func under(ids []string, id string) bool {
	for _, top := range ids {
		if id == top || (len(id) > len(top) && id[len(top)] == '/' && id[:len(top)] == top) {
			return true
		}
	}
	return false
}

// refuseHidden wraps a2a.sessions.open: a hidden session is the
// broker's own, and gets no session credential.
func (b *Broker) refuseHidden(open transport.HostMethod) transport.HostMethod {
	return func(ctx context.Context, params json.RawMessage) (any, error) {
		var p wire.SessionParams
		if wire.DecodeParams(params, &p) == nil && b.hiddenSession(p.ContextID) {
			return nil, wire.ErrInvalidParams.Withf("contextId %s is the broker's own session", wire.Quote(p.ContextID))
		}
		return open(ctx, params)
	}
}

// limitsFor derives the size limits from the message limit and from the
// bus's payload limit, when the bus has one.
func limitsFor(bus transport.Bus, cfg Config) (wire.Limits, error) {
	l := wire.NewLimits(cfg.MaxMessageBytes)
	if pl, ok := bus.(transport.PayloadLimiter); ok {
		var err error
		if l, err = l.Within(pl.MaxPayload()); err != nil {
			return l, fmt.Errorf("broker: %w", err)
		}
	}
	if cfg.MaxTaskBytes > 0 && cfg.MaxTaskBytes < l.Task {
		l.Task = cfg.MaxTaskBytes
	}
	return l, nil
}

// Limits returns the size limits the broker enforces.
func (b *Broker) Limits() wire.Limits { return b.limits }

// startHousekeeping prunes terminal tasks beyond the retention and drops
// the notifications of idle sessions, now and then every
// housekeepingEvery, until Close.
func (b *Broker) startHousekeeping() {
	every := min(housekeepingEvery, max(b.cfg.OrphanTimeout/4, 10*time.Millisecond))
	b.wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		lastPrune := time.Time{}
		for {
			if *b.cfg.Retention != (store.Retention{}) && time.Since(lastPrune) >= housekeepingEvery {
				lastPrune = time.Now()
				n, err := b.store.Prune(b.ctx, *b.cfg.Retention, b.cfg.Now())
				switch {
				case err != nil && b.ctx.Err() == nil:
					b.log.Warn("pruning terminal tasks failed", "error", err)
				case n > 0:
					b.log.Info("pruned terminal tasks", "count", n)
				}
			}
			b.sweepSessions()
			select {
			case <-b.ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
}

// Epoch returns the name of this broker run; it changes at every start.
// In a cluster it is the cluster's (Cluster.Epoch).
func (b *Broker) Epoch() string { return b.epoch }

// Close stops the broker's own work (the orphan sweep, housekeeping). It neither closes
// the bus nor the store. Idempotent.
func (b *Broker) Close() error {
	b.mirrorState.once.Do(func() {
		if b.mirrorState.stop != nil {
			b.mirrorState.stop()
		}
	})
	// Under the republisher's lock: it (and a cluster's take-over) starts
	// no goroutine once canceled.
	b.republish.mu.Lock()
	b.cancel()
	b.republish.mu.Unlock()
	b.wg.Wait()
	b.failures.Close()
	return nil
}

func hostMethod(fn transport.HostMethod) func(context.Context, transport.Caller, *wire.Request) (any, *wire.Error) {
	return func(ctx context.Context, _ transport.Caller, req *wire.Request) (any, *wire.Error) {
		res, err := fn(ctx, req.Params)
		if err != nil {
			return nil, wire.AsError(err)
		}
		return res, nil
	}
}

// ServeRPC implements transport.Handler: it answers one raw request.
func (b *Broker) ServeRPC(ctx context.Context, from transport.Caller, raw []byte) []byte {
	req, perr := wire.ParseRequest(raw, b.limits.Message)
	if perr != nil {
		b.log.Debug("bad request", "scope", from.Scope, "error", perr.Message)
		return wire.ErrorResponse(nil, perr)
	}
	if req.IsNotification() {
		b.log.Warn("request without id ignored: JSON-RPC forbids answering a notification", "method", wire.Quote(req.Method))
		return nil
	}
	res, rerr := b.call(ctx, from, req)
	if rerr != nil {
		if rerr.Code == wire.ErrInternal.Code {
			b.failures.Error(logsummary.Key("request failed", req.Method, rerr.Message), "request failed", "method", req.Method, "error", rerr.Message)
		}
		return wire.ErrorResponse(req.ID, rerr)
	}
	out, err := wire.EncodeResult(req.ID, res)
	if err != nil {
		b.log.Error("encode result", "method", req.Method, "error", err)
		return wire.ErrorResponse(req.ID, wire.ErrInternal.Withf("cannot encode the result"))
	}
	return out
}

func (b *Broker) call(ctx context.Context, from transport.Caller, req *wire.Request) (any, *wire.Error) {
	m, ok := b.methods[req.Method]
	if ok {
		switch from.Scope {
		case transport.ScopeSession:
			ok = !m.host
		case transport.ScopeHost:
			ok = m.host
		case transport.ScopeOwner:
		default:
			return nil, wire.ErrInternal.Withf("the bus gave the request no scope")
		}
	}
	if !ok {
		return nil, wire.ErrMethodNotFound.Withf("method %s is not served here", wire.Quote(req.Method))
	}
	if !wire.ParamsObject(req.Params) {
		return nil, wire.ErrInvalidParams.Withf("params must be an object")
	}
	return m.serve(ctx, from, req)
}

// storeFailure turns a store failure into the error a client sees. The
// request may be retried. Where the store says why in words a client may
// see (a full disk), the error says it too.
func (b *Broker) storeFailure(op string, err error) *wire.Error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return wire.ErrInternal.Withf("%s: the broker is shutting down", op)
	}
	b.failures.Error(logsummary.Key("store failure", op, err.Error()), "store failure", "op", op, "error", err)
	var r reasoned
	if errors.As(err, &r) {
		return wire.ErrInternal.Withf("%s failed in the task store: %s", op, r.Reason())
	}
	return wire.ErrInternal.Withf("%s failed in the task store", op)
}

// reasoned is a store error that says why in words a client may see (no
// paths): a durable store's full disk ("the disk is full"), say.
type reasoned interface {
	error
	Reason() string
}
