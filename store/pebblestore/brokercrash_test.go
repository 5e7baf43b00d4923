package pebblestore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/store/pebblestore"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/transport/fakebus"
	"github.com/a2a-bus/a2a-bus/wire"
)

// crashBroker is a broker over a store on a crashable file system.
type crashBroker struct {
	st  *pebblestore.Store
	bus *fakebus.Bus
	b   *broker.Broker
}

func startCrashBroker(dir string, fs vfs.FS) (*crashBroker, error) {
	st, err := pebblestore.Open(dir, pebblestore.WithFS(pebblestore.Options{}, fs))
	if err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	bus := fakebus.New(fakebus.Config{})
	b, err := broker.New(context.Background(), bus, broker.Config{Store: st})
	if err != nil {
		bus.Close()
		st.Close()
		return nil, err
	}
	return &crashBroker{st: st, bus: bus, b: b}, nil
}

func (c *crashBroker) close() error {
	c.b.Close()
	c.bus.Close()
	return c.st.Close()
}

// call makes a request of session's, and decodes its result into out.
func (c *crashBroker) call(session, method string, params, out any) error {
	p, err := json.Marshal(params)
	if err != nil {
		return err
	}
	req, err := wire.EncodeRequest(1, method, p)
	if err != nil {
		return err
	}
	resp := c.b.ServeRPC(context.Background(), transport.Caller{Scope: transport.ScopeSession, Session: session}, req)
	if rpcErr := wire.ResponseError(resp); rpcErr != nil {
		return rpcErr
	}
	res, err := wire.DecodeResult(resp)
	if err != nil {
		return err
	}
	return json.Unmarshal(res, out)
}

func (c *crashBroker) register(session, name, instance string) (wire.RegisterResult, error) {
	var r wire.RegisterResult
	err := c.call(session, wire.MethodRegister, wire.RegisterParams{ContextID: session, Card: &wire.AgentCard{Name: name, Description: "agent " + name}, InstanceID: instance}, &r)
	return r, err
}

// brokerAgent is an agent registered and acknowledged.
type brokerAgent struct {
	session, name, instance, agentID, token string
}

// TestCrashKeepsTheBrokersTasksAndNames: a broker over a store on a
// crashable file system registers agents (names and instance ids), and
// makes and updates tasks; at crash points a crash clone is taken, and a
// broker started on each finds every task it acknowledged in the state
// acknowledged (or a later one then under way), gives every agent it
// acknowledged its name back when it registers again with its instance
// id, and gives that name to no agent of another session. So an address
// never moves to another session's agent after a power cut.
func TestCrashKeepsTheBrokersTasksAndNames(t *testing.T) {
	seed := crashSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	dir, fs := memDataDir(t)
	c, err := startCrashBroker(dir, fs)
	require.NoError(t, err)

	type point struct {
		fs     *vfs.MemFS
		agents []brokerAgent
		tasks  map[string][]wire.State // id -> states acknowledged
	}
	var points []point
	var agents []brokerAgent
	tasks := map[string][]wire.State{}
	// The calls are made one at a time: a clone is taken between two,
	// so every change acknowledged before it must be there, exactly.
	crash := func() {
		percent := 0
		if rng.IntN(2) == 1 {
			percent = 1 + rng.IntN(100)
		}
		cfg := vfs.CrashCloneCfg{UnsyncedDataPercent: percent, RNG: rand.New(rand.NewPCG(seed, uint64(len(points)+1)))}
		p := point{fs: fs.CrashClone(cfg), agents: append([]brokerAgent(nil), agents...), tasks: map[string][]wire.State{}}
		for id, states := range tasks {
			p.tasks[id] = append([]wire.State(nil), states...)
		}
		points = append(points, p)
	}
	const want = 40
	for i := 0; len(points) < want; i++ {
		switch n := rng.IntN(10); {
		case n < 3 || len(agents) < 2:
			a := brokerAgent{session: fmt.Sprint("s", rng.IntN(4)), name: fmt.Sprint("agent", i), instance: fmt.Sprint("inst-", i)}
			r, err := c.register(a.session, a.name, a.instance)
			require.NoError(t, err)
			a.agentID, a.token = r.AgentID, r.Token
			agents = append(agents, a)
		case n < 6:
			k := rng.IntN(len(agents))
			from, to := agents[k], agents[(k+1+rng.IntN(len(agents)-1))%len(agents)]
			var r wire.TaskResult
			require.NoError(t, c.call(from.session, wire.MethodSend, map[string]any{
				"token": from.token, "to": to.agentID,
				"message": map[string]any{"messageId": fmt.Sprint("m-", i), "parts": []any{map[string]any{"kind": "text", "text": fmt.Sprint("hello ", i)}}},
			}, &r))
			tasks[r.Task.ID] = []wire.State{r.Task.Status.State}
		default:
			// The assignee moves a task on.
			var r wire.TaskResult
			for id, states := range tasks {
				if !states[len(states)-1].Open() {
					continue
				}
				rec, err := c.st.Get(context.Background(), id)
				require.NoError(t, err)
				var to brokerAgent
				for _, a := range agents {
					if a.instance == rec.AssigneeInstance {
						to = a
					}
				}
				state := []wire.State{wire.StateWorking, wire.StateCompleted}[rng.IntN(2)]
				require.NoError(t, c.call(to.session, wire.MethodUpdateTask, map[string]any{"token": to.token, "taskId": id, "state": state}, &r))
				tasks[id] = append(states, r.Task.Status.State)
				break
			}
		}
		if rng.IntN(4) == 0 {
			crash()
		}
	}
	require.NoError(t, c.close())

	for i, p := range points {
		c, err := startCrashBroker(dir, p.fs)
		require.NoError(t, err, "crash point %d", i)
		for id, states := range p.tasks {
			rec, err := c.st.Get(context.Background(), id)
			require.NoError(t, err, "crash point %d: task %s", i, id)
			require.Equal(t, states[len(states)-1], rec.Task.Status.State, "crash point %d: task %s", i, id)
		}
		// An agent of another session asking for each name first: none
		// gets a name held for an acknowledged registration.
		// (One session each: a session holds at most 64 live agents,
		// and a crash point may hold more names than that.)
		for j, a := range p.agents {
			r, err := c.register(fmt.Sprint("intruder-", j), a.name, "")
			require.NoError(t, err)
			require.NotEqual(t, a.agentID, r.AgentID, "crash point %d: the name of %s went to another session's agent", i, a.instance)
		}
		for _, a := range p.agents {
			r, err := c.register(a.session, a.name, a.instance)
			require.NoError(t, err, "crash point %d", i)
			require.Equal(t, a.agentID, r.AgentID, "crash point %d: %s registers again", i, a.instance)
		}
		require.NoError(t, c.close())
	}
	t.Logf("%d crash points checked", len(points))
}
