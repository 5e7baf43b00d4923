package broker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// restartable is a broker on a store that outlives it: run starts a
// broker on a new bus, as a restart of the broker process does.
type restartable struct {
	t   *testing.T
	st  store.Store
	cfg broker.Config
	cur *env
}

func newRestartable(t *testing.T, cfg broker.Config) *restartable {
	cfg.Store = store.NewMemory()
	return &restartable{t: t, st: cfg.Store, cfg: cfg}
}

// run stops the running broker, if any, and starts the next.
func (r *restartable) run() *env {
	if r.cur != nil {
		r.cur.bus.Close()
		r.cur.broker.Close()
	}
	r.cur = newEnvWrapped(r.t, r.cfg, fakebus.Config{}, func(b *fakebus.Bus) transport.Bus { return revokerBus{b} })
	return r.cur
}

// revokerBus is the fake bus with session credentials to revoke (none),
// so that the broker serves a2a.sessions.close.
type revokerBus struct{ *fakebus.Bus }

func (revokerBus) RevokeSession(context.Context, string) error { return nil }

// TestNamesSurviveARestart: two sessions' agents named planner, a task
// between them; after a restart a newcomer registers first and the two
// come back in the reverse order: each gets its old name, the newcomer
// the next, and the task's names still say who is who.
func TestNamesSurviveARestart(t *testing.T) {
	r := newRestartable(t, broker.Config{})
	e := r.run()
	one := e.registerInstance("chat-1", "planner", "inst-1")
	two := e.registerInstance("chat-2", "planner", "inst-2")
	require.Equal(t, "planner", one.id)
	require.Equal(t, "planner-2", two.id)
	task := one.mustSend("planner-2", "plan it")

	e = r.run()
	newcomer := e.registerInstance("chat-3", "planner", "inst-3")
	assert.Equal(t, "planner-3", newcomer.id, "held names are not given to a newcomer")
	two = e.registerInstance("chat-2", "planner", "inst-2")
	one = e.registerInstance("chat-1", "planner", "inst-1")
	assert.Equal(t, "planner-2", two.id)
	assert.Equal(t, "planner", one.id)
	got, err := one.get(task.ID)
	require.NoError(t, err)
	assert.Equal(t, "planner", got.RequesterName)
	assert.Equal(t, "planner-2", got.AgentName)

	// The address planner-2 still means chat-2's agent.
	sent := newcomer.mustSend("planner-2", "hello")
	assert.Equal(t, "chat-2", sent.AgentContextID)
}

// TestAHeldInstanceStaysWithItsSession: after a restart another session
// cannot register a held instance id, as for a live one; the orphan
// timeout lets it go, and then it can.
func TestAHeldInstanceStaysWithItsSession(t *testing.T) {
	r := newRestartable(t, broker.Config{OrphanTimeout: 200 * time.Millisecond})
	e := r.run()
	e.registerInstance("owner", "keeper", "inst-keeper")

	e = r.run()
	_, err := e.tryRegister("thief", "keeper", "inst-keeper")
	requireCode(t, err, wire.ErrInvalidParams)
	assert.Contains(t, err.Error(), "held for another session")
	other := e.registerInstance("thief", "keeper", "inst-other")
	assert.Equal(t, "keeper-2", other.id, "the name is held too")

	require.Eventually(t, func() bool {
		a, err := e.tryRegister("thief", "keeper", "inst-keeper")
		return err == nil && a.id == "keeper"
	}, 10*time.Second, 20*time.Millisecond, "the orphan timeout lets the name and the instance go")
	regs, err := r.st.Registrations(t.Context())
	require.NoError(t, err)
	require.Len(t, regs, 2)
	assert.Equal(t, "thief", regs[0].Session, "inst-keeper is thief's now")
}

