package broker_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
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

// racingRegistry is one broker's view of a fakeCluster in which another
// broker's registration lands between this broker's check of an instance
// and its store: hook runs once, as this broker claims a name, which a
// registration does after it has checked the instance and before it
// stores it.
type racingRegistry struct {
	*fakeCluster
	once sync.Once
	hook func()
}

func (r *racingRegistry) ClaimName(ctx context.Context, id, instance string) error {
	r.once.Do(r.hook)
	return r.fakeCluster.ClaimName(ctx, id, instance)
}

func (c *fakeCluster) racingBroker(t *testing.T, id string, r *racingRegistry) *env {
	t.Helper()
	cfg := broker.Config{Store: c}
	cfg.Cluster = &broker.Cluster{Broker: id, Epoch: "cluster-epoch", Registry: r, Events: c, Leases: c, LeaseEvery: 10 * time.Millisecond}
	return newEnvWrapped(t, cfg, fakebus.Config{}, func(b *fakebus.Bus) transport.Bus {
		c.mu.Lock()
		c.buses = append(c.buses, b)
		c.mu.Unlock()
		return b
	})
}

// One instance registers in two sessions at once, through two brokers.
// PROTOCOL §4.1: an instance live in another session is -32602, and a
// registration is answered only once it is stored. Of the two, one must
// be refused; the cluster's registration is written without a
// compare-and-set, so both are acknowledged and the later store silently
// replaces the earlier one (whose token then stops working): the other
// session has taken the instance over.
func TestReviewAnInstanceRegisteredInTwoSessionsAtOnceIsRefusedOnce(t *testing.T) {
	c := newFakeCluster()
	b1 := c.broker(t, "b1")
	r := &racingRegistry{fakeCluster: c}
	b2 := c.racingBroker(t, "b2", r)
	var alice *agent
	var aliceErr error
	r.hook = func() { alice, aliceErr = b1.tryRegister("s1", "alice", "shared-instance") }
	_, malloryErr := b2.tryRegister("s2", "mallory", "shared-instance")
	require.NotErrorIs(t, aliceErr, errTransport)
	require.NotErrorIs(t, malloryErr, errTransport)

	assert.False(t, aliceErr == nil && malloryErr == nil,
		"both registrations of one instance, in sessions s1 and s2, were acknowledged")
	if aliceErr == nil {
		reg, err := c.Registration(context.Background(), "shared-instance")
		require.NoError(t, err)
		assert.Equal(t, "s1", reg.Session, "alice's acknowledged registration was replaced by another session's")
		_, err = alice.tryCall(wire.MethodListAgents, nil)
		assert.NoError(t, err, "alice's token, acknowledged, no longer works")
	}
}

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

// readHook is one broker's view of a fakeCluster that runs hook once,
// once armed, right after this broker has read instance's registration:
// the moment between a take-over's read and its write.
type readHook struct {
	*fakeCluster
	instance string
	armed    atomic.Bool
	once     sync.Once
	hook     func()
	fired    chan struct{}
}

func (r *readHook) Registration(ctx context.Context, instance string) (*store.Registration, error) {
	reg, err := r.fakeCluster.Registration(ctx, instance)
	if r.armed.Load() && instance == r.instance {
		r.once.Do(func() {
			r.hook()
			close(r.fired)
		})
	}
	return reg, err
}

