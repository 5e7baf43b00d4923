package broker_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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

// fakeCluster is the shared state of brokers in one process, as a
// cluster's JetStream gives it: one store, names claimed in one map,
// registrations watched, and each session's notifications numbered in
// one log and published on every broker's bus (a cluster's subjects
// reach every server).
type fakeCluster struct {
	store.Store // shared; registrations are watched

	mu       sync.Mutex
	names    map[string]string // agentId -> instance
	watchers map[int]func(string)
	nextW    int
	logs     map[string]*fakeLog
	buses    []*fakebus.Bus
	syncs    atomic.Int64
	syncHold func()               // holds the first Sync
	renewed  map[string]time.Time // broker -> last renewal
	stopped  map[string]bool      // brokers whose renewals are ignored

	// The registrations' revisions, numbered as a stream numbers its
	// messages: regMu makes each compare-and-set one step.
	regMu  sync.Mutex
	regSeq uint64
	revs   map[string]uint64 // instance -> its registration's revision

	homes map[string]string // session -> the broker of its host
}

// leaseTerm is how long a fake lease holds after its renewal.
const leaseTerm = 100 * time.Millisecond

func (c *fakeCluster) Renew(_ context.Context, broker string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.stopped[broker] {
		c.renewed[broker] = time.Now()
	}
	return nil
}

func (c *fakeCluster) Live(context.Context) (map[string]bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	live := map[string]bool{}
	for b, at := range c.renewed {
		if time.Since(at) < leaseTerm {
			live[b] = true
		}
	}
	return live, nil
}

// lapse makes broker's lease lapse, as if it had died.
func (c *fakeCluster) lapse(broker string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped[broker] = true
	delete(c.renewed, broker)
}

type fakeLog struct {
	seq  uint64
	kept []json.RawMessage // from oldest
}

func newFakeCluster() *fakeCluster {
	return &fakeCluster{Store: store.NewMemory(), names: map[string]string{}, watchers: map[int]func(string){}, logs: map[string]*fakeLog{},
		renewed: map[string]time.Time{}, stopped: map[string]bool{}, revs: map[string]uint64{}, homes: map[string]string{}}
}

func (c *fakeCluster) notify(instance string) {
	c.mu.Lock()
	ws := make([]func(string), 0, len(c.watchers))
	for _, w := range c.watchers {
		ws = append(ws, w)
	}
	c.mu.Unlock()
	for _, w := range ws {
		w(instance)
	}
}

func (c *fakeCluster) PutRegistration(ctx context.Context, reg store.Registration) error {
	c.regMu.Lock()
	rev := c.revs[reg.Instance]
	c.regMu.Unlock()
	return c.PutRegistrationAt(ctx, reg, rev)
}

func (c *fakeCluster) DeleteRegistration(ctx context.Context, instance string) error {
	c.regMu.Lock()
	rev := c.revs[instance]
	c.regMu.Unlock()
	if rev == 0 {
		return nil
	}
	return c.DeleteRegistrationAt(ctx, instance, rev)
}

func (c *fakeCluster) RegistrationRev(ctx context.Context, instance string) (*store.Registration, uint64, error) {
	c.regMu.Lock()
	defer c.regMu.Unlock()
	reg, err := c.Registration(ctx, instance)
	if err != nil {
		return nil, 0, err
	}
	return reg, c.revs[instance], nil
}

func (c *fakeCluster) PutRegistrationAt(ctx context.Context, reg store.Registration, rev uint64) error {
	c.regMu.Lock()
	if c.revs[reg.Instance] != rev {
		c.regMu.Unlock()
		return store.ErrChanged
	}
	if err := c.Store.PutRegistration(ctx, reg); err != nil {
		c.regMu.Unlock()
		return err
	}
	c.regSeq++
	c.revs[reg.Instance] = c.regSeq
	c.regMu.Unlock()
	c.notify(reg.Instance)
	return nil
}

func (c *fakeCluster) DeleteRegistrationAt(ctx context.Context, instance string, rev uint64) error {
	c.regMu.Lock()
	if c.revs[instance] != rev {
		c.regMu.Unlock()
		return store.ErrChanged
	}
	if err := c.Store.DeleteRegistration(ctx, instance); err != nil {
		c.regMu.Unlock()
		return err
	}
	delete(c.revs, instance)
	c.regMu.Unlock()
	c.notify(instance)
	return nil
}

