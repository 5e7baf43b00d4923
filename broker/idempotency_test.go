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

// keyed is a text message with a client messageId.
func keyed(id, s string) map[string]any {
	m := text(s)
	m["messageId"] = id
	return m
}

func (a *agent) sendKeyed(to, id, msg string) (*wire.Task, error) {
	p := map[string]any{"message": keyed(id, msg)}
	if to != "" {
		p["to"] = to
	}
	return a.tryTask(wire.MethodSend, p)
}

func TestARetriedSendReturnsTheSameTask(t *testing.T) {
	e := newEnv(t, broker.Config{})
	a := e.register("chat-1", "discussant")
	b := e.register("chat-2", "scribe")
	first, err := a.sendKeyed(b.id, "m-1", "claim notes.md")
	require.NoError(t, err)
	require.Equal(t, wire.EventCreated, e.event("chat-2").TaskEvent.Kind)
	_, err = b.update(first.ID, wire.StateWorking, "")
	require.NoError(t, err)
	e.event("chat-1")

	again, err := a.sendKeyed(b.id, "m-1", "claim notes.md")
	require.NoError(t, err)
	assert.Equal(t, first.ID, again.ID, "the retry names the first task")
	assert.Equal(t, wire.StateWorking, again.Status.State, "in its current state")
	e.noEvent("chat-2") // nobody is told twice
	tasks, err := b.tryCall(wire.MethodListTasks, nil)
	require.NoError(t, err)
	var l wire.ListTasksResult
	require.NoError(t, json.Unmarshal(tasks, &l))
	assert.Len(t, l.Tasks, 1, "one task per intent")

	// A retry without to finds the task even when the implicit peer
	// would now be another (or ambiguous).
	e.register("chat-1", "second")
	_, err = a.sendKeyed(b.id, "m-2", "another")
	require.NoError(t, err)
	again, err = a.sendKeyed(b.id, "m-2", "another")
	require.NoError(t, err)
	e.event("chat-2")
	e.noEvent("chat-2")
	assert.NotEqual(t, first.ID, again.ID)
}

func TestAReusedMessageIDWithOtherContentIsInvalidParams(t *testing.T) {
	e := newEnv(t, broker.Config{})
	a := e.register("chat-1", "discussant")
	b := e.register("chat-2", "scribe")
	c := e.register("chat-3", "critic")
	_, err := a.sendKeyed(b.id, "m-1", "claim notes.md")
	require.NoError(t, err)
	for name, retry := range map[string]map[string]any{
		"other text":     {"to": b.id, "message": keyed("m-1", "claim other.md")},
		"other to":       {"to": c.id, "message": keyed("m-1", "claim notes.md")},
		"other metadata": {"to": b.id, "message": keyed("m-1", "claim notes.md"), "metadata": map[string]any{"k": 1}},
		"oneway":         {"to": b.id, "message": keyed("m-1", "claim notes.md"), "oneway": true},
	} {
		_, err := a.tryTask(wire.MethodSend, retry)
		requireCode(t, err, wire.ErrInvalidParams)
		assert.Contains(t, err.Error(), "already used for a different change", name)
	}
	// Another requester may use the same id: keys are per instance.
	other, err := c.sendKeyed(b.id, "m-1", "claim notes.md")
	require.NoError(t, err)
	assert.Equal(t, c.id, other.RequesterName)
	// White space in the metadata is not content.
	p := map[string]any{"to": b.id, "message": keyed("m-3", "x"), "metadata": json.RawMessage(`{"k": [1, 2]}`)}
	t1, err := a.tryTask(wire.MethodSend, p)
	require.NoError(t, err)
	p["metadata"] = json.RawMessage(`{"k":[1,2]}`)
	t2, err := a.tryTask(wire.MethodSend, p)
	require.NoError(t, err)
	assert.Equal(t, t1.ID, t2.ID)
}

