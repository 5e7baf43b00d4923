package broker_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

var owner = transport.Caller{Scope: transport.ScopeOwner}

// raw sends one raw message to the broker and decodes the response.
func raw(t *testing.T, b *broker.Broker, from transport.Caller, msg string) *wire.Response {
	t.Helper()
	out := b.ServeRPC(context.Background(), from, []byte(msg))
	if out == nil {
		return nil
	}
	var r wire.Response
	require.NoError(t, json.Unmarshal(out, &r), "response is JSON: %s", out)
	assert.Equal(t, "2.0", r.JSONRPC)
	return &r
}

func TestEnvelope(t *testing.T) {
	e := newEnv(t, broker.Config{MaxMessageBytes: 4096})
	tests := []struct {
		name   string
		msg    string
		code   int
		nullID bool
	}{
		{"not JSON", `{"jsonrpc":`, -32700, true},
		{"not UTF-8", "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\"}", -32700, true},
		{"empty", ``, -32700, true},
		{"a batch", `[{"jsonrpc":"2.0","id":1,"method":"a2a.agents.list"}]`, -32600, true},
		{"not an object", `42`, -32600, true},
		{"a string", `"a2a.agents.list"`, -32600, true},
		{"no method", `{"jsonrpc":"2.0","id":1}`, -32600, true},
		{"method not a string", `{"jsonrpc":"2.0","id":1,"method":7}`, -32600, true},
		{"wrong jsonrpc", `{"jsonrpc":"1.0","id":1,"method":"a2a.agents.list"}`, -32600, true},
		{"no jsonrpc", `{"id":1,"method":"a2a.agents.list"}`, -32600, true},
		{"id an object", `{"jsonrpc":"2.0","id":{},"method":"a2a.agents.list"}`, -32600, true},
		{"over the size limit", `{"jsonrpc":"2.0","id":1,"method":"a2a.agents.list","params":{"x":"` + strings.Repeat("a", 5000) + `"}}`, -32600, true},
		{"unknown method", `{"jsonrpc":"2.0","id":1,"method":"a2a.nope"}`, -32601, false},
		{"params an array", `{"jsonrpc":"2.0","id":1,"method":"a2a.agents.list","params":[]}`, -32602, false},
		{"params a string", `{"jsonrpc":"2.0","id":1,"method":"a2a.agents.list","params":"x"}`, -32602, false},
		{"absent params are {}: then the token is missing", `{"jsonrpc":"2.0","id":1,"method":"a2a.agents.list"}`, -32045, false},
		{"id null is answered with id null", `{"jsonrpc":"2.0","id":null,"method":"a2a.agents.list","params":{}}`, -32045, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := raw(t, e.broker, owner, tc.msg)
			require.NotNil(t, r)
			require.NotNil(t, r.Error)
			assert.Equal(t, tc.code, r.Error.Code, r.Error.Message)
			assert.NotEmpty(t, r.Error.DataCode())
			if tc.nullID {
				assert.Equal(t, "null", string(r.ID))
			} else {
				assert.Equal(t, "1", string(r.ID))
			}
		})
	}
	t.Run("string ids are echoed", func(t *testing.T) {
		r := raw(t, e.broker, owner, `{"jsonrpc":"2.0","id":"abc","method":"a2a.nope"}`)
		assert.Equal(t, `"abc"`, string(r.ID))
	})
	t.Run("a notification is not answered", func(t *testing.T) {
		assert.Nil(t, raw(t, e.broker, owner, `{"jsonrpc":"2.0","method":"a2a.agents.list","params":{}}`))
		assert.Nil(t, raw(t, e.broker, owner, `{"jsonrpc":"2.0","method":"a2a.nope"}`))
	})
	t.Run("unknown fields are ignored", func(t *testing.T) {
		r := raw(t, e.broker, owner, `{"jsonrpc":"2.0","id":1,"method":"a2a.agents.register","extra":1,"params":{"contextId":"s1","card":{"name":"x","colour":"blue"},"whatever":[1]}}`)
		require.Nil(t, r.Error)
	})
	t.Run("the broker keeps serving", func(t *testing.T) {
		a := e.register("s1", "after")
		assert.Equal(t, "after", a.id)
	})
}

