package broker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/transport"
)

// FuzzServeRPC dispatches arbitrary messages, from an owner and from a
// session-bound caller, to a broker holding a few agents and a task: it
// never panics, answers every request with one well-formed response
// (nothing for a notification), and keeps serving.
func FuzzServeRPC(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"a2a.agents.register","params":{"contextId":"s1","card":{"name":"x"}}}`,
		`{"jsonrpc":"2.0","id":2,"method":"a2a.message.send","params":{"token":"TOKEN","message":{"parts":[{"kind":"text","text":"x"}]}}}`,
		`{"jsonrpc":"2.0","id":3,"method":"a2a.tasks.update","params":{"token":"TOKEN","taskId":"TASK","state":"completed","artifacts":[{"parts":[{"kind":"data","data":{}}]}]}}`,
		`{"jsonrpc":"2.0","id":4,"method":"a2a.events.replay","params":{"contextId":"s1","epoch":"","afterSeq":0}}`,
		`{"jsonrpc":"2.0","id":"x","method":"a2a.tasks.list","params":{"token":"TOKEN","state":"working","role":"assignee"}}`,
		`{"jsonrpc":"2.0","method":"a2a.agents.list","params":{}}`, `[]`, `{`, "\xf0",
	} {
		f.Add([]byte(s), false)
	}
	e := newEnv(f, broker.Config{})
	a := e.register("s1", "a")
	e.register("s2", "b")
	task := a.mustSend("b", "x")
	// The fuzzer's TOKEN and TASK stand for a live token and a real task,
	// so that it reaches past authentication.
	swap := func(raw []byte) []byte {
		raw = bytes.ReplaceAll(raw, []byte("TOKEN"), []byte(a.token))
		return bytes.ReplaceAll(raw, []byte("TASK"), []byte(task.ID))
	}
	callers := []transport.Caller{{Scope: transport.ScopeOwner}, {Scope: transport.ScopeSession, Session: "s1"}}
	f.Fuzz(func(t *testing.T, raw []byte, bound bool) {
		from := callers[0]
		if bound {
			from = callers[1]
		}
		raw = swap(raw)
		out := e.broker.ServeRPC(context.Background(), from, raw)
		if out == nil {
			var m map[string]json.RawMessage
			if json.Unmarshal(raw, &m) != nil || m["id"] != nil {
				t.Fatalf("no answer to %q", raw)
			}
			return
		}
		var resp map[string]json.RawMessage
		if err := json.Unmarshal(out, &resp); err != nil {
			t.Fatalf("answer is not JSON: %q", out)
		}
		_, hasResult := resp["result"]
		_, hasError := resp["error"]
		if hasResult == hasError || string(resp["jsonrpc"]) != `"2.0"` || resp["id"] == nil {
			t.Fatalf("malformed answer %s to %q", out, raw)
		}
	})
}
