package schema_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/broker/brokertest"
	"github.com/a2a-bus/a2a-bus/internal/schema"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/transport/bustest"
	"github.com/a2a-bus/a2a-bus/transport/fakebus"
	"github.com/a2a-bus/a2a-bus/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var file = filepath.Join("..", "..", schema.Path)

// TestTheSchemaFileMatchesTheGoTypes fails when a wire type changes
// without the schema. A2A_BUS_UPDATE_SCHEMA=1 writes the file anew.
func TestTheSchemaFileMatchesTheGoTypes(t *testing.T) {
	want, err := schema.Generate()
	require.NoError(t, err)
	if os.Getenv("A2A_BUS_UPDATE_SCHEMA") == "1" {
		require.NoError(t, os.WriteFile(file, want, 0o644))
	}
	got, err := os.ReadFile(file)
	require.NoError(t, err)
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is not what the wire types make: run A2A_BUS_UPDATE_SCHEMA=1 go test ./internal/schema, and review the difference", schema.Path)
	}
}

func TestEveryMethodHasItsTypes(t *testing.T) {
	seen := map[string]bool{}
	for _, m := range schema.Methods {
		assert.False(t, seen[m.Name], "%s twice", m.Name)
		seen[m.Name] = true
	}
	for _, name := range []string{wire.MethodRegister, wire.MethodDeregister, wire.MethodListAgents, wire.MethodSend, wire.MethodGetTask,
		wire.MethodListTasks, wire.MethodUpdateTask, wire.MethodCancelTask, wire.MethodReplay, wire.MethodSessionOpen, wire.MethodSessionClose,
		wire.MethodAdminInfo, wire.MethodAdminAgents, wire.MethodAdminTasks, wire.MethodAdminSessions} {
		assert.True(t, seen[name], "%s has no entry", name)
	}
}

// validator checks messages against the schema file.
type validator struct {
	t       *testing.T
	mu      sync.Mutex
	schemas map[string]*jsonschema.Schema
	c       *jsonschema.Compiler
	methods map[string]struct{ Params, Result string }
	notes   map[string]struct{ Params string }
	counts  map[string]int
}

func newValidator(t *testing.T) *validator {
	raw, err := os.ReadFile(file)
	require.NoError(t, err)
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	require.NoError(t, err)
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	require.NoError(t, c.AddResource("schema.json", doc))
	var meta struct {
		Methods map[string]struct{ Params, Result string } `json:"x-methods"`
		Notes   map[string]struct{ Params string }         `json:"x-notifications"`
	}
	require.NoError(t, json.Unmarshal(raw, &meta))
	return &validator{t: t, c: c, schemas: map[string]*jsonschema.Schema{}, methods: meta.Methods, notes: meta.Notes, counts: map[string]int{}}
}