// TestAHeldAgentComesBackWithItsTasks: the returning instance keeps its
// open tasks (the orphan sweep leaves them), and its token is new: the
// old one is not valid after a restart.
func TestAHeldAgentComesBackWithItsTasks(t *testing.T) {
	r := newRestartable(t, broker.Config{OrphanTimeout: 200 * time.Millisecond})
	swept := make(chan struct{}, 1)
	broker.OnSwept(t, func() { swept <- struct{}{} })
	e := r.run()
	a := e.registerInstance("chat-1", "asker", "inst-a")
	b := e.registerInstance("chat-2", "doer", "inst-b")
	task := a.mustSend("doer", "work")
	oldToken := b.token

	e = r.run()
	b = e.registerInstance("chat-2", "doer", "inst-b")
	a = e.registerInstance("chat-1", "asker", "inst-a")
	assert.NotEqual(t, oldToken, b.token)
	stale := &agent{e: e, session: "chat-2", token: oldToken}
	_, err := stale.get(task.ID)
	requireCode(t, err, wire.ErrUnauthorized)
	<-swept // the sweep ran, and closed nothing of theirs
	_, err = b.update(task.ID, wire.StateCompleted, "done")
	require.NoError(t, err)
	got, err := a.get(task.ID)
	require.NoError(t, err)
	assert.Equal(t, wire.StateCompleted, got.Status.State, "the requester, back too, reads the result")
}

// TestDeregisteringForgetsTheName: a deregistered agent's name is not
// held after a restart.
func TestDeregisteringForgetsTheName(t *testing.T) {
	r := newRestartable(t, broker.Config{})
	e := r.run()
	a := e.registerInstance("chat-1", "planner", "inst-1")
	require.NoError(t, a.tryDeregister())
	e = r.run()
	assert.Equal(t, "planner", e.registerInstance("chat-2", "planner", "inst-2").id)
	regs, err := r.st.Registrations(t.Context())
	require.NoError(t, err)
	require.Len(t, regs, 1)
	assert.Equal(t, "inst-2", regs[0].Instance)
}

// TestClosingASessionLetsItsHeldAgentsGo: a2a.sessions.close ends the
// holds of the session's agents that have not come back, and closes
// their tasks; keepAgents keeps them.
func TestClosingASessionLetsItsHeldAgentsGo(t *testing.T) {
	r := newRestartable(t, broker.Config{OrphanTimeout: broker.Forever})
	e := r.run()
	a := e.registerInstance("chat-1", "planner", "inst-1")
	e.registerInstance("chat-2", "helper", "inst-2")
	task := a.mustSend("helper", "help")

	e = r.run()
	res, err := e.bus.CallHost(t.Context(), wire.MethodSessionClose, map[string]any{"contextId": "chat-2", "keepAgents": true})
	require.NoError(t, err)
	assert.JSONEq(t, `{"deregistered":[]}`, string(res))
	assert.Equal(t, "helper-2", e.registerInstance("chat-3", "helper", "inst-3").id, "keepAgents keeps the hold")

	res, err = e.bus.CallHost(t.Context(), wire.MethodSessionClose, map[string]any{"contextId": "chat-2"})
	require.NoError(t, err)
	assert.JSONEq(t, `{"deregistered":["helper"]}`, string(res))
	assert.Equal(t, "helper", e.registerInstance("chat-3", "helper", "inst-4").id)
	a = e.registerInstance("chat-1", "planner", "inst-1")
	got, err := a.get(task.ID)
	require.NoError(t, err)
	assert.Equal(t, wire.StateFailed, got.Status.State, "the assignee is gone: its task is closed as at a deregistration")
}

