package broker_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/wire"
)

// The tests in this file are named after the addressing rules as
// docs/PROTOCOL.md numbers them (TestRuleN_) and ADR 0162's
// consequences; each runs over the fake bus.

func TestRule1_ListReturnsEveryOtherLiveAgentWithItsContextId(t *testing.T) {
	e := newEnv(t, broker.Config{})
	a := e.register("s1", "alice")
	b := e.register("s1", "bob")
	c := e.register("s2", "carol")
	gone := e.register("s3", "dave")
	require.NoError(t, gone.deregister())

	tests := []struct {
		name string
		self *agent
		want map[string]string // agentId -> contextId
	}{
		{"caller in a session with a peer", a, map[string]string{"bob": "s1", "carol": "s2"}},
		{"other caller in the same session", b, map[string]string{"alice": "s1", "carol": "s2"}},
		{"caller alone in its session", c, map[string]string{"alice": "s1", "bob": "s1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := map[string]string{}
			for _, card := range tc.self.list() {
				assert.NotEqual(t, tc.self.id, card.AgentID, "the caller's own card is excluded")
				assert.NotNil(t, card.RegisteredAt)
				assert.NotEmpty(t, card.Name)
				got[card.AgentID] = card.ContextID
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestRule1_ListNeverShowsTokensOrInstanceIds(t *testing.T) {
	e := newEnv(t, broker.Config{})
	a := e.register("s1", "alice")
	b := e.registerInstance("s2", "bob", "bob-instance-secret")
	res, err := a.call(wire.MethodListAgents, nil)
	require.NoError(t, err)
	assert.NotContains(t, string(res), b.token)
	assert.NotContains(t, string(res), "bob-instance-secret")
}

func TestRule2_SendWithoutToResolvesThePeer(t *testing.T) {
	tests := []struct {
		name      string
		agents    [][2]string // session, name; the first is the caller
		wantPeer  string
		wantErr   *wire.Error
		wantCands []string
	}{
		{"single same-session peer wins over other sessions",
			[][2]string{{"s1", "a"}, {"s1", "b"}, {"s2", "c"}}, "b", nil, nil},
		{"no same-session peer: the single other-session peer",
			[][2]string{{"s1", "a"}, {"s2", "c"}}, "c", nil, nil},
		{"two same-session peers are ambiguous even with one elsewhere",
			[][2]string{{"s1", "a"}, {"s1", "b"}, {"s1", "d"}, {"s2", "c"}}, "", wire.ErrAmbiguousPeer, []string{"b", "d"}},
		{"two other-session peers are ambiguous",
			[][2]string{{"s1", "a"}, {"s2", "c"}, {"s3", "d"}}, "", wire.ErrAmbiguousPeer, []string{"c", "d"}},
		{"nobody else: no peers",
			[][2]string{{"s1", "a"}}, "", wire.ErrNoPeers, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, broker.Config{})
			var caller *agent
			for i, sa := range tc.agents {
				a := e.register(sa[0], sa[1])
				if i == 0 {
					caller = a
				}
			}
			task, err := caller.send("", "hi")
			if tc.wantErr != nil {
				requireCode(t, err, tc.wantErr)
				if tc.wantCands != nil {
					var we *wire.Error
					require.ErrorAs(t, err, &we)
					assert.Equal(t, tc.wantCands, we.Data.Candidates)
				}
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantPeer, task.AgentName)
		})
	}
}

func TestRule2_SendToNamesAnyLiveAgent(t *testing.T) {
	e := newEnv(t, broker.Config{})
	a := e.register("s1", "a")
	e.register("s1", "b")
	e.register("s2", "c")
	gone := e.register("s2", "gone")
	require.NoError(t, gone.deregister())

	tests := []struct {
		name, to string
		want     string
		wantErr  *wire.Error
	}{
		{"same-session peer", "b", "b", nil},
		{"other-session peer", "c", "c", nil},
		{"unknown name", "nobody", "", wire.ErrUnknownAgent},
		{"deregistered name", "gone", "", wire.ErrUnknownAgent},
		{"the caller itself", "a", "", wire.ErrInvalidParams},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			task, err := a.send(tc.to, "hi")
			if tc.wantErr != nil {
				requireCode(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, task.AgentName)
		})
	}
}

func TestRule3_TaskAccessIsMembershipNotSession(t *testing.T) {
	e := newEnv(t, broker.Config{})
	req := e.register("s1", "requester")
	asg := e.register("s2", "assignee")
	sameSessionStranger := e.register("s1", "stranger")
	otherSessionStranger := e.register("s3", "outsider")
	task := req.mustSend("assignee", "do it")

	for _, s := range []*agent{sameSessionStranger, otherSessionStranger} {
		t.Run(s.id, func(t *testing.T) {
			ops := map[string]func() error{
				"get":    func() error { _, err := s.get(task.ID); return err },
				"send":   func() error { _, err := s.reply(task.ID, "me too"); return err },
				"update": func() error { _, err := s.update(task.ID, wire.StateCompleted, ""); return err },
				"cancel": func() error { _, err := s.cancel(task.ID); return err },
			}
			for name, op := range ops {
				t.Run(name, func(t *testing.T) { requireCode(t, op(), wire.ErrUnknownAgent) })
			}
			res, err := s.call(wire.MethodListTasks, nil)
			require.NoError(t, err)
			assert.JSONEq(t, `{"tasks":[],"nextPageToken":""}`, string(res), "a stranger lists none of the task")
		})
	}
	t.Run("members from both sessions", func(t *testing.T) {
		got, err := req.get(task.ID)
		require.NoError(t, err)
		assert.Equal(t, "s1", got.ContextID)
		got, err = asg.get(task.ID)
		require.NoError(t, err)
		assert.Equal(t, "s2", got.AgentContextID)
	})
	t.Run("unknown task", func(t *testing.T) {
		_, err := req.get("no-such-task")
		requireCode(t, err, wire.ErrUnknownTask)
	})
	t.Run("A2A_CROSS_CONTEXT_DENIED is never produced", func(t *testing.T) {
		assert.Zero(t, e.codes[wire.ErrCrossContextDenied.Code], "codes seen: %v", e.codes)
		assert.NotZero(t, e.codes[wire.ErrUnknownAgent.Code], "the strangers were refused")
	})
}

func TestRule3_OpenTaskCapPerRequesterSession(t *testing.T) {
	e := newEnv(t, broker.Config{MaxTasksPerContext: 3})
	a := e.register("s1", "a")
	a2 := e.register("s1", "a2")
	b := e.register("s2", "b")
	var tasks []*wire.Task
	for i := range 2 {
		tasks = append(tasks, a.mustSend("b", fmt.Sprint("task ", i)))
	}
	tasks = append(tasks, a2.mustSend("b", "from a2"))
	// The cap counts the session, not the agent.
	_, err := a.send("b", "one too many")
	requireCode(t, err, wire.ErrTaskLimit)
	_, err = a2.send("b", "one too many")
	requireCode(t, err, wire.ErrTaskLimit)
	// Another session is not affected, even towards the same assignee.
	c := e.register("s3", "c")
	c.mustSend("b", "fine")
	// Oneway messages count toward no cap.
	_, err = a.call(wire.MethodSend, map[string]any{"to": "b", "oneway": true, "message": text("ping")})
	require.NoError(t, err)
	// Settling a task frees its slot.
	_, err = b.update(tasks[0].ID, wire.StateCompleted, "done")
	require.NoError(t, err)
	a.mustSend("b", "now it fits")
}

func TestRule4_NamesAreUniqueAcrossTheHost(t *testing.T) {
	e := newEnv(t, broker.Config{})
	d1 := e.register("s1", "discussant")
	d2 := e.register("s2", "discussant")
	d3 := e.register("s3", "discussant")
	assert.Equal(t, "discussant", d1.id)
	assert.Equal(t, "discussant-2", d2.id)
	assert.Equal(t, "discussant-3", d3.id)
	assert.Equal(t, "discussant", d2.card.Name, "name stays as given")
	assert.Equal(t, "discussant-2", d2.card.AgentID)
	assert.Equal(t, "s2", d2.card.ContextID)

	t.Run("lowest free suffix after a deregister", func(t *testing.T) {
		require.NoError(t, d2.deregister())
		d4 := e.register("s4", "discussant")
		assert.Equal(t, "discussant-2", d4.id)
		d5 := e.register("s4", "discussant")
		assert.Equal(t, "discussant-4", d5.id)
	})
	t.Run("a card literally named like a suffix takes the next one", func(t *testing.T) {
		x := e.register("s5", "panel")
		lit := e.register("s5", "panel-2")
		y := e.register("s6", "panel")
		assert.Equal(t, []string{"panel", "panel-2", "panel-3"}, []string{x.id, lit.id, y.id})
	})
	t.Run("the same session also gets suffixes", func(t *testing.T) {
		x := e.register("s7", "twin")
		y := e.register("s7", "twin")
		assert.Equal(t, []string{"twin", "twin-2"}, []string{x.id, y.id})
	})
}

func TestRule4_ReRegisteringAnInstance(t *testing.T) {
	e := newEnv(t, broker.Config{})
	peer := e.register("s2", "peer")
	a := e.registerInstance("s1", "worker", "inst-1")
	task := peer.mustSend("worker", "job")
	e.event("s1") // created

	t.Run("live in the same session: replaced, same agentId, new token, tasks open", func(t *testing.T) {
		again := e.registerInstance("s1", "worker", "inst-1")
		assert.Equal(t, a.id, again.id)
		assert.NotEqual(t, a.token, again.token)
		_, err := a.get(task.ID)
		requireCode(t, err, wire.ErrUnauthorized)
		got, err := again.get(task.ID)
		require.NoError(t, err)
		assert.Equal(t, wire.StateSubmitted, got.Status.State)
		e.noEvent("s2")
		a = again
	})
	t.Run("live in another session: invalid params", func(t *testing.T) {
		_, err := e.call("s9", wire.MethodRegister, wire.RegisterParams{ContextID: "s9", Card: &wire.AgentCard{Name: "worker"}, InstanceID: "inst-1"})
		requireCode(t, err, wire.ErrInvalidParams)
	})
	t.Run("live, renamed: a new agentId", func(t *testing.T) {
		renamed := e.registerInstance("s1", "builder", "inst-1")
		assert.Equal(t, "builder", renamed.id)
		assert.Len(t, peer.list(), 1)
		got, err := renamed.get(task.ID)
		require.NoError(t, err)
		assert.Equal(t, task.ID, got.ID)
		a = renamed
	})
	t.Run("after deregister: access to its (now closed) tasks comes back", func(t *testing.T) {
		require.NoError(t, a.deregister())
		back := e.registerInstance("s1", "worker", "inst-1")
		got, err := back.get(task.ID)
		require.NoError(t, err)
		assert.Equal(t, wire.StateFailed, got.Status.State)
	})
}

func TestRule5_EventsGoOnlyToTheRecipientSession(t *testing.T) {
	e := newEnv(t, broker.Config{})
	req := e.register("s1", "discussant")
	bystander := e.register("s1", "bystander")
	asg := e.register("s2", "discussant")
	e.session("s3") // an idle session, listening
	_ = bystander

	task := req.mustSend("discussant-2", "share a fact")
	ev := e.event("s2")
	require.NotNil(t, ev.TaskEvent)
	assert.Equal(t, wire.EventCreated, ev.TaskEvent.Kind)
	assert.Equal(t, "discussant-2", ev.TaskEvent.Recipient)
	assert.Equal(t, "s2", ev.TaskEvent.RecipientContextID)
	assert.Equal(t, "s1", ev.TaskEvent.ContextID, "contextId is where the event comes from")
	assert.Equal(t, uint64(1), ev.TaskEvent.Seq)
	assert.Equal(t, e.broker.Epoch(), ev.TaskEvent.Epoch)
	assert.Nil(t, ev.TaskEvent.Task.History, "events carry the task without history")
	require.NotNil(t, ev.TaskEvent.Message)
	assert.Equal(t, "discussant", ev.TaskEvent.Message.From)
	assert.False(t, ev.TaskEvent.Final)
	e.noEvent("s1")
	e.noEvent("s3")

	_, err := asg.update(task.ID, wire.StateCompleted, "done")
	require.NoError(t, err)
	ev = e.event("s1")
	assert.Equal(t, "discussant", ev.TaskEvent.Recipient)
	assert.Equal(t, "s1", ev.TaskEvent.RecipientContextID)
	assert.Equal(t, "s2", ev.TaskEvent.ContextID)
	assert.Equal(t, uint64(1), ev.TaskEvent.Seq, "seq counts per recipient session")
	assert.True(t, ev.TaskEvent.Final)
	assert.Equal(t, wire.StateCompleted, ev.TaskEvent.Task.Status.State)
	e.noEvent("s2")
	e.noEvent("s3")

	t.Run("push", func(t *testing.T) {
		res, err := asg.call(wire.MethodSend, map[string]any{"to": "bystander", "oneway": true, "message": text("psst")})
		require.NoError(t, err)
		assert.JSONEq(t, `{"delivered":"bystander"}`, string(res))
		ev := e.event("s1")
		require.NotNil(t, ev.Push)
		assert.Equal(t, "bystander", ev.Push.Recipient)
		assert.Equal(t, "s1", ev.Push.RecipientContextID)
		assert.Equal(t, "s2", ev.Push.ContextID)
		assert.Equal(t, "discussant-2", ev.Push.From)
		assert.Equal(t, uint64(2), ev.Push.Seq)
		assert.Equal(t, "s2", ev.Push.Message.ContextID)
		e.noEvent("s2")
		e.noEvent("s3")
	})
}

func TestRule6_SettledDelegateIsDeregistered(t *testing.T) {
	e := newEnv(t, broker.Config{})
	a := e.register("s1", "a")
	b := e.register("s2", "b")
	asked := a.mustSend("b", "b works for a")
	e.event("s2")
	owed := b.mustSend("a", "a works for b")
	e.event("s1")
	done := a.mustSend("b", "already finished")
	e.event("s2")
	_, err := b.update(done.ID, wire.StateCompleted, "ok")
	require.NoError(t, err)
	e.event("s1")

	require.NoError(t, a.deregister())

	t.Run("the token stops working", func(t *testing.T) {
		_, err := a.get(asked.ID)
		requireCode(t, err, wire.ErrUnauthorized)
		requireCode(t, a.deregister(), wire.ErrUnauthorized)
	})
	t.Run("the other member hears of each open task", func(t *testing.T) {
		got := map[string]wire.State{}
		for range 2 {
			ev := e.event("s2")
			require.NotNil(t, ev.TaskEvent)
			assert.True(t, ev.TaskEvent.Final)
			assert.Equal(t, "s1", ev.TaskEvent.ContextID)
			got[ev.TaskEvent.TaskID] = ev.TaskEvent.Task.Status.State
		}
		assert.Equal(t, map[string]wire.State{asked.ID: wire.StateCanceled, owed.ID: wire.StateFailed}, got)
		e.noEvent("s2")
	})
	t.Run("the records stay", func(t *testing.T) {
		for id, want := range map[string]wire.State{asked.ID: wire.StateCanceled, owed.ID: wire.StateFailed, done.ID: wire.StateCompleted} {
			got, err := b.get(id)
			require.NoError(t, err)
			assert.Equal(t, want, got.Status.State)
		}
	})
	t.Run("it is no longer listed or addressable", func(t *testing.T) {
		assert.Empty(t, b.list())
		_, err := b.send("a", "anyone?")
		requireCode(t, err, wire.ErrUnknownAgent)
		_, err = b.send("", "anyone?")
		requireCode(t, err, wire.ErrNoPeers)
	})
}

func TestConsequence_CrossSessionRoundTrip(t *testing.T) {
	e := newEnv(t, broker.Config{})
	d1 := e.register("chat-1", "discussant")
	d2 := e.register("chat-2", "discussant")
	require.Equal(t, "discussant-2", d2.id)

	// Discovery across sessions.
	cards := d1.list()
	require.Len(t, cards, 1)
	assert.Equal(t, "discussant-2", cards[0].AgentID)
	assert.Equal(t, "chat-2", cards[0].ContextID)

	// Without to: no same-session peer, so the single other-session one.
	task := d1.mustSend("", "what is the capital of France?")
	assert.Equal(t, wire.StateSubmitted, task.Status.State)
	assert.Equal(t, "chat-1", task.ContextID)
	assert.Equal(t, "discussant", task.RequesterName)
	assert.Equal(t, "discussant-2", task.AgentName)
	assert.Equal(t, "chat-2", task.AgentContextID)
	require.Len(t, task.History, 1)
	assert.Equal(t, wire.RoleUser, task.History[0].Role)

	created := e.event("chat-2")
	assert.Equal(t, wire.EventCreated, created.TaskEvent.Kind)

	_, err := d2.update(task.ID, wire.StateWorking, "")
	require.NoError(t, err)
	assert.Equal(t, wire.StateWorking, e.event("chat-1").TaskEvent.Task.Status.State)

	_, err = d2.update(task.ID, wire.StateInputRequired, "which France?")
	require.NoError(t, err)
	ev := e.event("chat-1")
	assert.Equal(t, wire.StateInputRequired, ev.TaskEvent.Task.Status.State)
	assert.Equal(t, "which France?", *ev.TaskEvent.Message.Parts[0].Text)

	_, err = d1.reply(task.ID, "the country")
	require.NoError(t, err)
	ev = e.event("chat-2")
	assert.Equal(t, wire.EventMessage, ev.TaskEvent.Kind)
	assert.Equal(t, wire.StateInputRequired, ev.TaskEvent.Task.Status.State, "a message leaves the state alone")

	res, err := d2.call(wire.MethodUpdateTask, map[string]any{
		"taskId": task.ID, "state": "completed", "message": text("Paris"),
		"artifacts": []any{map[string]any{"name": "answer", "parts": []any{map[string]any{"kind": "data", "data": map[string]any{"city": "Paris"}}}}},
	})
	require.NoError(t, err)
	final := decodeTask(t, res)
	assert.Equal(t, wire.StateCompleted, final.Status.State)
	require.Len(t, final.Artifacts, 1)
	assert.NotEmpty(t, final.Artifacts[0].ArtifactID)
	var roles []wire.Role
	for _, m := range final.History {
		roles = append(roles, m.Role)
	}
	assert.Equal(t, []wire.Role{wire.RoleUser, wire.RoleAgent, wire.RoleUser, wire.RoleAgent}, roles,
		"the question, the agent's input request, the answer, the result")
	ev = e.event("chat-1")
	assert.True(t, ev.TaskEvent.Final)
	assert.Equal(t, "Paris", *ev.TaskEvent.Task.Status.Message.Parts[0].Text)
	e.noEvent("chat-1")
	e.noEvent("chat-2")
}

func TestConsequence_SameSessionCommonCaseUnchanged(t *testing.T) {
	e := newEnv(t, broker.Config{})
	a := e.register("s1", "lead")
	b := e.register("s1", "helper")
	e.register("s2", "elsewhere")
	task := a.mustSend("", "help me")
	assert.Equal(t, "helper", task.AgentName)
	ev := e.event("s1")
	assert.Equal(t, "helper", ev.TaskEvent.Recipient)
	_, err := b.update(task.ID, wire.StateCompleted, "helped")
	require.NoError(t, err)
	assert.Equal(t, "lead", e.event("s1").TaskEvent.Recipient)
	e.noEvent("s2")
}

func TestConsequence_NameReuseCannotReadAnOldTask(t *testing.T) {
	e := newEnv(t, broker.Config{})
	req := e.register("s1", "requester")
	old := e.register("s2", "discussant")
	task := req.mustSend("discussant", "private work")
	require.NoError(t, old.deregister())

	// A new delegate takes the freed name, in the same session or another.
	for _, s := range []string{"s2", "s3"} {
		newcomer := e.register(s, "discussant")
		require.Equal(t, "discussant", newcomer.id)
		_, err := newcomer.get(task.ID)
		requireCode(t, err, wire.ErrUnknownAgent)
		_, err = newcomer.reply(task.ID, "let me in")
		requireCode(t, err, wire.ErrUnknownAgent)
		_, err = newcomer.update(task.ID, wire.StateCompleted, "")
		requireCode(t, err, wire.ErrUnknownAgent)
		res, err := newcomer.call(wire.MethodListTasks, nil)
		require.NoError(t, err)
		assert.JSONEq(t, `{"tasks":[],"nextPageToken":""}`, string(res))
		require.NoError(t, newcomer.deregister())
	}
}

func TestLifecycle(t *testing.T) {
	e := newEnv(t, broker.Config{})
	req := e.register("s1", "req")
	asg := e.register("s2", "asg")

	t.Run("requester cannot update", func(t *testing.T) {
		task := req.mustSend("asg", "x")
		_, err := req.update(task.ID, wire.StateCompleted, "")
		requireCode(t, err, wire.ErrInvalidTransition)
	})
	t.Run("assignee cannot cancel", func(t *testing.T) {
		task := req.mustSend("asg", "x")
		_, err := asg.cancel(task.ID)
		requireCode(t, err, wire.ErrInvalidTransition)
	})
	t.Run("the same state again reports progress", func(t *testing.T) {
		task := req.mustSend("asg", "x")
		for _, msg := range []string{"10%", "50%"} {
			got, err := asg.update(task.ID, wire.StateWorking, msg)
			require.NoError(t, err)
			assert.Equal(t, msg, *got.Status.Message.Parts[0].Text)
		}
	})
	t.Run("states an update may not set", func(t *testing.T) {
		task := req.mustSend("asg", "x")
		for _, s := range []string{"submitted", "canceled", "done", ""} {
			_, err := asg.update(task.ID, wire.State(s), "")
			requireCode(t, err, wire.ErrInvalidParams)
		}
	})
	t.Run("terminal states admit no change", func(t *testing.T) {
		for _, end := range []wire.State{wire.StateCompleted, wire.StateFailed, wire.StateRejected, wire.StateCanceled} {
			t.Run(string(end), func(t *testing.T) {
				task := req.mustSend("asg", "x")
				var err error
				if end == wire.StateCanceled {
					_, err = req.cancel(task.ID)
				} else {
					_, err = asg.update(task.ID, end, "")
				}
				require.NoError(t, err)
				_, err = asg.update(task.ID, wire.StateWorking, "")
				requireCode(t, err, wire.ErrInvalidTransition)
				_, err = req.cancel(task.ID)
				requireCode(t, err, wire.ErrInvalidTransition)
				_, err = req.reply(task.ID, "hello?")
				requireCode(t, err, wire.ErrInvalidTransition)
				got, err := req.get(task.ID)
				require.NoError(t, err)
				assert.Equal(t, end, got.Status.State)
			})
		}
	})
	t.Run("send with taskId and to", func(t *testing.T) {
		task := req.mustSend("asg", "x")
		_, err := req.taskCall(wire.MethodSend, task.ID, map[string]any{"to": "asg", "message": text("to the other member")})
		require.NoError(t, err)
		_, err = req.taskCall(wire.MethodSend, task.ID, map[string]any{"to": "req", "message": text("to myself")})
		requireCode(t, err, wire.ErrInvalidParams)
		_, err = req.taskCall(wire.MethodSend, task.ID, map[string]any{"oneway": true, "message": text("oneway")})
		requireCode(t, err, wire.ErrInvalidParams)
	})
	t.Run("list by state and role", func(t *testing.T) {
		e := newEnv(t, broker.Config{})
		a := e.register("s1", "a")
		b := e.register("s2", "b")
		t1 := a.mustSend("b", "1")
		t2 := b.mustSend("a", "2")
		_, err := b.update(t1.ID, wire.StateCompleted, "")
		require.NoError(t, err)
		ids := func(p map[string]any) []string {
			res, err := a.call(wire.MethodListTasks, p)
			require.NoError(t, err)
			var r wire.ListTasksResult
			require.NoError(t, json.Unmarshal(res, &r))
			var out []string
			for _, task := range r.Tasks {
				out = append(out, task.ID)
			}
			return out
		}
		assert.Equal(t, []string{t1.ID, t2.ID}, ids(nil))
		assert.Equal(t, []string{t1.ID}, ids(map[string]any{"role": "requester"}))
		assert.Equal(t, []string{t2.ID}, ids(map[string]any{"role": "assignee"}))
		assert.Equal(t, []string{t1.ID}, ids(map[string]any{"state": "completed"}))
		_, err = a.call(wire.MethodListTasks, map[string]any{"role": "boss"})
		requireCode(t, err, wire.ErrInvalidParams)
		_, err = a.call(wire.MethodListTasks, map[string]any{"state": "sleeping"})
		requireCode(t, err, wire.ErrInvalidParams)
	})
}

func TestATaskCannotGrowWithoutBound(t *testing.T) {
	e := newEnv(t, broker.Config{MaxTaskBytes: 8 << 10})
	a := e.register("s1", "a")
	b := e.register("s2", "b")
	task := a.mustSend("b", "start")
	chunk := strings.Repeat("x", 1500)
	var err error
	n := 0
	for ; n < 20; n++ {
		if _, err = a.reply(task.ID, chunk); err != nil {
			break
		}
	}
	requireCode(t, err, wire.ErrInvalidParams)
	assert.Less(t, n, 8, "refused once the task holds about 8 KiB")
	// The task is intact and can still be closed.
	got, err := b.update(task.ID, wire.StateCompleted, "")
	require.NoError(t, err)
	assert.Len(t, got.History, n+1)
	_, err = a.send("b", strings.Repeat("y", 9<<10))
	requireCode(t, err, wire.ErrInvalidParams)
}
