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
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/transport/fakebus"
	"github.com/a2a-bus/a2a-bus/wire"
)

// A departure and a send that races it on another broker, whose copy of
// the registry has not yet heard of the departure: the departure closes
// the open tasks it finds, and the task the send makes after that must
// not stay open with a member that is gone (no departure would ever
// close it).
func TestClusterATaskMadeForAnAgentThatLeftThroughAnotherBrokerCloses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		leaver  string // who leaves through b1 while bob's or alice's send is served by b2
		want    wire.State
		toldTo  string // the member that lives, and is told
		session string
	}{
		{name: "the assignee left", leaver: "alice", want: wire.StateFailed, toldTo: "bob", session: "s2"},
		{name: "the requester left", leaver: "bob", want: wire.StateCanceled, toldTo: "alice", session: "s1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// b2's copy of the registry lags: it hears of a change only
			// when it catches up, which a send to a live agent does not.
			c := newFakeCluster()
			b1, b2 := c.broker(t, "b1"), c.laggingBroker(t, "b2")
			alice := b1.register("s1", "alice")
			bob := b2.register("s2", "bob")
			seen(t, bob, "alice")
			seen(t, alice, "bob")
			leaver, stays := alice, bob
			if tc.leaver == "bob" {
				leaver, stays = bob, alice
			}
			require.NoError(t, leaver.on(b1).deregister())
			task, err := bob.on(b2).send("alice", "work")
			require.NoError(t, err, "b2 does not know yet that %s left", tc.leaver)

			got, err := stays.on(b1).get(task.ID)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got.Status.State, "the task of an agent that left")
			for {
				ev := stays.e.event(tc.session) // on the bus it registered through
				if ev.TaskEvent != nil && ev.TaskEvent.Final {
					assert.Equal(t, tc.want, ev.TaskEvent.Task.Status.State)
					assert.Equal(t, stays.id, ev.TaskEvent.Recipient)
					break
				}
			}
		})
	}
}

// heldWatch is one broker's view of a fakeCluster whose watch lags, as
// laggingWatch, with the test holding it: deliver tells the broker's
// copy of what is pending, as the watch coming round does.
func (c *fakeCluster) heldWatchBroker(t *testing.T, id string) (*env, *laggingWatch) {
	t.Helper()
	lag := &laggingWatch{fakeCluster: c}
	cfg := broker.Config{Store: c}
	cfg.Cluster = &broker.Cluster{Broker: id, Epoch: "cluster-epoch", Registry: lag, Events: c, Leases: c, LeaseEvery: 10 * time.Millisecond}
	return newEnvWrapped(t, cfg, fakebus.Config{}, func(b *fakebus.Bus) transport.Bus {
		c.mu.Lock()
		c.buses = append(c.buses, b)
		c.mu.Unlock()
		return b
	}), lag
}