// TestHeldAgentsCountAgainstTheHostsCap: restarts in a row cannot pile
// up held registrations past the host's cap; a returning agent is never
// refused for it.
func TestHeldAgentsCountAgainstTheHostsCap(t *testing.T) {
	r := newRestartable(t, broker.Config{MaxAgents: 2, OrphanTimeout: broker.Forever})
	e := r.run()
	e.registerInstance("chat-1", "a", "inst-a")
	e.registerInstance("chat-2", "b", "inst-b")
	e = r.run()
	_, err := e.tryRegister("chat-3", "c", "inst-c")
	requireCode(t, err, wire.ErrAgentLimit)
	assert.Contains(t, err.Error(), "held since a restart (2)")
	assert.Equal(t, "b", e.registerInstance("chat-2", "b", "inst-b").id, "a held agent comes back at the cap")
	e = r.run()
	_, err = e.tryRegister("chat-3", "c", "inst-c")
	requireCode(t, err, wire.ErrAgentLimit)
	regs, err := r.st.Registrations(t.Context())
	require.NoError(t, err)
	assert.Len(t, regs, 2)
}

// TestARegistrationIsStoredBeforeItIsAnswered: a store that cannot take
// the registration fails the register with -32603, and leaves the name
// free and the previous registration as it was.
func TestARegistrationIsStoredBeforeItIsAnswered(t *testing.T) {
	st := &failingRegistry{Store: store.NewMemory()}
	e := newEnv(t, broker.Config{Store: st})
	a := e.registerInstance("chat-1", "planner", "inst-1")
	st.fail(true)
	_, err := e.tryRegister("chat-2", "planner", "inst-2")
	requireCode(t, err, wire.ErrInternal)
	_, err = e.tryRegister("chat-1", "coder", "inst-1")
	requireCode(t, err, wire.ErrInternal)
	_, err = a.get("no-such-task")
	requireCode(t, err, wire.ErrUnknownTask) // the old token still works
	st.fail(false)
	b := e.registerInstance("chat-2", "planner", "inst-2")
	assert.Equal(t, "planner-2", b.id, "the failed one reserved nothing")
	require.NoError(t, b.tryDeregister())
	assert.Equal(t, "planner-2", e.registerInstance("chat-3", "planner", "inst-3").id)
}

type failingRegistry struct {
	store.Store
	mu     sync.Mutex
	failed bool
}

func (f *failingRegistry) fail(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failed = on
}

func (f *failingRegistry) PutRegistration(ctx context.Context, reg store.Registration) error {
	f.mu.Lock()
	failed := f.failed
	f.mu.Unlock()
	if failed {
		return errors.New("injected: the disk is full")
	}
	return f.Store.PutRegistration(ctx, reg)
}

// TestConcurrentRegistrationsGetUniqueNames: many instances registering
// one name at once while their registrations are being stored each get
// their own.
func TestConcurrentRegistrationsGetUniqueNames(t *testing.T) {
	e := newEnv(t, broker.Config{})
	const n = 64
	ids := make(chan string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			a, err := e.tryRegister(fmt.Sprintf("chat-%d", i%8), "planner", fmt.Sprintf("inst-%d", i))
			if assert.NoError(t, err) {
				ids <- a.id
			}
		})
	}
	wg.Wait()
	close(ids)
	seen := map[string]bool{}
	for id := range ids {
		assert.False(t, seen[id], "%s given twice", id)
		seen[id] = true
	}
	assert.Len(t, seen, n)
	assert.True(t, seen["planner"] && seen[fmt.Sprintf("planner-%d", n)], "the lowest free names: %v", seen)
}