func TestARetriedUpdateOrCancelReturnsTheTaskUnchanged(t *testing.T) {
	e := newEnv(t, broker.Config{})
	a := e.register("chat-1", "discussant")
	b := e.register("chat-2", "scribe")
	task := a.mustSend(b.id, "write it")
	e.event("chat-2")

	complete := map[string]any{"state": wire.StateCompleted, "messageId": "u-1",
		"artifacts": []any{map[string]any{"name": "notes", "parts": []any{map[string]any{"kind": "text", "text": "done"}}}}}
	done, err := b.taskCall(wire.MethodUpdateTask, task.ID, complete)
	require.NoError(t, err)
	e.event("chat-1")
	again, err := b.taskCall(wire.MethodUpdateTask, task.ID, complete)
	require.NoError(t, err, "a retried completion is not an invalid transition")
	assert.Equal(t, done, again, "the task, unchanged")
	e.noEvent("chat-1")
	complete["state"] = wire.StateFailed
	_, err = b.taskCall(wire.MethodUpdateTask, task.ID, complete)
	requireCode(t, err, wire.ErrInvalidParams)

	// An update's message id is its key when it has no other.
	task2 := a.mustSend(b.id, "again")
	e.event("chat-2")
	ask := map[string]any{"state": wire.StateInputRequired, "message": keyed("q-1", "which file?")}
	asked, err := b.taskCall(wire.MethodUpdateTask, task2.ID, ask)
	require.NoError(t, err)
	e.event("chat-1")
	again, err = b.taskCall(wire.MethodUpdateTask, task2.ID, ask)
	require.NoError(t, err)
	assert.Len(t, again.History, len(asked.History), "no second message")
	e.noEvent("chat-1")

	// A reply on the task, retried.
	reply := map[string]any{"message": keyed("r-1", "notes.md")}
	replied, err := a.taskCall(wire.MethodSend, task2.ID, reply)
	require.NoError(t, err)
	e.event("chat-2")
	again, err = a.taskCall(wire.MethodSend, task2.ID, reply)
	require.NoError(t, err)
	assert.Len(t, again.History, len(replied.History))
	e.noEvent("chat-2")
	// The members' keys are their own: the assignee may use the same id.
	_, err = b.taskCall(wire.MethodSend, task2.ID, reply)
	require.NoError(t, err)
	e.event("chat-1")

	// A retried cancel.
	canceled, err := a.taskCall(wire.MethodCancelTask, task2.ID, map[string]any{"messageId": "c-1"})
	require.NoError(t, err)
	require.Equal(t, wire.StateCanceled, canceled.Status.State)
	e.event("chat-2")
	again, err = a.taskCall(wire.MethodCancelTask, task2.ID, map[string]any{"messageId": "c-1"})
	require.NoError(t, err)
	assert.Equal(t, canceled, again)
	e.noEvent("chat-2")
	// Without a key, a second cancel is what it always was.
	_, err = a.cancel(task2.ID)
	requireCode(t, err, wire.ErrInvalidTransition)
}

func TestARetriedPushIsDeliveredOnce(t *testing.T) {
	e := newEnv(t, broker.Config{})
	a := e.register("chat-1", "discussant")
	b := e.register("chat-2", "scribe")
	p := map[string]any{"to": b.id, "oneway": true, "message": keyed("p-1", "fyi")}
	for range 2 {
		res, err := a.call(wire.MethodSend, p)
		require.NoError(t, err)
		var r wire.SendResult
		require.NoError(t, json.Unmarshal(res, &r))
		assert.Equal(t, b.id, r.Delivered)
	}
	require.Equal(t, wire.NotifyPush, e.event("chat-2").Method)
	e.noEvent("chat-2")
	p["message"] = keyed("p-1", "other")
	_, err := a.tryCall(wire.MethodSend, p)
	requireCode(t, err, wire.ErrInvalidParams)
}

// A retry that races its first attempt still makes one task.
func TestConcurrentRetriesMakeOneTask(t *testing.T) {
	e := newEnv(t, broker.Config{})
	a := e.register("chat-1", "discussant")
	b := e.register("chat-2", "scribe")
	const n = 16
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			task, err := a.sendKeyed(b.id, "m-race", "once")
			if assert.NoError(t, err) {
				ids[i] = task.ID
			}
		})
	}
	wg.Wait()
	for _, id := range ids {
		assert.Equal(t, ids[0], id)
	}
	e.event("chat-2")
	e.noEvent("chat-2")
}

