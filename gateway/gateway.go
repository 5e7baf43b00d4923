// Package gateway lets any A2A 1.0 client on the machine talk to a live
// delegate: an HTTP server on loopback that serves each agent's Agent Card
// and A2A JSON-RPC endpoint (github.com/a2aproject/a2a-go/v2's a2asrv does
// the JSON-RPC and SSE), and acts for its clients through one agent of its
// own, in a session the broker hides from delegates
// (broker.Config.HiddenSessions). It is a client of the broker like any
// host: every call goes through the bus contract. The mapping between the
// two protocols is docs/PROTOCOL.md §12.
package gateway

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"

	"github.com/a2a-bus/a2a-bus/internal/brokerid"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// DefaultSession is the gateway's session.
const DefaultSession = brokerid.GatewaySession

// Instance is the instance id of the gateway's agent when
// Config.Instance is "": a well-known id, which the gateway of a2a-bus
// serve no longer uses (it keeps one of its own in the data dir). A broker
// owns it all the same (broker.Config.OwnedInstances), so that no
// session can read the tasks an earlier version's gateway left under it.
const Instance = brokerid.LegacyGatewayInstance

// InstanceFile is the file in a broker's data dir that keeps the instance
// id of the gateway's agent.
const InstanceFile = brokerid.InstanceFile

// pollEvery is how often a waiting request reads its task again, events
// or not: a safety net under the event feed (a session closed by the
// host, a resync that reported nothing). A var for the tests, which set
// it before a gateway starts (export_test.go).
var pollEvery = 5 * time.Second

// Config configures a Gateway. Token is required; every other zero
// value is the default. New refuses a config that Validate refuses.
type Config struct {
	// Session is the gateway's own session; it must be one of the
	// broker's HiddenSessions. "" means DefaultSession.
	Session string
	// Instance is the instance id of the gateway's agent; it should be
	// one of the broker's OwnedInstances, so that no session can take it.
	// The same id on every run of a broker gives the gateway its tasks
	// back. "" means Instance.
	Instance string
	// Token is the bearer token every request must carry.
	Token string
	// BaseURL is where the gateway is served (http://127.0.0.1:port); the
	// cards name their endpoints under it.
	BaseURL string
	// MaxBodyBytes bounds a request's body. 0 means the bus's message
	// limit, wire.DefaultMaxMessageBytes.
	MaxBodyBytes int64
	// Version is the card version of agents whose card has none.
	Version string
	// MaxCalls bounds the gateway's calls to the broker under way at
	// once; more wait their turn. 0 means DefaultMaxCalls.
	MaxCalls int
	// MaxInFlightBytes bounds the bodies of the requests in service at
	// once, each weighed by its size or, for a body whose decoded form is
	// large for its size, more (body.go); more wait up to BusyWait, then
	// are refused. 0 means 8 × MaxBodyBytes.
	MaxInFlightBytes int64
	// Clients are the client credentials beside Token, each client with
	// an agent of its own. nil: Token only.
	Clients *Clients
	// MaxStreamsPerClient bounds a client's streams and blocking sends
	// open at once (the clients of Token count as one). 0 means
	// DefaultMaxStreamsPerClient.
	MaxStreamsPerClient int
	// AbandonAfter is how long a task whose client stopped waiting for it
	// (a blocking send whose connection closed) is kept open with no
	// subscriber and no read by its client before the gateway cancels
	// it. 0 means DefaultAbandonAfter.
	AbandonAfter time.Duration
	// NeverAbandon keeps such a task open until its agent or its client
	// ends it: the gateway never cancels it. AbandonAfter must be 0.
	NeverAbandon bool
	// Logger receives the gateway's logs. nil discards them.
	Logger *slog.Logger
}

// Validate reports the first setting of cfg that is missing or out of
// range.
func (cfg Config) Validate() error {
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"MaxBodyBytes", cfg.MaxBodyBytes},
		{"MaxCalls", int64(cfg.MaxCalls)},
		{"MaxInFlightBytes", cfg.MaxInFlightBytes},
		{"MaxStreamsPerClient", int64(cfg.MaxStreamsPerClient)},
		{"AbandonAfter", int64(cfg.AbandonAfter)},
	} {
		if f.v < 0 {
			return fmt.Errorf("gateway: Config.%s is negative: want 0 (the default) or more", f.name)
		}
	}
	switch {
	case cfg.Token == "":
		return errors.New("gateway: a token is required")
	case cfg.NeverAbandon && cfg.AbandonAfter != 0:
		return errors.New("gateway: Config.NeverAbandon and AbandonAfter both set: choose one")
	}
	return nil
}

