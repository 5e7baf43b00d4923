package broker_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/wire"
)

// The brokers of a cluster write a registration only as they read it,
// under the instance's lock: what another broker stored meanwhile is
// never undone unseen.

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

// One instance registers in two sessions at once, through two brokers.
// PROTOCOL §4.1: an instance live in another session is -32602, and a
// registration is answered only once it is stored. Of the two, one is
// refused: the acknowledged one is never replaced by the other session's.
func TestClusterAnInstanceRegisteredInTwoSessionsAtOnceIsRefusedOnce(t *testing.T) {
	c := newFakeCluster()
	b1 := c.broker(t, "b1")
	r := &racingRegistry{fakeCluster: c}
	b2 := c.brokerOn(t, "b2", broker.Config{}, r, nil)
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
	// The refused registration's name is not left taken.
	assert.Empty(t, c.nameHolder("mallory"))
}

// readHook is one broker's view of a fakeCluster that runs hook once,
// once armed, right after this broker has read instance's registration
// with its revision: the moment between a take-over's or a release's
// read and its write.
type readHook struct {
	*fakeCluster
	instance string
	armed    atomic.Bool
	once     sync.Once
	hook     func()
	fired    chan struct{}
}

func (r *readHook) RegistrationRev(ctx context.Context, instance string) (*store.Registration, uint64, error) {
	reg, rev, err := r.fakeCluster.RegistrationRev(ctx, instance)
	if r.armed.Load() && instance == r.instance {
		r.once.Do(func() {
			r.hook()
			close(r.fired)
		})
	}
	return reg, rev, err
}

// An agent of a lapsed broker calls another broker, which takes it over
// (PROTOCOL §13); meanwhile the agent registers again, by its instance id,
// through a third broker, which answers with a new token. The take-over
// wrote the registration it read before: it must not replace the
// acknowledged one, whose new token must keep working (and the old one,
// which its runtime dropped, must not work again).
func TestClusterATakeOverNeverUndoesARegistrationMadeMeanwhile(t *testing.T) {
	c := newFakeCluster()
	cfg := broker.Config{OrphanTimeout: time.Hour}
	b1 := c.brokerWith(t, "b1", cfg)
	hooked := &readHook{fakeCluster: c, instance: "alice-instance", fired: make(chan struct{})}
	b2 := c.brokerOn(t, "b2", cfg, hooked, nil)
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
	assert.Equal(t, tokenHash(again.token), reg.TokenHash,
		"the registration acknowledged through b3 was replaced by b2's take-over of the one before it")
	assert.Equal(t, "b3", reg.Broker)
	_, err = again.tryCall(wire.MethodListAgents, nil)
	require.NoError(t, err, "the token of the registration acknowledged meanwhile")
	requireCode(t, alice.on(b3).tryDeregister(), wire.ErrUnauthorized)
}

// A broker lets a lapsed broker's agents go (PROTOCOL §13) while, between
// its read of a registration and its delete, the agent registers again
// through another broker, or calls another broker, which takes it over.
// The release must not delete the registration made or changed
// meanwhile, nor leave its name free.
func TestClusterALetGoNeverDeletesARegistrationChangedMeanwhile(t *testing.T) {
	for _, tc := range []struct {
		name string
		// meanwhile changes alice's registration through b3, and returns
		// the token that works from then on.
		meanwhile func(t *testing.T, c *fakeCluster, alice *agent, b3 *env) (string, error)
	}{
		{"registered again", func(_ *testing.T, _ *fakeCluster, _ *agent, b3 *env) (string, error) {
			again, err := b3.tryRegister("s1", "alice", "alice-instance")
			if err != nil {
				return "", err
			}
			return again.token, nil
		}},
		{"taken over", func(_ *testing.T, c *fakeCluster, alice *agent, b3 *env) (string, error) {
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				_, _ = alice.on(b3).tryCall(wire.MethodListAgents, nil) // b3 takes her over once it sees b1 lapsed
				if reg, err := c.Registration(context.Background(), "alice-instance"); err == nil && reg.Broker == "b3" {
					return alice.token, nil
				}
				time.Sleep(5 * time.Millisecond)
			}
			return "", errors.New("b3 never took alice over")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeCluster()
			keep := broker.Config{OrphanTimeout: time.Hour}
			b1 := c.brokerWith(t, "b1", keep)
			hooked := &readHook{fakeCluster: c, instance: "alice-instance", fired: make(chan struct{})}
			b2 := c.brokerOn(t, "b2", broker.Config{OrphanTimeout: 50 * time.Millisecond}, hooked, nil)
			b3 := c.brokerWith(t, "b3", keep)
			alice := b1.registerInstance("s1", "alice", "alice-instance")
			seen(t, b3.register("s9", "watcher"), "alice")

			var token string
			var meanwhileErr error
			hooked.hook = func() { token, meanwhileErr = tc.meanwhile(t, c, alice, b3) }
			hooked.armed.Store(true)
			require.NoError(t, b1.broker.Close())
			c.lapse("b1")
			select {
			case <-hooked.fired:
			case <-time.After(10 * time.Second):
				require.Fail(t, "b2 never let alice go")
			}
			require.NoError(t, meanwhileErr)
			require.NoError(t, b2.broker.Close()) // waits for the release to end

			reg, err := c.Registration(context.Background(), "alice-instance")
			require.NoError(t, err, "the registration changed meanwhile was deleted")
			assert.Equal(t, tokenHash(token), reg.TokenHash)
			assert.Equal(t, "b3", reg.Broker)
			assert.Equal(t, "alice-instance", c.nameHolder("alice"), "the name of the registration changed meanwhile is free")
			me := *alice
			me.token, me.e = token, b3
			_, err = me.tryCall(wire.MethodListAgents, nil)
			require.NoError(t, err, "the token of the registration changed meanwhile")
		})
	}
}

