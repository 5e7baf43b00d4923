package gateway_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/a2aproject/a2a-go/v2/a2aclient/agentcard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/gateway"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/transport/fakebus"
	"github.com/a2a-bus/a2a-bus/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const token = "test-token"

type env struct {
	t    *testing.T
	bus  *fakebus.Bus
	base string
	http *http.Client
	g    *gateway.Gateway
}

// bearer adds the gateway's token to every request.
type bearer struct{ tok string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.tok)
	return http.DefaultTransport.RoundTrip(r)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newEnv(t *testing.T) *env { return newEnvWith(t, broker.Config{}) }

func (e *env) delegate(session, name string) *runtime.Delegate {
	sess, err := e.bus.Session(ctxT(e.t), session)
	require.NoError(e.t, err)
	rt, err := runtime.New(ctxT(e.t), sess, runtime.Config{})
	require.NoError(e.t, err)
	e.t.Cleanup(func() { rt.Close() })
	d, err := rt.Spawn(ctxT(e.t), wire.AgentCard{Name: name, Description: "takes notes", Skills: []wire.Skill{{ID: "notes", Name: "notes"}}})
	require.NoError(e.t, err)
	return d
}

// client resolves the agent's card as an A2A client does, and makes a
// client from it.
func (e *env) client(agentID string) (*a2a.AgentCard, *a2aclient.Client) {
	card, err := agentcard.NewResolver(e.http).Resolve(ctxT(e.t), e.base+"/agents/"+agentID)
	require.NoError(e.t, err)
	c, err := a2aclient.NewFromCard(ctxT(e.t), card, a2aclient.WithJSONRPCTransport(e.http))
	require.NoError(e.t, err)
	e.t.Cleanup(func() { c.Destroy() })
	return card, c
}