// Gateway is the A2A 1.0 gateway. It implements a2asrv.RequestHandler for
// the agent its context names (see Handler).
type Gateway struct {
	cfg Config
	log *slog.Logger
	rpc http.Handler

	ctx    context.Context
	cancel context.CancelFunc
	slots  chan struct{} // one per call to the broker under way (call)
	bodies *budget       // the bodies of the requests in service (serveRPC)

	transport transport.Client
	def       *clientState // the default client (Config.Token): the gateway's own agent
	joinMu    sync.Mutex
	// testJoinHook, when set (tests), runs at points of join.
	testJoinHook func(point string)
	closeOnce    sync.Once
	closeErr     error

	mu      sync.Mutex
	subs    map[string]map[*sub]struct{} // by task id
	pending map[*pending]struct{}        // sends whose task id is not known yet
	clients map[string]*clientState      // by client id: those that joined
	// abandoned are the clocks of tasks whose client stopped waiting
	// (abandon), by task id; bg counts their ends under way.
	abandoned map[string]*abandonClock
	bg        sync.WaitGroup
}

// pending holds every event that comes while a send is under way: the
// new task's id is known only once the send returns, and its first
// changes may come before that.
type pending struct {
	events []*wire.TaskEvent
	lost   bool // more came than it keeps
}

// maxPending bounds what a pending send keeps.
const maxPending = 256

var _ a2asrv.RequestHandler = (*Gateway)(nil)