// An agent of a lapsed broker calls another broker, which takes it over
// (PROTOCOL §13); meanwhile the agent registers again, by its instance id,
// through a third broker, which answers with a new token. The take-over
// writes the registration it read before, without a compare-and-set: the
// acknowledged registration is replaced by the old one, so the new token
// stops working and the old one, which its runtime dropped, works again.
// releaseLapsed (a read, then a delete without a compare-and-set) loses a
// take-over or a registration made between its read and its delete the
// same way.
func TestReviewATakeOverNeverUndoesARegistrationMadeMeanwhile(t *testing.T) {
	c := newFakeCluster()
	cfg := broker.Config{OrphanTimeout: time.Hour}
	b1 := c.brokerWith(t, "b1", cfg)
	hooked := &readHook{fakeCluster: c, instance: "alice-instance", fired: make(chan struct{})}
	cfg2 := cfg
	cfg2.Store = c
	cfg2.Cluster = &broker.Cluster{Broker: "b2", Epoch: "cluster-epoch", Registry: hooked, Events: c, Leases: c, LeaseEvery: 10 * time.Millisecond}
	b2 := newEnvWrapped(t, cfg2, fakebus.Config{}, func(b *fakebus.Bus) transport.Bus {
		c.mu.Lock()
		c.buses = append(c.buses, b)
		c.mu.Unlock()
		return b
	})
	b3 := c.brokerWith(t, "b3", cfg)
	alice := b1.registerInstance("s1", "alice", "alice-instance")
	seen(t, b3.register("s9", "watcher"), "alice")

	var again *agent
	var againErr error
	hooked.hook = func() { again, againErr = b3.tryRegister("s1", "alice", "alice-instance") }
	require.NoError(t, b1.broker.Close())
	c.lapse("b1")
	hooked.armed.Store(true)
	deadline := time.Now().Add(10 * time.Second)
	for fired := false; !fired; {
		require.True(t, time.Now().Before(deadline), "b2 never took alice over")
		_, _ = alice.on(b2).tryCall(wire.MethodListAgents, nil) // b2 takes her over once it sees b1 lapsed
		select {
		case <-hooked.fired:
			fired = true
		case <-time.After(5 * time.Millisecond):
		}
	}
	require.NoError(t, againErr)
	require.NoError(t, b2.broker.Close()) // waits for the take-over to end

	reg, err := c.Registration(context.Background(), "alice-instance")
	require.NoError(t, err)
	sum := sha256.Sum256([]byte(again.token))
	assert.Equal(t, hex.EncodeToString(sum[:]), reg.TokenHash,
		"the registration acknowledged through b3 was replaced by b2's take-over of the one before it")
}

// failingUpdates is a fakeCluster whose task updates fail: the cluster's
// task stream out of reach, or the broker killed, after a registration
// was deleted and before its tasks were closed.
type failingUpdates struct{ *fakeCluster }

func (failingUpdates) Update(context.Context, string, func(*store.Record) error) (*store.Record, error) {
	return nil, errors.New("the cluster's task stream is out of reach")
}

// A broker lets a lapsed broker's agents go: registrations deleted, then
// names freed, then tasks closed. PROTOCOL §13: "Every broker that sees
// it does the same; each step is one the next finds done." When the
// tasks cannot be closed (the broker dies, or the task stream is out of
// reach, after the delete), no broker ever closes them: each finds the
// registration gone and stops there, and no orphan sweep runs at a
// cluster broker's start. The task stays open for ever, and counts
// against its requester's session's --max-tasks-per-context.
func TestReviewTheTasksOfALapsedBrokersAgentsAreClosedEvenIfTheFirstReleaseStoppedHalfway(t *testing.T) {
	c := newFakeCluster()
	cfg := broker.Config{OrphanTimeout: 100 * time.Millisecond}
	b1 := c.brokerWith(t, "b1", cfg)
	alice := b1.register("s1", "alice")
	bob := b1.register("s2", "bob")
	task := bob.mustSend("alice", "work")

	cfg2 := cfg
	cfg2.Store = failingUpdates{c}
	cfg2.Cluster = &broker.Cluster{Broker: "b2", Epoch: "cluster-epoch", Registry: c, Events: c, Leases: c, LeaseEvery: 10 * time.Millisecond}
	b2 := newEnvWrapped(t, cfg2, fakebus.Config{}, func(b *fakebus.Bus) transport.Bus { return b })
	require.NoError(t, b1.broker.Close())
	c.lapse("b1")
	require.Eventually(t, func() bool {
		_, errA := c.Registration(context.Background(), alice.instance)
		_, errB := c.Registration(context.Background(), bob.instance)
		return errors.Is(errA, store.ErrNotFound) && errors.Is(errB, store.ErrNotFound)
	}, 10*time.Second, 5*time.Millisecond, "b2 never let b1's agents go")
	require.NoError(t, b2.broker.Close())
	c.lapse("b2")

	c.brokerWith(t, "b3", cfg)
	require.Eventually(t, func() bool {
		rec, err := c.Get(context.Background(), task.ID)
		return err == nil && rec.Task.Status.State.Terminal()
	}, 10*time.Second, 10*time.Millisecond, "the task of two agents let go stays open for ever")
}
