package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// patience bounds how long a test waits for what must come before it
// fails: a bound on a failure, not a timing (the feed polls every
// lostPoll).
const (
	patience = 10 * time.Second
	lostPoll = 20 * time.Millisecond
)

// lostEnv is a faultEnv whose broker restarts, on its store or on an
// empty one (a broker without a durable store).
type lostEnv struct {
	*faultEnv
	mu      sync.Mutex
	brokers []*broker.Broker
}

func newLostEnv(t *testing.T) *lostEnv {
	e := &lostEnv{}
	// Registered first, so it runs last: after the runtimes have settled
	// their delegates on the broker that serves them.
	t.Cleanup(func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, b := range e.brokers {
			b.Close()
		}
	})
	e.faultEnv = newFaultEnv(t)
	return e
}

// runtimeOn starts a runtime for session on a session wrap may wrap.
func (e *lostEnv) runtimeOn(t *testing.T, session string, wrap func(transport.Session) transport.Session) *runtime.Runtime {
	t.Helper()
	sess, err := e.bus.Session(ctxT(t), session)
	require.NoError(t, err)
	if wrap != nil {
		sess = wrap(sess)
	}
	rt, err := runtime.New(ctxT(t), sess, runtime.Config{Feed: runtime.FeedConfig{CheckInterval: lostPoll}})
	require.NoError(t, err)
	e.rts[session] = rt
	return rt
}

// restart kills the broker and starts another on st, or on an empty
// memory store when st is nil, which it returns.
func (e *lostEnv) restart(t *testing.T, st *store.Memory) *store.Memory {
	t.Helper()
	if st == nil {
		st = store.NewMemory()
	}
	e.bus.Unserve()
	b, err := broker.New(context.Background(), e.bus, broker.Config{Store: st})
	require.NoError(t, err)
	e.mu.Lock()
	e.brokers = append(e.brokers, b)
	e.mu.Unlock()
	return st
}

// pair is a requester in session s1 and an assignee in s2, each with its
// Wait running.
type pair struct {
	asker, worker   *runtime.Delegate
	askerC, workerC <-chan runtime.Event
}

func newPair(t *testing.T, e *lostEnv, wrapAsker func(transport.Session) transport.Session) *pair {
	t.Helper()
	asker, err := e.runtimeOn(t, "s1", wrapAsker).Spawn(ctxT(t), wire.AgentCard{Name: "asker"})
	require.NoError(t, err)
	worker, err := e.runtimeOn(t, "s2", nil).Spawn(ctxT(t), wire.AgentCard{Name: "worker"})
	require.NoError(t, err)
	return &pair{asker: asker, worker: worker, askerC: watch(t, asker), workerC: watch(t, worker)}
}

