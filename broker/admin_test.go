package broker_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/wire"
)

func TestAdminMethods(t *testing.T) {
	e := newEnv(t, broker.Config{BusName: "fake"})
	a := e.register("s1", "a")
	e.register("s1", "a")
	e.register("s2", "b")
	task := a.mustSend("b", "x")
	e.session("s3")
	host := func(method string, out any) {
		t.Helper()
		res, err := e.bus.CallHost(context.Background(), method, nil)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(res, out))
	}
	var info wire.AdminInfo
	host(wire.MethodAdminInfo, &info)
	assert.Equal(t, "fake", info.Bus)
	assert.Equal(t, e.broker.Epoch(), info.Epoch)
	assert.Equal(t, 3, info.Agents)
	assert.Equal(t, 2, info.Sessions)
	assert.Equal(t, 1, info.OpenTasks)
	assert.NotEmpty(t, info.Version)

	var agents wire.AdminAgents
	host(wire.MethodAdminAgents, &agents)
	var ids []string
	for _, c := range agents.Agents {
		ids = append(ids, c.AgentID+"@"+c.ContextID)
	}
	assert.Equal(t, []string{"a@s1", "a-2@s1", "b@s2"}, ids)

	var tasks wire.AdminTasks
	host(wire.MethodAdminTasks, &tasks)
	require.Len(t, tasks.Open, 1)
	assert.Equal(t, task.ID, tasks.Open[0].ID)
	assert.Equal(t, wire.StateSubmitted, tasks.Open[0].State)
	assert.Empty(t, tasks.NextPageToken)

	var sessions wire.AdminSessions
	host(wire.MethodAdminSessions, &sessions)
	byID := map[string]wire.AdminSession{}
	for _, s := range sessions.Sessions {
		byID[s.ContextID] = s
	}
	assert.Equal(t, 2, byID["s1"].Agents)
	assert.Equal(t, uint64(1), byID["s2"].LastSeq, "the created event")
	require.NotNil(t, byID["s2"].Subscribers)
	assert.Equal(t, 1, *byID["s2"].Subscribers)

	t.Run("sessions cannot call them", func(t *testing.T) {
		_, err := e.call("s1", wire.MethodAdminAgents, nil)
		requireCode(t, err, wire.ErrMethodNotFound)
	})
}