// TestErrorPrecedence follows PROTOCOL §1: method, params object, token,
// param shapes, unknown task, unknown agent, then the task checks.
func TestErrorPrecedence(t *testing.T) {
	e := newOwnerEnv(t, broker.Config{})
	a := e.register("s1", "a")
	b := e.register("s2", "b")
	stranger := e.register("s3", "c")
	task := a.mustSend("b", "x")
	tests := []struct {
		name   string
		method string
		params any
		want   *wire.Error
	}{
		{"params not an object before a bad token", wire.MethodGetTask, []int{1}, wire.ErrInvalidParams},
		{"bad token before bad shapes", wire.MethodGetTask, map[string]any{"token": "nope", "taskId": 5}, wire.ErrUnauthorized},
		{"token of the wrong type is a missing token", wire.MethodGetTask, map[string]any{"token": 5, "taskId": 5}, wire.ErrUnauthorized},
		{"shape before unknown task", wire.MethodUpdateTask, map[string]any{"token": b.token, "taskId": "nope", "state": "bogus"}, wire.ErrInvalidParams},
		{"unknown task before membership", wire.MethodGetTask, map[string]any{"token": stranger.token, "taskId": "nope"}, wire.ErrUnknownTask},
		{"membership before the transition", wire.MethodCancelTask, map[string]any{"token": stranger.token, "taskId": task.ID}, wire.ErrUnknownAgent},
		{"membership before a wrong to", wire.MethodSend, map[string]any{"token": stranger.token, "taskId": task.ID, "to": "zzz", "message": text("x")}, wire.ErrUnknownAgent},
		{"wrong to is a task check", wire.MethodSend, map[string]any{"token": a.token, "taskId": task.ID, "to": "zzz", "message": text("x")}, wire.ErrInvalidParams},
		{"invalid part is a shape error", wire.MethodSend, map[string]any{"token": a.token, "to": "nobody", "message": map[string]any{"parts": []any{map[string]any{"kind": "text"}}}}, wire.ErrInvalidParams},
		{"unknown agent on a valid message", wire.MethodSend, map[string]any{"token": a.token, "to": "nobody", "message": text("x")}, wire.ErrUnknownAgent},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.call("s1", tc.method, tc.params)
			requireCode(t, err, tc.want)
		})
	}
}

