package broker_test

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/transport/fakebus"
	"github.com/a2a-bus/a2a-bus/wire"
)

// laggingWatch is one broker's view of a fakeCluster whose watch lags:
// the changes stored reach the broker's copy only when it calls Sync, as
// a JetStream watch may come round to a change well after another broker
// stored it and answered its client.
type laggingWatch struct {
	*fakeCluster
	mu      sync.Mutex
	fn      func(string)
	pending []string
}

func (l *laggingWatch) WatchRegistrations(ctx context.Context, fn func(string)) (func(), error) {
	l.mu.Lock()
	l.fn = fn
	l.mu.Unlock()
	return l.fakeCluster.WatchRegistrations(ctx, func(instance string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.pending = append(l.pending, instance)
	})
}

func (l *laggingWatch) Sync(ctx context.Context) (map[string]bool, error) {
	l.mu.Lock()
	pending, fn := l.pending, l.fn
	l.pending = nil
	l.mu.Unlock()
	for _, instance := range pending {
		fn(instance)
	}
	return l.stored(ctx)
}

// laggingBroker starts a broker of c whose copy of the registrations is
// brought up to date only by its Sync calls.
func (c *fakeCluster) laggingBroker(t *testing.T, id string) *env {
	t.Helper()
	return c.start(t, id, broker.Config{}, &laggingWatch{fakeCluster: c}, nil)
}

// An agent another broker registered a moment ago is an addressee at
// once, by name and without: the broker catches up with the cluster's
// registrations before it answers that there is no such agent, as it
// does before it refuses a token.
func TestClusterAnAgentRegisteredElsewhereIsFoundAtOnce(t *testing.T) {
	c := newFakeCluster()
	b1, b2 := c.broker(t, "b1"), c.laggingBroker(t, "b2")
	alice := b2.register("s1", "alice")

	bob := b1.register("s2", "bob")
	task, err := alice.send("bob", "hello")
	require.NoError(t, err, "a send by name to an agent registered through another broker")
	assert.Equal(t, bob.id, task.AgentName)

	carol := b1.register("s3", "carol")
	res, err := alice.call(wire.MethodListAgents, map[string]any{"agentId": "carol"})
	require.NoError(t, err)
	var page wire.ListAgentsResult
	require.NoError(t, json.Unmarshal(res, &page))
	require.Len(t, page.Agents, 1, "the card of an agent registered through another broker")
	assert.Equal(t, carol.id, page.Agents[0].AgentID)

	// Without to, the single other agent of alice's session.
	dave := b1.register("s1", "dave")
	task, err = alice.send("", "hello")
	require.NoError(t, err, "a send without to, whose only candidate registered through another broker")
	assert.Equal(t, dave.id, task.AgentName)
}

// a2a.sessions.close deregisters the session's agents (PROTOCOL §2.2),
// in a cluster those of every broker (§13: everything of §1–§12 holds
// across the cluster), as of the call: an agent of the session
// registered through another broker a moment ago, not yet in this
// broker's copy, goes too, with its token, its name and its open tasks.
func TestClusterClosingASessionDeregistersItsAgentRegisteredElsewhereAMomentAgo(t *testing.T) {
	c := newFakeCluster()
	lag := &laggingWatch{fakeCluster: c}
	cfg := broker.Config{Store: c}
	cfg.Cluster = &broker.Cluster{Broker: "b1", Epoch: "cluster-epoch", Registry: lag, Events: c, Leases: c, LeaseEvery: 10 * time.Millisecond}
	b1 := newEnvWrapped(t, cfg, fakebus.Config{}, func(b *fakebus.Bus) transport.Bus {
		c.mu.Lock()
		c.buses = append(c.buses, b)
		c.mu.Unlock()
		return revokerBus{b}
	})
	b2 := c.broker(t, "b2")
	helper := b2.register("s2", "helper")

	res, err := b1.bus.CallHost(t.Context(), wire.MethodSessionClose, map[string]any{"contextId": "s2"})
	require.NoError(t, err)
	assert.JSONEq(t, `{"deregistered":["helper"]}`, string(res))
	_, err = c.Registration(context.Background(), helper.instance)
	assert.ErrorIs(t, err, store.ErrNotFound, "the closed session's agent is still registered in the cluster")
	requireCode(t, helper.tryDeregister(), wire.ErrUnauthorized)
	assert.Empty(t, c.nameHolder("helper"), "the closed session's agent's name is still taken")
}

// deafWatch is one broker's view of a fakeCluster whose watch never
// tells the changes of one instance: a change lost on the way, or read
// from before it was made.
type deafWatch struct {
	*fakeCluster
	deaf atomic.Pointer[string]
}

func (d *deafWatch) WatchRegistrations(ctx context.Context, fn func(string)) (func(), error) {
	return d.fakeCluster.WatchRegistrations(ctx, func(instance string) {
		if deaf := d.deaf.Load(); deaf == nil || instance != *deaf {
			fn(instance)
		}
	})
}

// A copy that missed a change (alice left through another broker, and
// this broker's watch never told it) is mended at the next catch-up,
// which checks the copy against the instances the cluster stores: the
// list the catch-up comes before does not show alice, and her token
// stops working here.
func TestClusterACopyThatMissedAChangeIsMendedAtTheNextCatchUp(t *testing.T) {
	c := newFakeCluster()
	b1 := c.broker(t, "b1")
	alice := b1.register("s1", "alice")
	bob := b1.register("s2", "bob")
	watch := &deafWatch{fakeCluster: c}
	b2 := c.start(t, "b2", broker.Config{}, watch, nil)
	require.Contains(t, ids(bob.on(b2).list()), "alice")
	stale := alice.on(b2)
	watch.deaf.Store(&alice.instance)

	require.NoError(t, alice.deregister())
	assert.NotContains(t, ids(bob.on(b2).list()), "alice", "b2's copy kept an agent that left")
	requireCode(t, stale.tryDeregister(), wire.ErrUnauthorized)

	// And the other way: carol, registered through b1 under the deaf
	// instance id, reaches b2's copy all the same.
	carol := b1.registerInstance("s1", "carol", alice.instance)
	assert.Contains(t, ids(bob.on(b2).list()), "carol")
	_, err := carol.on(b2).call(wire.MethodListAgents, nil)
	require.NoError(t, err)
}
