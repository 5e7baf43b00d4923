package e2e_test

import (
	"context"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/a2aproject/a2a-go/v2/a2aclient/agentcard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/host"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/wire"
)

// bearer adds a token to every request, as an A2A client configured with
// the gateway's a2aToken does.
type bearer struct{ tok string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.tok)
	return http.DefaultTransport.RoundTrip(r)
}

func gwCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// joinHost joins the sidecar as the desktop host does: through its
// connection file.
func joinHost(t *testing.T, s *sidecar) *host.Host {
	h, err := host.Open(gwCtx(t), host.Config{Bus: host.NATS, ConnectionFile: s.connFile})
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() })
	return h
}

func spawn(t *testing.T, h *host.Host, session, name string) *runtime.Delegate {
	rt, err := h.Session(gwCtx(t), session)
	require.NoError(t, err)
	d, err := rt.Spawn(gwCtx(t), wire.AgentCard{Name: name, Description: "takes notes"})
	require.NoError(t, err)
	return d
}

// TestAnOfficialA2AClientReachesADelegateThroughServe is the gateway's
// scenario on a real `serve --a2a-listen 127.0.0.1:0`, with the official
// Go SDK: resolve a delegate's card, send it a message; the delegate's
// runtime wakes with an ordinary task, works on it with an artifact and
// completes it; the client sees the completed task and the stream each
// update in order.
func TestAnOfficialA2AClientReachesADelegateThroughServe(t *testing.T) {
	t.Parallel()
	s := startSidecar(t, "--a2a-listen", "127.0.0.1:0")
	require.NotEmpty(t, s.a2aURL, "the connection file names the gateway")
	require.NotEmpty(t, s.a2aToken)
	h := joinHost(t, s)
	d := spawn(t, h, "chat-1", "scribe")

	c, _ := gatewayClient(t, s, d.ID())
	defer c.Destroy()

	worked := make(chan error, 1)
	go func() {
		for n := 0; n < 2; {
			ev, err := d.Wait(gwCtx(t))
			if err != nil {
				worked <- err
				return
			}
			if ev.Task == nil || ev.Task.Kind != wire.EventCreated {
				continue
			}
			n++
			if _, err := d.Update(gwCtx(t), ev.Task.TaskID, wire.StateWorking, nil, wire.Artifact{Name: "notes", Parts: []wire.Part{wire.TextPart("seat 2 is free")}}); err != nil {
				worked <- err
				return
			}
			if _, err := d.Update(gwCtx(t), ev.Task.TaskID, wire.StateCompleted, &wire.Message{Parts: []wire.Part{wire.TextPart("done")}}); err != nil {
				worked <- err
				return
			}
		}
		worked <- nil
	}()

	res, err := c.SendMessage(gwCtx(t), &a2a.SendMessageRequest{Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("is seat 2 free?"))})
	require.NoError(t, err)
	task := res.(*a2a.Task)
	assert.Equal(t, a2a.TaskStateCompleted, task.Status.State)
	require.Len(t, task.Artifacts, 1)

	var kinds []string
	for ev, err := range c.SendStreamingMessage(gwCtx(t), &a2a.SendMessageRequest{Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("and seat 3?"))}) {
		require.NoError(t, err)
		switch v := ev.(type) {
		case *a2a.Task:
			kinds = append(kinds, "task:"+string(v.Status.State))
		case *a2a.TaskArtifactUpdateEvent:
			kinds = append(kinds, "artifact")
		case *a2a.TaskStatusUpdateEvent:
			kinds = append(kinds, "status:"+string(v.Status.State))
		}
	}
	assert.Equal(t, []string{"task:TASK_STATE_SUBMITTED", "status:TASK_STATE_WORKING", "artifact", "status:TASK_STATE_COMPLETED"}, kinds)
	require.NoError(t, <-worked)

	got, err := c.GetTask(gwCtx(t), &a2a.GetTaskRequest{ID: task.ID})
	require.NoError(t, err)
	assert.Equal(t, a2a.TaskStateCompleted, got.Status.State)
	list, err := c.ListTasks(gwCtx(t), &a2a.ListTasksRequest{})
	require.NoError(t, err)
	assert.Len(t, list.Tasks, 2)

	// A wrong token is 401.
	resp, err := (&http.Client{Transport: bearer{"wrong"}}).Get(s.a2aURL + "/agents")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

