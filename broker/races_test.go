package broker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
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

// gateStore pauses the first List that matches, until released, and
// calls listed, if set, once that List has returned from the store.
type gateStore struct {
	*store.Memory
	match   func(store.Query) bool
	once    sync.Once
	entered chan struct{}
	release chan struct{}
	listed  func()
}

func newGateStore(match func(store.Query) bool) *gateStore {
	return &gateStore{Memory: store.NewMemory(), match: match, entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *gateStore) List(ctx context.Context, q store.Query) ([]*store.Record, bool, error) {
	held := false
	if g.match(q) {
		g.once.Do(func() { held = true; close(g.entered); <-g.release })
	}
	recs, more, err := g.Memory.List(ctx, q)
	if held && g.listed != nil {
		g.listed()
	}
	return recs, more, err
}

// order records what happened, in the order it happened.
type order struct {
	mu  sync.Mutex
	log []string
}

func (o *order) add(what string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.log = append(o.log, what)
}

func (o *order) all() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.log)
}

// TestDeregisterWaitsForOperationsInFlight: an operation that
// authenticated before a deregister finishes before the deregister does.
func TestDeregisterWaitsForOperationsInFlight(t *testing.T) {
	g := newGateStore(func(q store.Query) bool { return !q.OpenOnly })
	e := newEnv(t, broker.Config{Store: g})
	e.register("s1", "a")
	b := e.register("s2", "b")
	var o order
	g.listed = func() { o.add("listed") }
	listed := make(chan error, 1)
	go func() {
		_, err := b.tryCall(wire.MethodListTasks, nil)
		listed <- err
	}()
	<-g.entered
	revoking := make(chan struct{}, 1)
	broker.OnRevoking(t, func() { revoking <- struct{}{} })
	dereg := make(chan error, 1)
	go func() {
		err := b.tryDeregister()
		o.add("deregistered")
		dereg <- err
	}()
	<-revoking // the deregister has come to the agent's lock, which the list holds
	close(g.release)
	require.NoError(t, <-listed)
	require.NoError(t, <-dereg)
	assert.Equal(t, []string{"listed", "deregistered"}, o.all(), "the deregister answered only after the operation in flight had read the store")
}

// TestDeregisterSweepSparesANewRegistration: a new registration of the
// same instance cannot slip in while a deregister closes the tasks, so
// the tasks it creates are its own and stay open.
func TestDeregisterSweepSparesANewRegistration(t *testing.T) {
	g := newGateStore(func(q store.Query) bool { return q.OpenOnly && q.Instance == "inst-1" })
	e := newEnv(t, broker.Config{Store: g})
	old := e.registerInstance("s1", "w", "inst-1")
	e.register("s2", "peer")
	var o order
	g.listed = func() { o.add("swept") }
	done := make(chan error, 1)
	go func() {
		done <- old.tryDeregister()
	}()
	<-g.entered // the departure holds the instance and closes its tasks
	locking := make(chan struct{}, 1)
	broker.OnLockingInstance(t, func(instance string) {
		if instance == "inst-1" {
			locking <- struct{}{}
		}
	})
	again := make(chan *agent, 1)
	go func() {
		a, err := e.tryRegister("s1", "w", "inst-1")
		assert.NoError(t, err)
		o.add("registered")
		again <- a
	}()
	<-locking // the registration has come to the instance's lock
	close(g.release)
	require.NoError(t, <-done)
	a := <-again
	require.NotNil(t, a)
	assert.Equal(t, []string{"swept", "registered"}, o.all(), "the registration waited for the departure's sweep")
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
		var errs [4]error
		wg.Go(func() { again, errs[0] = e.tryRegister("s1", name, inst) })
		for i := range 3 {
			wg.Go(func() { _, errs[i+1] = e.tryRegister("s2", name, "") })
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		require.Equal(t, first.id, again.id, "round %d", round)
	}
}

// pauseBus holds the first push until released.
type pauseBus struct {
	*fakebus.Bus
	once      sync.Once
	entered   chan struct{}
	release   chan struct{}
	published func() // called once the held push is on the bus
}

func (p *pauseBus) Publish(session string, msg []byte) error {
	h, _ := wire.DecodeNotificationHead(msg)
	if h.Method != wire.NotifyPush {
		return p.Bus.Publish(session, msg)
	}
	held := false
	p.once.Do(func() { held = true; close(p.entered); <-p.release })
	err := p.Bus.Publish(session, msg)
	if held {
		p.published()
	}
	return err
}

