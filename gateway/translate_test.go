package gateway_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/gateway"
	"github.com/a2a-bus/a2a-bus/wire"
)

func TestStatesMapBothWays(t *testing.T) {
	for _, tc := range []struct {
		bus wire.State
		v1  a2a.TaskState
	}{
		{wire.StateSubmitted, a2a.TaskStateSubmitted},
		{wire.StateWorking, a2a.TaskStateWorking},
		{wire.StateInputRequired, a2a.TaskStateInputRequired},
		{wire.StateCompleted, a2a.TaskStateCompleted},
		{wire.StateFailed, a2a.TaskStateFailed},
		{wire.StateCanceled, a2a.TaskStateCanceled},
		{wire.StateRejected, a2a.TaskStateRejected},
	} {
		assert.Equal(t, tc.v1, gateway.State(tc.bus))
		back, ok := gateway.FromState(tc.v1)
		assert.True(t, ok)
		assert.Equal(t, tc.bus, back)
	}
	_, ok := gateway.FromState(a2a.TaskStateAuthRequired)
	assert.False(t, ok, "a2a-bus has no auth-required")
	assert.Equal(t, a2a.MessageRoleUser, gateway.Role(wire.RoleUser))
	assert.Equal(t, a2a.MessageRoleAgent, gateway.Role(wire.RoleAgent))
}

func TestPartsMapBothWays(t *testing.T) {
	data, err := wire.DataPart(map[string]any{"seat": 2.0})
	require.NoError(t, err)
	data.Metadata = json.RawMessage(`{"k":"v"}`)
	for name, tc := range map[string]struct {
		bus   wire.Part
		check func(*a2a.Part)
	}{
		"text": {wire.TextPart("hi"), func(p *a2a.Part) { assert.Equal(t, a2a.Text("hi"), p.Content) }},
		"data": {data, func(p *a2a.Part) {
			assert.Equal(t, a2a.Data{Value: json.RawMessage(`{"seat":2}`)}, p.Content, "the broker's JSON as it is")
			assert.Equal(t, map[string]any{"k": "v"}, p.Metadata)
		}},
		"file by bytes": {wire.FileBytesPart("a.txt", "text/plain", []byte("hello")), func(p *a2a.Part) {
			assert.Equal(t, a2a.Raw("hello"), p.Content)
			assert.Equal(t, "a.txt", p.Filename)
			assert.Equal(t, "text/plain", p.MediaType)
		}},
		"file by uri": {wire.FileURIPart("b.png", "image/png", "https://example.com/b.png"), func(p *a2a.Part) {
			assert.Equal(t, a2a.URL("https://example.com/b.png"), p.Content)
			assert.Equal(t, "b.png", p.Filename)
		}},
	} {
		t.Run(name, func(t *testing.T) {
			v1, err := gateway.Part(&tc.bus)
			require.NoError(t, err)
			tc.check(v1)
			back, err := gateway.FromPart(v1)
			require.NoError(t, err)
			require.NoError(t, back.Validate("part"))
			want, _ := json.Marshal(tc.bus)
			got, _ := json.Marshal(back)
			assert.JSONEq(t, string(want), string(got), "the round trip keeps the part")
		})
	}
	_, err = gateway.FromPart(&a2a.Part{})
	assert.Error(t, err, "a part without content")
}