func TestInvalidParams(t *testing.T) {
	e := newOwnerEnv(t, broker.Config{})
	a := e.register("s1", "a")
	e.register("s2", "b")
	long := strings.Repeat("x", 300)
	msg := func(parts ...any) map[string]any { return map[string]any{"parts": parts} }
	tests := []struct {
		name   string
		method string
		params map[string]any
	}{
		{"register without card", wire.MethodRegister, map[string]any{"contextId": "s1"}},
		{"register without contextId", wire.MethodRegister, map[string]any{"card": map[string]any{"name": "x"}}},
		{"register with a long contextId", wire.MethodRegister, map[string]any{"contextId": long, "card": map[string]any{"name": "x"}}},
		{"register with a control character", wire.MethodRegister, map[string]any{"contextId": "a\x01b", "card": map[string]any{"name": "x"}}},
		{"card name empty", wire.MethodRegister, map[string]any{"contextId": "s1", "card": map[string]any{"name": ""}}},
		{"card name with a space", wire.MethodRegister, map[string]any{"contextId": "s1", "card": map[string]any{"name": "a b"}}},
		{"card name of 65", wire.MethodRegister, map[string]any{"contextId": "s1", "card": map[string]any{"name": strings.Repeat("n", 65)}}},
		{"card skills not an array", wire.MethodRegister, map[string]any{"contextId": "s1", "card": map[string]any{"name": "x", "skills": "all"}}},
		{"card metadata not an object", wire.MethodRegister, map[string]any{"contextId": "s1", "card": map[string]any{"name": "x", "metadata": 3}}},
		{"long instanceId", wire.MethodRegister, map[string]any{"contextId": "s1", "card": map[string]any{"name": "x"}, "instanceId": long}},
		{"send without message", wire.MethodSend, map[string]any{"token": a.token}},
		{"message without parts", wire.MethodSend, map[string]any{"token": a.token, "message": msg()}},
		{"part without kind", wire.MethodSend, map[string]any{"token": a.token, "message": msg(map[string]any{"text": "x"})}},
		{"part of unknown kind", wire.MethodSend, map[string]any{"token": a.token, "message": msg(map[string]any{"kind": "video", "text": "x"})}},
		{"text part without text", wire.MethodSend, map[string]any{"token": a.token, "message": msg(map[string]any{"kind": "text"})}},
		{"text part with data too", wire.MethodSend, map[string]any{"token": a.token, "message": msg(map[string]any{"kind": "text", "text": "x", "data": 1})}},
		{"text not a string", wire.MethodSend, map[string]any{"token": a.token, "message": msg(map[string]any{"kind": "text", "text": 1})}},
		{"data part without data", wire.MethodSend, map[string]any{"token": a.token, "message": msg(map[string]any{"kind": "data"})}},
		{"file part with bytes and uri", wire.MethodSend, map[string]any{"token": a.token, "message": msg(map[string]any{"kind": "file", "file": map[string]any{"bytes": "aGk=", "uri": "file:///x"}})}},
		{"file part with neither", wire.MethodSend, map[string]any{"token": a.token, "message": msg(map[string]any{"kind": "file", "file": map[string]any{"name": "x"}})}},
		{"file bytes not base64", wire.MethodSend, map[string]any{"token": a.token, "message": msg(map[string]any{"kind": "file", "file": map[string]any{"bytes": "***"}})}},
		{"file bytes unpadded", wire.MethodSend, map[string]any{"token": a.token, "message": msg(map[string]any{"kind": "file", "file": map[string]any{"bytes": "aGk"}})}},
		{"part metadata not an object", wire.MethodSend, map[string]any{"token": a.token, "message": msg(map[string]any{"kind": "text", "text": "x", "metadata": []int{}})}},
		{"send metadata not an object", wire.MethodSend, map[string]any{"token": a.token, "message": text("x"), "metadata": "m"}},
		{"to not a string", wire.MethodSend, map[string]any{"token": a.token, "to": 7, "message": text("x")}},
		{"oneway not a boolean", wire.MethodSend, map[string]any{"token": a.token, "oneway": "yes", "message": text("x")}},
		{"get without taskId", wire.MethodGetTask, map[string]any{"token": a.token}},
		{"replay without epoch", wire.MethodReplay, map[string]any{"contextId": "s1", "afterSeq": 0}},
		{"replay without afterSeq", wire.MethodReplay, map[string]any{"contextId": "s1", "epoch": ""}},
		{"replay with a negative afterSeq", wire.MethodReplay, map[string]any{"contextId": "s1", "epoch": "", "afterSeq": -1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.call("s1", tc.method, tc.params)
			requireCode(t, err, wire.ErrInvalidParams)
			var we *wire.Error
			require.ErrorAs(t, err, &we)
			assert.NotContains(t, we.Message, "wire.", "no Go type names reach a client")
			assert.NotContains(t, we.Message, "Go ")
		})
	}
	t.Run("valid parts of every kind", func(t *testing.T) {
		_, err := e.call("s1", wire.MethodSend, map[string]any{"token": a.token, "message": msg(
			map[string]any{"kind": "text", "text": ""},
			map[string]any{"kind": "data", "data": nil},
			map[string]any{"kind": "data", "data": []any{1, "two"}},
			map[string]any{"kind": "file", "file": map[string]any{"name": "a.txt", "mimeType": "text/plain", "bytes": "aGk="}},
			map[string]any{"kind": "file", "file": map[string]any{"uri": "https://example.com/x"}, "metadata": map[string]any{"k": 1}},
		)})
		require.NoError(t, err)
	})
}