// The window: a send's key lasts as long as its task is stored, an
// update's as long as it is among the task's last store.MaxApplied keyed
// changes. Past that, a retry is a new change (docs/PROTOCOL.md §4.11).
func TestARetryAfterItsKeyLeftTheWindowIsANewChange(t *testing.T) {
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	st := store.NewMemory()
	e := newEnv(t, broker.Config{Store: st, Now: clock})
	a := e.register("chat-1", "discussant")
	b := e.register("chat-2", "scribe")

	first, err := a.sendKeyed(b.id, "m-1", "once")
	require.NoError(t, err)
	_, err = b.update(first.ID, wire.StateCompleted, "")
	require.NoError(t, err)
	mu.Lock()
	now = now.Add(time.Hour)
	mu.Unlock()
	n, err := st.Prune(context.Background(), store.Retention{MaxAge: time.Minute}, now)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	again, err := a.sendKeyed(b.id, "m-1", "once")
	require.NoError(t, err)
	assert.NotEqual(t, first.ID, again.ID, "the key left with its pruned task: a new task")

	// Updates: the first key falls out after MaxApplied others.
	reply := func(id string) (*wire.Task, error) {
		return a.taskCall(wire.MethodSend, again.ID, map[string]any{"message": keyed(id, "r")})
	}
	_, err = reply("r-0")
	require.NoError(t, err)
	for i := 1; i <= store.MaxApplied; i++ {
		_, err = reply(fmt.Sprint("r-", i))
		require.NoError(t, err)
	}
	before, err := a.get(again.ID)
	require.NoError(t, err)
	after, err := reply("r-0")
	require.NoError(t, err)
	assert.Len(t, after.History, len(before.History)+1, "out of the window, the retry is appended again")
}

func TestAKeyParamOverTheIDLimitIsInvalidParams(t *testing.T) {
	e := newEnv(t, broker.Config{})
	a := e.register("chat-1", "discussant")
	b := e.register("chat-2", "scribe")
	task := a.mustSend(b.id, "x")
	long := string(make([]byte, wire.MaxIDBytes+1))
	_, err := a.tryTask(wire.MethodCancelTask, map[string]any{"taskId": task.ID, "messageId": long})
	requireCode(t, err, wire.ErrInvalidParams)
	_, err = b.tryTask(wire.MethodUpdateTask, map[string]any{"taskId": task.ID, "state": wire.StateWorking, "messageId": long})
	requireCode(t, err, wire.ErrInvalidParams)
}

// Each member has its own window of keys: the other member's keyed
// changes, however many, never make a member's retry a new change.
func TestAPeersChangesNeverPushOutAMembersKeys(t *testing.T) {
	e := newEnv(t, broker.Config{})
	a := e.register("chat-1", "asker")
	b := e.register("chat-2", "worker")
	task, err := a.sendKeyed(b.id, "m-1", "job")
	require.NoError(t, err)
	e.event("chat-2")
	reply := map[string]any{"message": keyed("r-1", "more context")}
	first, err := a.taskCall(wire.MethodSend, task.ID, reply) // its answer is lost
	require.NoError(t, err)
	e.event("chat-2")
	for i := range store.MaxApplied { // the worker streams progress, each update with its own key
		_, err := b.taskCall(wire.MethodUpdateTask, task.ID, map[string]any{"state": wire.StateWorking, "messageId": fmt.Sprint("u-", i)})
		require.NoError(t, err)
		e.event("chat-1")
	}
	again, err := a.taskCall(wire.MethodSend, task.ID, reply) // the retry, with the same key
	require.NoError(t, err)
	n := 0
	for _, m := range again.History {
		if m.MessageID == "r-1" {
			n++
		}
	}
	assert.Equal(t, 1, n, "retried reply appended %d times", n)
	assert.Len(t, again.History, len(first.History))
	e.noEvent("chat-2") // the worker is told once
}