// New opens the gateway's session on client and registers its agent. The
// gateway owns the session: Close closes it.
func New(ctx context.Context, client transport.Client, cfg Config) (*Gateway, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Session == "" {
		cfg.Session = DefaultSession
	}
	if cfg.Instance == "" {
		cfg.Instance = Instance
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = wire.DefaultMaxMessageBytes
	}
	if cfg.MaxCalls == 0 {
		cfg.MaxCalls = DefaultMaxCalls
	}
	if cfg.MaxInFlightBytes == 0 {
		cfg.MaxInFlightBytes = 8 * cfg.MaxBodyBytes
	}
	if cfg.MaxStreamsPerClient == 0 {
		cfg.MaxStreamsPerClient = DefaultMaxStreamsPerClient
	}
	if cfg.AbandonAfter == 0 && !cfg.NeverAbandon {
		cfg.AbandonAfter = DefaultAbandonAfter
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	sess, err := client.Session(ctx, cfg.Session)
	if err != nil {
		return nil, fmt.Errorf("gateway: open session: %w", err)
	}
	rt, err := runtime.New(ctx, sess, runtime.Config{Logger: cfg.Logger})
	if err != nil {
		sess.Close()
		return nil, fmt.Errorf("gateway: %w", err)
	}
	// A kept instance id: after a restart of the broker (or of serve) the
	// gateway's agent gets its name and tasks back, and its clients with
	// them.
	d, err := rt.SpawnInstance(ctx, wire.AgentCard{Name: "a2a-gateway", Description: "acts for the A2A clients of the gateway"}, cfg.Instance)
	if err != nil {
		rt.Close()
		return nil, fmt.Errorf("gateway: register: %w", err)
	}
	g := &Gateway{cfg: cfg, log: cfg.Logger, transport: client, slots: make(chan struct{}, cfg.MaxCalls),
		subs: map[string]map[*sub]struct{}{}, pending: map[*pending]struct{}{}, clients: map[string]*clientState{}, abandoned: map[string]*abandonClock{}}
	g.def = &clientState{rt: rt, d: d, done: make(chan struct{})}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	g.rpc = a2asrv.NewJSONRPCHandler(g)
	g.bodies = newBudget(cfg.MaxInFlightBytes)
	g.def.bodies = newBudget(g.clientShare())
	if cfg.Clients != nil {
		cfg.Clients.mu.Lock()
		cfg.Clients.revoked = g.dropClient
		cfg.Clients.mu.Unlock()
	}
	go g.pump(g.def)
	return g, nil
}

// Close stops the gateway: its waiting requests end and its session
// closes. Its agent stays registered, with its tasks open: the next
// gateway on this broker, or on its restart, takes them back (PROTOCOL
// §12). Idempotent.
func (g *Gateway) Close() error {
	g.closeOnce.Do(func() {
		if g.cfg.Clients != nil {
			g.cfg.Clients.mu.Lock()
			g.cfg.Clients.revoked = nil
			g.cfg.Clients.mu.Unlock()
		}
		g.cancel()
		g.stopAbandoned()
		// A join under way ends first; none starts from here on (join
		// sees g.ctx).
		g.joinMu.Lock()
		g.mu.Lock()
		clients := g.clients
		g.clients = map[string]*clientState{}
		g.mu.Unlock()
		g.joinMu.Unlock()
		<-g.def.done
		g.closeErr = g.def.rt.Leave()
		for _, c := range clients {
			<-c.done
			_ = c.rt.Leave()
		}
	})
	return g.closeErr
}

// pump hands the gateway agent's events to the requests that wait for
// them, by task. The runtime closes every gap (replay, then a re-read of
// the tasks: a Resync), so a waiter misses no change.
func (g *Gateway) pump(c *clientState) {
	defer close(c.done)
	for {
		ev, err := c.d.Wait(g.ctx)
		if err != nil {
			return
		}
		switch {
		case ev.Task != nil:
			g.deliver(ev.Task)
		case ev.Resync != nil:
			// The runtime lost events: every waiter reads its task again
			// (Changed is what the runtime had not seen, and the gateway's
			// own reads count as seen).
			g.lagAll()
		}
	}
}

// sub is one waiter for a task's events. When its buffer is full an event
// is dropped and lagged set: the waiter then reads the task again, which
// holds every change.
type sub struct {
	c    chan *wire.TaskEvent
	kick chan struct{}
	mu   sync.Mutex
	lag  bool
}

// lagged tells the waiter to read its task again: an event for it was
// dropped, or events may have been lost.
func (s *sub) lagged() {
	s.mu.Lock()
	s.lag = true
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (g *Gateway) subscribe(taskID string) (*sub, func()) {
	return g.subscribeAfter(nil, taskID)
}

// expect starts keeping the events that come during a send; end it with
// subscribeAfter, or drop.
func (g *Gateway) expect() (p *pending, drop func()) {
	p = &pending{}
	g.mu.Lock()
	g.pending[p] = struct{}{}
	g.mu.Unlock()
	return p, func() {
		g.mu.Lock()
		delete(g.pending, p)
		g.mu.Unlock()
	}
}

// subscribeAfter subscribes to a task's events, first with those p kept
// for it (nil: none).
func (g *Gateway) subscribeAfter(p *pending, taskID string) (*sub, func()) {
	s := &sub{c: make(chan *wire.TaskEvent, 64), kick: make(chan struct{}, 1)}
	g.mu.Lock()
	if p != nil {
		delete(g.pending, p)
		s.lag = p.lost
		for _, ev := range p.events {
			if ev.TaskID != taskID {
				continue
			}
			select {
			case s.c <- ev:
			default:
				s.lag = true
			}
		}
	}
	if g.subs[taskID] == nil {
		g.subs[taskID] = map[*sub]struct{}{}
	}
	g.subs[taskID][s] = struct{}{}
	g.mu.Unlock()
	return s, func() {
		g.mu.Lock()
		delete(g.subs[taskID], s)
		if len(g.subs[taskID]) == 0 {
			delete(g.subs, taskID)
		}
		g.mu.Unlock()
	}
}

func (g *Gateway) deliver(ev *wire.TaskEvent) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for p := range g.pending {
		if len(p.events) < maxPending {
			p.events = append(p.events, ev)
		} else {
			p.lost = true
		}
	}
	for s := range g.subs[ev.TaskID] {
		select {
		case s.c <- ev:
		default:
			s.lagged()
		}
	}
}

// lagAll has every waiter read its task again.
func (g *Gateway) lagAll() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, subs := range g.subs {
		for s := range subs {
			s.lagged()
		}
	}
}