func (v *validator) check(ref string, what string, raw []byte) {
	v.mu.Lock()
	defer v.mu.Unlock()
	s, ok := v.schemas[ref]
	if !ok {
		var err error
		s, err = v.c.Compile("schema.json" + ref)
		require.NoError(v.t, err, ref)
		v.schemas[ref] = s
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	require.NoError(v.t, err)
	if err := s.Validate(inst); err != nil {
		v.t.Errorf("%s does not match %s: %v\n%s", what, ref, err, cut(raw))
	}
	v.counts[ref]++
}

func cut(b []byte) string {
	if len(b) > 600 {
		return string(b[:600]) + "…"
	}
	return string(b)
}

// recBus is a fake bus that shows every request the broker serves, its
// answer and every notification to the validator.
type recBus struct {
	*fakebus.Bus
	v *validator
}

func (b *recBus) Serve(h transport.Handler) error {
	return b.Bus.Serve(transport.HandlerFunc(func(ctx context.Context, from transport.Caller, req []byte) []byte {
		resp := h.ServeRPC(ctx, from, req)
		b.v.exchange(req, resp)
		return resp
	}))
}

func (b *recBus) Publish(session string, msg []byte) error {
	b.v.notification(msg)
	return b.Bus.Publish(session, msg)
}

func (v *validator) exchange(req, resp []byte) {
	if resp == nil {
		return
	}
	if e := wire.ResponseError(resp); e != nil {
		var r struct {
			Error json.RawMessage `json:"error"`
		}
		require.NoError(v.t, json.Unmarshal(resp, &r))
		v.check("#/$defs/Error", "an error", r.Error)
		return
	}
	parsed, perr := wire.ParseRequest(req, 0)
	require.Nil(v.t, perr, "a request that was answered with a result parses")
	m, ok := v.methods[parsed.Method]
	if !ok {
		v.t.Errorf("method %s answered, but not in the schema", parsed.Method)
		return
	}
	v.check(strings.TrimPrefix(m.Params, "schema.json"), parsed.Method+" params", parsed.Params)
	result, err := wire.DecodeResult(resp)
	require.NoError(v.t, err)
	v.check(m.Result, parsed.Method+" result", result)
}

func (v *validator) notification(msg []byte) {
	var n struct {
		Method string          `json:"method"`
		Params json.RawMessage `json:"params"`
	}
	require.NoError(v.t, json.Unmarshal(msg, &n))
	note, ok := v.notes[n.Method]
	if !ok {
		v.t.Errorf("notification %s is not in the schema", n.Method)
		return
	}
	v.check(note.Params, n.Method+" params", n.Params)
}

// TestWhatTheBrokerSendsMatchesTheSchema runs the broker's conformance
// suite on a bus that validates every accepted request's params, every
// result, every error and every notification against the file.
func TestWhatTheBrokerSendsMatchesTheSchema(t *testing.T) {
	v := newValidator(t)
	f := bustest.Features{BoundSessions: true, HostScope: transport.ScopeHost}
	brokertest.Run(t, f, func(t *testing.T) bustest.Harness {
		b := fakebus.New(fakebus.Config{})
		return bustest.Harness{Bus: &recBus{Bus: b, v: v}, Client: b}
	})
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, ref := range []string{"#/$defs/RegisterParams", "#/$defs/SendParams", "#/$defs/SendResult", "#/$defs/TaskEvent", "#/$defs/Push", "#/$defs/Error"} {
		assert.Positive(t, v.counts[ref], "nothing was checked against %s", ref)
	}
}

// TestEveryMethodsAnswerMatchesTheSchema drives every method the broker
// serves on the fake bus (all but sessions.open and sessions.close, which
// need a bus that issues session credentials: NATS), with a file and a
// data part, and checks each exchange.
func TestEveryMethodsAnswerMatchesTheSchema(t *testing.T) {
	v := newValidator(t)
	fb := fakebus.New(fakebus.Config{})
	defer fb.Close()
	b, err := broker.New(context.Background(), &recBus{Bus: fb, v: v}, broker.Config{})
	require.NoError(t, err)
	defer b.Close()
	ctx := context.Background()
	call := func(session, method string, params any) json.RawMessage {
		s, err := fb.Session(ctx, session)
		require.NoError(t, err)
		res, err := s.Call(ctx, method, params)
		require.NoError(t, err, method)
		return res
	}
	register := func(session, name string) wire.RegisterResult {
		var r wire.RegisterResult
		require.NoError(t, json.Unmarshal(call(session, wire.MethodRegister, wire.RegisterParams{ContextID: session,
			Card: &wire.AgentCard{Name: name, Description: "d", Skills: []wire.Skill{{ID: "s", Tags: []string{"t"}}}, Metadata: json.RawMessage(`{"k":1}`)}}), &r))
		return r
	}
	a, c := register("chat-1", "asker"), register("chat-2", "worker")
	for _, s := range []string{"chat-1", "chat-2"} {
		sess, err := fb.Session(ctx, s)
		require.NoError(t, err)
		sub, err := sess.Subscribe(ctx)
		require.NoError(t, err)
		defer sub.Close()
	}
	call("chat-1", wire.MethodListAgents, wire.ListAgentsParams{Token: a.Token})
	data, err := wire.DataPart(map[string]any{"seat": 2})
	require.NoError(t, err)
	msg := &wire.Message{MessageID: "m-1", Parts: []wire.Part{wire.TextPart("seat?"), data, wire.FileBytesPart("a.txt", "text/plain", []byte("hi")), wire.FileURIPart("b", "", "https://example.com/b")}, Metadata: json.RawMessage(`{"k":"v"}`)}
	var sent wire.TaskResult
	require.NoError(t, json.Unmarshal(call("chat-1", wire.MethodSend, wire.SendParams{Token: a.Token, To: c.AgentID, Message: msg, Metadata: json.RawMessage(`{"x":[1]}`)}), &sent))
	id := sent.Task.ID
	call("chat-1", wire.MethodSend, wire.SendParams{Token: a.Token, TaskID: id, Message: &wire.Message{Parts: []wire.Part{wire.TextPart("more")}}})
	call("chat-1", wire.MethodSend, wire.SendParams{Token: a.Token, To: c.AgentID, Oneway: true, Message: &wire.Message{Parts: []wire.Part{wire.TextPart("fyi")}}})
	call("chat-2", wire.MethodUpdateTask, wire.UpdateParams{Token: c.Token, TaskID: id, State: wire.StateWorking,
		Artifacts: []wire.Artifact{{Name: "a", Parts: []wire.Part{wire.TextPart("x")}, Metadata: json.RawMessage(`{}`)}}})
	call("chat-2", wire.MethodUpdateTask, wire.UpdateParams{Token: c.Token, TaskID: id, State: wire.StateInputRequired, Message: &wire.Message{Parts: []wire.Part{wire.TextPart("which?")}}, MessageID: "u-1"})
	call("chat-1", wire.MethodGetTask, wire.TaskParams{Token: a.Token, TaskID: id})
	call("chat-2", wire.MethodListTasks, wire.ListTasksParams{Token: c.Token, Role: wire.ListAssignee, PageParams: wire.PageParams{PageSize: 10}})
	call("chat-1", wire.MethodCancelTask, wire.CancelParams{Token: a.Token, TaskID: id, MessageID: "c-1"})
	zero, epoch := uint64(0), b.Epoch()
	call("chat-1", wire.MethodReplay, wire.ReplayParams{ContextID: "chat-1", Epoch: &epoch, AfterSeq: &zero})
	for _, m := range []string{wire.MethodAdminInfo, wire.MethodAdminAgents, wire.MethodAdminTasks, wire.MethodAdminSessions} {
		_, err := fb.CallHost(ctx, m, map[string]any{})
		require.NoError(t, err, m)
	}
	call("chat-2", wire.MethodDeregister, wire.TokenParams{Token: c.Token})
	// An error, for its object.
	s, err := fb.Session(ctx, "chat-1")
	require.NoError(t, err)
	_, err = s.Call(ctx, wire.MethodGetTask, wire.TaskParams{Token: "nope", TaskID: id})
	require.Error(t, err)

	v.mu.Lock()
	defer v.mu.Unlock()
	for _, m := range schema.Methods {
		if m.Name == wire.MethodSessionOpen || m.Name == wire.MethodSessionClose {
			continue
		}
		assert.Positive(t, v.counts[v.methods[m.Name].Result], "%s: its result was not checked", m.Name)
		assert.Positive(t, v.counts[v.methods[m.Name].Params], "%s: its params were not checked", m.Name)
	}
	for n, note := range v.notes {
		assert.Positive(t, v.counts[note.Params], "%s: not checked", n)
	}
	assert.Positive(t, v.counts["#/$defs/Error"])
}

// The schema refuses what the protocol refuses, so that the checks above
// can fail.
func TestTheSchemaRefusesWhatTheProtocolRefuses(t *testing.T) {
	v := newValidator(t)
	for ref, bad := range map[string]string{
		"#/$defs/Part":       `{"kind":"text"}`,
		"#/$defs/TaskStatus": `{"state":"done","timestamp":"2026-12-01T09:00:00.000Z"}`,
		"#/$defs/SendParams": `{"token":"t","to":"x"}`,
		"#/$defs/File":       `{"name":"a"}`,
		"#/$defs/Message":    `{"messageId":"m","parts":[{"kind":"text","text":"x"}],"metadata":[1]}`,
		"#/$defs/Artifact":   `{"artifactId":"a","parts":[]}`,
		"#/$defs/Task":       `{"id":"x","contextId":"c","requesterName":"a","agentName":"b","agentContextId":"d","status":{"state":"working","timestamp":"yesterday"},"artifacts":[],"createdAt":"2026-12-01T09:00:00Z","updatedAt":"2026-12-01T09:00:00Z"}`,
	} {
		s, err := v.c.Compile("schema.json" + ref)
		require.NoError(t, err)
		inst, err := jsonschema.UnmarshalJSON(strings.NewReader(bad))
		require.NoError(t, err)
		assert.Error(t, s.Validate(inst), "%s accepted %s", ref, bad)
	}
}
