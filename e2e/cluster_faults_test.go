package e2e_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/store/jsstore"
	"github.com/a2a-bus/a2a-bus/wire"
)

// Faults under load on a cluster of three hosts (three nats-server
// processes, three brokers): on every host, delegates in a few sessions
// keep registering and deregistering under contended names, sending
// tasks to each other across hosts, moving them through working to an
// end, canceling them; meanwhile one nats-server is killed and started
// again, then one broker. Every call is recorded (cluster_history_test.go)
// and, once the load stops, checked: every acknowledged change is in the
// cluster's store, no name was held by two instances at once, no
// notification reached another session, delegates waiting on the hosts
// that lived got their answers, and the history is linearizable for the
// registry's names and for each task's states (porcupine).

// faultsDeadline bounds every wait of these tests for a condition: the
// machine may be slow and busy; it bounds a wait that would otherwise
// hang, it times nothing.
const faultsDeadline = 90 * time.Second

// faultPlan is how much load, and how many rounds of faults.
type faultPlan struct {
	rounds int // rounds of faults: a nats-server killed and restarted, then a broker
	phase  int // calls answered with a result, per host, that each phase waits for
}

// TestClusterFaultsUnderLoad runs one round of faults under a short load.
func TestClusterFaultsUnderLoad(t *testing.T) {
	runFaults(t, faultPlan{rounds: 1, phase: 25})
}

// TestClusterFaultsSoak is the long version: more calls and a fault of
// every kind on every node in turn. It runs with A2A_BUS_SOAK=1 (some
// minutes on a small machine):
//
//	A2A_BUS_SOAK=1 go test -race -run TestClusterFaultsSoak -timeout 30m ./e2e
func TestClusterFaultsSoak(t *testing.T) {
	if os.Getenv("A2A_BUS_SOAK") != "1" {
		t.Skip("a long soak: set A2A_BUS_SOAK=1 to run it")
	}
	runFaults(t, faultPlan{rounds: 3, phase: 150})
}