// TestTheGatewayChangesNoDelegatesView: agents.list and the choice of a
// send without to are the same with the gateway on and off.
func TestTheGatewayChangesNoDelegatesView(t *testing.T) {
	t.Parallel()
	view := func(args ...string) (peers []string, chosen string) {
		s := startSidecar(t, args...)
		h := joinHost(t, s)
		a := spawn(t, h, "chat-1", "discussant")
		b := spawn(t, h, "chat-2", "scribe")
		cards, err := a.Peers(gwCtx(t))
		require.NoError(t, err)
		for _, c := range cards {
			peers = append(peers, c.AgentID)
		}
		task, err := a.Send(gwCtx(t), "", wire.Message{Parts: []wire.Part{wire.TextPart("seat 2?")}}, nil)
		require.NoError(t, err)
		require.Equal(t, b.ID(), task.AgentName)
		return peers, task.AgentName
	}
	offPeers, offChosen := view()
	onPeers, onChosen := view("--a2a-listen", "127.0.0.1:0")
	assert.Equal(t, offPeers, onPeers)
	assert.Equal(t, offChosen, onChosen)
	assert.Equal(t, []string{"scribe"}, onPeers)
}

// TestAnOfficialA2AClientCancelsAndResubscribesThroughServe: on a real
// serve, a task the client starts without waiting; a subscription dropped
// after its first event and taken again loses nothing; the client cancels
// and the delegate hears of it; an agent that leaves is gone from
// /agents, and a send to it is refused with its a2a-bus code.
func TestAnOfficialA2AClientCancelsAndResubscribesThroughServe(t *testing.T) {
	t.Parallel()
	s := startSidecar(t, "--a2a-listen", "127.0.0.1:0")
	h := joinHost(t, s)
	d := spawn(t, h, "chat-1", "scribe")
	c, hc := gatewayClient(t, s, d.ID())
	defer c.Destroy()

	res, err := c.SendMessage(gwCtx(t), &a2a.SendMessageRequest{Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("take seat 2")), Config: &a2a.SendMessageConfig{ReturnImmediately: true}})
	require.NoError(t, err)
	task := res.(*a2a.Task)
	require.Equal(t, a2a.TaskStateSubmitted, task.Status.State)
	ev, err := d.Wait(gwCtx(t))
	require.NoError(t, err)
	require.Equal(t, string(task.ID), ev.Task.TaskID, "the delegate wakes with an ordinary task")

	// A subscription dropped after its first event.
	ctx, cancel := context.WithCancel(gwCtx(t))
	for ev, err := range c.SubscribeToTask(ctx, &a2a.SubscribeToTaskRequest{ID: task.ID}) {
		require.NoError(t, err)
		require.IsType(t, &a2a.Task{}, ev)
		break
	}
	cancel()
	_, err = d.Update(gwCtx(t), string(task.ID), wire.StateWorking, nil, wire.Artifact{Name: "half", Parts: []wire.Part{wire.TextPart("row 4")}})
	require.NoError(t, err)
	// Taken again: the task as it is now, with what happened meanwhile.
	for ev, err := range c.SubscribeToTask(gwCtx(t), &a2a.SubscribeToTaskRequest{ID: task.ID}) {
		require.NoError(t, err)
		snap := ev.(*a2a.Task)
		assert.Equal(t, a2a.TaskStateWorking, snap.Status.State)
		require.Len(t, snap.Artifacts, 1)
		break
	}
	got, err := c.GetTask(gwCtx(t), &a2a.GetTaskRequest{ID: task.ID})
	require.NoError(t, err)
	assert.Equal(t, a2a.TaskStateWorking, got.Status.State)

	canceled, err := c.CancelTask(gwCtx(t), &a2a.CancelTaskRequest{ID: task.ID})
	require.NoError(t, err)
	assert.Equal(t, a2a.TaskStateCanceled, canceled.Status.State)
	for {
		ev, err := d.Wait(gwCtx(t))
		require.NoError(t, err)
		if ev.Task != nil && ev.Task.Task.Status.State == wire.StateCanceled {
			break
		}
	}
	_, err = c.CancelTask(gwCtx(t), &a2a.CancelTaskRequest{ID: task.ID})
	assert.ErrorIs(t, err, a2a.ErrTaskNotCancelable)
	_, err = c.GetTask(gwCtx(t), &a2a.GetTaskRequest{ID: "no-such-task"})
	assert.ErrorIs(t, err, a2a.ErrTaskNotFound)

	require.NoError(t, d.Settle(gwCtx(t)))
	resp, err := hc.Get(s.a2aURL + "/agents/" + d.ID() + "/.well-known/agent-card.json")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "a deregistered agent's card is gone")
	_, err = c.SendMessage(gwCtx(t), &a2a.SendMessageRequest{Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("still there?"))})
	require.Error(t, err)
	assert.ErrorIs(t, err, a2a.ErrServerError)
	assert.Contains(t, err.Error(), "no live agent")
}