// watch runs d's Wait in a loop and hands over each event, until the test
// ends. Wait has noted an event (what a Resync compares with) before it
// is handed over.
func watch(t *testing.T, d *runtime.Delegate) <-chan runtime.Event {
	c := make(chan runtime.Event)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			ev, err := d.Wait(ctx)
			if err != nil {
				return
			}
			select {
			case c <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

func next(t *testing.T, c <-chan runtime.Event, what string) runtime.Event {
	t.Helper()
	select {
	case ev := <-c:
		return ev
	case <-time.After(patience):
		t.Fatalf("no event: waited for %s", what)
		return runtime.Event{}
	}
}

// untilTask reads events until one says task id is in state.
func untilTask(t *testing.T, c <-chan runtime.Event, id string, state wire.State) {
	t.Helper()
	for {
		ev := next(t, c, fmt.Sprintf("task %s to be %s", id, state))
		require.Nil(t, ev.Resync, "a Resync before task %s was %s", id, state)
		if ev.Task != nil && ev.Task.TaskID == id && ev.Task.Task.Status.State == state {
			return
		}
	}
}

// untilResync reads events until a Resync.
func untilResync(t *testing.T, c <-chan runtime.Event) *runtime.Resync {
	t.Helper()
	for {
		if ev := next(t, c, "a Resync"); ev.Resync != nil {
			return ev.Resync
		}
	}
}

// send makes a task from asker to worker, and waits until the worker
// has heard of it.
func (p *pair) send(t *testing.T) string {
	t.Helper()
	task, err := p.asker.Send(ctxT(t), "worker", wire.Message{Parts: []wire.Part{wire.TextPart("job")}}, nil)
	require.NoError(t, err)
	untilTask(t, p.workerC, task.ID, wire.StateSubmitted)
	return task.ID
}

// complete completes a task, and waits until the asker has heard of it.
func (p *pair) complete(t *testing.T, id string) {
	t.Helper()
	_, err := p.worker.Update(ctxT(t), id, wire.StateCompleted, &wire.Message{Parts: []wire.Part{wire.TextPart("done")}})
	require.NoError(t, err)
	untilTask(t, p.askerC, id, wire.StateCompleted)
}

// blocked waits until both delegates are blocked in Wait.
func (p *pair) blocked(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool { return p.asker.Waiting() && p.worker.Waiting() }, patience, time.Millisecond)
}

func pick(ids []string, at []int) []string {
	var out []string
	for _, i := range at {
		out = append(out, ids[i])
	}
	slices.Sort(out)
	return out
}

// TestAResyncNamesTheOpenTasksTheBrokerLost: the broker restarts on an
// empty store while both members of some tasks wait; each is woken by a
// Resync whose Lost names the tasks it knew open, and none it knew ended.
func TestAResyncNamesTheOpenTasksTheBrokerLost(t *testing.T) {
	tests := []struct {
		name string
		// before makes tasks, each member hearing of what it does, and
		// returns their ids.
		before func(t *testing.T, e *lostEnv, p *pair) []string
		// Which of before's tasks each member finds in Lost.
		askerLost, workerLost []int
	}{
		{
			name:      "an open task is lost to both members",
			before:    func(t *testing.T, _ *lostEnv, p *pair) []string { return []string{p.send(t)} },
			askerLost: []int{0}, workerLost: []int{0},
		},
		{
			name: "a task both members saw completed is not lost",
			before: func(t *testing.T, _ *lostEnv, p *pair) []string {
				id := p.send(t)
				p.complete(t, id)
				return []string{id}
			},
		},
		{
			name: "a task both members saw canceled is not lost",
			before: func(t *testing.T, _ *lostEnv, p *pair) []string {
				id := p.send(t)
				_, err := p.asker.Cancel(ctxT(t), id)
				require.NoError(t, err)
				untilTask(t, p.workerC, id, wire.StateCanceled)
				return []string{id}
			},
		},
		{
			name: "a task in input-required is lost",
			before: func(t *testing.T, _ *lostEnv, p *pair) []string {
				id := p.send(t)
				_, err := p.worker.Update(ctxT(t), id, wire.StateInputRequired, &wire.Message{Parts: []wire.Part{wire.TextPart("which one?")}})
				require.NoError(t, err)
				untilTask(t, p.askerC, id, wire.StateInputRequired)
				return []string{id}
			},
			askerLost: []int{0}, workerLost: []int{0},
		},
		{
			name: "of several tasks only the open ones are lost",
			before: func(t *testing.T, _ *lostEnv, p *pair) []string {
				ids := []string{p.send(t), p.send(t), p.send(t), p.send(t)}
				p.complete(t, ids[1])
				p.complete(t, ids[3])
				return ids
			},
			askerLost: []int{0, 2}, workerLost: []int{0, 2},
		},
		{
			// The completion's event never reached the requester before the
			// broker went: to it the task was open, and its outcome is lost.
			name: "a task whose end one member missed is lost to that member only",
			before: func(t *testing.T, e *lostEnv, p *pair) []string {
				id := p.send(t)
				e.bus.Disconnect("s1")
				_, err := p.worker.Update(ctxT(t), id, wire.StateCompleted, nil)
				require.NoError(t, err)
				return []string{id}
			},
			askerLost: []int{0},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newLostEnv(t)
			p := newPair(t, e, nil)
			ids := tt.before(t, e, p)
			p.blocked(t)

			restarted := time.Now()
			e.restart(t, nil)
			e.bus.Reconnect("s1")

			askerRS, workerRS := untilResync(t, p.askerC), untilResync(t, p.workerC)
			t.Logf("both woke %v after the restart (polling every %v)", time.Since(restarted).Round(time.Millisecond), lostPoll)
			assert.Equal(t, pick(ids, tt.askerLost), askerRS.Lost, "the requester's Lost")
			assert.Equal(t, pick(ids, tt.workerLost), workerRS.Lost, "the assignee's Lost")
			assert.Empty(t, askerRS.Changed, "the new broker has no task")
			assert.Empty(t, workerRS.Changed, "the new broker has no task")
			assert.Empty(t, p.asker.KnownOpen(), "a lost task is forgotten once told")
			assert.Empty(t, p.worker.KnownOpen(), "a lost task is forgotten once told")
			for _, id := range workerRS.Lost {
				_, err := p.worker.Update(ctxT(t), id, wire.StateCompleted, nil)
				assert.ErrorIs(t, err, wire.ErrUnknownTask, "the assignee's update of a lost task")
			}
		})
	}
}