func runFaults(t *testing.T, plan faultPlan) {
	began := time.Now()
	// A broker that dies comes back well within the orphan timeout: its
	// agents are held for it meanwhile, not let go.
	c := startTestCluster(t, "--orphan-timeout=10m")
	t.Logf("cluster up in %v", time.Since(began).Round(time.Millisecond))
	tap := c.seqTap(2)
	l := startLoad(t, c)
	loadBegan := time.Now()

	l.progress("warm-up", []int{0, 1, 2}, plan.phase)
	faults := 0
	for round := range plan.rounds {
		node, brk := round%3, (round+1)%3
		others := func(dead int) []int {
			var out []int
			for i := range 3 {
				if i != dead {
					out = append(out, i)
				}
			}
			return out
		}
		live := others(node)

		// A nats-server dies: the broker and the host connected to it
		// move to the other servers, the streams it led elect new
		// leaders, and a delegate waiting on another host gets its task
		// from the third, works it, and its asker learns it.
		wait := l.waitingWorker(live[0], fmt.Sprintf("r%d-nats", round))
		t0 := time.Now()
		c.nats.Kill(node)
		faults++
		t.Logf("round %d: nats-server %d killed (at %v in the history)", round, node, time.Duration(l.h.now()))
		l.ask(live[1], wait)
		l.progress(fmt.Sprintf("nats-server %d down", node), live, plan.phase)
		c.nats.Restart(node)
		t.Logf("round %d: nats-server %d restarted after %v (at %v in the history)", round, node, time.Since(t0).Round(time.Millisecond), time.Duration(l.h.now()))
		l.progress(fmt.Sprintf("nats-server %d back", node), []int{0, 1, 2}, plan.phase)

		// A broker dies: the others answer every request meanwhile, and
		// hold its agents for it (their names, their tasks) until it
		// comes back under the same name, well within the orphan
		// timeout.
		live = others(brk)
		wait = l.waitingWorker(live[0], fmt.Sprintf("r%d-broker", round))
		t0 = time.Now()
		c.killBroker(brk)
		faults++
		t.Logf("round %d: broker %d killed (at %v in the history)", round, brk, time.Duration(l.h.now()))
		l.ask(live[1], wait)
		l.progress(fmt.Sprintf("broker %d down", brk), []int{0, 1, 2}, plan.phase)
		c.startBroker(brk)
		t.Logf("round %d: broker %d restarted after %v (at %v in the history)", round, brk, time.Since(t0).Round(time.Millisecond), time.Duration(l.h.now()))
		l.progress(fmt.Sprintf("broker %d back", brk), []int{0, 1, 2}, plan.phase)
	}
	l.stopLoad()
	counts := l.h.count()
	t.Logf("load: %d calls (%d answered, %d refused, %d unknown) and %d faults in %v",
		counts[outcomeOK]+counts[outcomeFailed]+counts[outcomeUnknown], counts[outcomeOK], counts[outcomeFailed], counts[outcomeUnknown],
		faults, time.Since(loadBegan).Round(time.Millisecond))

	checkBegan := time.Now()
	st := l.openStore()
	reads := l.readTasks(st)
	l.checkAcknowledged(reads)
	l.checkNames(st, l.waiters)
	l.checkOpenTasksHaveMembers(st, reads)
	tap.check(t)
	names, tasks, unplaced := l.h.models(reads)
	t.Logf("linearizability: %d name operations, %d task operations over %d tasks, %d calls of unknown outcome that name no task or agent",
		len(names), len(tasks), len(reads), unplaced)
	checkLinearizable(t, "names", nameModel, names)
	checkLinearizable(t, "tasks", taskModel, tasks)
	t.Logf("checks in %v; the test in %v", time.Since(checkBegan).Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}

// load is the delegates at work on every host, and what they did.
type load struct {
	t     *testing.T
	c     *testCluster
	h     *history
	hosts []*natsbus.Client
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup

	mu       sync.Mutex
	workers  map[int]*runtime.Delegate // the long-lived worker of each host
	churners map[*runtime.Delegate]int // live churners, by host
	waiters  []*runtime.Delegate       // every long-lived delegate, for the final lists
}

// newLoad dials every host, and records their calls; no one calls yet.
func newLoad(t *testing.T, c *testCluster) *load {
	ctx, stop := context.WithCancel(context.Background())
	l := &load{t: t, c: c, h: newHistory(), ctx: ctx, stop: stop,
		workers: map[int]*runtime.Delegate{}, churners: map[*runtime.Delegate]int{}}
	l.h.writeOnFailure(t) // after the load stops
	t.Cleanup(l.stopLoad)
	for i := range 3 {
		l.hosts = append(l.hosts, c.host(i))
	}
	return l
}

// startLoad starts the delegates at work on every host.
func startLoad(t *testing.T, c *testCluster) *load {
	l := newLoad(t, c)
	for i := range 3 {
		w := l.spawn(i, fmt.Sprintf("h%d-work", i), "worker")
		l.workers[i] = w
		l.waiters = append(l.waiters, w)
	}
	for i := range 3 {
		a := l.spawn(i, fmt.Sprintf("h%d-ask", i), "asker")
		l.waiters = append(l.waiters, a)
		l.goActor(fmt.Sprintf("worker %d", i), func(ctx context.Context) { l.work(ctx, l.workers[i]) })
		l.goActor(fmt.Sprintf("asker %d", i), func(ctx context.Context) { l.askLoop(ctx, i, a) })
		for k, session := range []string{"work", "ask"} {
			rt := l.runtime(i, fmt.Sprintf("h%d-%s", i, session))
			l.goActor(fmt.Sprintf("churner %d.%d", i, k), func(ctx context.Context) { l.churn(ctx, i, rt) })
		}
	}
	return l
}

// runtime opens a session on host i, recorded.
func (l *load) runtime(i int, session string) *runtime.Runtime {
	t := l.t
	s, err := l.hosts[i].Session(context.Background(), session)
	require.NoError(t, err)
	rt, err := runtime.New(context.Background(), recordingSession{Session: s, h: l.h, host: i},
		runtime.Config{Feed: runtime.FeedConfig{CheckInterval: 200 * time.Millisecond}})
	require.NoError(t, err)
	t.Cleanup(func() { rt.Close() })
	return rt
}

// spawn spawns a long-lived delegate, trying again while the cluster
// does not answer.
func (l *load) spawn(i int, session, name string) *runtime.Delegate {
	t := l.t
	rt := l.runtime(i, session)
	ctx := as(context.Background(), l.h.actor(fmt.Sprintf("spawn %s on %d", name, i)))
	var d *runtime.Delegate
	require.Eventually(t, func() bool {
		var err error
		d, err = rt.Spawn(ctx, wire.AgentCard{Name: name})
		return err == nil
	}, faultsDeadline, 100*time.Millisecond, "spawn %s on host %d", name, i)
	return d
}

// goActor runs fn until the load stops, its calls recorded as one actor's.
func (l *load) goActor(name string, fn func(ctx context.Context)) {
	ctx := as(l.ctx, l.h.actor(name))
	l.wg.Go(func() { fn(ctx) })
}

// stopLoad stops every actor and waits for them. Idempotent.
func (l *load) stopLoad() {
	l.stop()
	l.wg.Wait()
}

// pause waits d, or until ctx ends: the load's pace, so that the
// brokers and servers keep some of two cores for their own work.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// work is a worker: every task it is given goes through working to an
// end, now and then through input-required, or is rejected.
func (l *load) work(ctx context.Context, d *runtime.Delegate) {
	n := 0
	for ctx.Err() == nil {
		ev, err := d.Wait(ctx)
		if err != nil {
			if errors.Is(err, runtime.ErrSettled) || errors.Is(err, runtime.ErrClosed) {
				return
			}
			pause(ctx, 50*time.Millisecond)
			continue
		}
		var ids []string
		switch {
		case ev.Task != nil && ev.Task.Kind == wire.EventCreated:
			ids = append(ids, ev.Task.TaskID)
		case ev.Resync != nil:
			for _, task := range ev.Resync.Changed {
				if task.AgentName == d.ID() && task.Status.State.Open() {
					ids = append(ids, task.ID)
				}
			}
		}
		for _, id := range ids {
			n++
			switch {
			case n%7 == 0:
				_, _ = d.Update(ctx, id, wire.StateRejected, nil)
			case n%5 == 0:
				_, _ = d.Update(ctx, id, wire.StateWorking, nil)
				_, _ = d.Update(ctx, id, wire.StateInputRequired, nil)
				_, _ = d.Task(ctx, id)
				_, _ = d.Update(ctx, id, wire.StateFailed, nil)
			default:
				_, _ = d.Update(ctx, id, wire.StateWorking, nil)
				_, _ = d.Update(ctx, id, wire.StateCompleted, &wire.Message{Parts: []wire.Part{wire.TextPart("done")}})
			}
		}
	}
}

// targets returns the agentIds an asker on host i sends to: the workers
// and the live churners of the other hosts.
func (l *load) targets(i int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for h, w := range l.workers {
		if h != i {
			out = append(out, w.ID())
		}
	}
	for d, h := range l.churners {
		if h != i {
			out = append(out, d.ID())
		}
	}
	slices.Sort(out)
	return out
}

// askLoop sends tasks across hosts, cancels some and reads some.
func (l *load) askLoop(ctx context.Context, i int, d *runtime.Delegate) {
	for n := 0; ctx.Err() == nil; n++ {
		targets := l.targets(i)
		to := targets[n%len(targets)]
		task, err := d.Send(ctx, to, clusterText(fmt.Sprintf("job %d from host %d", n, i)), nil)
		if err == nil {
			switch n % 4 {
			case 1:
				_, _ = d.Cancel(ctx, task.ID)
			case 2:
				pause(ctx, 20*time.Millisecond)
				_, _ = d.Task(ctx, task.ID)
				_, _ = d.Cancel(ctx, task.ID)
			case 3:
				_, _ = d.Task(ctx, task.ID)
			}
		}
		pause(ctx, 30*time.Millisecond)
	}
}

// churn registers delegates under names every host contends for, has
// each ask a worker for something (a task its deregistration cancels if
// it is still open), lets the askers find it for a while (a task
// assigned to it fails when it goes), and deregisters it.
func (l *load) churn(ctx context.Context, i int, rt *runtime.Runtime) {
	for n := 0; ctx.Err() == nil; n++ {
		d, err := rt.Spawn(ctx, wire.AgentCard{Name: []string{"alpha", "beta"}[n%2]})
		if err != nil {
			pause(ctx, 50*time.Millisecond)
			continue
		}
		l.mu.Lock()
		l.churners[d] = i
		worker := l.workers[(i+1+n%2)%3]
		l.mu.Unlock()
		if task, err := d.Send(ctx, worker.ID(), clusterText(fmt.Sprintf("churn %d from host %d", n, i)), nil); err == nil && n%3 == 0 {
			_, _ = d.Task(ctx, task.ID)
		}
		pause(ctx, 100*time.Millisecond)
		l.mu.Lock()
		delete(l.churners, d)
		l.mu.Unlock()
		// Settled even once the load stops: a settle cut short is tried
		// again by the runtime's Close.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		_ = d.Settle(sctx)
		cancel()
	}
}

// progress waits until every host in hosts has had n more calls
// answered with a result: the load goes on there.
func (l *load) progress(what string, hosts []int, n int) {
	t := l.t
	t.Helper()
	base := map[int]int{}
	for _, i := range hosts {
		base[i] = l.h.answered(i)
	}
	began := time.Now()
	deadline := time.Now().Add(faultsDeadline)
	for {
		done := true
		for _, i := range hosts {
			if l.h.answered(i)-base[i] < n {
				done = false
			}
		}
		if done {
			t.Logf("%s: %d calls answered on hosts %v in %v", what, n, hosts, time.Since(began).Round(time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			got := map[int]int{}
			for _, i := range hosts {
				got[i] = l.h.answered(i) - base[i]
			}
			t.Fatalf("%s: after %v, calls answered by host: %v; want %d each", what, faultsDeadline, got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waiter is a delegate waiting for a task.
type waiter struct {
	d    *runtime.Delegate
	done chan error // the task it got, worked and completed; or why not
}

// waitingWorker spawns a delegate on host i that waits for one task,
// works it and completes it.
func (l *load) waitingWorker(i int, tag string) *waiter {
	d := l.spawn(i, fmt.Sprintf("h%d-wait-%s", i, tag), "waiter-"+tag)
	w := &waiter{d: d, done: make(chan error, 1)}
	ctx := as(context.Background(), l.h.actor("waiter "+tag))
	l.wg.Go(func() {
		ctx, cancel := context.WithTimeout(ctx, faultsDeadline)
		defer cancel()
		for {
			ev, err := d.Wait(ctx)
			if err != nil {
				w.done <- fmt.Errorf("the waiting worker never got its task: %w", err)
				return
			}
			var id string
			switch {
			case ev.Task != nil && ev.Task.Kind == wire.EventCreated:
				id = ev.Task.TaskID
			case ev.Resync != nil:
				for _, task := range ev.Resync.Changed {
					if task.Status.State.Open() {
						id = task.ID
					}
				}
			}
			if id == "" {
				continue
			}
			// Each update carries a key of its own, kept across the
			// calls that try it again: it is applied once.
			working := wire.Message{MessageID: "working-" + id, Parts: []wire.Part{wire.TextPart("on it")}}
			if err := retryCall(ctx, func(ctx context.Context) error {
				_, err := d.Update(ctx, id, wire.StateWorking, &working)
				return err
			}); err != nil {
				w.done <- fmt.Errorf("the waiting worker's update to working: %w", err)
				return
			}
			done := wire.Message{MessageID: "done-" + id, Parts: []wire.Part{wire.TextPart("done while a node was down")}}
			w.done <- retryCall(ctx, func(ctx context.Context) error {
				_, err := d.Update(ctx, id, wire.StateCompleted, &done)
				return err
			})
			return
		}
	})
	return w
}

// retryCall calls fn until it is answered: a call whose outcome is
// unknown is made again, with the same idempotency key, so that it is
// applied once.
func retryCall(ctx context.Context, fn func(ctx context.Context) error) error {
	for {
		err := fn(ctx)
		if o, _ := classify(err); o != outcomeUnknown || ctx.Err() != nil {
			return err
		}
		pause(ctx, 100*time.Millisecond)
	}
}

// ask has a new delegate on host i send w its task, and checks that w
// worked it and that the asker learned it completed.
func (l *load) ask(i int, w *waiter) {
	t := l.t
	t.Helper()
	d := l.spawn(i, fmt.Sprintf("h%d-ask-%s", i, w.d.ID()), "asker-"+w.d.ID())
	ctx, cancel := context.WithTimeout(as(context.Background(), l.h.actor("asker of "+w.d.ID())), faultsDeadline)
	defer cancel()
	var task *wire.Task
	msg := clusterText("work while a node is down")
	msg.MessageID = "ask-" + w.d.ID() // one intent: a retry of a send cut short is applied once
	require.NoError(t, retryCall(ctx, func(ctx context.Context) error {
		var err error
		task, err = d.Send(ctx, w.d.ID(), msg, nil)
		return err
	}), "the asker on host %d could not reach %s", i, w.d.ID())
	select {
	case err := <-w.done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatalf("the waiting worker %s did not finish its task", w.d.ID())
	}
	assert.Equal(t, wire.StateCompleted, waitFinal(t, d, task.ID), "what the asker on host %d learned of its task", i)
}

// openStore opens the cluster's store from a connection of the test's.
func (l *load) openStore() *jsstore.Store {
	t := l.t
	nc, err := nats.Connect(l.c.url(0))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), faultsDeadline)
	defer cancel()
	st, err := jsstore.Open(ctx, nc, jsstore.Config{Prefix: "a2a", Replicas: 3})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	return st
}

// readTasks reads, from the stream leader, every task the history
// names.
func (l *load) readTasks(st *jsstore.Store) map[string]finalRead {
	t := l.t
	ids := map[string]bool{}
	for _, r := range l.h.snapshot() {
		if r.outcome != outcomeOK {
			continue
		}
		switch r.method {
		case wire.MethodSend, wire.MethodUpdateTask, wire.MethodCancelTask, wire.MethodGetTask:
			var res wire.TaskResult
			if json.Unmarshal(r.result, &res) == nil && res.Task != nil {
				ids[res.Task.ID] = true
			}
		}
	}
	reads := map[string]finalRead{}
	ctx, cancel := context.WithTimeout(context.Background(), faultsDeadline)
	defer cancel()
	for id := range ids {
		rd := finalRead{call: l.h.now()}
		rec, err := st.Get(ctx, id)
		rd.ret = l.h.now()
		if errors.Is(err, store.ErrNotFound) {
			rec, err = nil, nil
		}
		require.NoError(t, err, "read task %s", id)
		rd.rec = rec
		reads[id] = rd
	}
	return reads
}

// checkAcknowledged checks that every acknowledged change is in the
// store: each task whose create was answered exists; each answered
// update or cancel left its key in the task's record; a task answered
// as having ended is still in that end.
func (l *load) checkAcknowledged(reads map[string]finalRead) {
	t := l.t
	ended := map[string]wire.State{}
	for _, r := range l.h.snapshot() {
		if r.outcome != outcomeOK {
			continue
		}
		var res wire.TaskResult
		switch r.method {
		case wire.MethodSend:
			if json.Unmarshal(r.result, &res) == nil && res.Task != nil {
				assert.NotNil(t, reads[res.Task.ID].rec, "task %s, whose create was acknowledged, is gone", res.Task.ID)
			}
		case wire.MethodUpdateTask, wire.MethodCancelTask:
			var p struct {
				TaskID    string     `json:"taskId"`
				MessageID string     `json:"messageId"`
				State     wire.State `json:"state"`
			}
			if json.Unmarshal(r.params, &p) != nil || json.Unmarshal(r.result, &res) != nil || res.Task == nil {
				continue
			}
			rec := reads[p.TaskID].rec
			if !assert.NotNil(t, rec, "task %s, changed with an acknowledgement, is gone", p.TaskID) {
				continue
			}
			assert.True(t, slices.ContainsFunc(rec.Applied, func(a store.Applied) bool { return a.Key == p.MessageID }),
				"task %s: the acknowledged change %s (%s) is not in its record", p.TaskID, p.MessageID, r.method)
			if s := res.Task.Status.State; s.Terminal() {
				if prev, ok := ended[p.TaskID]; ok {
					assert.Equal(t, prev, s, "task %s was acknowledged as ended twice, differently", p.TaskID)
				}
				ended[p.TaskID] = s
			}
		}
	}
	for id, s := range ended {
		if rec := reads[id].rec; rec != nil {
			assert.Equal(t, s, rec.Task.Status.State, "task %s was acknowledged %s", id, s)
		}
	}
}

// checkNames checks that no agentId is held by two agents: in the
// store (each registration's agentId is its own, and its name's claim
// names its instance), and in what every broker lists (each agentId
// once, with one session and one registration time, the same on every
// broker, and the store's registrations all there). Requests spread
// over the brokers at random: each host lists many times, so that every
// broker answers some of them.
func (l *load) checkNames(st *jsstore.Store, listers []*runtime.Delegate) {
	t := l.t
	ctx, cancel := context.WithTimeout(context.Background(), faultsDeadline)
	defer cancel()
	regs, err := st.Registrations(ctx)
	require.NoError(t, err)
	byID := map[string]store.Registration{}
	for _, r := range regs {
		if prev, ok := byID[r.AgentID]; ok {
			t.Errorf("agentId %s is registered to two instances: %s (session %s) and %s (session %s)", r.AgentID, prev.Instance, prev.Session, r.Instance, r.Session)
		}
		byID[r.AgentID] = r
		holder, err := st.NameHolder(ctx, r.AgentID)
		require.NoError(t, err)
		assert.Equal(t, r.Instance, holder, "the claim of %s", r.AgentID)
	}
	// Every name claimed is its registration's: a claim left by an
	// acknowledged departure would keep the name from everyone for ever.
	departed := l.departures()
	for id, instance := range l.nameClaims() {
		reg, ok := byID[id]
		switch {
		case ok && reg.Instance == instance:
		case departed[instance]:
			t.Errorf("the name %s is still claimed by %s, which left with an acknowledgement", id, instance)
		default:
			t.Logf("the name %s is claimed by %s, which has no registration under it: its departure was cut short", id, instance)
		}
	}
	type seen struct{ session, registeredAt string }
	cards := map[string]seen{}
	for _, d := range listers {
		want := map[string]bool{}
		for id := range byID {
			if id != d.ID() {
				want[id] = true
			}
		}
		// A broker's copy follows the store by a watch: give it a moment
		// to catch up after the load, then every answer must be whole.
		agree := 0
		for tries := 0; agree < 8; tries++ {
			peers, err := d.Peers(ctx)
			require.NoError(t, err, "%s lists its peers", d.ID())
			got := map[string]bool{}
			for _, p := range peers {
				assert.False(t, got[p.AgentID], "%s is listed twice to %s", p.AgentID, d.ID())
				got[p.AgentID] = true
				at, _ := json.Marshal(p.RegisteredAt)
				s := seen{p.ContextID, string(at)}
				if prev, ok := cards[p.AgentID]; ok {
					assert.Equal(t, prev, s, "%s is listed with two registrations", p.AgentID)
				}
				cards[p.AgentID] = s
			}
			if sameSet(got, want) {
				agree++
				continue
			}
			require.Less(t, tries, 200, "the peers listed to %s: %v; the store's registrations: %v", d.ID(), keys(got), keys(want))
			agree = 0
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// nameClaims reads every name claimed in the cluster (the agents
// bucket's n.<agentId> keys, store/jsstore's layout) and the instance
// claiming it, from the stream leader.
func (l *load) nameClaims() map[string]string {
	t := l.t
	ctx, cancel := context.WithTimeout(context.Background(), faultsDeadline)
	defer cancel()
	nc, err := nats.Connect(l.c.url(1))
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	str, err := js.Stream(ctx, "KV_a2a_agents")
	require.NoError(t, err)
	const prefix = "$KV.a2a_agents.n."
	info, err := str.Info(ctx, jetstream.WithSubjectFilter(prefix+"*"))
	require.NoError(t, err)
	out := map[string]string{}
	for subject := range info.State.Subjects {
		m, err := str.GetLastMsgForSubject(ctx, subject)
		require.NoError(t, err)
		if op := m.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
			continue
		}
		id, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(subject, prefix))
		require.NoError(t, err, "the name key %s", subject)
		out[string(id)] = string(m.Data)
	}
	return out
}

// checkOpenTasksHaveMembers checks that no task is left open with a
// member that is gone although its departure was acknowledged: an
// acknowledged departure closed its agent's open tasks, those another
// broker made for it meanwhile included. A departure that was not
// acknowledged (its broker was killed while it closed them) may leave
// them open for a while: every broker looks for such tasks at its start
// and every minute, and closes them, so they must be closed within a
// minute and a bit.
func (l *load) checkOpenTasksHaveMembers(st *jsstore.Store, reads map[string]finalRead) {
	t := l.t
	ctx, cancel := context.WithTimeout(context.Background(), faultsDeadline)
	defer cancel()
	regs, err := st.Registrations(ctx)
	require.NoError(t, err)
	live := map[string]bool{}
	for _, r := range regs {
		live[r.Instance] = true
	}
	departed := l.departures()
	cutShort := map[string]bool{}
	for id, rd := range reads {
		if rd.rec == nil || rd.rec.Task.Status.State.Terminal() {
			continue
		}
		for _, m := range []struct{ role, instance, name string }{
			{"requester", rd.rec.RequesterInstance, rd.rec.Task.RequesterName},
			{"assignee", rd.rec.AssigneeInstance, rd.rec.Task.AgentName},
		} {
			switch {
			case live[m.instance]:
			case departed[m.instance]:
				t.Errorf("task %s is %s, and its %s %s left with an acknowledgement", id, rd.rec.Task.Status.State, m.role, m.name)
			default:
				t.Logf("task %s is %s, and its %s %s is gone: its departure was cut short", id, rd.rec.Task.Status.State, m.role, m.name)
				cutShort[id] = true
			}
		}
	}
	// A sweep comes within a minute of the last: 75 s leave a margin.
	began := time.Now()
	for len(cutShort) > 0 && time.Since(began) < 75*time.Second {
		for id := range cutShort {
			if rec, err := st.Get(ctx, id); err == nil && rec.Task.Status.State.Terminal() {
				delete(cutShort, id)
			}
		}
		if len(cutShort) > 0 {
			time.Sleep(200 * time.Millisecond)
		}
	}
	for id := range cutShort {
		t.Errorf("task %s is still open %v after the checks began, with a member whose departure was cut short", id, time.Since(began).Round(time.Second))
	}
}

// departures returns the instances whose deregistration was
// acknowledged.
func (l *load) departures() map[string]bool {
	rpcs := l.h.snapshot()
	byToken := map[string]string{}
	out := map[string]bool{}
	for _, r := range rpcs {
		switch {
		case r.method == wire.MethodRegister && r.outcome == outcomeOK:
			var res wire.RegisterResult
			if json.Unmarshal(r.result, &res) == nil {
				byToken[res.Token] = res.InstanceID
			}
		case r.method == wire.MethodDeregister && r.outcome == outcomeOK:
			var p wire.TokenParams
			if json.Unmarshal(r.params, &p) == nil && byToken[p.Token] != "" {
				out[byToken[p.Token]] = true
			}
		}
	}
	return out
}

func sameSet(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// seqTap records every notification published to any session, from a
// raw connection to node i: one whose recipientContextId is not its
// subject's session is wrong, and a session's seq seen twice must carry
// the same notification.
type seqTap struct {
	mu        sync.Mutex
	wrong     []string
	bySeq     map[string]map[uint64]string // session -> seq -> notification
	conflicts []string
	count     int
}

func (c *testCluster) seqTap(i int) *seqTap {
	t := c.t
	nc, err := nats.Connect(c.url(i), nats.MaxReconnects(-1))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	tp := &seqTap{bySeq: map[string]map[uint64]string{}}
	_, err = nc.Subscribe("a2a.session.*.events", func(m *nats.Msg) {
		token := strings.TrimSuffix(strings.TrimPrefix(m.Subject, "a2a.session."), ".events")
		session, err := natsbus.SessionID(token)
		ev, derr := wire.DecodeEvent(m.Data)
		tp.mu.Lock()
		defer tp.mu.Unlock()
		tp.count++
		if err != nil || derr != nil || ev.Head().RecipientContextID != session {
			tp.wrong = append(tp.wrong, m.Subject+" "+string(m.Data))
			return
		}
		seqs := tp.bySeq[session]
		if seqs == nil {
			seqs = map[uint64]string{}
			tp.bySeq[session] = seqs
		}
		seq := ev.Head().Seq
		if prev, ok := seqs[seq]; ok && prev != string(m.Data) {
			tp.conflicts = append(tp.conflicts, fmt.Sprintf("session %s seq %d: %s and %s", session, seq, prev, m.Data))
		}
		seqs[seq] = string(m.Data)
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	return tp
}

func (tp *seqTap) check(t *testing.T) {
	t.Helper()
	tp.mu.Lock()
	defer tp.mu.Unlock()
	t.Logf("notifications seen: %d in %d sessions", tp.count, len(tp.bySeq))
	assert.NotZero(t, tp.count, "the tap saw no notification")
	assert.Empty(t, tp.wrong, "notifications published to another session than their recipient's")
	assert.Empty(t, tp.conflicts, "two notifications with one seq in one session")
}