// next returns the task's next change: an event, or after a drop (and
// every pollEvery without one) the task as it is now.
func (g *Gateway) next(ctx context.Context, s *sub, taskID string) (*wire.TaskEvent, error) {
	s.mu.Lock()
	lagged := s.lag
	s.lag = false
	s.mu.Unlock()
	if lagged {
		t, err := g.task(ctx, taskID)
		if err != nil {
			return nil, err
		}
		return &wire.TaskEvent{TaskID: t.ID, Kind: wire.EventStatus, Task: t.WithoutHistory(), Final: t.Status.State.Terminal()}, nil
	}
	poll := time.NewTimer(pollEvery)
	defer poll.Stop()
	select {
	case ev := <-s.c:
		return ev, nil
	case <-s.kick:
		return g.next(ctx, s, taskID)
	case <-poll.C:
		s.mu.Lock()
		s.lag = true
		s.mu.Unlock()
		return g.next(ctx, s, taskID)
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-g.ctx.Done():
		return nil, a2a.NewError(a2a.ErrInternalError, "the gateway is shutting down")
	}
}

// BodyTimeout bounds the reading of a request's body.
const BodyTimeout = 30 * time.Second

// The HTTP server's bounds (Server): what a local process without the
// token can hold open is bounded too (and conns.go).
const (
	// IdleTimeout closes a keep-alive connection idle this long.
	IdleTimeout = 30 * time.Second
	// HeaderTimeout bounds the reading of a request's headers.
	HeaderTimeout = 10 * time.Second
)

// Server is an HTTP server of the gateway's Handler, with the bounds above;
// serve it on a LimitListener.
func (g *Gateway) Server() *http.Server {
	return &http.Server{Handler: g.Handler(), ReadHeaderTimeout: HeaderTimeout, IdleTimeout: IdleTimeout, MaxHeaderBytes: 64 << 10,
		ConnContext: connContext, ErrorLog: slog.NewLogLogger(g.log.Handler(), slog.LevelWarn)}
}

// agentKey carries the agent a request's path names.
type agentKey struct{}

func agentOf(ctx context.Context) string { s, _ := ctx.Value(agentKey{}).(string); return s }

// Handler is the gateway's HTTP API (docs/PROTOCOL.md §12):
//
//	GET  /agents                                    the live agents and their card URLs
//	GET  /agents/{agentId}/.well-known/agent-card.json  an agent's A2A 1.0 card
//	POST /agents/{agentId}                          its A2A JSON-RPC endpoint
//
// Every request carries "Authorization: Bearer <token>", else 401.
func (g *Gateway) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /agents", g.serveAgents)
	mux.HandleFunc("GET /agents/{agent}/.well-known/agent-card.json", g.serveCard)
	mux.HandleFunc("POST /agents/{agent}", g.serveRPC) // body.go
	return g.auth(mux)
}