// An agent registers again, by its instance id, through another broker
// than the one it first registered through, whose copy has not seen the
// new registration yet. Its old token, sent to that broker, was revoked
// by the new registration: it must not deregister the new one (delete
// its registration, free its name, close its tasks).
func TestClusterAnOldTokenOnALaggingBrokerNeverDeregistersItsSuccessor(t *testing.T) {
	c := newFakeCluster()
	b1, b2 := c.laggingBroker(t, "b1"), c.broker(t, "b2")
	old := b1.registerInstance("s1", "alice", "alice-instance")
	successor := b2.registerInstance("s1", "alice", "alice-instance") // b1 not told
	bob := b2.register("s2", "bob")
	task := bob.mustSend("alice", "work")

	requireCode(t, old.tryDeregister(), wire.ErrUnauthorized)
	reg, err := c.Registration(context.Background(), "alice-instance")
	require.NoError(t, err, "the old token deleted its successor's registration")
	assert.Equal(t, tokenHash(successor.token), reg.TokenHash)
	assert.Equal(t, "alice-instance", c.nameHolder("alice"))
	got, err := bob.get(task.ID)
	require.NoError(t, err)
	assert.False(t, got.Status.State.Terminal(), "the old token closed its successor's task")
	// b1's copy is the successor's now.
	_, err = successor.on(b1).tryCall(wire.MethodListAgents, nil)
	require.NoError(t, err)
}

// failingUpdates is a fakeCluster whose task updates fail: the cluster's
// task stream out of reach from one broker. It counts the tries.
type failingUpdates struct {
	*fakeCluster
	tries *atomic.Int64
}

func (f failingUpdates) Update(context.Context, string, func(*store.Record) error) (*store.Record, error) {
	f.tries.Add(1)
	return nil, errors.New("the cluster's task stream is out of reach")
}

// A broker lets a lapsed broker's agents go (PROTOCOL §13: "Every broker
// that sees it does the same; each step is one the next finds done"):
// their open tasks closed, their names freed, their registrations
// deleted last. When the tasks cannot be closed (the task stream is out
// of reach, or the broker dies), the registrations stay, so that the
// release is not lost: the next broker that sees them lets them go, and
// closes the tasks, which would otherwise stay open for ever and count
// against their requester's --max-tasks-per-context.
func TestClusterTheTasksOfALapsedBrokersAgentsAreClosedEvenIfTheFirstReleaseStoppedHalfway(t *testing.T) {
	c := newFakeCluster()
	cfg := broker.Config{OrphanTimeout: 100 * time.Millisecond}
	b1 := c.brokerWith(t, "b1", cfg)
	alice := b1.register("s1", "alice")
	bob := b1.register("s2", "bob")
	task := bob.mustSend("alice", "work")

	var tries atomic.Int64
	b2 := c.brokerOn(t, "b2", cfg, c, failingUpdates{c, &tries})
	require.NoError(t, b1.broker.Close())
	c.lapse("b1")
	require.Eventually(t, func() bool { return tries.Load() >= 2 }, 10*time.Second, 5*time.Millisecond,
		"b2 never tried to let b1's agents go")
	for _, a := range []*agent{alice, bob} {
		_, err := c.Registration(context.Background(), a.instance)
		require.NoError(t, err, "%s's registration was deleted before its task was closed", a.id)
	}
	require.NoError(t, b2.broker.Close())
	c.lapse("b2")

	c.brokerWith(t, "b3", cfg)
	require.Eventually(t, func() bool {
		rec, err := c.Get(context.Background(), task.ID)
		return err == nil && rec.Task.Status.State.Terminal()
	}, 10*time.Second, 10*time.Millisecond, "the task of two agents let go stays open for ever")
	require.Eventually(t, func() bool {
		_, errA := c.Registration(context.Background(), alice.instance)
		_, errB := c.Registration(context.Background(), bob.instance)
		return errors.Is(errA, store.ErrNotFound) && errors.Is(errB, store.ErrNotFound)
	}, 10*time.Second, 5*time.Millisecond, "b3 never let b1's agents go")
	assert.Empty(t, c.nameHolder("alice"))
	assert.Empty(t, c.nameHolder("bob"))
}