// work is the delegate's side: each task it is given goes to working with
// an artifact, then completes.
func work(t *testing.T, d *runtime.Delegate, tasks int) chan error {
	done := make(chan error, 1)
	go func() {
		for n := 0; n < tasks; {
			ev, err := d.Wait(ctxT(t))
			if err != nil {
				done <- err
				return
			}
			if ev.Task == nil || ev.Task.Kind != wire.EventCreated {
				continue
			}
			n++
			id := ev.Task.TaskID
			if _, err := d.Update(ctxT(t), id, wire.StateWorking, nil, wire.Artifact{Name: "notes", Parts: []wire.Part{wire.TextPart("seat 2 is free")}}); err != nil {
				done <- err
				return
			}
			if _, err := d.Update(ctxT(t), id, wire.StateCompleted, &wire.Message{Parts: []wire.Part{wire.TextPart("done")}}); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	return done
}

func userMessage(text string) *a2a.Message {
	return a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(text))
}

func TestAnA2AClientHandsADelegateATask(t *testing.T) {
	e := newEnv(t)
	d := e.delegate("chat-1", "scribe")
	card, c := e.client(d.ID())
	assert.Equal(t, "scribe", card.Name)
	require.Len(t, card.SupportedInterfaces, 1)
	assert.Equal(t, a2a.ProtocolVersion("1.0"), card.SupportedInterfaces[0].ProtocolVersion)
	assert.True(t, card.Capabilities.Streaming)
	assert.False(t, card.Capabilities.PushNotifications)
	assert.Contains(t, card.SecuritySchemes, a2a.SecuritySchemeName("bearer"))
	require.Len(t, card.Skills, 1)

	done := work(t, d, 2)
	msg := userMessage("is seat 2 free?")
	msg.ContextID = "client-ctx-1"
	res, err := c.SendMessage(ctxT(t), &a2a.SendMessageRequest{Message: msg})
	require.NoError(t, err)
	task, ok := res.(*a2a.Task)
	require.True(t, ok, "a task, got %T", res)
	assert.Equal(t, a2a.TaskStateCompleted, task.Status.State, "the send blocks until the task ends")
	assert.Equal(t, "client-ctx-1", task.ContextID, "the client's own contextId comes back")
	require.Len(t, task.Artifacts, 1)
	assert.Equal(t, "seat 2 is free", task.Artifacts[0].Parts[0].Text())
	bus := task.Metadata[gateway.MetaKey].(map[string]any)
	assert.Equal(t, d.ID(), bus["agentName"])
	assert.Equal(t, "chat-1", bus["agentContextId"])
	require.Len(t, task.History, 2)
	assert.Equal(t, a2a.MessageRoleUser, task.History[0].Role)
	assert.Equal(t, a2a.MessageRoleAgent, task.History[1].Role)

	// The stream: the task, then each update in order, closed at the end.
	var kinds []string
	for ev, err := range c.SendStreamingMessage(ctxT(t), &a2a.SendMessageRequest{Message: userMessage("and seat 3?")}) {
		require.NoError(t, err)
		switch v := ev.(type) {
		case *a2a.Task:
			kinds = append(kinds, "task:"+string(v.Status.State))
		case *a2a.TaskArtifactUpdateEvent:
			kinds = append(kinds, "artifact:"+v.Artifact.Parts[0].Text())
		case *a2a.TaskStatusUpdateEvent:
			kinds = append(kinds, "status:"+string(v.Status.State))
		}
	}
	assert.Equal(t, []string{"task:TASK_STATE_SUBMITTED", "status:TASK_STATE_WORKING", "artifact:seat 2 is free", "status:TASK_STATE_COMPLETED"}, kinds)
	require.NoError(t, <-done)

	// GetTask with historyLength, ListTasks.
	one := 1
	got, err := c.GetTask(ctxT(t), &a2a.GetTaskRequest{ID: task.ID, HistoryLength: &one})
	require.NoError(t, err)
	require.Len(t, got.History, 1)
	assert.Equal(t, "done", got.History[0].Parts[0].Text())
	list, err := c.ListTasks(ctxT(t), &a2a.ListTasksRequest{})
	require.NoError(t, err)
	assert.Len(t, list.Tasks, 2)
	list, err = c.ListTasks(ctxT(t), &a2a.ListTasksRequest{ContextID: "client-ctx-1"})
	require.NoError(t, err)
	require.Len(t, list.Tasks, 1)
	assert.Equal(t, task.ID, list.Tasks[0].ID)

	// An unknown task is TaskNotFound; a task that ended cannot be canceled.
	_, err = c.GetTask(ctxT(t), &a2a.GetTaskRequest{ID: "nope"})
	assert.ErrorIs(t, err, a2a.ErrTaskNotFound)
	_, err = c.CancelTask(ctxT(t), &a2a.CancelTaskRequest{ID: task.ID})
	assert.ErrorIs(t, err, a2a.ErrTaskNotCancelable)
}

func TestCancelAndASubscriptionAfterADroppedStream(t *testing.T) {
	e := newEnv(t)
	d := e.delegate("chat-1", "scribe")
	_, c := e.client(d.ID())

	res, err := c.SendMessage(ctxT(t), &a2a.SendMessageRequest{Message: userMessage("take seat 2"), Config: &a2a.SendMessageConfig{ReturnImmediately: true}})
	require.NoError(t, err)
	task := res.(*a2a.Task)
	assert.Equal(t, a2a.TaskStateSubmitted, task.Status.State)
	ev, err := d.Wait(ctxT(t))
	require.NoError(t, err)
	require.Equal(t, string(task.ID), ev.Task.TaskID, "the delegate wakes with an ordinary task")

	// A stream dropped after its first event.
	ctx, cancel := context.WithCancel(ctxT(t))
	for ev, err := range c.SubscribeToTask(ctx, &a2a.SubscribeToTaskRequest{ID: task.ID}) {
		require.NoError(t, err)
		_, isTask := ev.(*a2a.Task)
		require.True(t, isTask, "a subscription starts with the task")
		break
	}
	cancel()
	// Meanwhile the delegate works.
	_, err = d.Update(ctxT(t), string(task.ID), wire.StateWorking, nil, wire.Artifact{Name: "a", Parts: []wire.Part{wire.TextPart("half")}})
	require.NoError(t, err)
	// Subscribing again loses nothing: the task as it is, then what follows.
	var seen []a2a.Event
	sub := c.SubscribeToTask(ctxT(t), &a2a.SubscribeToTaskRequest{ID: task.ID})
	next, stop := iterPull(sub)
	defer stop()
	first, err := next()
	require.NoError(t, err)
	snap := first.(*a2a.Task)
	assert.Equal(t, a2a.TaskStateWorking, snap.Status.State)
	require.Len(t, snap.Artifacts, 1)
	// The stream subscribed before it read the task: a change made now
	// follows the snapshot, whether or not the client reads yet.
	_, err = d.Update(ctxT(t), string(task.ID), wire.StateInputRequired, &wire.Message{Parts: []wire.Part{wire.TextPart("which row?")}})
	require.NoError(t, err)
	for {
		ev, err := next()
		if err != nil || ev == nil {
			break
		}
		seen = append(seen, ev)
	}
	require.NotEmpty(t, seen)
	last := seen[len(seen)-1].(*a2a.TaskStatusUpdateEvent)
	assert.Equal(t, a2a.TaskStateInputRequired, last.Status.State)

	// The client answers; the delegate gets the message; the client cancels.
	_, err = c.SendMessage(ctxT(t), &a2a.SendMessageRequest{Message: &a2a.Message{ID: a2a.NewMessageID(), Role: a2a.MessageRoleUser, TaskID: task.ID, Parts: a2a.ContentParts{a2a.NewTextPart("row 4")}}, Config: &a2a.SendMessageConfig{ReturnImmediately: true}})
	require.NoError(t, err)
	for {
		ev, err := d.Wait(ctxT(t))
		require.NoError(t, err)
		if ev.Task != nil && ev.Task.Kind == wire.EventMessage {
			assert.Equal(t, "row 4", *ev.Task.Message.Parts[0].Text)
			break
		}
	}
	canceled, err := c.CancelTask(ctxT(t), &a2a.CancelTaskRequest{ID: task.ID})
	require.NoError(t, err)
	assert.Equal(t, a2a.TaskStateCanceled, canceled.Status.State)
	// A subscription to a task that ended is refused, as the spec has it.
	for _, err := range c.SubscribeToTask(ctxT(t), &a2a.SubscribeToTaskRequest{ID: task.ID}) {
		assert.ErrorIs(t, err, a2a.ErrUnsupportedOperation)
		break
	}
}

// iterPull is iter.Pull2 that returns (nil, nil) at the end.
func iterPull(seq func(func(a2a.Event, error) bool)) (func() (a2a.Event, error), func()) {
	ch := make(chan struct {
		ev  a2a.Event
		err error
	})
	stopc := make(chan struct{})
	go func() {
		defer close(ch)
		for ev, err := range seq {
			select {
			case ch <- struct {
				ev  a2a.Event
				err error
			}{ev, err}:
			case <-stopc:
				return
			}
		}
	}()
	return func() (a2a.Event, error) {
			v, ok := <-ch
			if !ok {
				return nil, nil
			}
			return v.ev, v.err
		}, func() {
			close(stopc)
			for range ch {
			}
		}
}

func TestTheGatewayGuardsItsDoor(t *testing.T) {
	e := newEnv(t)
	d := e.delegate("chat-1", "scribe")
	other := e.delegate("chat-2", "critic")

	for _, auth := range []string{"", "Bearer wrong", "Basic " + token, "Bearer" + token} {
		req, _ := http.NewRequest("GET", e.base+"/agents", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "Authorization %q", auth)
	}
	resp, err := e.http.Get(e.base + "/agents/" + d.ID() + "/.well-known/agent-card.json")
	require.NoError(t, err)
	var raw struct {
		Capabilities map[string]any `json:"capabilities"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&raw))
	resp.Body.Close()
	assert.Equal(t, map[string]any{"streaming": true, "pushNotifications": false}, raw.Capabilities, "both capabilities are named")

	resp, err = e.http.Get(e.base + "/agents/nobody/.well-known/agent-card.json")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)

	agents := func() []string {
		resp, err := e.http.Get(e.base + "/agents")
		require.NoError(t, err)
		defer resp.Body.Close()
		var l struct{ Agents []gateway.AgentSummary }
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&l))
		var ids []string
		for _, a := range l.Agents {
			ids = append(ids, a.AgentID)
		}
		slices.Sort(ids)
		return ids
	}
	assert.Equal(t, []string{other.ID(), d.ID()}, agents())
	require.NoError(t, other.Settle(ctxT(t)))
	assert.Equal(t, []string{d.ID()}, agents(), "a deregistered agent is gone")

	// The delegates do not see the gateway.
	peers, err := d.Peers(ctxT(t))
	require.NoError(t, err)
	assert.Empty(t, peers, "the gateway's agent is hidden")

	// A send to an agent that is not live is refused with its a2a-bus code.
	_, c := e.client(d.ID())
	require.NoError(t, d.Settle(ctxT(t)))
	_, err = c.SendMessage(ctxT(t), &a2a.SendMessageRequest{Message: userMessage("hello?")})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no live agent")
}
