package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/a2aproject/a2a-go/v2/a2aclient/agentcard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/gateway"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/wire"
)

// clientsEnv is a gateway with client credentials, over a real broker on
// the fake bus, as serve wires them: the broker serves the host methods
// that issue them.
type clientsEnv struct{ *env }

func newClientsEnv(t *testing.T, bcfg broker.Config, gcfg gateway.Config) *clientsEnv {
	gcfg.Clients = gateway.NewClients()
	return &clientsEnv{newGateway(t, bcfg, gcfg)}
}

// issue has the host issue a client credential.
func (e *clientsEnv) issue(label string) gateway.ClientCredential {
	raw, err := e.bus.CallHost(ctxT(e.t), wire.MethodGatewayClientIssue, gateway.IssueParams{Label: label})
	require.NoError(e.t, err)
	var cred gateway.ClientCredential
	require.NoError(e.t, json.Unmarshal(raw, &cred))
	require.NotEmpty(e.t, cred.Token)
	require.NotEmpty(e.t, cred.ClientID)
	return cred
}

// clientAs is an A2A client of the agent, with that bearer token.
func (e *clientsEnv) clientAs(tok, agentID string) *a2aclient.Client {
	hc := &http.Client{Transport: bearer{tok}}
	card, err := agentcard.NewResolver(hc).Resolve(ctxT(e.t), e.base+"/agents/"+agentID)
	require.NoError(e.t, err)
	c, err := a2aclient.NewFromCard(ctxT(e.t), card, a2aclient.WithJSONRPCTransport(hc))
	require.NoError(e.t, err)
	e.t.Cleanup(func() { c.Destroy() })
	return c
}

func sendNow(t *testing.T, c *a2aclient.Client, text string) (*a2a.Task, error) {
	res, err := c.SendMessage(ctxT(t), &a2a.SendMessageRequest{Message: userMessage(text), Config: &a2a.SendMessageConfig{ReturnImmediately: true}})
	if err != nil {
		return nil, err
	}
	return res.(*a2a.Task), nil
}

// TestClientsAreToldApart: two clients with credentials of their own, and
// the default token's, each see only their own tasks, cannot read or
// cancel another's, and do not share a cap: one that filled its own can
// still be served beside the others.
func TestClientsAreToldApart(t *testing.T) {
	e := newClientsEnv(t, broker.Config{MaxTasksPerContext: 2}, gateway.Config{})
	d := e.delegate("chat-1", "scribe")
	alice, bob := e.issue("alice"), e.issue("bob")
	ca, cb, cd := e.clientAs(alice.Token, d.ID()), e.clientAs(bob.Token, d.ID()), e.clientAs(token, d.ID())

	ta, err := sendNow(t, ca, "alice's first")
	require.NoError(t, err)
	tb, err := sendNow(t, cb, "bob's first")
	require.NoError(t, err)
	td, err := sendNow(t, cd, "the default client's")
	require.NoError(t, err)

	for _, c := range []struct {
		name   string
		c      *a2aclient.Client
		own    a2a.TaskID
		others []a2a.TaskID
	}{{"alice", ca, ta.ID, []a2a.TaskID{tb.ID, td.ID}}, {"bob", cb, tb.ID, []a2a.TaskID{ta.ID, td.ID}}, {"default", cd, td.ID, []a2a.TaskID{ta.ID, tb.ID}}} {
		list, err := c.c.ListTasks(ctxT(t), &a2a.ListTasksRequest{})
		require.NoError(t, err, c.name)
		require.Len(t, list.Tasks, 1, "%s lists its own task only", c.name)
		assert.Equal(t, c.own, list.Tasks[0].ID, c.name)
		for _, other := range c.others {
			_, err := c.c.GetTask(ctxT(t), &a2a.GetTaskRequest{ID: other})
			assert.ErrorIs(t, err, a2a.ErrTaskNotFound, "%s reads another client's task", c.name)
			_, err = c.c.CancelTask(ctxT(t), &a2a.CancelTaskRequest{ID: other})
			assert.ErrorIs(t, err, a2a.ErrTaskNotFound, "%s cancels another client's task", c.name)
		}
	}

	// Alice fills her cap of 2; Bob and the default client are served.
	_, err = sendNow(t, ca, "alice's second")
	require.NoError(t, err)
	_, err = sendNow(t, ca, "alice's third")
	require.Error(t, err, "alice is over her own cap")
	_, err = sendNow(t, cb, "bob's second")
	require.NoError(t, err, "bob has a cap of his own")
	_, err = sendNow(t, cd, "the default client's second")
	require.NoError(t, err, "so has the default client")

	// The task's requester is the client's own agent, under the
	// gateway's session.
	got, err := d.Task(ctxT(t), string(ta.ID))
	require.NoError(t, err)
	assert.Equal(t, gateway.DefaultSession+"/"+alice.ClientID, got.ContextID)
}

