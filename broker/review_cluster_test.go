package broker_test

import (
	"context"
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

// a2a.sessions.close deregisters the session's agents (PROTOCOL §2.2),
// in a cluster those of every broker (§13: everything of §1–§12 holds
// across the cluster). It goes through the broker's copy of the
// registrations without catching up with the cluster first, as a token
// check, a send and a list do: an agent of the session registered through
// another broker a moment ago, not yet in this broker's copy, survives
// the close, with its token, its name and its open tasks.
func TestReviewClosingASessionDeregistersItsAgentRegisteredElsewhereAMomentAgo(t *testing.T) {
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
}