func (c *fakeCluster) ClaimName(_ context.Context, id, instance string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if holder, ok := c.names[id]; ok && holder != instance {
		return store.ErrNameTaken
	}
	c.names[id] = instance
	return nil
}

func (c *fakeCluster) ReleaseName(_ context.Context, id, instance string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.names[id] == instance {
		delete(c.names, id)
	}
	return nil
}

func (c *fakeCluster) Registration(ctx context.Context, instance string) (*store.Registration, error) {
	regs, err := c.Store.Registrations(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range regs {
		if r.Instance == instance {
			return &r, nil
		}
	}
	return nil, store.ErrNotFound
}

func (c *fakeCluster) WatchRegistrations(ctx context.Context, fn func(string)) (func(), error) {
	regs, err := c.Store.Registrations(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range regs {
		fn(r.Instance)
	}
	c.mu.Lock()
	id := c.nextW
	c.nextW++
	c.watchers[id] = fn
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		delete(c.watchers, id)
		c.mu.Unlock()
	}, nil
}

// Sync has nothing to wait for: the fake's watch is called before a
// change returns (laggingBroker's watch has). It counts its calls;
// syncHold holds the first.
func (c *fakeCluster) Sync(ctx context.Context) (map[string]bool, error) {
	if c.syncs.Add(1) == 1 && c.syncHold != nil {
		c.syncHold()
	}
	return c.stored(ctx)
}

// stored is the instances whose registrations are stored.
func (c *fakeCluster) stored(ctx context.Context) (map[string]bool, error) {
	regs, err := c.Store.Registrations(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, r := range regs {
		out[r.Instance] = true
	}
	return out, nil
}

func (c *fakeCluster) Append(_ context.Context, session string, build func(uint64) ([]byte, error)) (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.logs[session]
	if l == nil {
		l = &fakeLog{}
		c.logs[session] = l
	}
	msg, err := build(l.seq + 1)
	if err != nil {
		return 0, err
	}
	l.seq++
	l.kept = append(l.kept, msg)
	for _, b := range c.buses {
		_ = b.Publish(session, msg)
	}
	return l.seq, nil
}

func (c *fakeCluster) Since(_ context.Context, session string, after uint64, _ int) ([]json.RawMessage, uint64, uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.logs[session]
	if l == nil {
		return nil, 1, 0, nil
	}
	oldest := l.seq - uint64(len(l.kept)) + 1
	var out []json.RawMessage
	for i, m := range l.kept {
		if oldest+uint64(i) > after {
			out = append(out, m)
		}
	}
	return out, oldest, l.seq, nil
}

func (c *fakeCluster) Forget(_ context.Context, session string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.logs[session]; l != nil {
		l.kept = nil
	}
	return nil
}

// broker starts one broker of the cluster.
func (c *fakeCluster) broker(t *testing.T, id string) *env {
	t.Helper()
	return c.brokerWith(t, id, broker.Config{})
}

func (c *fakeCluster) brokerWith(t *testing.T, id string, cfg broker.Config) *env {
	t.Helper()
	return c.start(t, id, cfg, c, nil)
}

// brokerOn starts a broker of c that reaches the cluster's registry
// through reg (a view of c that a test steers) and its store through st
// (c when nil).
func (c *fakeCluster) brokerOn(t *testing.T, id string, cfg broker.Config, reg broker.SharedRegistry, st store.Store) *env {
	t.Helper()
	return c.start(t, id, cfg, reg, st)
}

// start starts a broker of c: it reaches the cluster's registry through
// reg and its store through st (c when nil).
func (c *fakeCluster) start(t *testing.T, id string, cfg broker.Config, reg broker.SharedRegistry, st store.Store) *env {
	t.Helper()
	cfg.Store = st
	if st == nil {
		cfg.Store = c
	}
	every := 10 * time.Millisecond
	if cfg.Cluster != nil && cfg.Cluster.LeaseEvery > 0 {
		every = cfg.Cluster.LeaseEvery // the test's
	}
	cfg.Cluster = &broker.Cluster{Broker: id, Epoch: "cluster-epoch", Registry: reg, Events: c, Leases: c, LeaseEvery: every}
	return newEnvWrapped(t, cfg, fakebus.Config{}, func(b *fakebus.Bus) transport.Bus {
		c.mu.Lock()
		c.buses = append(c.buses, b)
		c.mu.Unlock()
		return homedBus{b, c}
	})
}

// homedBus is a fake bus of c whose sessions' requests name their host's
// broker, as a cluster's client does in its A2A-Broker header.
type homedBus struct {
	*fakebus.Bus
	c *fakeCluster
}

func (h homedBus) Serve(next transport.Handler) error {
	return h.Bus.Serve(transport.HandlerFunc(func(ctx context.Context, from transport.Caller, req []byte) []byte {
		from.HomeBroker = h.c.homeOf(from.Session)
		return next.ServeRPC(ctx, from, req)
	}))
}

// livesWith says that session's host is broker's: its requests name
// broker, whichever broker they go to.
func (c *fakeCluster) livesWith(session, broker string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.homes[session] = broker
}

func (c *fakeCluster) homeOf(session string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.homes[session]
}

// nameHolder is the instance that holds agentID in the cluster ("" for
// none).
func (c *fakeCluster) nameHolder(agentID string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.names[agentID]
}

func tokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// on returns a as its runtime would be if its requests went to e's
// broker (another broker of the cluster).
func (a *agent) on(e *env) *agent {
	c := *a
	c.e = e
	return &c
}

// seen waits until self, on its broker, lists an agent with this id (the
// other brokers' registrations reach a broker's copy a moment later).
func seen(t *testing.T, self *agent, id string) wire.AgentCard {
	t.Helper()
	var card wire.AgentCard
	require.Eventually(t, func() bool {
		for _, c := range self.list() {
			if c.AgentID == id {
				card = c
				return true
			}
		}
		return false
	}, 10*time.Second, time.Millisecond, "%s never saw %s", self.id, id)
	return card
}

func TestClusterNamesAreUniqueAcrossBrokers(t *testing.T) {
	c := newFakeCluster()
	b1, b2 := c.broker(t, "b1"), c.broker(t, "b2")
	first := b1.register("s1", "discussant")
	second := b2.register("s2", "discussant")
	assert.Equal(t, "discussant", first.id)
	assert.Equal(t, "discussant-2", second.id)
	// Each broker lists the other's agent with its session.
	assert.Equal(t, "s2", seen(t, first, "discussant-2").ContextID)
	assert.Equal(t, "s1", seen(t, second, "discussant").ContextID)
	// A third, on the first broker once it has seen the second.
	third := b1.register("s3", "discussant")
	assert.Equal(t, "discussant-3", third.id)
}

func TestClusterANameTakenElsewhereIsSkippedBeforeItIsSeen(t *testing.T) {
	c := newFakeCluster()
	b1 := c.broker(t, "b1")
	// Another broker's claim that has not reached this broker's copy.
	require.NoError(t, c.ClaimName(context.Background(), "scribe", "elsewhere"))
	a := b1.register("s1", "scribe")
	assert.Equal(t, "scribe-2", a.id)
}

func TestClusterAnyBrokerServesAnAgent(t *testing.T) {
	c := newFakeCluster()
	b1, b2 := c.broker(t, "b1"), c.broker(t, "b2")
	alice := b1.register("s1", "alice")
	bob := b2.register("s2", "bob")
	seen(t, alice, "bob")
	seen(t, bob, "alice")

	// alice's send goes to b2, which never saw her register: without to,
	// the single other-session peer.
	task, err := alice.on(b2).send("", "hello")
	require.NoError(t, err)
	assert.Equal(t, "bob", task.AgentName)
	assert.Equal(t, "s2", task.AgentContextID)

	// The event reaches only bob's session, numbered by the cluster.
	ev := b2.event("s2")
	assert.Equal(t, "s2", ev.Head().RecipientContextID)
	assert.Equal(t, uint64(1), ev.Head().Seq)
	assert.Equal(t, "cluster-epoch", ev.Head().Epoch)
	b1.noEvent("s1")

	// bob works it through b1; alice hears of it in her session.
	_, err = bob.on(b1).update(task.ID, wire.StateCompleted, "done")
	require.NoError(t, err)
	got, err := alice.get(task.ID)
	require.NoError(t, err)
	assert.Equal(t, wire.StateCompleted, got.Status.State)
	ev = b1.event("s1")
	assert.Equal(t, "s1", ev.Head().RecipientContextID)
	assert.Equal(t, uint64(1), ev.Head().Seq)

	// A stranger on either broker is not a member.
	carol := b1.register("s3", "carol")
	_, err = carol.on(b2).get(task.ID)
	requireCode(t, err, wire.ErrUnknownAgent)
}

func TestClusterADeregistrationReachesEveryBroker(t *testing.T) {
	c := newFakeCluster()
	b1, b2 := c.broker(t, "b1"), c.broker(t, "b2")
	alice := b1.register("s1", "alice")
	bob := b2.register("s2", "bob")
	seen(t, bob, "alice")
	task := bob.mustSend("alice", "hi")

	// alice leaves through the other broker: her token stops working on
	// both, her task fails, and bob hears of it.
	require.NoError(t, alice.on(b2).deregister())
	require.Eventually(t, func() bool {
		_, err := alice.tryCall(wire.MethodListAgents, nil)
		return err != nil
	}, 10*time.Second, time.Millisecond, "alice's token still works on her own broker")
	requireCode(t, alice.tryDeregister(), wire.ErrUnauthorized)
	got, err := bob.get(task.ID)
	require.NoError(t, err)
	assert.Equal(t, wire.StateFailed, got.Status.State)
	require.Eventually(t, func() bool {
		return !slices.ContainsFunc(bob.on(b1).list(), func(c wire.AgentCard) bool { return c.AgentID == "alice" })
	}, 10*time.Second, time.Millisecond)
	// Her name is free in the cluster.
	again := b1.register("s9", "alice")
	assert.Equal(t, "alice", again.id)
}

func TestClusterReplayThroughAnotherBroker(t *testing.T) {
	c := newFakeCluster()
	b1, b2 := c.broker(t, "b1"), c.broker(t, "b2")
	alice := b1.register("s1", "alice")
	bob := b2.register("s2", "bob")
	seen(t, alice, "bob")
	alice.mustSend("bob", "one")
	alice.mustSend("bob", "two")
	for _, b := range []*env{b1, b2} {
		res, err := bob.on(b).call(wire.MethodReplay, map[string]any{"contextId": "s2", "epoch": "cluster-epoch", "afterSeq": 1})
		require.NoError(t, err)
		var r wire.ReplayResult
		require.NoError(t, json.Unmarshal(res, &r))
		assert.Equal(t, uint64(2), r.LastSeq)
		require.Len(t, r.Events, 1)
		ev, err := wire.DecodeEvent(r.Events[0])
		require.NoError(t, err)
		assert.Equal(t, uint64(2), ev.Head().Seq)
	}
}

func TestClusterConfigNeedsItsParts(t *testing.T) {
	_, err := broker.New(context.Background(), fakebus.New(fakebus.Config{}), broker.Config{Cluster: &broker.Cluster{Broker: "b1"}})
	require.ErrorIs(t, err, broker.ErrInvalidConfig)
}

func TestClusterTheAgentsOfALapsedBrokerAreLetGoAfterTheOrphanTimeout(t *testing.T) {
	c := newFakeCluster()
	cfg := broker.Config{OrphanTimeout: 300 * time.Millisecond}
	b1, b2 := c.brokerWith(t, "b1", cfg), c.brokerWith(t, "b2", cfg)
	alice := b1.register("s1", "alice")
	bob := b2.register("s2", "bob")
	seen(t, bob, "alice")
	task := bob.mustSend("alice", "work")

	// b1 and its host die: nothing renews b1's lease.
	require.NoError(t, b1.broker.Close())
	c.lapse("b1")

	// b2 lets alice go: her task fails, bob hears of it, her name is free.
	require.Eventually(t, func() bool {
		got, err := bob.get(task.ID)
		return err == nil && got.Status.State == wire.StateFailed
	}, 10*time.Second, 5*time.Millisecond, "the lapsed broker's agent's task never failed")
	assert.NotContains(t, ids(bob.list()), "alice")
	_, err := c.Registration(context.Background(), alice.instance)
	require.ErrorIs(t, err, store.ErrNotFound)
	requireCode(t, alice.on(b2).tryDeregister(), wire.ErrUnauthorized)
	assert.Equal(t, "alice", b2.register("s3", "alice").id)
}

func TestClusterAnAgentThatCallsAnotherBrokerIsTakenOver(t *testing.T) {
	c := newFakeCluster()
	cfg := broker.Config{OrphanTimeout: 300 * time.Millisecond}
	b1, b2 := c.brokerWith(t, "b1", cfg), c.brokerWith(t, "b2", cfg)
	alice := b1.register("s1", "alice")
	carol := b1.register("s4", "carol")
	bob := b2.register("s2", "bob")
	seen(t, bob, "alice")
	seen(t, bob, "carol")

	// Only b1 dies; alice's host lives, and its requests now go to b2.
	require.NoError(t, b1.broker.Close())
	c.lapse("b1")
	require.Eventually(t, func() bool {
		reg, err := c.Registration(context.Background(), alice.instance)
		require.NoError(t, err)
		if reg.Broker == "b2" {
			return true
		}
		alice.on(b2).list() // a call: b2 takes her over once it sees b1 lapsed
		return false
	}, 10*time.Second, 5*time.Millisecond, "alice was never taken over")

	task := bob.mustSend("alice", "work")
	// carol, who made no call, is let go after the orphan timeout: by then
	// alice would have been too, had she not been taken over.
	require.Eventually(t, func() bool {
		_, err := c.Registration(context.Background(), carol.instance)
		return errors.Is(err, store.ErrNotFound)
	}, 10*time.Second, 5*time.Millisecond, "carol was never let go")
	_, err := alice.on(b2).update(task.ID, wire.StateCompleted, "done")
	require.NoError(t, err)
	assert.Contains(t, ids(bob.list()), "alice")
}

// A broker's first look at the leases may come before another broker
// has started: an agent of that one calling this broker is not taken
// over on the strength of that look (it would then belong to a broker
// that is not its own, and be let go when that one dies), only once
// looks have found its broker lapsed.
func TestClusterAnAgentOfABrokerStartedAfterTheLastLookIsNotTakenOver(t *testing.T) {
	c := newFakeCluster()
	// b1 looks at the leases at its start, and not again for the test.
	b1 := c.brokerWith(t, "b1", broker.Config{Cluster: &broker.Cluster{LeaseEvery: time.Hour}})
	b2 := c.broker(t, "b2")
	alice := b2.register("s1", "alice")
	alice.on(b1).list()                   // a call through b1, which has never seen b2's lease
	require.NoError(t, b1.broker.Close()) // a take-over under way is done
	reg, err := c.Registration(context.Background(), alice.instance)
	require.NoError(t, err)
	assert.Equal(t, "b2", reg.Broker, "alice was taken over from a live broker")
}

// An agent belongs to its host's broker, whichever broker serves it: a
// host that dies with its broker has its agents let go though another
// broker registered them, and a host that lives keeps its agents though
// the broker that registered them died.
func TestClusterAnAgentBelongsToItsHostsBroker(t *testing.T) {
	c := newFakeCluster()
	cfg := broker.Config{OrphanTimeout: 300 * time.Millisecond}
	b1, b2 := c.brokerWith(t, "b1", cfg), c.brokerWith(t, "b2", cfg)
	c.livesWith("s1", "b1")
	c.livesWith("s2", "b2")
	// Each host's registration lands on the other host's broker.
	doomed := b2.register("s1", "doomed")
	kept := b1.register("s2", "kept")
	for _, a := range []*agent{doomed, kept} {
		reg, err := c.Registration(context.Background(), a.instance)
		require.NoError(t, err)
		assert.Equal(t, map[*agent]string{doomed: "b1", kept: "b2"}[a], reg.Broker, "the broker %s belongs to", a.id)
	}
	seen(t, kept.on(b2), "doomed")
	task := kept.on(b2).mustSend("doomed", "work")

	// b1 dies with its host, s1's; kept was registered through b1.
	require.NoError(t, b1.broker.Close())
	c.lapse("b1")

	// b2 lets doomed go: her task fails, and her name is free; kept
	// stays, though she made no call since.
	require.Eventually(t, func() bool {
		_, err := c.Registration(context.Background(), doomed.instance)
		return errors.Is(err, store.ErrNotFound)
	}, 10*time.Second, 5*time.Millisecond, "the dead host's agent was never let go")
	got, err := kept.on(b2).get(task.ID)
	require.NoError(t, err)
	assert.Equal(t, wire.StateFailed, got.Status.State)
	reg, err := c.Registration(context.Background(), kept.instance)
	require.NoError(t, err, "the agent of the host that lives was let go")
	assert.Equal(t, "b2", reg.Broker)
	assert.Equal(t, "doomed", b2.register("s3", "doomed").id)
}

// A host that names a broker whose lease is not live (a typo, or its
// broker away) has its agents belong to the broker that serves it; once
// its broker is live, the agent's next call takes it home.
func TestClusterAnAgentGoesHomeWhenItsHostsBrokerIsBack(t *testing.T) {
	c := newFakeCluster()
	b2 := c.broker(t, "b2")
	c.livesWith("s1", "b3")
	alice := b2.register("s1", "alice")
	owner := func() string {
		reg, err := c.Registration(context.Background(), alice.instance)
		require.NoError(t, err)
		return reg.Broker
	}
	assert.Equal(t, "b2", owner(), "registered while b3 was not live")

	c.broker(t, "b3")
	require.Eventually(t, func() bool {
		alice.list() // a call names b3; b2 moves her once it sees b3 live
		return owner() == "b3"
	}, 10*time.Second, 5*time.Millisecond, "alice never went home to b3")
}

// A flood of unknown tokens costs the cluster a catch-up per round trip,
// not one per request: requests that came while one ran share the next.
func TestClusterAFloodOfUnknownTokensSharesCatchUps(t *testing.T) {
	c := newFakeCluster()
	const n = 64
	var waiting atomic.Int64
	all := make(chan struct{})
	broker.OnCatchingUp(t, func() {
		if waiting.Add(1) == n {
			close(all)
		}
	})
	// The first catch-up lasts until every request waits for one.
	c.syncHold = func() {
		select {
		case <-all:
		case <-time.After(10 * time.Second): // the count below then fails
		}
	}
	b1 := c.broker(t, "b1")
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, err := b1.tryCall("s1", wire.MethodDeregister, map[string]any{"token": fmt.Sprintf("guess-%d", i)})
			assert.ErrorIs(t, err, wire.ErrUnauthorized)
		})
	}
	wg.Wait()
	require.EqualValues(t, n, waiting.Load())
	// The first, and the one the others shared.
	assert.EqualValues(t, 2, c.syncs.Load(), "catch-ups for %d requests", n)
}