// TestTheGatewaysTasksOutliveARestart: tasks A2A clients started are the
// gateway agent's, whose instance id is fixed; after serve stops (cleanly
// or killed) and starts again on the same data dir, the clients read
// them all, and a clean stop cancels none of them.
func TestTheGatewaysTasksOutliveARestart(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			data := t.TempDir()
			s := startSidecar(t, "--a2a-listen", "127.0.0.1:0", "--data-dir", data)
			h := joinHost(t, s)
			d := spawn(t, h, "chat-1", "scribe")
			c, _ := gatewayClient(t, s, d.ID())
			now := &a2a.SendMessageConfig{ReturnImmediately: true}
			r1, err := c.SendMessage(gwCtx(t), &a2a.SendMessageRequest{Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("one")), Config: now})
			require.NoError(t, err)
			r2, err := c.SendMessage(gwCtx(t), &a2a.SendMessageRequest{Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("two")), Config: now})
			require.NoError(t, err)
			done, open := string(r1.(*a2a.Task).ID), string(r2.(*a2a.Task).ID)
			_, err = d.Update(gwCtx(t), done, wire.StateCompleted, &wire.Message{Parts: []wire.Part{wire.TextPart("the answer")}})
			require.NoError(t, err)
			_, err = d.Update(gwCtx(t), open, wire.StateWorking, nil)
			require.NoError(t, err)
			c.Destroy()
			require.NoError(t, s.cmd.Process.Signal(sig))
			<-s.done

			s2 := startSidecar(t, "--a2a-listen", "127.0.0.1:0", "--data-dir", data)
			h2 := joinHost(t, s2)
			// The same delegate comes back (by its instance id, as a
			// host's rejoin brings it), and gets its held name back.
			rt2, err := h2.Session(gwCtx(t), "chat-1")
			require.NoError(t, err)
			back, err := rt2.SpawnInstance(gwCtx(t), wire.AgentCard{Name: "scribe", Description: "takes notes"}, d.InstanceID())
			require.NoError(t, err)
			require.Equal(t, "scribe", back.ID())
			c2, _ := gatewayClient(t, s2, "scribe")
			defer c2.Destroy()
			got, err := c2.GetTask(gwCtx(t), &a2a.GetTaskRequest{ID: a2a.TaskID(done)})
			require.NoError(t, err, "a finished task's result survives")
			assert.Equal(t, a2a.TaskStateCompleted, got.Status.State)
			assert.Equal(t, "the answer", got.Status.Message.Parts[0].Text())
			got, err = c2.GetTask(gwCtx(t), &a2a.GetTaskRequest{ID: a2a.TaskID(open)})
			require.NoError(t, err, "an open task is still the clients'")
			assert.Equal(t, a2a.TaskStateWorking, got.Status.State, "the gateway's stop canceled nothing")
		})
	}
}

// gatewayClient resolves an agent's card on the sidecar's gateway and
// makes an official A2A client for it; hc is the HTTP client with the
// gateway's token.
func gatewayClient(t *testing.T, s *sidecar, agentID string) (c *a2aclient.Client, hc *http.Client) {
	t.Helper()
	hc = &http.Client{Transport: bearer{s.a2aToken}}
	card, err := agentcard.NewResolver(hc).Resolve(gwCtx(t), s.a2aURL+"/agents/"+agentID)
	require.NoError(t, err)
	c, err = a2aclient.NewFromCard(gwCtx(t), card, a2aclient.WithJSONRPCTransport(hc))
	require.NoError(t, err)
	return c, hc
}
