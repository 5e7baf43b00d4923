package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-bus/a2a-bus/internal/secret"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// Clients are the gateway's client credentials beyond the default token:
// one per A2A client the host tells apart (docs/PROTOCOL.md §12). Each
// client acts through an agent of its own, in a session of its own under
// the gateway's, so that it has its own tasks, idempotency keys and cap,
// and sees no other client's tasks. The host issues and revokes them with
// the host methods HostMethods returns. They live in memory: a restarted
// gateway knows none, and the host issues them again.
type Clients struct {
	mu     sync.Mutex
	byHash map[[32]byte]*ClientCredential
	byID   map[string]*ClientCredential
	// revoked is told of a revoked client (the gateway ends its streams).
	revoked func(id string)
}

// ClientCredential is one client's credential, as issued.
type ClientCredential struct {
	// ClientID names the client: its session is the gateway's, "/", the
	// id, and its agent's instance id the gateway's, "/", the id.
	ClientID string `json:"clientId"`
	// Token is the bearer token the client sends.
	Token string `json:"token"`
	// Label is the host's name for the client; it is its agent's card
	// name (the broker makes it unique).
	Label string `json:"label,omitempty"`
}

// IssueParams are the params of a2a.gateway.clients.issue.
type IssueParams struct {
	Label string `json:"label,omitempty"`
}

// RevokeParams are the params of a2a.gateway.clients.revoke.
type RevokeParams struct {
	ClientID string `json:"clientId"`
}

// MaxClients bounds the client credentials issued and not revoked.
const MaxClients = 1024

// maxLabelBytes bounds a client's label.
const maxLabelBytes = 64

// NewClients returns an empty set of client credentials.
func NewClients() *Clients {
	return &Clients{byHash: map[[32]byte]*ClientCredential{}, byID: map[string]*ClientCredential{}}
}

// Issue makes a client credential.
func (c *Clients) Issue(label string) (ClientCredential, error) {
	if label == "" {
		label = "a2a-client"
	}
	if len(label) > maxLabelBytes {
		return ClientCredential{}, wire.ErrInvalidParams.Withf("label: longer than %d bytes", maxLabelBytes)
	}
	if err := wire.ValidateID("label", label); err != nil {
		return ClientCredential{}, err
	}
	cred := &ClientCredential{ClientID: "c" + secret.Hex(12), Token: secret.Hex(32), Label: label}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.byID) >= MaxClients {
		return ClientCredential{}, wire.ErrInvalidParams.Withf("%d gateway clients are issued: revoke one first", MaxClients)
	}
	c.byHash[sha256.Sum256([]byte(cred.Token))] = cred
	c.byID[cred.ClientID] = cred
	return *cred, nil
}

// Revoke ends a client's credential: its requests are refused from now
// on, and its streams end. It reports whether the client was known.
func (c *Clients) Revoke(id string) bool {
	c.mu.Lock()
	cred, ok := c.byID[id]
	if ok {
		delete(c.byID, id)
		delete(c.byHash, sha256.Sum256([]byte(cred.Token)))
	}
	revoked := c.revoked
	c.mu.Unlock()
	if ok && revoked != nil {
		revoked(id)
	}
	return ok
}

// lookup returns the client whose token this is; nil if none.
func (c *Clients) lookup(token string) *ClientCredential {
	if c == nil {
		return nil
	}
	h := sha256.Sum256([]byte(token))
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byHash[h]
}

// HostMethods are the host methods that issue and revoke client
// credentials, for broker.Config.HostMethods.
func (c *Clients) HostMethods() map[string]transport.HostMethod {
	return map[string]transport.HostMethod{
		wire.MethodGatewayClientIssue: func(_ context.Context, params json.RawMessage) (any, error) {
			var p IssueParams
			if len(params) > 0 {
				if err := wire.DecodeParams(params, &p); err != nil {
					return nil, err
				}
			}
			return c.Issue(p.Label)
		},
		wire.MethodGatewayClientRevoke: func(_ context.Context, params json.RawMessage) (any, error) {
			var p RevokeParams
			if err := wire.DecodeParams(params, &p); err != nil {
				return nil, err
			}
			if p.ClientID == "" {
				return nil, wire.ErrInvalidParams.Withf("clientId: required")
			}
			return struct {
				Revoked bool `json:"revoked"`
			}{c.Revoke(p.ClientID)}, nil
		},
	}
}