// TestTheBrokersOwnIdentitiesCannotBeClaimed: a session cannot register
// an instance id the broker owns (the gateway's), whether or not the
// broker's agent is registered, nor get a credential for a hidden
// session; the hidden session registers it.
func TestTheBrokersOwnIdentitiesCannotBeClaimed(t *testing.T) {
	cfg := broker.Config{HiddenSessions: []string{"gw"}, OwnedInstances: []string{"gw-agent"}}
	e := newEnv(t, cfg)
	_, err := e.tryRegister("evil", "a2a-gateway", "gw-agent")
	requireCode(t, err, wire.ErrInvalidParams)
	assert.Contains(t, err.Error(), "the broker's own")
	e.registerInstance("gw", "a2a-gateway", "gw-agent")
	_, err = e.tryRegister("evil", "a2a-gateway", "gw-agent")
	requireCode(t, err, wire.ErrInvalidParams)

	opened := false
	b, err := broker.New(t.Context(), sessionOpener{e.bus2(t), &opened}, cfg)
	require.NoError(t, err)
	defer b.Close()
	host := transport.Caller{Scope: transport.ScopeHost}
	r := raw(t, b, host, `{"jsonrpc":"2.0","id":1,"method":"a2a.sessions.open","params":{"contextId":"gw"}}`)
	require.NotNil(t, r.Error)
	assert.Equal(t, -32602, r.Error.Code)
	assert.Contains(t, r.Error.Message, "the broker's own session")
	assert.False(t, opened, "no credential was made")
	r = raw(t, b, host, `{"jsonrpc":"2.0","id":1,"method":"a2a.sessions.open","params":{"contextId":"chat-1"}}`)
	require.Nil(t, r.Error)
	assert.True(t, opened)
}

// TestTheSessionsAndInstancesUnderTheBrokersOwnAreItsOwn: a session under
// a hidden one ("gw/…", a gateway client's) is hidden and gets no
// credential; an instance id under an owned one registers only in a
// hidden session; a name that merely starts the same is no one's.
func TestTheSessionsAndInstancesUnderTheBrokersOwnAreItsOwn(t *testing.T) {
	cfg := broker.Config{HiddenSessions: []string{"gw"}, OwnedInstances: []string{"gw-agent"}}
	e := newEnv(t, cfg)
	_, err := e.tryRegister("evil", "client", "gw-agent/c1")
	requireCode(t, err, wire.ErrInvalidParams)
	e.registerInstance("gw/c1", "client", "gw-agent/c1")
	e.registerInstance("gwx", "neighbour", "gw-agentx") // no prefix of an owned id, no sub-session

	opened := false
	b, err := broker.New(t.Context(), sessionOpener{e.bus2(t), &opened}, cfg)
	require.NoError(t, err)
	defer b.Close()
	host := transport.Caller{Scope: transport.ScopeHost}
	r := raw(t, b, host, `{"jsonrpc":"2.0","id":1,"method":"a2a.sessions.open","params":{"contextId":"gw/c1"}}`)
	require.NotNil(t, r.Error)
	assert.Contains(t, r.Error.Message, "the broker's own session")
	assert.False(t, opened, "no credential was made")
	r = raw(t, b, host, `{"jsonrpc":"2.0","id":1,"method":"a2a.sessions.open","params":{"contextId":"gwx"}}`)
	require.Nil(t, r.Error)
	assert.True(t, opened)
}

// TestHostMethodsOfTheEmbedder: Config.HostMethods are served to the host
// only, and one that clashes with a broker method is refused at New.
func TestHostMethodsOfTheEmbedder(t *testing.T) {
	e := newEnv(t, broker.Config{})
	cfg := broker.Config{HostMethods: map[string]transport.HostMethod{
		"x.ping": func(context.Context, json.RawMessage) (any, error) { return map[string]string{"pong": "yes"}, nil },
	}}
	b, err := broker.New(t.Context(), e.bus2(t), cfg)
	require.NoError(t, err)
	defer b.Close()
	r := raw(t, b, transport.Caller{Scope: transport.ScopeHost}, `{"jsonrpc":"2.0","id":1,"method":"x.ping"}`)
	require.Nil(t, r.Error)
	assert.JSONEq(t, `{"pong":"yes"}`, string(r.Result))
	r = raw(t, b, transport.Caller{Scope: transport.ScopeSession, Session: "chat-1"}, `{"jsonrpc":"2.0","id":1,"method":"x.ping"}`)
	require.NotNil(t, r.Error, "a session cannot call a host method")

	cfg.HostMethods = map[string]transport.HostMethod{wire.MethodSend: cfg.HostMethods["x.ping"]}
	_, err = broker.New(t.Context(), e.bus2(t), cfg)
	require.Error(t, err)
}