// A retried message on a task that named the peer by its agentId of the
// time is still a retry after the peer re-registered under another name.
func TestARetryNamingARenamedPeerIsStillARetry(t *testing.T) {
	e := newEnv(t, broker.Config{})
	a := e.register("chat-1", "asker")
	b := e.registerInstance("chat-2", "worker", "inst-w")
	task, err := a.sendKeyed(b.id, "m-1", "job")
	require.NoError(t, err)
	b2 := e.registerInstance("chat-2", "worker-two", "inst-w")
	require.NotEqual(t, b.id, b2.id)
	reply := map[string]any{"to": b2.id, "message": keyed("r-1", "more")}
	_, err = a.taskCall(wire.MethodSend, task.ID, reply) // applied; answer lost
	require.NoError(t, err)
	e.registerInstance("chat-2", "worker-three", "inst-w")
	_, err = a.tryTask(wire.MethodSend, map[string]any{"taskId": task.ID, "to": b2.id, "message": keyed("r-1", "more")})
	assert.NoError(t, err, "a retry of an applied change must answer the task")
}

// What a JSON client considers the same change is the same change:
// members in another order, another spelling of a number or a string,
// null metadata or none.
func TestARetryReEncodedIsTheSameChange(t *testing.T) {
	e := newEnv(t, broker.Config{})
	a := e.register("chat-1", "asker")
	b := e.register("chat-2", "worker")
	cases := []struct{ name, first, retry string }{
		{"member order", `{"a":1,"b":2}`, `{"b":2,"a":1}`},
		{"number form", `{"n":1.0}`, `{"n":1}`},
		{"string escape", `{"s":"é"}`, `{"s":"\u00e9"}`},
		{"null vs absent", `null`, ``},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := fmt.Sprint("k-", i)
			p := map[string]any{"to": b.id, "message": keyed(id, "x"), "metadata": json.RawMessage(c.first)}
			_, err := a.tryTask(wire.MethodSend, p)
			require.NoError(t, err)
			p2 := map[string]any{"to": b.id, "message": keyed(id, "x")}
			if c.retry != "" {
				p2["metadata"] = json.RawMessage(c.retry)
			}
			_, err = a.tryTask(wire.MethodSend, p2)
			assert.NoError(t, err, "retry of the same change")
		})
	}
	// Same inside the message (data part).
	mk := func(data string) map[string]any {
		return map[string]any{"messageId": "k-data", "parts": []any{map[string]any{"kind": "data", "data": json.RawMessage(data)}}}
	}
	_, err := a.tryTask(wire.MethodSend, map[string]any{"to": b.id, "message": mk(`{"x":1,"y":2}`)})
	require.NoError(t, err)
	_, err = a.tryTask(wire.MethodSend, map[string]any{"to": b.id, "message": mk(`{"y":2,"x":1}`)})
	assert.NoError(t, err, "data part member order")
}

// gateFind holds the first FindSend until the test opens its gate.
type gateFind struct {
	store.Store
	mu   sync.Mutex
	gate chan struct{}
	in   chan struct{}
}

func (g *gateFind) FindSend(ctx context.Context, instance, key string) (*store.Record, error) {
	g.mu.Lock()
	gate := g.gate
	g.gate = nil
	g.mu.Unlock()
	if gate != nil {
		g.in <- struct{}{}
		<-gate
	}
	return g.Store.FindSend(ctx, instance, key)
}

// A keyed send racing its agent's departure leaves no window of push
// keys behind: windows go with the agents.
func TestAKeyedSendRacingADepartureLeavesNoWindow(t *testing.T) {
	g := &gateFind{Store: store.NewMemory(), in: make(chan struct{}, 1)}
	e := newEnv(t, broker.Config{Store: g})
	peer := e.register("chat-2", "worker")
	locking := make(chan struct{})
	broker.OnLockingSend(t, func(string, string) { locking <- struct{}{} })
	const rounds = 50
	for i := range rounds {
		a := e.register("chat-1", fmt.Sprint("asker", i))
		gate := make(chan struct{})
		g.mu.Lock()
		g.gate = gate
		g.mu.Unlock()
		p := map[string]any{"to": peer.id, "message": keyed("k", "x")}
		var wg sync.WaitGroup
		wg.Go(func() { a.tryTask(wire.MethodSend, p) }) // holds the key's lock, waits in FindSend
		<-locking
		<-g.in
		wg.Go(func() { a.tryTask(wire.MethodSend, p) }) // the retry: authenticated, waits for the key's lock
		<-locking
		require.NoError(t, a.tryDeregister()) // forgets the window
		close(gate)
		wg.Wait()
	}
	agents, _, _, _ := e.broker.Footprint()
	assert.Equal(t, 1, agents)
	assert.LessOrEqual(t, e.broker.PushWindows(), 1, "push windows of departed instances left behind")
}

