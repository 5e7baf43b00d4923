package broker_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

// gateStore pauses the first List that matches, until released.
type gateStore struct {
	*store.Memory
	match   func(store.Query) bool
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func newGateStore(match func(store.Query) bool) *gateStore {
	return &gateStore{Memory: store.NewMemory(), match: match, entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *gateStore) List(ctx context.Context, q store.Query) ([]*store.Record, bool, error) {
	if g.match(q) {
		g.once.Do(func() { close(g.entered); <-g.release })
	}
	return g.Memory.List(ctx, q)
}

// blocked reports whether c yields nothing within a moment, and puts
// back what it took (c must have room for it). It only shows that
// something waits: a slow machine can make a broken test pass, never a
// sound one fail.
func blocked[T any](c chan T) bool {
	select {
	case v := <-c:
		c <- v
		return false
	case <-time.After(100 * time.Millisecond):
		return true
	}
}

// TestDeregisterWaitsForOperationsInFlight: an operation that
// authenticated before a deregister finishes before the deregister does.
func TestDeregisterWaitsForOperationsInFlight(t *testing.T) {
	g := newGateStore(func(q store.Query) bool { return !q.OpenOnly })
	e := newEnv(t, broker.Config{Store: g})
	e.register("s1", "a")
	b := e.register("s2", "b")
	listed := make(chan error, 1)
	go func() { _, err := b.call(wire.MethodListTasks, nil); listed <- err }()
	<-g.entered
	dereg := make(chan error, 1)
	go func() { dereg <- b.deregister() }()
	assert.True(t, blocked(dereg), "deregister returned while an operation of the agent was running")
	close(g.release)
	require.NoError(t, <-listed)
	require.NoError(t, <-dereg)
}

// TestDeregisterSweepSparesANewRegistration: a new registration of the
// same instance cannot slip in while a deregister closes the tasks, so
// the tasks it creates are its own and stay open.
func TestDeregisterSweepSparesANewRegistration(t *testing.T) {
	g := newGateStore(func(q store.Query) bool { return q.OpenOnly && q.Instance == "inst-1" })
	e := newEnv(t, broker.Config{Store: g})
	old := e.registerInstance("s1", "w", "inst-1")
	e.register("s2", "peer")
	done := make(chan error, 1)
	go func() { done <- old.deregister() }()
	<-g.entered
	again := make(chan *agent, 1)
	go func() { again <- e.registerInstance("s1", "w", "inst-1") }()
	assert.True(t, blocked(again), "a registration of the instance slipped into its departure")
	close(g.release)
	require.NoError(t, <-done)
	a := <-again
	fresh := a.mustSend("peer", "new work")
	got, err := a.get(fresh.ID)
	require.NoError(t, err)
	assert.Equal(t, wire.StateSubmitted, got.Status.State)
}

// TestReRegisterKeepsItsAgentIdUnderContention: same instance, same name:
// the same agentId, even while others register that name.
func TestReRegisterKeepsItsAgentIdUnderContention(t *testing.T) {
	// 150 agents of s2 stay live: lift the per-session cap.
	e := newEnv(t, broker.Config{MaxAgentsPerSession: 1000})
	for round := range 50 {
		inst := fmt.Sprint("inst-", round)
		name := fmt.Sprint("w", round)
		first := e.registerInstance("s1", name, inst)
		var wg sync.WaitGroup
		var again *agent
		wg.Go(func() { again = e.registerInstance("s1", name, inst) })
		for range 3 {
			wg.Go(func() { e.register("s2", name) })
		}
		wg.Wait()
		require.Equal(t, first.id, again.id, "round %d", round)
	}
}

// pauseBus holds the first push until released.
type pauseBus struct {
	*fakebus.Bus
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (p *pauseBus) Publish(session string, msg []byte) error {
	if h, _ := wire.DecodeNotificationHead(msg); h.Method == wire.NotifyPush {
		p.once.Do(func() { close(p.entered); <-p.release })
	}
	return p.Bus.Publish(session, msg)
}

// TestDeregisterWaitsForAPushInFlight: once deregister has answered, no
// push from the agent is still on its way.
func TestDeregisterWaitsForAPushInFlight(t *testing.T) {
	fb := fakebus.New(fakebus.Config{})
	pb := &pauseBus{Bus: fb, entered: make(chan struct{}), release: make(chan struct{})}
	b, err := broker.New(context.Background(), pb, broker.Config{Logger: quietLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { fb.Close(); b.Close() })
	e := &env{t: t, bus: fb, broker: b, sessions: map[string]*session{}, codes: map[int]int{}}
	a := e.register("s1", "a")
	e.register("s2", "b")
	pushed := make(chan error, 1)
	go func() {
		_, err := a.call(wire.MethodSend, map[string]any{"to": "b", "oneway": true, "message": text("hi")})
		pushed <- err
	}()
	<-pb.entered
	dereg := make(chan error, 1)
	go func() { dereg <- a.deregister() }()
	assert.True(t, blocked(dereg), "deregister answered while the agent's push was unpublished")
	close(pb.release)
	require.NoError(t, <-pushed)
	require.NoError(t, <-dereg)
}

// jitterBus delays each Publish a little, so that unordered publishing
// would show.
type jitterBus struct{ *fakebus.Bus }

func (j jitterBus) Publish(s string, m []byte) error {
	time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
	return j.Bus.Publish(s, m)
}

// TestEventsFollowTheOrderOfChanges: with concurrent changes to one task
// and concurrent pushes to one session, a session's notifications are
// published in seq order and a task's events in the order of its history.
func TestEventsFollowTheOrderOfChanges(t *testing.T) {
	fb := fakebus.New(fakebus.Config{})
	b, err := broker.New(context.Background(), jitterBus{fb}, broker.Config{Logger: quietLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { fb.Close(); b.Close() })
	e := &env{t: t, bus: fb, broker: b, sessions: map[string]*session{}, codes: map[int]int{}}
	a := e.register("s1", "a")
	e.register("s2", "b")
	task := a.mustSend("b", "0")
	var wg sync.WaitGroup
	var failures atomic.Int32
	for i := 1; i <= 100; i++ {
		wg.Go(func() {
			if _, err := a.reply(task.ID, fmt.Sprint(i)); err != nil {
				failures.Add(1)
			}
			if _, err := a.call(wire.MethodSend, map[string]any{"to": "b", "oneway": true, "message": text("push")}); err != nil {
				failures.Add(1)
			}
		})
	}
	wg.Wait()
	require.Zero(t, failures.Load())
	final, err := a.get(task.ID)
	require.NoError(t, err)
	var last uint64
	var got []string
	for range 201 {
		ev := e.event("s2")
		require.Greater(t, ev.Head().Seq, last, "published in seq order")
		last = ev.Head().Seq
		if ev.TaskEvent != nil {
			got = append(got, *ev.TaskEvent.Message.Parts[0].Text)
		}
	}
	var want []string
	for _, m := range final.History {
		want = append(want, *m.Parts[0].Text)
	}
	assert.Equal(t, want, got, "events follow the order of the changes")
}

// TestNullContextIdIsAShapeError: a null contextId claims no session.
func TestNullContextIdIsAShapeError(t *testing.T) {
	e := newEnv(t, broker.Config{})
	for _, ctxID := range []any{nil, ""} {
		_, err := e.call("s1", wire.MethodRegister, map[string]any{"contextId": ctxID, "card": map[string]any{"name": "x"}})
		requireCode(t, err, wire.ErrInvalidParams)
		_, err = e.call("s1", wire.MethodReplay, map[string]any{"contextId": ctxID, "epoch": "", "afterSeq": 0})
		requireCode(t, err, wire.ErrInvalidParams)
	}
}

var _ transport.Bus = jitterBus{}

// failingStore fails every Update once armed.
type failingStore struct {
	*store.Memory
	armed atomic.Bool
}

func (f *failingStore) Update(ctx context.Context, id string, fn func(*store.Record) error) (*store.Record, error) {
	if f.armed.Load() {
		return nil, errors.New("disk full")
	}
	return f.Memory.Update(ctx, id, fn)
}

// TestDeregisterSaysWhenClosingItsTasksFailed: the agent is revoked, and
// the answer does not claim that closings were stored when they were not.
func TestDeregisterSaysWhenClosingItsTasksFailed(t *testing.T) {
	st := &failingStore{Memory: store.NewMemory()}
	e := newEnv(t, broker.Config{Store: st})
	a := e.register("s1", "a")
	e.register("s2", "b")
	task := a.mustSend("b", "x")
	st.armed.Store(true)
	requireCode(t, a.deregister(), wire.ErrInternal)
	_, err := a.get(task.ID)
	requireCode(t, err, wire.ErrUnauthorized)
}

func TestTheHostHasABoundOnLiveAgents(t *testing.T) {
	e := newEnv(t, broker.Config{MaxAgents: 3})
	for i := range 3 {
		e.registerInstance(fmt.Sprint("s", i), "a", fmt.Sprint("inst-", i))
	}
	_, err := e.call("s9", wire.MethodRegister, wire.RegisterParams{ContextID: "s9", Card: &wire.AgentCard{Name: "one-too-many"}})
	requireCode(t, err, wire.ErrAgentLimit)
	assert.ErrorContains(t, err, "the host already has 3 live agents")
	// Replacing a live registration is not a new agent: it still works.
	again := e.registerInstance("s0", "a", "inst-0")
	assert.Equal(t, "a", again.id)
}