// TestARevokedClientIsRefused: after a2a.gateway.clients.revoke, the
// client's token is refused; an unknown id is said so.
func TestARevokedClientIsRefused(t *testing.T) {
	e := newClientsEnv(t, broker.Config{}, gateway.Config{})
	d := e.delegate("chat-1", "scribe")
	cred := e.issue("")
	c := e.clientAs(cred.Token, d.ID())
	_, err := sendNow(t, c, "before")
	require.NoError(t, err)

	raw, err := e.bus.CallHost(ctxT(t), wire.MethodGatewayClientRevoke, gateway.RevokeParams{ClientID: cred.ClientID})
	require.NoError(t, err)
	assert.JSONEq(t, `{"revoked":true}`, string(raw))
	req, err := http.NewRequestWithContext(ctxT(t), http.MethodGet, e.base+"/agents", nil)
	require.NoError(t, err)
	resp, err := (&http.Client{Transport: bearer{cred.Token}}).Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	raw, err = e.bus.CallHost(ctxT(t), wire.MethodGatewayClientRevoke, gateway.RevokeParams{ClientID: cred.ClientID})
	require.NoError(t, err)
	assert.JSONEq(t, `{"revoked":false}`, string(raw))
	_, err = e.bus.CallHost(ctxT(t), wire.MethodGatewayClientRevoke, gateway.RevokeParams{})
	assert.ErrorIs(t, err, wire.ErrInvalidParams)
}

// TestAnAbandonedTaskEnds: a client's blocking send whose connection
// closes, to a delegate that never answers, leaves a task that holds a
// slot of the client's cap; once AbandonAfter has passed with no
// subscriber (the test runs the clock out), the gateway cancels it, and
// the slot is free again. A task with a subscriber is left open.
func TestAnAbandonedTaskEnds(t *testing.T) {
	e := newClientsEnv(t, broker.Config{MaxTasksPerContext: 1}, gateway.Config{AbandonAfter: time.Hour})
	d := e.delegate("chat-1", "silent")
	cred := e.issue("impatient")
	c := e.clientAs(cred.Token, d.ID())

	ctx, cancel := context.WithCancel(ctxT(t))
	sent := make(chan error, 1)
	go func() {
		_, err := c.SendMessage(ctx, &a2a.SendMessageRequest{Message: userMessage("wait for me")})
		sent <- err
	}()
	created := waitFor(t, d, wire.EventCreated)
	cancel() // the client gives up: its connection closes
	require.Error(t, <-sent)
	require.Eventually(t, func() bool { return gateway.Abandoned(e.g) == 1 }, 10*time.Second, time.Millisecond, "the task's clock runs")
	_, err := sendNow(t, c, "while the first holds the cap")
	require.ErrorIs(t, err, a2a.ErrServerError, "the abandoned task holds the client's only slot") // A2A_TASK_LIMIT

	gateway.ExpireAbandoned(e.g)
	ended := waitFor(t, d, wire.EventStatus, wire.StateCanceled)
	assert.Equal(t, created.TaskID, ended.TaskID, "the abandoned task was canceled")
	next, err := sendNow(t, c, "the slot is free again")
	require.NoError(t, err)

	// A task someone watches is not abandoned.
	sctx, scancel := context.WithCancel(ctxT(t))
	defer scancel()
	watching := make(chan struct{})
	go func() {
		for _, err := range c.SubscribeToTask(sctx, &a2a.SubscribeToTaskRequest{ID: next.ID}) {
			if err != nil {
				return
			}
			select {
			case <-watching:
			default:
				close(watching)
			}
		}
	}()
	<-watching
	bctx, bcancel := context.WithCancel(ctxT(t))
	go func() {
		_, err := c.SendMessage(bctx, &a2a.SendMessageRequest{Message: &a2a.Message{ID: "reply-1", Role: a2a.MessageRoleUser, TaskID: next.ID, Parts: a2a.ContentParts{a2a.NewTextPart("more")}}})
		sent <- err
	}()
	waitFor(t, d, wire.EventMessage)
	bcancel()
	<-sent
	require.Eventually(t, func() bool { return gateway.Abandoned(e.g) == 1 }, 10*time.Second, time.Millisecond, "the task's clock runs")
	gateway.ExpireAbandoned(e.g)
	got, err := d.Task(ctxT(t), string(next.ID))
	require.NoError(t, err)
	assert.Equal(t, wire.StateSubmitted, got.Status.State, "a watched task stays open")
	assert.Equal(t, 1, gateway.Abandoned(e.g), "its clock starts again")
}