// lostAnswer is a fakeCluster whose first registration write is stored
// but answered with an error, as a write whose answer was lost.
type lostAnswer struct {
	*fakeCluster
	lost atomic.Bool
}

func (l *lostAnswer) PutRegistrationAt(ctx context.Context, reg store.Registration, rev uint64) error {
	err := l.fakeCluster.PutRegistrationAt(ctx, reg, rev)
	if err == nil && l.lost.CompareAndSwap(false, true) {
		return errors.New("the cluster's answer was lost")
	}
	return err
}

func (l *lostAnswer) PutRegistration(ctx context.Context, reg store.Registration) error {
	err := l.fakeCluster.PutRegistration(ctx, reg)
	if err == nil && l.lost.CompareAndSwap(false, true) {
		return errors.New("the cluster's answer was lost")
	}
	return err
}

// A registration whose write was stored but whose answer was lost is the
// agent's, with its name held: the broker does not free the name of a
// registration the cluster may hold (which would let another agent take
// it, and the cluster hold it twice).
func TestClusterARegistrationWhoseAnswerWasLostKeepsItsName(t *testing.T) {
	c := newFakeCluster()
	lost := &lostAnswer{fakeCluster: c}
	b1 := c.brokerOn(t, "b1", broker.Config{}, lost, lost)
	a, err := b1.tryRegister("s1", "alice", "alice-instance")
	require.True(t, lost.lost.Load(), "no answer was lost")
	require.NoError(t, err, "a registration stored was answered with an error")
	_, err = a.tryCall(wire.MethodListAgents, nil)
	require.NoError(t, err)
	reg, err := c.Registration(context.Background(), "alice-instance")
	require.NoError(t, err)
	assert.Equal(t, tokenHash(a.token), reg.TokenHash)
	assert.Equal(t, "alice-instance", c.nameHolder("alice"), "the name of a stored registration is free")
}

// A deregistration deletes the registration, then closes the agent's
// open tasks. When the closings fail (the task stream out of reach from
// that broker, or the broker dies in between), the tasks would stay open
// for ever with a member that is gone, and count against their
// requester's cap: another broker, looking for the open tasks of members
// whose registrations are gone, closes them as the departure would have,
// and tells the other member.
func TestClusterTheTasksOfADepartureCutShortAreClosedByAnotherBroker(t *testing.T) {
	c := newFakeCluster()
	var tries atomic.Int64
	b1 := c.brokerOn(t, "b1", broker.Config{}, c, failingUpdates{c, &tries})
	b2 := c.broker(t, "b2")
	alice := b2.register("s1", "alice")
	bob := b2.register("s2", "bob")
	asked := bob.mustSend("alice", "work")
	asking := alice.mustSend("bob", "work too")
	b2.event("s1") // the task alice was sent
	b2.event("s2") // the task bob was sent

	requireCode(t, alice.on(b1).tryDeregister(), wire.ErrInternal)
	require.Positive(t, tries.Load(), "b1 never tried to close alice's tasks")
	_, err := c.Registration(context.Background(), alice.instance)
	require.ErrorIs(t, err, store.ErrNotFound)

	for id, want := range map[string]wire.State{asked.ID: wire.StateFailed, asking.ID: wire.StateCanceled} {
		require.Eventually(t, func() bool {
			rec, err := c.Get(context.Background(), id)
			return err == nil && rec.Task.Status.State == want
		}, 10*time.Second, 5*time.Millisecond, "the task %s of an agent whose departure was cut short stays open", id)
	}
	// bob hears of both, once each.
	got := map[string]wire.State{}
	for range 2 {
		select {
		case raw := <-b2.session("s2").sub.C():
			ev, err := wire.DecodeEvent(raw)
			require.NoError(t, err)
			require.NotNil(t, ev.TaskEvent, "%s", raw)
			got[ev.TaskEvent.TaskID] = ev.TaskEvent.Task.Status.State
		case <-time.After(10 * time.Second):
			t.Fatalf("bob was told of %d of the 2 closings", len(got))
		}
	}
	assert.Equal(t, map[string]wire.State{asked.ID: wire.StateFailed, asking.ID: wire.StateCanceled}, got)
	b2.noEvent("s2")
}