// sessionOpener is a fake bus that serves a2a.sessions.open.
type sessionOpener struct {
	transport.Bus
	opened *bool
}

func (s sessionOpener) HostMethods() map[string]transport.HostMethod {
	return map[string]transport.HostMethod{
		wire.MethodSessionOpen: func(context.Context, json.RawMessage) (any, error) {
			*s.opened = true
			return map[string]string{}, nil
		},
	}
}

// gatePut is a store whose registrations wait, once they have said so,
// until the test lets them go: as if for the disk.
type gatePut struct {
	store.Store
	entered chan struct{}
	release chan struct{}
}

func (s gatePut) PutRegistration(ctx context.Context, r store.Registration) error {
	s.entered <- struct{}{}
	<-s.release
	return s.Store.PutRegistration(ctx, r)
}

// apartInstances returns n instance ids whose locks are distinct, so
// that no registration of one waits for another's.
func apartInstances(n int) []string {
	var ids []string
	taken := map[uint64]bool{}
	for i := 0; len(ids) < n; i++ {
		id := fmt.Sprint("i", i)
		if s := broker.InstanceStripe(id); !taken[s] {
			taken[s] = true
			ids = append(ids, id)
		}
	}
	return ids
}

// TestTheCapsHoldWhileRegistrationsAreStored: registrations at once,
// each waiting for the disk, cannot pass a cap together: while those the
// cap allows wait, every other is refused.
func TestTheCapsHoldWhileRegistrationsAreStored(t *testing.T) {
	for name, cfg := range map[string]broker.Config{
		"session": {MaxAgentsPerSession: 2},
		"host":    {MaxAgents: 3},
	} {
		t.Run(name, func(t *testing.T) {
			const n = 50
			gp := gatePut{Store: store.NewMemory(), entered: make(chan struct{}, n), release: make(chan struct{})}
			cfg.Store = gp
			e := newEnv(t, cfg)
			var ok atomic.Int32
			refused := make(chan struct{}, n)
			var wg sync.WaitGroup
			for i, inst := range apartInstances(n) {
				wg.Go(func() {
					if _, err := e.tryRegister(fmt.Sprint("s", i%2), "x", inst); err == nil {
						ok.Add(1)
					} else {
						refused <- struct{}{}
					}
				})
			}
			// Each registration either waits for the disk or is refused
			// meanwhile.
			waiting := 0
			for range n {
				select {
				case <-gp.entered:
					waiting++
				case <-refused:
				}
			}
			close(gp.release)
			wg.Wait()
			want := 3
			if name == "session" {
				want = 4 // two sessions of two
			}
			assert.Equal(t, want, waiting, "registrations waiting for the disk at once")
			assert.Equal(t, int32(want), ok.Load())
		})
	}
}

// delStore is a store whose registration deletions can fail, or wait.
type delStore struct {
	store.Store
	mu      sync.Mutex
	fail    bool
	block   chan struct{} // non-nil: a deletion waits for it
	entered chan struct{}
	failed  atomic.Int32 // deletions failed
}

func (g *delStore) set(fail bool, block chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.fail, g.block = fail, block
	if block != nil {
		g.entered = make(chan struct{}, 1)
	}
}

func (g *delStore) DeleteRegistration(ctx context.Context, inst string) error {
	g.mu.Lock()
	fail, block, entered := g.fail, g.block, g.entered
	g.mu.Unlock()
	if block != nil {
		entered <- struct{}{}
		<-block
	}
	if fail {
		g.failed.Add(1)
		return errors.New("injected: the disk is full")
	}
	return g.Store.DeleteRegistration(ctx, inst)
}