func TestATaskCarriesWhat1_0LacksUnderOneKey(t *testing.T) {
	now := wire.NewTime(wire.NewTime(timeAt()).Time)
	task := &wire.Task{
		ID: "t1", ContextID: "a2a-gateway", RequesterName: "a2a-gateway", AgentName: "scribe", AgentContextID: "chat-1",
		Status:    wire.TaskStatus{State: wire.StateInputRequired, Timestamp: now, Message: &wire.Message{MessageID: "m2", Role: wire.RoleAgent, From: "scribe", Parts: []wire.Part{wire.TextPart("which row?")}}},
		History:   []wire.Message{{MessageID: "m1", Role: wire.RoleUser, From: "a2a-gateway", Parts: []wire.Part{wire.TextPart("a seat?")}}, {MessageID: "m2", Role: wire.RoleAgent, From: "scribe", Parts: []wire.Part{wire.TextPart("which row?")}}},
		Artifacts: []wire.Artifact{{ArtifactID: "a1", Name: "plan", Parts: []wire.Part{wire.TextPart("rows")}}},
		CreatedAt: now, UpdatedAt: now,
		Metadata: json.RawMessage(`{"mine":1,"a2aBus":{"clientContextId":"client-7"}}`),
	}
	one := 1
	v1, err := gateway.Task(task, &one)
	require.NoError(t, err)
	assert.Equal(t, a2a.TaskID("t1"), v1.ID)
	assert.Equal(t, "client-7", v1.ContextID, "the client's own contextId")
	assert.Equal(t, a2a.TaskStateInputRequired, v1.Status.State)
	assert.Equal(t, "which row?", v1.Status.Message.Parts[0].Text())
	require.Len(t, v1.History, 1, "historyLength keeps the latest")
	assert.Equal(t, "m2", v1.History[0].ID)
	assert.Equal(t, "scribe", v1.History[0].Metadata[gateway.MetaKey].(map[string]any)["from"])
	require.Len(t, v1.Artifacts, 1)
	assert.Equal(t, json.Number("1"), v1.Metadata["mine"], "the client's metadata is kept, its numbers as written")
	bus := v1.Metadata[gateway.MetaKey].(map[string]any)
	for k, want := range map[string]string{"requesterName": "a2a-gateway", "agentName": "scribe", "agentContextId": "chat-1", "contextId": "a2a-gateway", "clientContextId": "client-7"} {
		assert.Equal(t, want, bus[k], k)
	}
	assert.NotEmpty(t, bus["createdAt"])
	all, err := gateway.Task(task, nil)
	require.NoError(t, err)
	assert.Len(t, all.History, 2)
	task.Metadata = nil
	bare, err := gateway.Task(task, nil)
	require.NoError(t, err)
	assert.Equal(t, "t1", bare.ContextID, "without one, the task id")
}

func TestErrorsMapToTheSpecs(t *testing.T) {
	for _, tc := range []struct {
		err    error
		cancel bool
		want   error
	}{
		{wire.ErrUnknownTask.Withf("no task"), false, a2a.ErrTaskNotFound},
		{wire.ErrInvalidTransition.Withf("ended"), true, a2a.ErrTaskNotCancelable},
		{wire.ErrInvalidTransition.Withf("ended"), false, a2a.ErrServerError},
		{wire.ErrInvalidParams.Withf("bad"), false, a2a.ErrInvalidParams},
		{wire.ErrUnknownAgent.Withf("no live agent"), false, a2a.ErrServerError},
		{wire.ErrTaskLimit.Withf("32 open"), false, a2a.ErrServerError},
		{wire.ErrInternal.Withf("store"), false, a2a.ErrInternalError},
	} {
		got := gateway.Error(tc.err, tc.cancel)
		assert.ErrorIs(t, got, tc.want, "%v", tc.err)
		var ae *a2a.Error
		require.True(t, errors.As(got, &ae))
		var we *wire.Error
		require.True(t, errors.As(tc.err, &we))
		assert.Equal(t, we.Code, ae.Details["a2aBusCode"])
		assert.Equal(t, we.DataCode(), ae.Details["a2aBusError"])
	}
}

func TestTheCardFillsEveryRequiredField(t *testing.T) {
	c := gateway.Card(&wire.AgentCard{Name: "scribe", AgentID: "scribe-2", Skills: []wire.Skill{{Name: "notes"}}}, "http://127.0.0.1:1/agents/scribe-2", "v9")
	assert.Equal(t, "scribe-2", c.Name)
	assert.NotEmpty(t, c.Description)
	assert.Equal(t, "v9", c.Version)
	assert.NotEmpty(t, c.DefaultInputModes)
	assert.NotEmpty(t, c.DefaultOutputModes)
	require.Len(t, c.Skills, 1)
	assert.Equal(t, "notes", c.Skills[0].ID)
	assert.NotNil(t, c.Skills[0].Tags)
	require.Len(t, c.SupportedInterfaces, 1)
	assert.Equal(t, a2a.TransportProtocolJSONRPC, c.SupportedInterfaces[0].ProtocolBinding)
	assert.Equal(t, a2a.ProtocolVersion("1.0"), c.SupportedInterfaces[0].ProtocolVersion)
	assert.True(t, c.Capabilities.Streaming)
}

func timeAt() time.Time { return time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC) }
