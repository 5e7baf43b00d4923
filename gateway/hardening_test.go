package gateway_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/gateway"
	"github.com/a2a-bus/a2a-bus/transport/fakebus"
	"github.com/a2a-bus/a2a-bus/wire"
)

// The tests below come from a hostile review of the gateway: each failed
// before its fix.

func newEnvWith(t *testing.T, cfg broker.Config) *env { return newGateway(t, cfg, gateway.Config{}) }

// newGateway is a gateway over a real broker on the fake bus. Its token,
// base URL and version are the test's; given Clients, the broker serves
// their host methods, as serve wires them.
func newGateway(t *testing.T, bcfg broker.Config, gcfg gateway.Config) *env {
	bus := fakebus.New(fakebus.Config{})
	bcfg.HiddenSessions = []string{gateway.DefaultSession}
	if gcfg.Clients != nil {
		bcfg.OwnedInstances, gcfg.Instance = []string{"gw-instance"}, "gw-instance"
		bcfg.HostMethods = gcfg.Clients.HostMethods()
	}
	b, err := broker.New(context.Background(), bus, bcfg)
	require.NoError(t, err)
	var h http.Handler
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, r) }))
	gcfg.Token, gcfg.BaseURL, gcfg.Version = token, srv.URL, "test"
	g, err := gateway.New(ctxT(t), bus, gcfg)
	require.NoError(t, err)
	h = g.Handler()
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		g.Close()
		bus.Close()
		b.Close()
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	})
	return &env{t: t, bus: bus, base: srv.URL, http: &http.Client{Transport: bearer{token}}, g: g}
}

func within(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// A client retries SendMessage with the same messageId and no contextId
// (what the SDKs send by default): the same task, not -32602.
func TestARetriedSendWithoutAContextIDIsTheSameTask(t *testing.T) {
	e := newEnv(t)
	d := e.delegate("chat-1", "scribe")
	_, c := e.client(d.ID())
	req := &a2a.SendMessageRequest{Message: userMessage("take seat 2"), Config: &a2a.SendMessageConfig{ReturnImmediately: true}}
	r1, err := c.SendMessage(ctxT(t), req)
	require.NoError(t, err)
	r2, err := c.SendMessage(ctxT(t), req)
	require.NoError(t, err, "a retry with the same messageId returns the first task")
	assert.Equal(t, r1.(*a2a.Task).ID, r2.(*a2a.Task).ID)
	assert.Equal(t, string(r1.(*a2a.Task).ID), r1.(*a2a.Task).ContextID, "without one, the task's id is its contextId")
}

// A blocking reply whose first attempt lost its answer, retried after the
// agent already asked its next question, returns that question.
func TestARetriedReplyReturnsTheTaskAsItSettled(t *testing.T) {
	e := newEnv(t)
	d := e.delegate("chat-1", "scribe")
	_, c := e.client(d.ID())
	res, err := c.SendMessage(ctxT(t), &a2a.SendMessageRequest{Message: userMessage("book"), Config: &a2a.SendMessageConfig{ReturnImmediately: true}})
	require.NoError(t, err)
	id := string(res.(*a2a.Task).ID)
	_, err = d.Update(ctxT(t), id, wire.StateInputRequired, &wire.Message{Parts: []wire.Part{wire.TextPart("which row?")}})
	require.NoError(t, err)
	reply := &a2a.SendMessageRequest{Message: &a2a.Message{ID: a2a.NewMessageID(), Role: a2a.MessageRoleUser, TaskID: a2a.TaskID(id), Parts: a2a.ContentParts{a2a.NewTextPart("row 4")}}}
	_, err = c.SendMessage(within(t, 200*time.Millisecond), reply)
	require.Error(t, err, "the first attempt gives up")
	_, err = d.Update(ctxT(t), id, wire.StateInputRequired, &wire.Message{Parts: []wire.Part{wire.TextPart("aisle or window?")}})
	require.NoError(t, err)
	got, err := c.SendMessage(within(t, 3*time.Second), reply)
	require.NoError(t, err, "the retry answers at once")
	task := got.(*a2a.Task)
	assert.Equal(t, a2a.TaskStateInputRequired, task.Status.State)
	assert.Equal(t, "aisle or window?", task.Status.Message.Parts[0].Text())
}

// Changes in the same millisecond each reach the stream: the broker's
// status timestamps strictly increase (a fixed clock makes it certain).
func TestChangesOfOneMillisecondEachReachTheStream(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e := newEnvWith(t, broker.Config{Now: func() time.Time { return now }})
	d := e.delegate("chat-1", "scribe")
	_, c := e.client(d.ID())
	go func() {
		for {
			ev, err := d.Wait(ctxT(t))
			if err != nil {
				return
			}
			if ev.Task != nil && ev.Task.Kind == wire.EventCreated {
				id := ev.Task.TaskID
				d.Update(ctxT(t), id, wire.StateWorking, &wire.Message{Parts: []wire.Part{wire.TextPart("step 1")}})
				d.Update(ctxT(t), id, wire.StateWorking, &wire.Message{Parts: []wire.Part{wire.TextPart("step 2")}})
				d.Update(ctxT(t), id, wire.StateCompleted, &wire.Message{Parts: []wire.Part{wire.TextPart("done")}})
				return
			}
		}
	}()
	var got []string
	for ev, err := range c.SendStreamingMessage(within(t, 10*time.Second), &a2a.SendMessageRequest{Message: userMessage("go")}) {
		require.NoError(t, err)
		if s, ok := ev.(*a2a.TaskStatusUpdateEvent); ok {
			got = append(got, string(s.Status.State)+":"+s.Status.Message.Parts[0].Text())
		}
	}
	assert.Equal(t, []string{"TASK_STATE_WORKING:step 1", "TASK_STATE_WORKING:step 2", "TASK_STATE_COMPLETED:done"}, got)
}

// A task between two delegates is, to a gateway client, no task at all:
// TaskNotFound, as for an id that does not exist, not a server error
// that tells it exists.
func TestAnotherAgentsTaskIsNotFound(t *testing.T) {
	e := newEnv(t)
	a := e.delegate("chat-1", "scribe")
	b := e.delegate("chat-2", "critic")
	task, err := a.Send(ctxT(t), b.ID(), wire.Message{Parts: []wire.Part{wire.TextPart("private")}}, nil)
	require.NoError(t, err)
	_, c := e.client(b.ID())
	_, err = c.GetTask(ctxT(t), &a2a.GetTaskRequest{ID: a2a.TaskID(task.ID)})
	assert.ErrorIs(t, err, a2a.ErrTaskNotFound)
	_, err = c.CancelTask(ctxT(t), &a2a.CancelTaskRequest{ID: a2a.TaskID(task.ID)})
	assert.ErrorIs(t, err, a2a.ErrTaskNotFound)
	// Nor can a delegate hand the gateway's agent a task.
	_, err = a.Send(ctxT(t), "a2a-gateway", wire.Message{Parts: []wire.Part{wire.TextPart("for the gateway")}}, nil)
	assert.ErrorIs(t, err, wire.ErrUnknownAgent)
}

// A stranger's connection does not stay: a 401 closes it, and the
// scheme's case does not matter to a client with the token.
func TestAStrangersConnectionIsClosed(t *testing.T) {
	e := newEnv(t)
	req, _ := http.NewRequest("GET", e.base+"/agents", nil)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assert.True(t, resp.Close, "the server closes a stranger's connection")
	req.Header.Set("Authorization", "bearer "+token)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the scheme is case-insensitive (RFC 7235)")
}