// waitFor waits for the delegate's next event of that kind (and, given
// one, that state).
func waitFor(t *testing.T, d *runtime.Delegate, kind wire.EventKind, state ...wire.State) *wire.TaskEvent {
	t.Helper()
	for {
		ev, err := d.Wait(ctxT(t))
		require.NoError(t, err)
		if ev.Task != nil && ev.Task.Kind == kind && (len(state) == 0 || ev.Task.Task.Status.State == state[0]) {
			return ev.Task
		}
	}
}

// TestStreamsPerClientAreBounded: a client's streams are bounded, so that
// its streams cannot take the server's connections; another client's are
// not counted with them.
func TestStreamsPerClientAreBounded(t *testing.T) {
	e := newClientsEnv(t, broker.Config{}, gateway.Config{MaxStreamsPerClient: 2})
	d := e.delegate("chat-1", "scribe")
	greedy, other := e.issue("greedy"), e.issue("other")
	cg, co := e.clientAs(greedy.Token, d.ID()), e.clientAs(other.Token, d.ID())
	task, err := sendNow(t, cg, "watch me")
	require.NoError(t, err)
	otherTask, err := sendNow(t, co, "and me")
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	open := func(c *a2aclient.Client, id a2a.TaskID) <-chan error {
		first := make(chan error, 1)
		go func() {
			for _, err := range c.SubscribeToTask(ctx, &a2a.SubscribeToTaskRequest{ID: id}) {
				select {
				case first <- err:
				default:
				}
				if err != nil {
					return
				}
			}
		}()
		return first
	}
	require.NoError(t, <-open(cg, task.ID))
	require.NoError(t, <-open(cg, task.ID))
	err = <-open(cg, task.ID)
	require.Error(t, err, "a third stream of the same client is refused")
	assert.True(t, errors.Is(err, a2a.ErrInvalidRequest), "InvalidRequest: %v", err)
	require.NoError(t, <-open(co, otherTask.ID), "another client's stream is served")
}

// TestARevokeDuringAJoinIsNotServed: a client revoked while its agent is
// being registered (the gap between the token's lookup and the agent's
// insert) is refused, and its agent departs.
func TestARevokeDuringAJoinIsNotServed(t *testing.T) {
	e := newClientsEnv(t, broker.Config{}, gateway.Config{})
	d := e.delegate("chat-1", "scribe")
	for _, at := range []string{"before the insert", "after the insert"} {
		cred := e.issue("late")
		c, err := gateway.JoinRevokedAt(e.g, cred.Token, at)
		require.Error(t, err, at)
		assert.Nil(t, c, at)
		peers, err := d.Peers(ctxT(t))
		require.NoError(t, err)
		assert.Empty(t, peers, "%s: the revoked client's agent is gone (and was hidden)", at)
		assert.Zero(t, gateway.Joined(e.g), at)
	}
}

// TestOneClientCannotHoldTheWholeBodyBudget: a client whose requests hold
// its share of the budget of bodies in service (here stalled bodies that
// never finish) waits on its share; another client is served at once.
func TestOneClientCannotHoldTheWholeBodyBudget(t *testing.T) {
	e := newClientsEnv(t, broker.Config{}, gateway.Config{MaxBodyBytes: 64 << 10, MaxInFlightBytes: 256 << 10})
	d := e.delegate("chat-1", "scribe")
	hog, fair := e.issue("hog"), e.issue("fair")
	// The hog's stalled bodies: headers that announce 64 KiB, then
	// nothing, eight of them, twice its share.
	for range 8 {
		conn, err := net.Dial("tcp", strings.TrimPrefix(e.base, "http://"))
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		_, err = fmt.Fprintf(conn, "POST /agents/%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", d.ID(), hog.Token, 64<<10)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return gateway.BodiesInService(e.g) >= 64<<10 }, 10*time.Second, time.Millisecond, "the hog holds its share")
	c := e.clientAs(fair.Token, d.ID())
	_, err := sendNow(t, c, "served beside the hog")
	require.NoError(t, err, "another client is served while the hog holds its share")
}
