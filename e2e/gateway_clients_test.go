package e2e_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/a2aproject/a2a-go/v2/a2aclient/agentcard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/gateway"
	"github.com/a2a-bus/a2a-bus/wire"
)

// TestGatewayClientsWithTheirOwnCredentials: on a real serve, the host
// issues two A2A clients credentials of their own (a host method on the
// NATS host credential). Through the official Go SDK, each sees only its
// own task, cannot read or cancel the other's, and has its own cap (here
// --max-tasks-per-context 1); the connection file's token is a third,
// separate client. Without --a2a-listen the host method is not served.
func TestGatewayClientsWithTheirOwnCredentials(t *testing.T) {
	t.Parallel()
	s := startSidecar(t, "--a2a-listen", "127.0.0.1:0", "--max-tasks-per-context", "1")
	d := spawn(t, joinHost(t, s), "chat-1", "scribe")
	issue := func(label string) gateway.ClientCredential {
		raw, err := s.hostCall(wire.MethodGatewayClientIssue, gateway.IssueParams{Label: label})
		require.NoError(t, err)
		var cred gateway.ClientCredential
		require.NoError(t, json.Unmarshal(raw, &cred))
		return cred
	}
	as := func(tok string) *a2aclient.Client {
		hc := &http.Client{Transport: bearer{tok}}
		card, err := agentcard.NewResolver(hc).Resolve(gwCtx(t), s.a2aURL+"/agents/"+d.ID())
		require.NoError(t, err)
		c, err := a2aclient.NewFromCard(gwCtx(t), card, a2aclient.WithJSONRPCTransport(hc))
		require.NoError(t, err)
		t.Cleanup(func() { c.Destroy() })
		return c
	}
	send := func(c *a2aclient.Client, text string) (*a2a.Task, error) {
		res, err := c.SendMessage(gwCtx(t), &a2a.SendMessageRequest{Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(text)),
			Config: &a2a.SendMessageConfig{ReturnImmediately: true}})
		if err != nil {
			return nil, err
		}
		return res.(*a2a.Task), nil
	}
	alice, bob := as(issue("alice").Token), as(issue("bob").Token)
	byDefault := as(s.a2aToken)
	ta, err := send(alice, "alice's")
	require.NoError(t, err)
	tb, err := send(bob, "bob's: alice's task holds no slot of his")
	require.NoError(t, err)
	_, err = send(byDefault, "the default client's")
	require.NoError(t, err)
	_, err = send(alice, "alice's second")
	require.Error(t, err, "alice is at her cap of 1")

	list, err := alice.ListTasks(gwCtx(t), &a2a.ListTasksRequest{})
	require.NoError(t, err)
	require.Len(t, list.Tasks, 1)
	assert.Equal(t, ta.ID, list.Tasks[0].ID)
	_, err = alice.GetTask(gwCtx(t), &a2a.GetTaskRequest{ID: tb.ID})
	assert.ErrorIs(t, err, a2a.ErrTaskNotFound, "alice reads bob's task")
	_, err = alice.CancelTask(gwCtx(t), &a2a.CancelTaskRequest{ID: tb.ID})
	assert.ErrorIs(t, err, a2a.ErrTaskNotFound, "alice cancels bob's task")
	got, err := bob.GetTask(gwCtx(t), &a2a.GetTaskRequest{ID: tb.ID})
	require.NoError(t, err)
	assert.Equal(t, a2a.TaskStateSubmitted, got.Status.State, "bob's task is as he left it")

	plain := startSidecar(t)
	_, err = plain.hostCall(wire.MethodGatewayClientIssue, gateway.IssueParams{})
	assert.ErrorIs(t, err, wire.ErrMethodNotFound, "no gateway, no gateway clients")
}