// An instance registered on one broker a moment ago is live in its
// session for every broker: it cannot be registered in another session
// through another broker before that broker's copy has seen it.
func TestClusterAnInstanceNeverMovesToAnotherSessionThroughAnotherBroker(t *testing.T) {
	c := newFakeCluster()
	b1, b2 := c.broker(t, "b1"), c.laggingBroker(t, "b2")
	b1.registerInstance("s1", "alice", "alice-instance")
	_, err := b2.tryRegister("s2", "mallory", "alice-instance")
	requireCode(t, err, wire.ErrInvalidParams)
	reg, err := c.Registration(context.Background(), "alice-instance")
	require.NoError(t, err)
	assert.Equal(t, "s1", reg.Session)
}

// A caller whose own registration was replaced through another broker,
// unseen here, lists the agents: the catch-up revokes its copy before the
// caller is held, so the list answers (the token is no longer good)
// instead of waiting for ever on the caller's own hold.
func TestClusterAListByAnAgentReplacedElsewhereAnswers(t *testing.T) {
	c := newFakeCluster()
	b1 := c.laggingBroker(t, "b1")
	b2 := c.broker(t, "b2")
	old := b1.registerInstance("s1", "alice", "alice-instance")
	b2.registerInstance("s1", "alice", "alice-instance") // a new token; b1 not told
	for _, params := range []map[string]any{nil, {"agentId": "nobody"}} {
		_, err := old.tryCall(wire.MethodListAgents, params)
		requireCode(t, err, wire.ErrUnauthorized)
	}
}