// TestALostTaskIsToldOnceAndALiveOneNever: across three restarts, a lost
// task is reported by the first Resync only, a task the broker kept is
// never reported, and a task that ended before its broker lost it is
// not reported either, and is forgotten.
func TestALostTaskIsToldOnceAndALiveOneNever(t *testing.T) {
	e := newLostEnv(t)
	p := newPair(t, e, nil)
	first := p.send(t)
	p.blocked(t)
	st := e.restart(t, nil)
	assert.Equal(t, []string{first}, untilResync(t, p.askerC).Lost)
	assert.Equal(t, []string{first}, untilResync(t, p.workerC).Lost)

	// A task made on the new broker, which restarts on its store.
	second := p.send(t)
	p.blocked(t)
	e.restart(t, st)
	for _, c := range []<-chan runtime.Event{p.askerC, p.workerC} {
		rs := untilResync(t, c)
		assert.Empty(t, rs.Lost, "neither the task reported before nor the live one")
	}
	assert.Equal(t, []string{second}, p.asker.KnownOpen())
	assert.Equal(t, []string{second}, p.worker.KnownOpen())

	// It ends, both hear of it, then the broker loses it.
	p.complete(t, second)
	p.blocked(t)
	e.restart(t, nil)
	for _, d := range []struct {
		d *runtime.Delegate
		c <-chan runtime.Event
	}{{p.asker, p.askerC}, {p.worker, p.workerC}} {
		rs := untilResync(t, d.c)
		assert.Empty(t, rs.Lost, "a task seen ended is not lost work")
		assert.Empty(t, d.d.KnownOpen())
		assert.Zero(t, d.d.Known(), "what the broker no longer has is forgotten")
	}
}

// quirkSession hides a task from the requester's task lists, as a paging
// or filter quirk would, and can fail its reads of that task as if the
// broker were out of reach.
type quirkSession struct {
	transport.Session
	mu       sync.Mutex
	hidden   string
	failGets atomic.Bool
}

func (s *quirkSession) hide(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hidden = id
}

func (s *quirkSession) Call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	s.mu.Lock()
	hidden := s.hidden
	s.mu.Unlock()
	switch method {
	case wire.MethodGetTask:
		if p, ok := params.(wire.TaskParams); ok && hidden != "" && p.TaskID == hidden && s.failGets.Load() {
			return nil, fmt.Errorf("%w: the test cut this read", transport.ErrUnavailable)
		}
	case wire.MethodListTasks:
		raw, err := s.Session.Call(ctx, method, params)
		if err != nil || hidden == "" {
			return raw, err
		}
		var res wire.ListTasksResult
		if err := wire.Unmarshal(raw, &res); err != nil {
			return nil, err
		}
		res.Tasks = slices.DeleteFunc(res.Tasks, func(t *wire.Task) bool { return t.ID == hidden })
		return wire.Marshal(res)
	}
	return s.Session.Call(ctx, method, params)
}