// TestCallerScope checks that a session-bound caller (as on NATS) can act
// only for its own session, and that host-only and agent methods stay on
// their own side.
func TestCallerScope(t *testing.T) {
	e := newEnv(t, broker.Config{})
	a := e.register("s1", "a")
	b := e.register("s2", "b")
	task := a.mustSend("b", "x")

	t.Run("token used from another session", func(t *testing.T) {
		_, err := e.call("s2", wire.MethodGetTask, map[string]any{"token": a.token, "taskId": task.ID})
		requireCode(t, err, wire.ErrUnauthorized)
	})
	t.Run("register for another session", func(t *testing.T) {
		_, err := e.call("s2", wire.MethodRegister, wire.RegisterParams{ContextID: "s1", Card: &wire.AgentCard{Name: "spy"}})
		requireCode(t, err, wire.ErrUnauthorized)
	})
	t.Run("register for another session with a bad card", func(t *testing.T) {
		_, err := e.call("s2", wire.MethodRegister, map[string]any{"contextId": "s1", "card": 5})
		requireCode(t, err, wire.ErrUnauthorized)
	})
	t.Run("replay of another session", func(t *testing.T) {
		_, err := e.call("s2", wire.MethodReplay, map[string]any{"contextId": "s1", "epoch": "", "afterSeq": 0})
		requireCode(t, err, wire.ErrUnauthorized)
	})
	t.Run("the owner acts for any session", func(t *testing.T) {
		r := raw(t, e.broker, owner, `{"jsonrpc":"2.0","id":1,"method":"a2a.tasks.get","params":{"token":"`+b.token+`","taskId":"`+task.ID+`"}}`)
		require.Nil(t, r.Error)
	})
	t.Run("agent methods are not served on the host scope", func(t *testing.T) {
		r := raw(t, e.broker, transport.Caller{Scope: transport.ScopeHost}, `{"jsonrpc":"2.0","id":1,"method":"a2a.agents.list","params":{}}`)
		require.NotNil(t, r.Error)
		assert.Equal(t, -32601, r.Error.Code)
	})
	t.Run("sessions methods are not served by a bus without them", func(t *testing.T) {
		_, err := e.bus.CallHost(context.Background(), wire.MethodSessionOpen, map[string]any{"contextId": "s1"})
		requireCode(t, err, wire.ErrMethodNotFound)
	})
}

// hostBus is a fake bus that serves one host method of its own.
type hostBus struct {
	transport.Bus
}

func (hostBus) HostMethods() map[string]transport.HostMethod {
	return map[string]transport.HostMethod{
		"a2a.test.echo": func(_ context.Context, params json.RawMessage) (any, error) { return params, nil },
		"a2a.test.fail": func(context.Context, json.RawMessage) (any, error) {
			return nil, wire.ErrInvalidParams.Withf("no")
		},
	}
}

func TestBusHostMethods(t *testing.T) {
	e := newEnv(t, broker.Config{})
	b, err := broker.New(context.Background(), hostBus{e.bus2(t)}, broker.Config{})
	require.NoError(t, err)
	defer b.Close()
	host := transport.Caller{Scope: transport.ScopeHost}
	r := raw(t, b, host, `{"jsonrpc":"2.0","id":1,"method":"a2a.test.echo","params":{"x":1}}`)
	require.Nil(t, r.Error)
	assert.JSONEq(t, `{"x":1}`, string(r.Result))
	r = raw(t, b, host, `{"jsonrpc":"2.0","id":1,"method":"a2a.test.fail","params":{}}`)
	assert.Equal(t, -32602, r.Error.Code)
	r = raw(t, b, transport.Caller{Scope: transport.ScopeSession, Session: "s1"}, `{"jsonrpc":"2.0","id":1,"method":"a2a.test.echo","params":{}}`)
	assert.Equal(t, -32601, r.Error.Code, "host methods are not served to sessions")
	r = raw(t, b, host, `{"jsonrpc":"2.0","id":1,"method":"a2a.test.echo","params":7}`)
	assert.Equal(t, -32602, r.Error.Code)
}

// A member given twice reads as one value everywhere: the session check
// and the decode of the params see the same contextId, so a register or a
// replay that names another session first and null last cannot slip by
// the check (it once registered an agent into the other session).
func TestARepeatedContextIDCannotReachAnotherSession(t *testing.T) {
	e := newEnv(t, broker.Config{})
	e.register("s1", "alice")
	e.register("s2", "bob")
	from := transport.Caller{Scope: transport.ScopeSession, Session: "s1"}
	for method, p := range map[string]string{
		wire.MethodRegister: `{"contextId":"s2","contextId":null,"card":{"name":"intruder"}}`,
		wire.MethodReplay:   `{"contextId":"s2","contextId":null}`,
	} {
		req, err := wire.EncodeRequest(1, method, json.RawMessage(p))
		require.NoError(t, err)
		resp := e.broker.ServeRPC(context.Background(), from, req)
		rpcErr := wire.ResponseError(resp)
		require.NotNil(t, rpcErr, "%s %s answered %s", method, p, resp)
	}
	for _, c := range e.register("s2", "carol").list() {
		assert.NotEqual(t, "intruder", c.Name, "nobody registered into s2 from s1")
	}
}