// A token issued through another broker a moment ago, whose registration
// this broker's watch has told and its mirror begun (but not finished)
// to bring in when the request comes: the request's catch-up finds
// nothing left to bring in, and waits for the mirror's instead of
// refusing the token.
func TestClusterACatchUpWaitsForTheRegistrationsTheMirrorIsBringingIn(t *testing.T) {
	// The hooks are set before the brokers start, so that they are
	// unset only once the brokers have stopped.
	var held atomic.Value // the instance whose locking is held, once set
	held.Store("")
	taken := make(chan struct{}, 1)
	release := make(chan struct{})
	broker.OnLockingInstance(t, func(instance string) {
		if instance == held.Load().(string) {
			select {
			case taken <- struct{}{}:
			default:
			}
			<-release
		}
	})
	var once sync.Once
	catching := make(chan struct{})
	broker.OnCatchingUp(t, func() { once.Do(func() { close(catching) }) })

	c := newFakeCluster()
	b1 := c.broker(t, "b1")
	b2, watch := c.heldWatchBroker(t, "b2")
	alice := b1.register("s1", "alice")

	// b2's watch tells it of alice; its mirror takes her in, and is
	// held as it comes to lock her instance.
	held.Store(alice.instance)
	_, err := watch.Sync(context.Background())
	require.NoError(t, err)
	<-taken
	done := make(chan error, 1)
	go func() {
		_, err := alice.on(b2).tryCall(wire.MethodListAgents, nil)
		done <- err
	}()
	<-catching
	select {
	case err := <-done:
		close(release)
		t.Fatalf("the request was answered while the mirror was still bringing alice in: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	require.NoError(t, <-done, "alice's token on b2")
}

// A name passes from one agent to another through one broker, and the
// newcomer calls another broker, which has heard of neither change yet:
// its catch-up brings both in (the departure first, which the
// newcomer's copy waits for), and the token works.
func TestClusterATokenForANameJustPassedOnWorksOnAnotherBroker(t *testing.T) {
	c := newFakeCluster()
	b1 := c.broker(t, "b1")
	b2 := c.laggingBroker(t, "b2")
	// The newcomer's instance sorts before the leaver's.
	leaver := b1.registerInstance("s1", "alpha", "instance-z")
	seen(t, b2.register("s9", "watcher"), "alpha")
	require.NoError(t, leaver.deregister())
	newcomer := b1.registerInstance("s2", "alpha", "instance-a")
	require.Equal(t, "alpha", newcomer.id)

	_, err := newcomer.on(b2).tryCall(wire.MethodListAgents, nil)
	require.NoError(t, err, "the newcomer's token, on a broker that catches up")
}

// deleteHook is one broker's view of a fakeCluster that runs hook once,
// right before this broker deletes instance's registration.
type deleteHook struct {
	*fakeCluster
	instance string
	once     sync.Once
	hook     func()
}

func (d *deleteHook) DeleteRegistrationAt(ctx context.Context, instance string, rev uint64) error {
	if instance == d.instance {
		d.once.Do(d.hook)
	}
	return d.fakeCluster.DeleteRegistrationAt(ctx, instance, rev)
}

// A broker lets a lapsed broker's agent go: it closes her open tasks,
// then deletes her registration. Between the two, another broker, whose
// copy still has her live, makes her a task: the release closes it too,
// instead of leaving it open for ever with an assignee that is gone.
func TestClusterATaskMadeForAnAgentBeingLetGoIsClosed(t *testing.T) {
	c := newFakeCluster()
	keep := broker.Config{OrphanTimeout: time.Hour}
	b1 := c.brokerWith(t, "b1", keep)
	alice := b1.registerInstance("s1", "alice", "alice-instance")
	hooked := &deleteHook{fakeCluster: c, instance: alice.instance}
	b3 := c.brokerWith(t, "b3", keep)
	bob := b3.register("s2", "bob")
	seen(t, bob, "alice")
	var task *wire.Task
	var sendErr error
	made := make(chan struct{})
	hooked.hook = func() {
		defer close(made)
		task, sendErr = bob.trySend("alice", "work")
	}
	c.brokerOn(t, "b2", broker.Config{OrphanTimeout: 50 * time.Millisecond}, hooked, nil) // lets alice go
	require.NoError(t, b1.broker.Close())
	c.lapse("b1")
	select {
	case <-made:
	case <-time.After(10 * time.Second):
		t.Fatal("b2 never let alice go")
	}
	require.NoError(t, sendErr, "b3 still has alice live")
	require.Eventually(t, func() bool {
		_, err := c.Registration(context.Background(), alice.instance)
		return err != nil
	}, 10*time.Second, 5*time.Millisecond, "alice was never let go")
	require.Eventually(t, func() bool {
		got, err := bob.get(task.ID)
		return err == nil && got.Status.State == wire.StateFailed
	}, 10*time.Second, 5*time.Millisecond, "the task made for alice while she was let go stays open")
}

// While a broker cannot catch up with the cluster's registrations, an
// agent its copy does not show may have registered through another
// broker a moment ago: its token and its name are not refused as
// unknown (A2A_UNAUTHORIZED, A2A_UNKNOWN_AGENT, which a runtime takes
// for final), but answered as a failure of the cluster (-32603, try
// again). Once it catches up, they work.
func TestClusterABrokerThatCannotCatchUpDoesNotRefuseAgentsItDoesNotKnow(t *testing.T) {
	c := newFakeCluster()
	b1 := c.broker(t, "b1")
	lag := &laggingWatch{fakeCluster: c}
	var stalled atomic.Bool
	stalled.Store(true)
	reg := &switchedWatch{laggingWatch: lag, stalled: &stalled}
	b2 := c.brokerOn(t, "b2", broker.Config{}, reg, nil)
	bob := b2.register("s2", "bob")
	alice := b1.register("s1", "alice")

	_, err := alice.on(b2).tryCall(wire.MethodListAgents, nil)
	requireCode(t, err, wire.ErrInternal)
	_, err = bob.trySend("alice", "work")
	requireCode(t, err, wire.ErrInternal)

	stalled.Store(false)
	_, err = alice.on(b2).tryCall(wire.MethodListAgents, nil)
	require.NoError(t, err)
	_, err = bob.trySend("alice", "work")
	require.NoError(t, err)
	// A token no broker issued is refused as ever.
	_, err = b2.tryCall("s2", wire.MethodListAgents, map[string]any{"token": "0000"})
	requireCode(t, err, wire.ErrUnauthorized)
}

// switchedWatch is one broker's view of a fakeCluster whose watch lags
// (laggingWatch) and, while stalled, cannot catch up: Sync fails, as
// while the registrations' stream has no leader (a server of the
// cluster died, or is rejoining).
type switchedWatch struct {
	*laggingWatch
	stalled *atomic.Bool
}

func (s *switchedWatch) Sync(ctx context.Context) (map[string]bool, error) {
	if s.stalled.Load() {
		return nil, errors.New("the registrations' stream has no leader")
	}
	return s.laggingWatch.Sync(ctx)
}
