package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/pipebus"
	"github.com/a2a-bus/a2a-bus/wire"
)

// rawBus sends raw messages to a broker and reads the raw answers, as a
// hostile client would.
type rawBus interface {
	// exchange sends msg and returns the answer (nil for none within a
	// moment, which only notifications may get).
	exchange(t *testing.T, msg []byte) map[string]json.RawMessage
}

// natsRaw sends on a2a.rpc.<session> with the host credential.
type natsRaw struct {
	nc      *nats.Conn
	subject string
}

func (n natsRaw) exchange(t *testing.T, msg []byte) map[string]json.RawMessage {
	t.Helper()
	reply, err := n.nc.Request(n.subject, msg, 5*time.Second)
	require.NoError(t, err)
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(reply.Data, &m), "%q", reply.Data)
	return m
}

// pipeRaw writes lines to the broker end of a pipe and reads its lines.
type pipeRaw struct {
	mu  sync.Mutex
	w   *os.File
	out *bufio.Reader
}

func (p *pipeRaw) exchange(t *testing.T, msg []byte) map[string]json.RawMessage {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := p.w.Write(append(msg, '\n'))
	require.NoError(t, err)
	line, err := p.out.ReadBytes('\n')
	require.NoError(t, err)
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(line, &m), "%q", line)
	return m
}

type hostileEnv struct {
	name string
	raw  rawBus
	// probe runs a round trip between two other sessions.
	probe func(t *testing.T)
}

// probeVia registers two agents in sessions of their own on a client and
// returns a function that does one task round trip between them.
func roundTripProbe(t *testing.T, call func(session, method string, params any) (json.RawMessage, error)) func(t *testing.T) {
	reg := func(session, name string) wire.RegisterResult {
		res, err := call(session, wire.MethodRegister, wire.RegisterParams{ContextID: session, Card: &wire.AgentCard{Name: name}})
		require.NoError(t, err)
		var r wire.RegisterResult
		require.NoError(t, json.Unmarshal(res, &r))
		return r
	}
	a, b := reg("bystander-1", "bystander-a"), reg("bystander-2", "bystander-b")
	return func(t *testing.T) {
		res, err := call("bystander-1", wire.MethodSend, wire.SendParams{Token: a.Token, To: b.AgentID, Message: &wire.Message{Parts: []wire.Part{wire.TextPart("still there?")}}})
		require.NoError(t, err)
		var tr wire.TaskResult
		require.NoError(t, json.Unmarshal(res, &tr))
		_, err = call("bystander-2", wire.MethodUpdateTask, wire.UpdateParams{Token: b.Token, TaskID: tr.Task.ID, State: wire.StateCompleted})
		require.NoError(t, err)
	}
}

func hostileEnvs(t *testing.T) []hostileEnv {
	t.Helper()
	var envs []hostileEnv
	{
		bus, err := natsbus.New(natsbus.Config{})
		require.NoError(t, err)
		b, err := broker.New(context.Background(), bus, broker.Config{})
		require.NoError(t, err)
		// A host's requests on a session's subject are answered in that
		// session's inbox only.
		nc, err := nats.Connect(bus.URL(), nats.Token(bus.Server().Token()), nats.CustomInboxPrefix(natsbus.SessionInbox("hostile")))
		require.NoError(t, err)
		c, err := bus.Connect(natsbus.ClientConfig{})
		require.NoError(t, err)
		t.Cleanup(func() { nc.Close(); c.Close(); bus.Close(); b.Close() })
		call := func(session, method string, params any) (json.RawMessage, error) {
			s, err := c.Session(context.Background(), session)
			if err != nil {
				return nil, err
			}
			return s.Call(context.Background(), method, params)
		}
		envs = append(envs, hostileEnv{"nats", natsRaw{nc, natsbus.RPCSubject("hostile")}, roundTripProbe(t, call)})
	}
	{
		// The pipe's broker end on os.Pipes, driven raw; a second pipe
		// carries the bystanders.
		reqR, reqW, err := os.Pipe()
		require.NoError(t, err)
		respR, respW, err := os.Pipe()
		require.NoError(t, err)
		bus, err := pipebus.New(reqR, respW, pipebus.Config{})
		require.NoError(t, err)
		b, err := broker.New(context.Background(), bus, broker.Config{})
		require.NoError(t, err)
		t.Cleanup(func() { reqW.Close(); bus.Close(); b.Close(); respR.Close() })
		envs = append(envs, hostileEnv{"pipe", &pipeRaw{w: reqW, out: bufio.NewReaderSize(respR, 1<<20)}, nil})
	}
	return envs
}