// TestATaskIsLostOnlyWhenTheBrokerSaysSo: a task missing from the list
// is read before it is called lost. A live one is not lost (and, changed
// meanwhile, is in Changed); one whose read fails otherwise is not lost
// yet, and the next Resync asks again.
func TestATaskIsLostOnlyWhenTheBrokerSaysSo(t *testing.T) {
	t.Run("a live task the list missed", func(t *testing.T) {
		e := newLostEnv(t)
		quirk := &quirkSession{}
		p := newPair(t, e, func(s transport.Session) transport.Session { quirk.Session = s; return quirk })
		id := p.send(t)
		quirk.hide(id)
		// It changes while the requester cannot hear, and the broker
		// restarts on its store.
		e.bus.Disconnect("s1")
		_, err := p.worker.Update(ctxT(t), id, wire.StateWorking, nil)
		require.NoError(t, err)
		p.blocked(t)
		e.restart(t, e.store)
		e.bus.Reconnect("s1")
		rs := untilResync(t, p.askerC)
		assert.Empty(t, rs.Lost)
		require.Len(t, rs.Changed, 1, "the task read is in Changed")
		assert.Equal(t, id, rs.Changed[0].ID)
		assert.Equal(t, wire.StateWorking, rs.Changed[0].Status.State)
		assert.Equal(t, []string{id}, p.asker.KnownOpen())
	})
	t.Run("a read that fails otherwise", func(t *testing.T) {
		e := newLostEnv(t)
		quirk := &quirkSession{}
		p := newPair(t, e, func(s transport.Session) transport.Session { quirk.Session = s; return quirk })
		id := p.send(t)
		quirk.hide(id)
		quirk.failGets.Store(true)
		p.blocked(t)
		e.restart(t, nil)
		assert.Equal(t, []string{id}, untilResync(t, p.workerC).Lost)
		assert.Empty(t, untilResync(t, p.askerC).Lost, "not known to be lost yet")
		assert.Equal(t, []string{id}, p.asker.KnownOpen(), "kept for the next Resync")

		quirk.failGets.Store(false)
		p.blocked(t)
		e.restart(t, nil)
		assert.Equal(t, []string{id}, untilResync(t, p.askerC).Lost)
		assert.Empty(t, untilResync(t, p.workerC).Lost, "told once")
	})
}

// TestTheKnownOpenTasksAreThoseNotSeenEnded: the tasks a Resync checks
// are the open ones; a task is forgotten from them when its member hears
// it ended, however it heard.
func TestTheKnownOpenTasksAreThoseNotSeenEnded(t *testing.T) {
	e := newLostEnv(t)
	p := newPair(t, e, nil)
	var ids []string
	for range 20 {
		ids = append(ids, p.send(t))
	}
	assert.Equal(t, ids, p.asker.KnownOpen(), "from the sends' results")
	assert.Equal(t, ids, p.worker.KnownOpen(), "from the created events")
	for _, id := range ids[:10] {
		p.complete(t, id) // the worker from its update's result, the asker from the event
	}
	for _, id := range ids[10:15] {
		_, err := p.asker.Cancel(ctxT(t), id) // the asker from its cancel's result
		require.NoError(t, err)
		untilTask(t, p.workerC, id, wire.StateCanceled)
	}
	assert.Equal(t, ids[15:], p.asker.KnownOpen())
	assert.Equal(t, ids[15:], p.worker.KnownOpen())
	// A read of a task seen ended does not open it again.
	_, err := p.asker.Tasks(ctxT(t), "", "")
	require.NoError(t, err)
	_, err = p.asker.Task(ctxT(t), ids[0])
	require.NoError(t, err)
	assert.Equal(t, ids[15:], p.asker.KnownOpen())
}