// client is a client the gateway acts for: the default one (the token of
// Config.Token), or one of Config.Clients.
type clientState struct {
	id string // "" for the default client
	rt *runtime.Runtime
	d  *runtime.Delegate
	// bodies is the client's share of the gateway's budget of bodies in
	// service (clientShare).
	bodies *budget

	// streams counts the client's open streams (mu of the gateway).
	streams int
	// done is closed when the client's pump returns.
	done chan struct{}
}

// clientKey carries a request's client.
type clientKey struct{}

// clientOf returns the request's client: the default one unless auth put
// another in ctx.
func (g *Gateway) clientOf(ctx context.Context) *clientState {
	if c, ok := ctx.Value(clientKey{}).(*clientState); ok {
		return c
	}
	return g.def
}

// agent returns the delegate that acts for the request's client.
func (g *Gateway) agent(ctx context.Context) *runtime.Delegate { return g.clientOf(ctx).d }

// join returns the gateway's client for cred, registering its agent the
// first time: in the session cfg.Session + "/" + id, with the instance id
// cfg.Instance + "/" + id (both the broker's own, see
// broker.Config.HiddenSessions).
func (g *Gateway) join(ctx context.Context, cred *ClientCredential) (*clientState, error) {
	if c := g.joined(cred.ClientID); c != nil {
		return c, nil
	}
	g.joinMu.Lock()
	defer g.joinMu.Unlock()
	if c := g.joined(cred.ClientID); c != nil {
		return c, nil
	}
	if g.ctx.Err() != nil {
		return nil, errShuttingDown
	}
	// Registered under the gateway's own context, not the request's: the
	// client's agent outlives the request that made it.
	rctx, cancel := context.WithTimeout(g.ctx, joinTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	sess, err := g.transport.Session(rctx, g.cfg.Session+"/"+cred.ClientID)
	if err != nil {
		return nil, fmt.Errorf("gateway: open the client's session: %w", err)
	}
	rt, err := runtime.New(rctx, sess, runtime.Config{Logger: g.log})
	if err != nil {
		sess.Close()
		return nil, fmt.Errorf("gateway: %w", err)
	}
	d, err := rt.SpawnInstance(rctx, wire.AgentCard{Name: cred.Label, Description: "acts for one A2A client of the gateway"},
		g.cfg.Instance+"/"+cred.ClientID)
	if err != nil {
		rt.Close()
		return nil, fmt.Errorf("gateway: register the client's agent: %w", err)
	}
	c := &clientState{id: cred.ClientID, rt: rt, d: d, bodies: newBudget(g.clientShare()), done: make(chan struct{})}
	g.testJoinPoint("before the insert")
	// Revoked meanwhile: its agent goes, and it is not served.
	if !g.cfg.Clients.current(cred) {
		_ = rt.Close()
		return nil, errRevoked
	}
	g.mu.Lock()
	g.clients[cred.ClientID] = c
	g.mu.Unlock()
	go g.pump(c)
	g.testJoinPoint("after the insert")
	// A revoke between the check and the insert found nothing to drop.
	if !g.cfg.Clients.current(cred) {
		g.dropClient(cred.ClientID)
		return nil, errRevoked
	}
	return c, nil
}

var errRevoked = errors.New("the client's credential was revoked")

// testJoinPoint runs the test's hook at a point of join.
func (g *Gateway) testJoinPoint(point string) {
	if g.testJoinHook != nil {
		g.testJoinHook(point)
	}
}

// joined returns the client if it has joined; nil if not.
func (g *Gateway) joined(id string) *clientState {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.clients[id]
}

// clientShare is how much of the budget of bodies in service one client
// may hold: a quarter, and at least one body of the largest size.
func (g *Gateway) clientShare() int64 {
	return max(g.bodies.size/4, min(g.cfg.MaxBodyBytes, g.bodies.size))
}

// current reports whether cred is issued and not revoked.
func (c *Clients) current(cred *ClientCredential) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byID[cred.ClientID] == cred
}

// joinTimeout bounds the registration of a client's agent.
const joinTimeout = 10 * time.Second

