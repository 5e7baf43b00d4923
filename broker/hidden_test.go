package broker_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/wire"
)

func ids(cards []wire.AgentCard) []string {
	out := []string{}
	for _, c := range cards {
		out = append(out, c.AgentID)
	}
	return out
}

// An agent of a hidden session (the A2A gateway's) changes no delegate's
// view: agents.list and the choice of a send without to are what they
// were without it. It is an agent like any other to everything else.
func TestAHiddenSessionChangesNoDelegatesView(t *testing.T) {
	e := newEnv(t, broker.Config{HiddenSessions: []string{"gateway"}})
	a := e.register("chat-1", "discussant")
	b := e.register("chat-2", "scribe")
	before := ids(a.list())
	gw := e.register("gateway", "a2a-gateway")
	assert.Equal(t, before, ids(a.list()), "the gateway is not listed")
	assert.Equal(t, []string{a.id}, ids(b.list()))
	assert.Contains(t, ids(gw.list()), a.id, "the gateway sees the delegates")

	// The single peer of the other sessions is still b, not ambiguous.
	task, err := a.send("", "who takes seat 2?")
	require.NoError(t, err)
	assert.Equal(t, b.id, task.AgentName)
	e.event("chat-2")

	// A session's lone delegate with the gateway in no session of its own:
	// a second agent in the gateway's session is still not a peer.
	e.register("gateway", "a2a-gateway-2")
	_, err = a.send("", "again")
	require.NoError(t, err)
	e.event("chat-2")

	// Not even by name.
	_, err = a.trySend(gw.id, "hello?")
	requireCode(t, err, wire.ErrUnknownAgent)

	// The gateway acts like any agent: it sends by name, and is answered.
	t2, err := gw.send(a.id, "from an A2A client")
	require.NoError(t, err)
	e.event("chat-1")
	_, err = a.update(t2.ID, wire.StateCompleted, "done")
	require.NoError(t, err)
	assert.Equal(t, wire.NotifyTaskEvent, e.event("gateway").Method)

}
