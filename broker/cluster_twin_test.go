package broker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/wire"
)

// countingReads is one broker's view of a fakeCluster that counts its
// reads of each instance's registration.
type countingReads struct {
	*fakeCluster
	mu sync.Mutex
	n  map[string]int
}

func (r *countingReads) count(instance string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n[instance]++
}

func (r *countingReads) reads(instances ...string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	total := 0
	for _, i := range instances {
		total += r.n[i]
	}
	return total
}

func (r *countingReads) Registration(ctx context.Context, instance string) (*store.Registration, error) {
	r.count(instance)
	return r.fakeCluster.Registration(ctx, instance)
}

func (r *countingReads) RegistrationRev(ctx context.Context, instance string) (*store.Registration, uint64, error) {
	r.count(instance)
	return r.fakeCluster.RegistrationRev(ctx, instance)
}

// plant stores a registration as another broker would have, its token
// hashed from token.
func (c *fakeCluster) plant(t *testing.T, instance, session, id, token string) {
	t.Helper()
	card, err := json.Marshal(wire.AgentCard{Name: id, AgentID: id, ContextID: session})
	require.NoError(t, err)
	require.NoError(t, c.PutRegistration(context.Background(), store.Registration{Instance: instance, Session: session,
		AgentID: id, Name: id, Card: card, TokenHash: tokenHash(token), Broker: "elsewhere"}))
}

// The cluster should never hold one agentId for two instances, but a
// store written by an earlier version may. A broker copies one of them,
// and leaves the other waiting, logged, until the first is gone: it does
// not read the two again and again for ever (every broker of the cluster
// asking the stream leader in a loop).
func TestClusterANameHeldTwiceIsNotReadAgainAndAgain(t *testing.T) {
	c := newFakeCluster()
	counted := &countingReads{fakeCluster: c, n: map[string]int{}}
	b1 := c.brokerOn(t, "b1", broker.Config{OrphanTimeout: broker.Forever}, counted, nil)
	watcher := b1.register("s9", "watcher")
	c.plant(t, "first-instance", "s1", "twin", "first-token")
	c.plant(t, "second-instance", "s2", "twin", "second-token")

	twin := func() *wire.AgentCard {
		for _, card := range watcher.list() {
			if card.AgentID == "twin" {
				return &card
			}
		}
		return nil
	}
	require.Eventually(t, func() bool { return twin() != nil }, 10*time.Second, time.Millisecond)
	// A registration stored meanwhile is copied by a pass of the broker's
	// watch, which takes every instance pending then: the twins, too, if
	// they are read again and again. Nothing else catches up meanwhile.
	markers := 0
	copied := func() bool {
		agents, _, _, _ := b1.broker.Footprint()
		markers++
		c.plant(t, fmt.Sprint("marker-", markers), "s8", fmt.Sprint("marker-", markers), "marker-token")
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if now, _, _, _ := b1.broker.Footprint(); now > agents {
				return true
			}
			time.Sleep(time.Millisecond)
		}
		return false
	}
	require.Eventually(t, func() bool {
		before := counted.reads("first-instance", "second-instance")
		return copied() && counted.reads("first-instance", "second-instance") == before
	}, 10*time.Second, time.Millisecond, "the two instances of one agentId are read again and again")
	assert.Equal(t, "s1", twin().ContextID)

	// Once the first is gone, the second is copied.
	require.NoError(t, c.DeleteRegistration(context.Background(), "first-instance"))
	require.Eventually(t, func() bool {
		card := twin()
		return card != nil && card.ContextID == "s2"
	}, 10*time.Second, time.Millisecond, "the second instance of the name was never copied")
}