// dropClient ends a revoked client: its streams and waiting requests end
// and its agent departs (its tasks stay with their other members).
func (g *Gateway) dropClient(id string) {
	g.mu.Lock()
	c, ok := g.clients[id]
	delete(g.clients, id)
	g.mu.Unlock()
	if !ok {
		return
	}
	_ = c.rt.Close()
	<-c.done
	// Its streams and waiting requests read their task again, through an
	// agent that is gone: they end now, not at their next poll.
	g.lagAll()
}

// DefaultMaxStreamsPerClient is Config.MaxStreamsPerClient's default.
const DefaultMaxStreamsPerClient = 32

// DefaultAbandonAfter is Config.AbandonAfter's default.
const DefaultAbandonAfter = 10 * time.Minute

// openStream counts a stream, or a blocking send, of the request's
// client against its bound; call release when it ends.
func (g *Gateway) openStream(ctx context.Context) (release func(), err error) {
	c := g.clientOf(ctx)
	g.mu.Lock()
	defer g.mu.Unlock()
	if c.streams >= g.cfg.MaxStreamsPerClient {
		return nil, a2a.NewError(a2a.ErrInvalidRequest, fmt.Sprintf("this client has %d streams and blocking sends open, its bound: end one first", c.streams))
	}
	c.streams++
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			c.streams--
			g.mu.Unlock()
		})
	}, nil
}

// abandon starts the clock on a task whose client stopped waiting for it
// (a blocking send whose connection closed): unless the task has a
// subscriber, or its client reads it, within Config.AbandonAfter, the
// client's agent cancels it, so that an abandoned task holds no slot of
// its client's cap for ever.
func (g *Gateway) abandon(c *clientState, id string) {
	if g.cfg.NeverAbandon {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ctx.Err() != nil {
		return
	}
	due := time.Now().Add(g.cfg.AbandonAfter)
	if a, ok := g.abandoned[id]; ok {
		a.due = due
		a.t.Reset(g.cfg.AbandonAfter)
		return
	}
	g.abandoned[id] = &abandonClock{c: c, due: due, t: time.AfterFunc(g.cfg.AbandonAfter, func() { g.endAbandoned(c, id) })}
}

// abandonClock is the clock of an abandoned task, and its client.
type abandonClock struct {
	t   *time.Timer
	c   *clientState
	due time.Time // put off by a read or a new wait: its timer comes again
}

// touch puts off the end of an abandoned task that its client reads.
func (g *Gateway) touch(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if a, ok := g.abandoned[id]; ok {
		a.due = time.Now().Add(g.cfg.AbandonAfter)
		a.t.Reset(g.cfg.AbandonAfter)
	}
}

// endAbandoned cancels an abandoned task, unless it has a subscriber now
// (then the clock starts again).
func (g *Gateway) endAbandoned(c *clientState, id string) {
	g.mu.Lock()
	if g.ctx.Err() != nil {
		g.mu.Unlock()
		return
	}
	a, ok := g.abandoned[id]
	if !ok || time.Now().Before(a.due) {
		// Ended, or put off while this end waited for the lock: its
		// timer comes again.
		g.mu.Unlock()
		return
	}
	delete(g.abandoned, id)
	watched := len(g.subs[id]) > 0
	g.bg.Add(1)
	g.mu.Unlock()
	defer g.bg.Done()
	if watched {
		g.abandon(c, id)
		return
	}
	ctx, cancel := context.WithTimeout(g.ctx, joinTimeout)
	defer cancel()
	_, err := c.d.Cancel(ctx, id)
	switch {
	case err == nil:
		g.log.Info("a task its gateway client abandoned was canceled", "task", id, "client", c.id, "after", g.cfg.AbandonAfter)
	case errors.Is(err, wire.ErrInvalidTransition), errors.Is(err, wire.ErrUnknownTask):
		// It ended meanwhile.
	default:
		g.log.Warn("a task its gateway client abandoned could not be canceled", "task", id, "error", err)
	}
}

// stopAbandoned stops the clocks of abandoned tasks and waits for an end
// under way (Close).
func (g *Gateway) stopAbandoned() {
	g.mu.Lock()
	for id, a := range g.abandoned {
		a.t.Stop()
		delete(g.abandoned, id)
	}
	g.mu.Unlock()
	g.bg.Wait()
}
