package gateway_test

import (
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/gateway"
	"github.com/a2a-bus/a2a-bus/wire"
)

// TestReadsRideOutALostLink: while the gateway's link to the broker is
// down (a cut connection being made again), a client's reads wait for it
// instead of failing, and a stream open meanwhile goes on: a cut costs
// the gateway's clients nothing they can see.
func TestReadsRideOutALostLink(t *testing.T) {
	e := newEnv(t)
	d := e.delegate("chat-1", "scribe")
	_, c := e.client(d.ID())
	res, err := c.SendMessage(ctxT(t), &a2a.SendMessageRequest{Message: userMessage("take notes"), Config: &a2a.SendMessageConfig{ReturnImmediately: true}})
	require.NoError(t, err)
	task := res.(*a2a.Task)

	e.bus.Disconnect(gateway.DefaultSession)
	back := time.AfterFunc(300*time.Millisecond, func() { e.bus.Reconnect(gateway.DefaultSession) })
	defer back.Stop()
	got, err := c.GetTask(ctxT(t), &a2a.GetTaskRequest{ID: task.ID})
	require.NoError(t, err, "a read made while the link is down is answered once it is back")
	assert.Equal(t, task.ID, got.ID)
	list, err := c.ListTasks(ctxT(t), &a2a.ListTasksRequest{})
	require.NoError(t, err)
	assert.Len(t, list.Tasks, 1)

	// A stream open across a second cut sees the task end.
	states := make(chan a2a.TaskState, 8)
	go func() {
		defer close(states)
		for ev, err := range c.SubscribeToTask(ctxT(t), &a2a.SubscribeToTaskRequest{ID: task.ID}) {
			if err != nil {
				t.Logf("the stream ended: %v", err)
				return
			}
			switch v := ev.(type) {
			case *a2a.Task:
				states <- v.Status.State
			case *a2a.TaskStatusUpdateEvent:
				states <- v.Status.State
			}
		}
	}()
	require.Equal(t, a2a.TaskStateSubmitted, <-states)
	e.bus.Disconnect(gateway.DefaultSession)
	_, err = d.Update(ctxT(t), string(task.ID), wire.StateCompleted, &wire.Message{Parts: []wire.Part{wire.TextPart("done")}})
	require.NoError(t, err)
	time.AfterFunc(300*time.Millisecond, func() { e.bus.Reconnect(gateway.DefaultSession) })
	var last a2a.TaskState
	for st := range states {
		last = st
	}
	assert.Equal(t, a2a.TaskStateCompleted, last, "the stream open across the cut saw the task end")
}
