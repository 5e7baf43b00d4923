package broker_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/wire"
)

// TestConcurrency has many agents in many sessions register (all under
// one name), send, update and deregister at once, then checks the
// invariants: live names unique, every event delivered once to the right
// session, in seq order without gaps, and each task's events complete.
func TestConcurrency(t *testing.T) {
	const sessions, perSession, sendsEach = 8, 4, 12
	e := newEnv(t, broker.Config{MaxTasksPerContext: 1000})
	for s := range sessions {
		e.session(fmt.Sprint("s", s))
	}

	agents := make([]*agent, sessions*perSession)
	errs := make([]error, len(agents))
	var wg sync.WaitGroup
	for i := range agents {
		wg.Go(func() { agents[i], errs[i] = e.tryRegister(fmt.Sprint("s", i%sessions), "worker", "") })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}

	ids := map[string]bool{}
	for _, a := range agents {
		require.False(t, ids[a.id], "duplicate live name %s", a.id)
		ids[a.id] = true
	}
	require.Len(t, agents[0].list(), len(agents)-1)

	var mu sync.Mutex
	created := map[string]*wire.Task{} // task id -> task as created
	for i, a := range agents {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(i), 7))
			for range sendsEach {
				peer := agents[r.IntN(len(agents))]
				if peer == a {
					continue
				}
				task, err := a.trySend(peer.id, "job from "+a.id)
				if !assert.NoError(t, err) {
					return
				}
				mu.Lock()
				created[task.ID] = task
				mu.Unlock()
				// Work off what is assigned to me meanwhile.
				res, err := a.tryCall(wire.MethodListTasks, map[string]any{"role": "assignee", "state": "submitted"})
				var l wire.ListTasksResult
				if !assert.NoError(t, err) || !assert.NoError(t, json.Unmarshal(res, &l)) {
					return
				}
				for _, mine := range l.Tasks {
					_, err := a.tryUpdate(mine.ID, wire.StateWorking, "")
					if err == nil {
						_, err = a.tryUpdate(mine.ID, wire.StateCompleted, "done")
					}
					if !assert.NoError(t, err) {
						return
					}
				}
			}
		})
	}
	wg.Wait()
	// Some leave; the rest finish what is left.
	for i, a := range agents {
		if i%5 == 0 {
			wg.Go(func() { assert.NoError(t, a.tryDeregister()) })
		}
	}
	wg.Wait()
	for i, a := range agents {
		if i%5 == 0 {
			continue
		}
		res, err := a.call(wire.MethodListTasks, map[string]any{"role": "assignee"})
		require.NoError(t, err)
		var l wire.ListTasksResult
		require.NoError(t, json.Unmarshal(res, &l))
		for _, mine := range l.Tasks {
			if mine.Status.State.Open() {
				_, err := a.update(mine.ID, wire.StateCompleted, "late")
				require.NoError(t, err)
			}
		}
	}

	// Every event is already in its session's channel (the fake bus
	// delivers before the call returns).
	type seen struct{ created, final int }
	perTask := map[string]*seen{}
	bySession := map[string]string{} // agentId -> session
	for _, a := range agents {
		bySession[a.id] = a.session
	}
	for s := range sessions {
		id := fmt.Sprint("s", s)
		var want uint64 = 1
		for {
			var raw []byte
			select {
			case raw = <-e.session(id).sub.C():
			default:
			}
			if raw == nil {
				break
			}
			ev, err := wire.DecodeEvent(raw)
			require.NoError(t, err)
			h := ev.Head()
			require.Equal(t, id, h.RecipientContextID, "delivered to its recipient's session only")
			require.Equal(t, bySession[h.Recipient], id, "the recipient lives in this session")
			require.Equal(t, want, h.Seq, "seq in order without gaps in %s", id)
			want++
			te := ev.TaskEvent
			require.NotNil(t, te)
			st := perTask[te.TaskID]
			if st == nil {
				st = &seen{}
				perTask[te.TaskID] = st
			}
			if te.Kind == wire.EventCreated {
				st.created++
				assert.Equal(t, created[te.TaskID].AgentName, h.Recipient)
			}
			if te.Final {
				st.final++
			}
		}
		assert.Zero(t, e.session(id).sub.Dropped())
	}
	require.Len(t, perTask, len(created))
	for id, st := range perTask {
		assert.Equal(t, 1, st.created, "task %s: one created event", id)
		assert.Equal(t, 1, st.final, "task %s: one final event", id)
	}
}

// TestStateMachineProperties drives random operation sequences by random
// actors against one task at a time and checks each answer against a
// model: a terminal state never changes, a non-member never acts, the
// wrong member never moves the state.
func TestStateMachineProperties(t *testing.T) {
	e := newEnv(t, broker.Config{MaxTasksPerContext: 10000})
	req := e.register("s1", "req")
	asg := e.register("s2", "asg")
	strangers := []*agent{e.register("s1", "same-session"), e.register("s3", "other-session")}
	updatable := []wire.State{wire.StateWorking, wire.StateInputRequired, wire.StateCompleted, wire.StateFailed, wire.StateRejected, wire.StateSubmitted, wire.StateCanceled}

	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	for seq := range 150 {
		task := req.mustSend("asg", fmt.Sprint("case ", seq))
		model := wire.StateSubmitted
		history := 1
		for step := range 25 {
			actors := []*agent{req, asg, strangers[0], strangers[1]}
			who := actors[r.IntN(len(actors))]
			isStranger := who != req && who != asg
			var err error
			var op string
			switch r.IntN(4) {
			case 0:
				s := updatable[r.IntN(len(updatable))]
				op = "update " + string(s)
				_, err = who.update(task.ID, s, "")
				switch {
				case s == wire.StateSubmitted || s == wire.StateCanceled:
					requireCode(t, err, wire.ErrInvalidParams) // a shape error outranks membership
				case isStranger:
					requireCode(t, err, wire.ErrUnknownAgent)
				case who != asg || model.Terminal():
					requireCode(t, err, wire.ErrInvalidTransition)
				default:
					require.NoError(t, err)
					model = s
				}
			case 1:
				op = "cancel"
				_, err = who.cancel(task.ID)
				switch {
				case isStranger:
					requireCode(t, err, wire.ErrUnknownAgent)
				case who != req || model.Terminal():
					requireCode(t, err, wire.ErrInvalidTransition)
				default:
					require.NoError(t, err)
					model = wire.StateCanceled
				}
			case 2:
				op = "message"
				_, err = who.reply(task.ID, "m")
				switch {
				case isStranger:
					requireCode(t, err, wire.ErrUnknownAgent)
				case model.Terminal():
					requireCode(t, err, wire.ErrInvalidTransition)
				default:
					require.NoError(t, err)
					history++
				}
			case 3:
				op = "get"
				_, err = who.get(task.ID)
				if isStranger {
					requireCode(t, err, wire.ErrUnknownAgent)
				} else {
					require.NoError(t, err)
				}
			}
			got, gerr := req.get(task.ID)
			require.NoError(t, gerr)
			require.Equal(t, model, got.Status.State, "case %d step %d (%s by %s)", seq, step, op, who.id)
			require.Len(t, got.History, history)
		}
	}
	// Drain: the events are not the subject here.
	for _, s := range []string{"s1", "s2", "s3"} {
		for len(e.session(s).sub.C()) > 0 {
			<-e.session(s).sub.C()
		}
	}
}