// PROTOCOL §1 ranks -32602 for the params' shape before A2A_UNKNOWN_TASK
// and A2A_INVALID_TRANSITION: an over-long update messageId too.
func TestAnOverlongUpdateKeyIsAShapeError(t *testing.T) {
	e := newEnv(t, broker.Config{})
	a := e.register("chat-1", "asker")
	b := e.register("chat-2", "worker")
	task := a.mustSend(b.id, "x")
	long := string(make([]byte, wire.MaxIDBytes+1))
	_, err := b.tryTask(wire.MethodUpdateTask, map[string]any{"taskId": "nope", "state": wire.StateWorking, "messageId": long})
	assert.ErrorIs(t, err, wire.ErrInvalidParams, "unknown task: %v", err)
	_, err = a.tryTask(wire.MethodUpdateTask, map[string]any{"taskId": task.ID, "state": wire.StateWorking, "messageId": long})
	assert.ErrorIs(t, err, wire.ErrInvalidParams, "requester: %v", err)
	_, err = a.tryTask(wire.MethodCancelTask, map[string]any{"taskId": "nope", "messageId": long})
	assert.ErrorIs(t, err, wire.ErrInvalidParams, "cancel, for comparison: %v", err)
}

// Keyed sends, pushes, updates and cancels, retried concurrently while
// their members re-register and deregister: no deadlock, no race, one
// task per key, and no window left behind.
func TestKeyedChangesUnderChurn(t *testing.T) {
	st := store.NewMemory()
	e := newEnv(t, broker.Config{MaxTasksPerContext: 1000, Store: st})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			inst := fmt.Sprint("req-", w)
			a, err := e.tryRegister(fmt.Sprint("s", w), "req", inst)
			if !assert.NoError(t, err) {
				return
			}
			b, err := e.tryRegister(fmt.Sprint("w", w), "wrk", fmt.Sprint("wrk-", w))
			if !assert.NoError(t, err) {
				return
			}
			var mu sync.Mutex
			current := func() *agent { mu.Lock(); defer mu.Unlock(); return a }
			for i := range 100 {
				k := fmt.Sprint("k", i%20)
				var inner sync.WaitGroup
				for j := range 3 {
					inner.Go(func() {
						req := current()
						switch (i + j) % 4 {
						case 0:
							req.tryTask(wire.MethodSend, map[string]any{"to": b.id, "message": keyed(k, "x")})
						case 1:
							req.tryCall(wire.MethodSend, map[string]any{"to": b.id, "oneway": true, "message": keyed(k+"p", "x")})
						case 2:
							if tk, err := req.tryTask(wire.MethodSend, map[string]any{"to": b.id, "message": keyed(k, "x")}); err == nil {
								req.tryTask(wire.MethodCancelTask, map[string]any{"taskId": tk.ID, "messageId": k})
								b.tryTask(wire.MethodUpdateTask, map[string]any{"taskId": tk.ID, "state": "working", "messageId": k})
							}
						case 3:
							if i%10 == 0 {
								if n, err := e.tryRegister(fmt.Sprint("s", w), "req", inst); err == nil {
									mu.Lock()
									a = n
									mu.Unlock()
								}
							}
						}
					})
				}
				inner.Wait()
			}
			assert.NoError(t, current().tryDeregister())
			assert.NoError(t, b.tryDeregister())
		})
	}
	wg.Wait()
	agents, _, _, _ := e.broker.Footprint()
	assert.Zero(t, agents)
	assert.Zero(t, e.broker.PushWindows(), "windows go with their agents")
	recs, _, err := st.List(context.Background(), store.Query{})
	require.NoError(t, err)
	seen := map[string]string{}
	for _, r := range recs {
		k := r.RequesterInstance + "/" + r.SendKey
		require.Empty(t, seen[k], "two tasks for %s: %s and %s", k, seen[k], r.Task.ID)
		seen[k] = r.Task.ID
	}
	assert.NotEmpty(t, seen)
}