func codeOf(t *testing.T, m map[string]json.RawMessage) int {
	t.Helper()
	require.Contains(t, m, "error", "want an error, got %v", m)
	var e wire.Error
	require.NoError(t, json.Unmarshal(m["error"], &e))
	return e.Code
}

func heapMiB() float64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapAlloc) / (1 << 20)
}

// TestHostileInput sends each class of hostile input over both buses:
// each is answered with its error, memory stays bounded, and a round trip
// between two other sessions keeps working throughout.
func TestHostileInput(t *testing.T) {
	parts := func(n int) string {
		p := make([]string, n)
		for i := range p {
			p[i] = `{"kind":"text","text":"x"}`
		}
		return strings.Join(p, ",")
	}
	register := func(ctx, name, instance string) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"a2a.agents.register","params":{"contextId":%q,"card":{"name":%q},"instanceId":%q}}`, ctx, name, instance)
	}
	cases := []struct {
		name string
		msg  string
		code int
		// onSession is the code when the request comes on a session's
		// subject (NATS), where a claim on another session comes first.
		onSession int
	}{
		{"oversized: rejected, not truncated", `{"jsonrpc":"2.0","id":1,"method":"a2a.agents.register","params":{"contextId":"hostile","card":{"name":"big","description":"` + strings.Repeat("d", 1<<20) + `"}}}`, -32600, 0},
		{"deeply nested", `{"jsonrpc":"2.0","id":1,"method":"a2a.agents.list","params":{"x":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}}`, -32700, 0},
		{"invalid UTF-8", "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a2a.agents.register\",\"params\":{\"contextId\":\"hostile\",\"card\":{\"name\":\"\xc0\xaf\"}}}", -32700, 0},
		{"huge part count", `{"jsonrpc":"2.0","id":1,"method":"a2a.message.send","params":{"token":"TOKEN","message":{"parts":[` + parts(30000) + `]}}}`, -32602, 0},
		{"very long name", register("hostile", strings.Repeat("n", 100000), "i1"), -32602, 0},
		{"very long session id", register(strings.Repeat("c", 100000), "n", "i2"), -32602, -32045},
		{"very long instance id", register("hostile", "n", strings.Repeat("i", 100000)), -32602, 0},
		{"very long task id", `{"jsonrpc":"2.0","id":1,"method":"a2a.tasks.get","params":{"token":"TOKEN","taskId":"` + strings.Repeat("t", 500000) + `"}}`, -32001, 0},
		{"a huge card", `{"jsonrpc":"2.0","id":1,"method":"a2a.agents.register","params":{"contextId":"hostile","card":{"name":"c","description":"` + strings.Repeat("d", 100000) + `"}}}`, -32602, 0},
	}
	for _, env := range hostileEnvs(t) {
		t.Run(env.name, func(t *testing.T) {
			var reg wire.RegisterResult
			ans := env.raw.exchange(t, []byte(register("hostile", "hostile", "hostile-1")))
			require.NoError(t, json.Unmarshal(ans["result"], &reg))
			before := heapMiB()
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					msg := strings.ReplaceAll(tc.msg, "TOKEN", reg.Token)
					want := tc.code
					if env.name == "nats" && tc.onSession != 0 {
						want = tc.onSession
					}
					assert.Equal(t, want, codeOf(t, env.raw.exchange(t, []byte(msg))))
					if env.probe != nil {
						env.probe(t)
					}
				})
			}
			t.Run("duplicate request ids are each answered", func(t *testing.T) {
				for range 3 {
					ans := env.raw.exchange(t, []byte(`{"jsonrpc":"2.0","id":7,"method":"a2a.agents.list","params":{"token":"`+reg.Token+`"}}`))
					assert.Equal(t, "7", string(ans["id"]))
					assert.Contains(t, ans, "result")
				}
			})
			t.Run("a flood of unknown methods", func(t *testing.T) {
				var wg sync.WaitGroup
				if env.probe != nil {
					wg.Go(func() {
						for range 20 {
							env.probe(t)
						}
					})
				}
				for i := range 5000 {
					ans := env.raw.exchange(t, []byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"a2a.nope.%d","params":{}}`, i, i)))
					if codeOf(t, ans) != -32601 {
						t.Fatalf("flood message %d: %v", i, ans)
					}
				}
				wg.Wait()
			})
			after := heapMiB()
			t.Logf("%s: heap %.1f MiB before the hostile input, %.1f MiB after", env.name, before, after)
			assert.Less(t, after-before, 32.0, "memory stays bounded")
		})
	}
}