// TestADepartedNameIsFreeOnlyOnceTheStoreForgotIt: while a
// deregistration's deletion is on its way to the disk, its name goes to
// no one (a crash then would leave the store with the name twice).
func TestADepartedNameIsFreeOnlyOnceTheStoreForgotIt(t *testing.T) {
	st := &delStore{Store: store.NewMemory()}
	e := newEnv(t, broker.Config{Store: st})
	a := e.registerInstance("chat-a", "planner", "inst-a")
	block := make(chan struct{})
	st.set(false, block)
	done := make(chan error, 1)
	go func() { done <- a.tryDeregister() }()
	<-st.entered
	b := e.registerInstance("chat-b", "planner", "inst-b")
	assert.Equal(t, "planner-2", b.id, "the name is not free while its deletion is pending")
	close(block)
	require.NoError(t, <-done)
	st.set(false, nil)
	assert.Equal(t, "planner", e.registerInstance("chat-c", "planner", "inst-c").id, "free once deleted")
}

// TestAFailedDeletionKeepsTheNameHeld: a deregistration the store cannot
// record answers -32603; the registry keeps the name held, as the store
// does, and the agent's tasks are closed all the same.
func TestAFailedDeletionKeepsTheNameHeld(t *testing.T) {
	st := &delStore{Store: store.NewMemory()}
	e := newEnv(t, broker.Config{Store: st})
	a := e.registerInstance("chat-a", "planner", "inst-a")
	peer := e.registerInstance("chat-p", "peer", "inst-p")
	task := peer.mustSend("planner", "work")
	st.set(true, nil)
	requireCode(t, a.tryDeregister(), wire.ErrInternal)
	st.set(false, nil)
	got, err := peer.get(task.ID)
	require.NoError(t, err)
	assert.Equal(t, wire.StateFailed, got.Status.State)
	assert.Equal(t, "planner-2", e.registerInstance("chat-b", "planner", "inst-b").id)
	_, err = e.tryRegister("chat-x", "planner", "inst-a")
	requireCode(t, err, wire.ErrInvalidParams)
	assert.Equal(t, "planner", e.registerInstance("chat-a", "planner", "inst-a").id, "its own agent gets it back")
}

// TestTheOrphanSweepTriesAgain: a hold the store could not let go at the
// orphan timeout is let go once it can.
func TestTheOrphanSweepTriesAgain(t *testing.T) {
	st := &delStore{Store: store.NewMemory()}
	r := &restartable{t: t, st: st, cfg: broker.Config{Store: st, OrphanTimeout: 50 * time.Millisecond}}
	e := r.run()
	e.registerInstance("chat-a", "planner", "inst-a")
	st.set(true, nil)
	e = r.run()
	require.Eventually(t, func() bool { return st.failed.Load() > 0 }, 10*time.Second, 10*time.Millisecond, "the sweep tried")
	_, err := e.tryRegister("chat-x", "x", "inst-a")
	requireCode(t, err, wire.ErrInvalidParams) // still held
	st.set(false, nil)
	require.Eventually(t, func() bool {
		a, err := e.tryRegister("chat-x", "planner", "inst-a")
		return err == nil && a.id == "planner"
	}, 10*time.Second, 50*time.Millisecond)
}

// TestHeldAgentsCountAgainstTheirSessionsCap: a session's newcomers
// cannot lock out its agents that are coming back.
func TestHeldAgentsCountAgainstTheirSessionsCap(t *testing.T) {
	r := newRestartable(t, broker.Config{MaxAgentsPerSession: 1, OrphanTimeout: broker.Forever})
	e := r.run()
	e.registerInstance("chat-1", "planner", "inst-1")
	e = r.run()
	_, err := e.tryRegister("chat-1", "other", "inst-2")
	requireCode(t, err, wire.ErrAgentLimit)
	assert.Contains(t, err.Error(), "held for it since a restart (1)")
	assert.Equal(t, "planner", e.registerInstance("chat-1", "planner", "inst-1").id)
}
