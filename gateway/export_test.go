package gateway

import (
	"context"
	"time"
)

// SetPollEvery sets pollEvery for a test, and returns its undo. Call it
// before the gateway starts and undo it after the gateway is closed: it
// is read without a lock.
func SetPollEvery(d time.Duration) (undo func()) {
	was := pollEvery
	pollEvery = d
	return func() { pollEvery = was }
}

// Abandoned returns how many abandoned tasks have their clock running.
func Abandoned(g *Gateway) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.abandoned)
}

// ExpireAbandoned runs out every abandoned task's clock now, as if
// AbandonAfter had passed, and returns once each end is done.
func ExpireAbandoned(g *Gateway) {
	g.mu.Lock()
	var due []func()
	for id, a := range g.abandoned {
		if a.t.Stop() {
			a.due = time.Time{}
			due = append(due, func() { g.endAbandoned(a.c, id) })
		}
	}
	g.mu.Unlock()
	for _, end := range due {
		end()
	}
}

// Joined returns how many issued clients have joined.
func Joined(g *Gateway) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.clients)
}

// BodiesInService returns what the budget of bodies in service holds.
func BodiesInService(g *Gateway) int64 {
	g.bodies.mu.Lock()
	defer g.bodies.mu.Unlock()
	return g.bodies.used
}

// JoinRevokedAt joins the client of token, revoking it at that point of
// the join: "before the insert" (the agent is registered) or "after the
// insert" (the client is in the gateway's map, not yet answered).
func JoinRevokedAt(g *Gateway, token, at string) (*clientState, error) {
	cred := g.cfg.Clients.lookup(token)
	g.testJoinHook = func(point string) {
		if point == at {
			g.cfg.Clients.Revoke(cred.ClientID)
		}
	}
	defer func() { g.testJoinHook = nil }()
	return g.join(context.Background(), cred)
}
