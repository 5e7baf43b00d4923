package broker_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/wire"
)

// lookup is a2a.agents.list narrowed to one agentId.
func (a *agent) lookup(id string, extra map[string]any) ([]wire.AgentCard, string) {
	a.e.t.Helper()
	params := map[string]any{"agentId": id}
	for k, v := range extra {
		params[k] = v
	}
	res, err := a.call(wire.MethodListAgents, params)
	require.NoError(a.e.t, err)
	var r wire.ListAgentsResult
	require.NoError(a.e.t, json.Unmarshal(res, &r))
	require.NotNil(a.e.t, r.Agents, "agents is [] when empty, never null")
	return r.Agents, r.NextPageToken
}

// a2a.agents.list with agentId answers that one agent's card as the list
// shows it, or none: the same visibility as the whole list.
func TestAgentsListNarrowedToOneAgentID(t *testing.T) {
	e := newEnv(t, broker.Config{HiddenSessions: []string{"gateway"}})
	a := e.register("chat-1", "discussant")
	b := e.register("chat-2", "scribe")
	c := e.register("chat-2", "critic")
	gw := e.register("gateway", "a2a-gateway")

	full := map[string]wire.AgentCard{}
	for _, card := range a.list() {
		full[card.AgentID] = card
	}
	got, next := a.lookup(b.id, nil)
	require.Len(t, got, 1)
	assert.Equal(t, full[b.id], got[0], "the card as the list shows it")
	assert.Equal(t, "", next, "one page")

	// Paging params are checked as ever; pageToken is not used.
	got, _ = a.lookup(b.id, map[string]any{"pageToken": c.id, "pageSize": 1})
	require.Len(t, got, 1)
	assert.Equal(t, b.id, got[0].AgentID)
	_, err := a.tryCall(wire.MethodListAgents, map[string]any{"agentId": b.id, "pageSize": wire.MaxPageSize + 1})
	requireCode(t, err, wire.ErrInvalidParams)

	// Unknown, the caller itself, a hidden agent: no card, no error.
	for _, id := range []string{"nobody", a.id, gw.id} {
		got, next := a.lookup(id, nil)
		assert.Empty(t, got, "agentId %s", id)
		assert.Equal(t, "", next)
	}
	// The hidden agent sees the others, as in the list, but not itself.
	got, _ = gw.lookup(a.id, nil)
	require.Len(t, got, 1)
	assert.Equal(t, a.id, got[0].AgentID)
	got, _ = gw.lookup(gw.id, nil)
	assert.Empty(t, got)

	// A deregistered agent is gone; its token lists nothing.
	require.NoError(t, c.deregister())
	got, _ = a.lookup(c.id, nil)
	assert.Empty(t, got)
	_, err = c.tryCall(wire.MethodListAgents, map[string]any{"agentId": a.id})
	requireCode(t, err, wire.ErrUnauthorized)

	// agentId "" is no narrowing: the whole list.
	got, _ = a.lookup("", nil)
	assert.Len(t, got, 1, "b only: c is gone, gw hidden")
}