// TestDeregisterWaitsForAPushInFlight: once deregister has answered, no
// push from the agent is still on its way.
func TestDeregisterWaitsForAPushInFlight(t *testing.T) {
	fb := fakebus.New(fakebus.Config{})
	pb := &pauseBus{Bus: fb, entered: make(chan struct{}), release: make(chan struct{})}
	b, err := broker.New(context.Background(), pb, broker.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { fb.Close(); b.Close() })
	e := &env{t: t, bus: fb, broker: b, sessions: map[string]*session{}, codes: map[int]int{}}
	a := e.register("s1", "a")
	e.register("s2", "b")
	var o order
	pb.published = func() { o.add("pushed") }
	pushed := make(chan error, 1)
	go func() {
		_, err := a.tryCall(wire.MethodSend, map[string]any{"to": "b", "oneway": true, "message": text("hi")})
		pushed <- err
	}()
	<-pb.entered
	revoking := make(chan struct{}, 1)
	broker.OnRevoking(t, func() { revoking <- struct{}{} })
	dereg := make(chan error, 1)
	go func() {
		err := a.tryDeregister()
		o.add("deregistered")
		dereg <- err
	}()
	<-revoking // the deregister has come to the agent's lock, which the push holds
	close(pb.release)
	require.NoError(t, <-pushed)
	require.NoError(t, <-dereg)
	assert.Equal(t, []string{"pushed", "deregistered"}, o.all(), "deregister answered only after the agent's push was on the bus")
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
	b, err := broker.New(context.Background(), jitterBus{fb}, broker.Config{})
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
			if _, err := a.tryTask(wire.MethodSend, map[string]any{"taskId": task.ID, "message": text(fmt.Sprint(i))}); err != nil {
				failures.Add(1)
			}
			if _, err := a.tryCall(wire.MethodSend, map[string]any{"to": "b", "oneway": true, "message": text("push")}); err != nil {
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

// holdBus holds the first task event's Publish until released.
type holdBus struct {
	*fakebus.Bus
	held    atomic.Bool
	entered chan struct{}
	release chan struct{}
	let     sync.Once
}

func (h *holdBus) Publish(session string, msg []byte) error {
	if head, _ := wire.DecodeNotificationHead(msg); head.Method == wire.NotifyTaskEvent && h.held.CompareAndSwap(false, true) {
		close(h.entered)
		<-h.release
	}
	return h.Bus.Publish(session, msg)
}

func (h *holdBus) letGo() { h.let.Do(func() { close(h.release) }) }

// TestAPublishHeldByTheBusHoldsUpNothingElse: while the bus holds a task
// event's Publish, the recipient's session replays, the task changes
// again and its other member hears of it, and a later notification to
// the session is numbered; that one reaches the bus only after the held
// one, in seq order.
func TestAPublishHeldByTheBusHoldsUpNothingElse(t *testing.T) {
	var hb *holdBus
	e := newEnvWrapped(t, broker.Config{}, fakebus.Config{}, func(fb *fakebus.Bus) transport.Bus {
		hb = &holdBus{Bus: fb, entered: make(chan struct{}), release: make(chan struct{})}
		return hb
	})
	t.Cleanup(hb.letGo) // before the bus closes, even when the test fails
	a := e.register("s1", "a")
	b := e.register("s2", "b")
	sent := make(chan error, 1)
	go func() {
		_, err := a.trySend(b.id, "hello")
		sent <- err
	}()
	<-hb.entered // the task is made; its event, seq 1 of s2, is held

	// The session's log is free: a replay has the held event.
	r, err := replayCall(e, "s2", e.broker.Epoch(), 0)
	require.NoError(t, err)
	require.EqualValues(t, 1, r.LastSeq)
	require.Len(t, r.Events, 1)
	created, err := wire.DecodeEvent(r.Events[0])
	require.NoError(t, err)
	require.NotNil(t, created.TaskEvent)

	// The task's stripe is free: its assignee changes it, and the
	// requester's session hears of it at once.
	_, err = b.update(created.TaskEvent.TaskID, wire.StateWorking, "")
	require.NoError(t, err)
	assert.Equal(t, wire.StateWorking, e.event("s1").TaskEvent.Task.Status.State)

	// A push to the held session is numbered, and waits for its turn.
	pushed := make(chan error, 1)
	go func() {
		_, err := a.tryCall(wire.MethodSend, map[string]any{"to": b.id, "oneway": true, "message": text("after")})
		pushed <- err
	}()
	require.Eventually(t, func() bool {
		res, err := e.tryCall("s2", wire.MethodReplay, map[string]any{"contextId": "s2"})
		var r wire.ReplayResult
		return err == nil && json.Unmarshal(res, &r) == nil && r.LastSeq == 2
	}, 10*time.Second, time.Millisecond)
	e.noEvent("s2")

	hb.letGo()
	require.NoError(t, <-sent)
	require.NoError(t, <-pushed)
	first, second := e.event("s2"), e.event("s2")
	require.NotNil(t, first.TaskEvent, "the held event comes first")
	assert.EqualValues(t, 1, first.Head().Seq)
	require.NotNil(t, second.Push)
	assert.EqualValues(t, 2, second.Head().Seq)
}