func (g *Gateway) auth(next http.Handler) http.Handler {
	want := []byte(g.cfg.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		bearer := strings.EqualFold(scheme, "Bearer")
		var cred *ClientCredential
		if bearer && subtle.ConstantTimeCompare([]byte(token), want) != 1 {
			cred = g.cfg.Clients.lookup(token)
		}
		if !bearer || (cred == nil && subtle.ConstantTimeCompare([]byte(token), want) != 1) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="a2a-bus"`)
			// No idle connection for a stranger, nor a wait for the rest
			// of a body it sends slowly: the server would read it to keep
			// the connection.
			w.Header().Set("Connection", "close")
			_ = http.NewResponseController(w).SetReadDeadline(time.Now())
			http.Error(w, "a bearer token is required: a2aToken in the broker's connection file, or a client's", http.StatusUnauthorized)
			return
		}
		client := ""
		if cred != nil {
			client = cred.ClientID
		}
		if !markAuthenticated(w, r, client) {
			return
		}
		if cred != nil {
			c, err := g.join(r.Context(), cred)
			if err != nil {
				g.log.Warn("a gateway client's agent could not be registered", "client", cred.ClientID, "error", err)
				http.Error(w, "the broker did not take this client's agent: "+err.Error(), http.StatusBadGateway)
				return
			}
			r = r.WithContext(context.WithValue(r.Context(), clientKey{}, c))
		}
		next.ServeHTTP(w, r)
	})
}

func (g *Gateway) agentURL(id string) string { return g.cfg.BaseURL + "/agents/" + url.PathEscape(id) }

// AgentSummary is one entry of GET /agents.
type AgentSummary struct {
	AgentID   string `json:"agentId"`
	ContextID string `json:"contextId"`
	URL       string `json:"url"`
	CardURL   string `json:"cardUrl"`
}

func (g *Gateway) serveAgents(w http.ResponseWriter, r *http.Request) {
	cards, err := g.peers(r.Context())
	if err != nil {
		http.Error(w, "cannot list the agents: "+err.Error(), http.StatusBadGateway)
		return
	}
	out := struct {
		Agents []AgentSummary `json:"agents"`
	}{Agents: []AgentSummary{}}
	for _, c := range cards {
		u := g.agentURL(c.AgentID)
		out.Agents = append(out.Agents, AgentSummary{AgentID: c.AgentID, ContextID: c.ContextID, URL: u, CardURL: u + "/.well-known/agent-card.json"})
	}
	writeJSON(w, out)
}

// peer returns the live agent's card; nil when there is none. It reads
// that one card (a2a.agents.list narrowed by agentId), not the list.
func (g *Gateway) peer(ctx context.Context, id string) (c *wire.AgentCard, err error) {
	err = g.read(ctx, func() error {
		c, err = g.def.d.Peer(ctx, id)
		return err
	})
	return c, err
}

func (g *Gateway) serveCard(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("agent")
	c, err := g.peer(r.Context(), id)
	if err != nil {
		http.Error(w, "cannot read the agents: "+err.Error(), http.StatusBadGateway)
		return
	}
	if c == nil {
		http.Error(w, fmt.Sprintf("no live agent %q", id), http.StatusNotFound)
		return
	}
	writeJSON(w, cardJSON(Card(c, g.agentURL(id), g.cfg.Version)))
}

// cardJSON is a card as served: capabilities name pushNotifications
// false, which the SDK's encoding leaves out as a zero value.
func cardJSON(c *a2a.AgentCard) any {
	b, err := json.Marshal(c)
	if err != nil {
		return c
	}
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return c
	}
	caps, _ := m["capabilities"].(map[string]any)
	if caps == nil {
		caps = map[string]any{}
		m["capabilities"] = caps
	}
	caps["pushNotifications"] = c.Capabilities.PushNotifications
	caps["streaming"] = c.Capabilities.Streaming
	return m
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// ownTask reads a task of the gateway's agent that is with the agent the
// request names; another is TaskNotFound, as is one that does not exist.
func (g *Gateway) ownTask(ctx context.Context, id a2a.TaskID) (*wire.Task, error) {
	t, err := g.task(ctx, string(id))
	if errors.Is(err, wire.ErrUnknownAgent) {
		// A task the gateway is no member of is no task of its clients:
		// not found, as one that does not exist.
		return nil, a2a.NewError(a2a.ErrTaskNotFound, fmt.Sprintf("no task %s with agent %s", id, agentOf(ctx)))
	}
	if err != nil {
		return nil, Error(err, false)
	}
	if t.AgentName != agentOf(ctx) {
		return nil, a2a.NewError(a2a.ErrTaskNotFound, fmt.Sprintf("no task %s with agent %s", id, agentOf(ctx)))
	}
	g.touch(t.ID) // its client reads it: not abandoned
	return t, nil
}

// GetTask implements a2asrv.RequestHandler.
func (g *Gateway) GetTask(ctx context.Context, req *a2a.GetTaskRequest) (*a2a.Task, error) {
	t, err := g.ownTask(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	return Task(t, req.HistoryLength)
}

// ListTasks implements a2asrv.RequestHandler: the tasks the gateway's
// clients gave the agent, a page of the broker's at a time (a page may
// hold fewer than pageSize, and TotalSize is the page's count).
func (g *Gateway) ListTasks(ctx context.Context, req *a2a.ListTasksRequest) (*a2a.ListTasksResponse, error) {
	size := req.PageSize
	switch {
	case size == 0:
		size = 50
	case size < 0 || size > 100:
		return nil, a2a.NewError(a2a.ErrInvalidParams, "pageSize must be between 1 and 100")
	}
	var state wire.State
	// No filter: unspecified, or "UNRECOGNIZED", which @a2a-js/sdk 1.3
	// sends for a status it was not given.
	if req.Status != a2a.TaskStateUnspecified && req.Status != "UNRECOGNIZED" {
		s, ok := FromState(req.Status)
		if !ok {
			return nil, a2a.NewError(a2a.ErrInvalidParams, fmt.Sprintf("status %s: a2a-bus has no such state", req.Status))
		}
		state = s
	}
	var tasks []*wire.Task
	var next string
	err := g.read(ctx, func() (err error) {
		tasks, next, err = g.agent(ctx).TasksPage(ctx, state, wire.ListRequester, size, req.PageToken)
		return err
	})
	if err != nil {
		return nil, Error(err, false)
	}
	out := &a2a.ListTasksResponse{Tasks: []*a2a.Task{}, PageSize: size, NextPageToken: next}
	zero := 0
	history := req.HistoryLength
	if history == nil {
		history = &zero
	}
	for _, t := range tasks {
		if t.AgentName != agentOf(ctx) || (req.ContextID != "" && ClientContextID(t) != req.ContextID) {
			continue
		}
		if req.StatusTimestampAfter != nil && !t.Status.Timestamp.After(*req.StatusTimestampAfter) {
			continue
		}
		at, err := Task(t, history)
		if err != nil {
			return nil, a2a.NewError(a2a.ErrInternalError, err.Error())
		}
		if !req.IncludeArtifacts {
			at.Artifacts = nil
		}
		out.Tasks = append(out.Tasks, at)
	}
	out.TotalSize = len(out.Tasks)
	return out, nil
}

// CancelTask implements a2asrv.RequestHandler.
func (g *Gateway) CancelTask(ctx context.Context, req *a2a.CancelTaskRequest) (*a2a.Task, error) {
	if _, err := g.ownTask(ctx, req.ID); err != nil {
		return nil, err
	}
	var t *wire.Task
	err := g.call(ctx, func() (err error) {
		t, err = g.agent(ctx).Cancel(ctx, string(req.ID))
		return err
	})
	if err != nil {
		return nil, Error(err, true)
	}
	// The broker tells a cancel to the task's other member, not to the
	// gateway that made it: the gateway's own waiters on the task (a
	// stream, a blocking send) hear it here, and close at once.
	g.deliver(&wire.TaskEvent{TaskID: t.ID, Kind: wire.EventStatus, Task: t.WithoutHistory(), Final: t.Status.State.Terminal()})
	return Task(t, nil)
}

// send hands the client's message to the broker: a new task for the
// agent, or a message on one of its tasks. It returns the task; the status
// a wait for the next settled one starts from (a reply waits past the
// status it answers, a new task or a retried reply does not); and a
// subscription to its changes made before the send, so none is missed.
func (g *Gateway) send(ctx context.Context, req *a2a.SendMessageRequest) (*wire.Task, wire.TaskStatus, *sub, func(), error) {
	agent := agentOf(ctx)
	exactNumbers(ctx, req) // numbers.go
	landData(ctx, req)     // lift.go
	msg, err := FromMessage(req.Message)
	if err != nil {
		return nil, wire.TaskStatus{}, nil, nil, a2a.NewError(a2a.ErrInvalidParams, err.Error())
	}
	if req.Message.TaskID != "" {
		before, err := g.ownTask(ctx, req.Message.TaskID)
		if err != nil {
			return nil, wire.TaskStatus{}, nil, nil, err
		}
		s, unsub := g.subscribe(string(req.Message.TaskID))
		var t *wire.Task
		// Runs to its answer even if the client goes meanwhile, as a
		// new task's send does (below): the abandon clock needs it.
		err = g.call(ctx, func() (err error) {
			t, err = g.agent(ctx).Reply(context.WithoutCancel(ctx), string(req.Message.TaskID), *msg)
			return err
		})
		if err != nil {
			unsub()
			return nil, wire.TaskStatus{}, nil, nil, Error(err, false)
		}
		start := t.Status
		if msg.MessageID != "" && slices.ContainsFunc(before.History, func(m wire.Message) bool { return m.MessageID == msg.MessageID }) {
			// A retry of a reply made before: the task as it is now
			// answers it, settled or not.
			start = wire.TaskStatus{}
		}
		return t, start, s, unsub, nil
	}
	meta := map[string]any{}
	for k, v := range req.Metadata {
		meta[k] = v
	}
	if ctxID := req.Message.ContextID; ctxID != "" {
		// Without one, the task's id serves (ClientContextID): the send
		// stays the same change when a client retries it.
		meta[MetaKey] = map[string]any{"clientContextId": ctxID}
	}
	// The task's id is the broker's: what comes during the send is kept,
	// and the subscription starts with it.
	p, drop := g.expect()
	var t *wire.Task
	// Once under way, the send runs to its answer (the runtime bounds it:
	// runtime.Config.CallTimeout) even if the client goes meanwhile: the
	// broker may have made the task, and only with its id can the abandon
	// clock (SendMessage) end it, so that it holds no slot of the
	// client's cap for ever.
	err = g.call(ctx, func() (err error) {
		t, err = g.agent(ctx).Send(context.WithoutCancel(ctx), agent, *msg, meta)
		return err
	})
	if err != nil {
		drop()
		return nil, wire.TaskStatus{}, nil, nil, Error(err, false)
	}
	s, unsub := g.subscribeAfter(p, t.ID)
	return t, wire.TaskStatus{}, s, unsub, nil
}

// settled reports whether a task has reached a state a blocking send or a
// stream ends at: input-required, or terminal.
func settled(s wire.State) bool { return s == wire.StateInputRequired || s.Terminal() }

// moved reports whether a status is a new one since from: a reply to a
// task that needs input waits for the next settled state, not the one it
// answers.
func moved(from, to *wire.TaskStatus) bool {
	return to.State != from.State || !to.Timestamp.Equal(from.Timestamp.Time)
}

// SendMessage implements a2asrv.RequestHandler: it blocks until the task
// needs input or ends, unless configuration.returnImmediately.
func (g *Gateway) SendMessage(ctx context.Context, req *a2a.SendMessageRequest) (a2a.SendMessageResult, error) {
	blocking := req.Config == nil || !req.Config.ReturnImmediately
	if blocking {
		release, err := g.openStream(ctx)
		if err != nil {
			return nil, err
		}
		defer release()
	}
	t, start, s, unsub, err := g.send(ctx, req)
	if err != nil {
		return nil, err
	}
	defer unsub()
	var history *int
	if req.Config != nil {
		history = req.Config.HistoryLength
	}
	if !blocking {
		return Task(t, history)
	}
	// A client that stops waiting leaves its task to the abandon clock.
	id := t.ID
	defer func() {
		if ctx.Err() != nil && g.ctx.Err() == nil && (t == nil || !t.Status.State.Terminal()) {
			g.abandon(g.clientOf(ctx), id)
		}
	}()
	// The task as it is now closes the gap between the send and the
	// subscription; events follow.
	if t, err = g.task(ctx, t.ID); err != nil {
		return nil, Error(err, false)
	}
	for !settled(t.Status.State) || !moved(&start, &t.Status) {
		if _, err := g.next(ctx, s, t.ID); err != nil {
			return nil, err
		}
		if t, err = g.task(ctx, t.ID); err != nil {
			return nil, Error(err, false)
		}
	}
	return Task(t, history)
}

// SendStreamingMessage implements a2asrv.RequestHandler: the task, then
// its artifact and status updates in order, until it needs input or ends.
func (g *Gateway) SendStreamingMessage(ctx context.Context, req *a2a.SendMessageRequest) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		release, err := g.openStream(ctx)
		if err != nil {
			yield(nil, err)
			return
		}
		defer release()
		t, start, s, unsub, err := g.send(ctx, req)
		if err != nil {
			yield(nil, err)
			return
		}
		defer unsub()
		g.stream(ctx, s, t, start, yield)
	}
}

// SubscribeToTask implements a2asrv.RequestHandler: the task as it is,
// then its updates until it needs input or ends. A task already ended is
// UnsupportedOperation, as the specification has it.
func (g *Gateway) SubscribeToTask(ctx context.Context, req *a2a.SubscribeToTaskRequest) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		release, err := g.openStream(ctx)
		if err != nil {
			yield(nil, err)
			return
		}
		defer release()
		s, unsub := g.subscribe(string(req.ID))
		defer unsub()
		t, err := g.ownTask(ctx, req.ID)
		if err != nil {
			yield(nil, err)
			return
		}
		if t.Status.State.Terminal() {
			yield(nil, a2a.NewError(a2a.ErrUnsupportedOperation, fmt.Sprintf("task %s has ended (%s)", t.ID, State(t.Status.State))))
			return
		}
		g.stream(ctx, s, t, t.Status, yield)
	}
}

// stream yields t, then each change after it, as A2A 1.0 events, until
// the task settles in a status other than start.
func (g *Gateway) stream(ctx context.Context, s *sub, t *wire.Task, start wire.TaskStatus, yield func(a2a.Event, error) bool) {
	first, err := Task(t, nil)
	if err != nil {
		yield(nil, a2a.NewError(a2a.ErrInternalError, err.Error()))
		return
	}
	if !yield(first, nil) {
		return
	}
	v := newView(t)
	// The subscription began before t was read (SubscribeToTask) or holds
	// what came since the send: its events follow t, and those t already
	// shows are skipped.
	for {
		if settled(v.state) && moved(&start, &v.status) {
			return
		}
		ev, err := g.next(ctx, s, t.ID)
		if err != nil {
			yield(nil, err)
			return
		}
		out, err := v.apply(ev)
		if err != nil {
			yield(nil, a2a.NewError(a2a.ErrInternalError, err.Error()))
			return
		}
		for _, e := range out {
			if !yield(e, nil) {
				return
			}
		}
	}
}

// view is what a stream has told its client of a task: it turns each
// event into the A2A updates the client has not had.
type view struct {
	ctxID     string
	state     wire.State
	status    wire.TaskStatus
	updated   wire.Time
	artifacts map[string]bool
}

func newView(t *wire.Task) *view {
	v := &view{ctxID: ClientContextID(t), state: t.Status.State, status: t.Status, updated: t.UpdatedAt, artifacts: map[string]bool{}}
	for _, a := range t.Artifacts {
		v.artifacts[a.ArtifactID] = true
	}
	return v
}

func (v *view) apply(ev *wire.TaskEvent) ([]a2a.Event, error) {
	var out []a2a.Event
	t := ev.Task
	if t == nil || t.UpdatedAt.Before(v.updated.Time) {
		return nil, nil // older than what the client has
	}
	v.updated = t.UpdatedAt
	// A change that both moves the task on and adds artifacts tells the
	// status first, unless the status is the last the stream sends: the
	// artifacts come before it.
	var statusEv []a2a.Event
	newStatus := !t.Status.Timestamp.Equal(v.status.Timestamp.Time) || t.Status.State != v.state
	if newStatus || (ev.Kind == wire.EventMessage && ev.Message != nil) {
		st, err := Status(&t.Status, v.ctxID)
		if err != nil {
			return nil, err
		}
		if !newStatus && ev.Message != nil {
			// A message on the task without a change of state.
			if st.Message, err = Message(ev.Message, v.ctxID); err != nil {
				return nil, err
			}
		}
		statusEv = append(statusEv, &a2a.TaskStatusUpdateEvent{TaskID: a2a.TaskID(t.ID), ContextID: v.ctxID, Status: st})
		v.state, v.status = t.Status.State, t.Status
	}
	last := settled(t.Status.State)
	if !last {
		out = append(out, statusEv...)
	}
	for i := range t.Artifacts {
		a := &t.Artifacts[i]
		if v.artifacts[a.ArtifactID] {
			continue
		}
		v.artifacts[a.ArtifactID] = true
		art, err := Artifact(a)
		if err != nil {
			return nil, err
		}
		out = append(out, &a2a.TaskArtifactUpdateEvent{TaskID: a2a.TaskID(t.ID), ContextID: v.ctxID, Artifact: art, LastChunk: true})
	}
	if last {
		out = append(out, statusEv...)
	}
	return out, nil
}

// The push-notification methods and the extended card are not supported.

// GetTaskPushConfig implements a2asrv.RequestHandler.
func (g *Gateway) GetTaskPushConfig(context.Context, *a2a.GetTaskPushConfigRequest) (*a2a.PushConfig, error) {
	return nil, a2a.ErrPushNotificationNotSupported
}

// ListTaskPushConfigs implements a2asrv.RequestHandler.
func (g *Gateway) ListTaskPushConfigs(context.Context, *a2a.ListTaskPushConfigRequest) (*a2a.ListTaskPushConfigResponse, error) {
	return nil, a2a.ErrPushNotificationNotSupported
}

// CreateTaskPushConfig implements a2asrv.RequestHandler.
func (g *Gateway) CreateTaskPushConfig(context.Context, *a2a.PushConfig) (*a2a.PushConfig, error) {
	return nil, a2a.ErrPushNotificationNotSupported
}

// DeleteTaskPushConfig implements a2asrv.RequestHandler.
func (g *Gateway) DeleteTaskPushConfig(context.Context, *a2a.DeleteTaskPushConfigRequest) error {
	return a2a.ErrPushNotificationNotSupported
}

// GetExtendedAgentCard implements a2asrv.RequestHandler.
func (g *Gateway) GetExtendedAgentCard(context.Context, *a2a.GetExtendedAgentCardRequest) (*a2a.AgentCard, error) {
	return nil, a2a.ErrExtendedCardNotConfigured
}
