package e2e_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// A history of the calls that sessions make to a cluster's brokers, as
// each was sent and answered, and its check for linearizability with
// porcupine (github.com/anishathalye/porcupine, a well-kept checker, the
// one etcd's robustness tests descend from): the registry's names,
// partitioned by agentId (a name is held by at most one instance at a
// time), and each task's states, partitioned by task id (the lifecycle
// of docs/PROTOCOL.md §3 and §4 with its idempotency keys, §4.11).
//
// Every call is recorded where the session's runtime sends it (below the
// runtime's retries and re-registrations), so a call retried with its
// key is two operations with one key, and the model knows that the
// second is a retry if the first was applied.

// outcome is what a call's caller learned.
type outcome int

const (
	// outcomeOK: the broker answered a result.
	outcomeOK outcome = iota
	// outcomeFailed: the broker answered an error that changed nothing.
	outcomeFailed
	// outcomeUnknown: no answer (the call's deadline passed, the
	// connection was cut), or an internal error (a store that did not
	// answer in time may have applied the change): it may or may not
	// have been applied.
	outcomeUnknown
)

func (o outcome) String() string {
	switch o {
	case outcomeOK:
		return "ok"
	case outcomeFailed:
		return "failed"
	default:
		return "unknown"
	}
}

// classify tells what err, a call's error, says of the call.
func classify(err error) (outcome, string) {
	if err == nil {
		return outcomeOK, ""
	}
	var we *wire.Error
	if errors.As(err, &we) {
		code := ""
		if we.Data != nil {
			code = we.Data.Code
		}
		if code == wire.CodeInternalError {
			return outcomeUnknown, code
		}
		return outcomeFailed, code
	}
	return outcomeUnknown, err.Error()
}

// rpc is one call of the history.
type rpc struct {
	host       int // the host whose session made it
	actor      int // who made it: a load goroutine, or 0 (the runtime on its own)
	method     string
	params     json.RawMessage
	call, ret  int64 // nanoseconds since the history began
	outcome    outcome
	code       string // the error's data.code, or the error for an unknown outcome
	result     json.RawMessage
	historyIdx int
}

// history records the calls of every session wrapped by record.
type history struct {
	origin time.Time
	mu     sync.Mutex
	rpcs   []rpc
	actors []string    // names of the actors, by id
	oks    map[int]int // calls answered with a result, by host
	gone   []departure // agents whose host died
	reads  map[string]finalRead
}

// departure is an agent whose host died at a time: from then on, its
// name may be let go, and its open tasks closed, at any moment.
type departure struct {
	instance, session, agentID string
	at                         int64
}

// hostDied notes that an agent's host died at a time of the history's
// clock.
func (h *history) hostDied(instance, session, agentID string, at int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gone = append(h.gone, departure{instance, session, agentID, at})
}

func newHistory() *history {
	return &history{origin: time.Now(), actors: []string{"runtime"}, oks: map[int]int{}}
}

// now is the history's clock: monotonic, shared by every session.
func (h *history) now() int64 { return int64(time.Since(h.origin)) }

// actor names a new actor and returns its id.
func (h *history) actor(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.actors = append(h.actors, name)
	return len(h.actors) - 1
}

func (h *history) add(r rpc) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r.historyIdx = len(h.rpcs)
	h.rpcs = append(h.rpcs, r)
	if r.outcome == outcomeOK {
		h.oks[r.host]++
	}
}

// answered returns how many calls of host's sessions were answered with
// a result.
func (h *history) answered(host int) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.oks[host]
}

// snapshot returns the calls recorded so far.
func (h *history) snapshot() []rpc {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.rpcs)
}

// count returns how many calls ended with each outcome.
func (h *history) count() map[outcome]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := map[outcome]int{}
	for _, r := range h.rpcs {
		n[r.outcome]++
	}
	return n
}

type actorKey struct{}

// as marks ctx as an actor's: the calls made under it are the actor's.
func as(ctx context.Context, actor int) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

// recordedMethods are the calls the models take.
var recordedMethods = map[string]bool{
	wire.MethodRegister: true, wire.MethodDeregister: true, wire.MethodSend: true,
	wire.MethodUpdateTask: true, wire.MethodCancelTask: true, wire.MethodGetTask: true,
}

// recordingSession is a session whose calls go into a history.
type recordingSession struct {
	transport.Session
	h    *history
	host int
}

func (s recordingSession) Call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	if !recordedMethods[method] {
		return s.Session.Call(ctx, method, params)
	}
	p, err := json.Marshal(params)
	if err != nil {
		return nil, err
	}
	actor, _ := ctx.Value(actorKey{}).(int)
	r := rpc{host: s.host, actor: actor, method: method, params: p, call: s.h.now()}
	raw, err := s.Session.Call(ctx, method, params)
	r.ret = s.h.now()
	r.outcome, r.code = classify(err)
	r.result = raw
	s.h.add(r)
	return raw, err
}

// finalRead is what the store held of a task after the load: a read
// from the stream leader, made between call and ret.
type finalRead struct {
	call, ret int64
	rec       *store.Record // nil: no such task
}

// The names model: each agentId's holder, an instance id ("" when free).

type nameInput struct {
	name     string // the agentId
	release  bool   // a deregistration; else a registration
	instance string
	session  string
}

type nameOutput struct {
	outcome outcome
}

var nameModel = porcupine.Model{
	Partition: partitionBy(func(in any) string { return in.(nameInput).name }),
	Init:      func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		holder, in, out := state.(string), input.(nameInput), output.(nameOutput)
		if !in.release {
			// Only registrations that were answered are in the history:
			// the others name no agentId.
			if holder != "" && holder != in.instance {
				return false, holder
			}
			return true, in.instance
		}
		if holder == in.instance {
			return true, ""
		}
		// A deregistration that was answered let go of the name its
		// instance held; one without an answer may not have happened.
		return out.outcome == outcomeUnknown, holder
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(nameInput), output.(nameOutput)
		verb := "register"
		if in.release {
			verb = "deregister"
		}
		return fmt.Sprintf("%s %s by %s (%s) -> %v", verb, in.name, short(in.instance), in.session, out.outcome)
	},
	DescribeState: func(state any) string {
		if state.(string) == "" {
			return "free"
		}
		return "held by " + short(state.(string))
	},
}

// The task model: whether the task exists, its state, and the keys of
// the changes applied to it (§4.11: a change whose key was applied is a
// retry, answered with the task as it is).

type taskKind int

const (
	taskCreate taskKind = iota // a2a.message.send without taskId
	taskUpdate                 // a2a.tasks.update
	taskCancel                 // a2a.tasks.cancel
	taskGet                    // a2a.tasks.get, or the final read of the store
	taskLeft                   // a member deregistered: its open tasks close
)

func (k taskKind) String() string {
	return [...]string{"create", "update", "cancel", "get", "left"}[k]
}

type taskInput struct {
	task   string
	kind   taskKind
	key    string     // the change's idempotency key
	target wire.State // update: the state asked for; left: failed (the assignee left) or canceled (the requester)
}

type taskOutput struct {
	outcome outcome
	code    string     // failed: the error's code
	state   wire.State // ok: the task's state in the answer
}

// taskState is one task as the model knows it.
type taskState struct {
	exists bool
	state  wire.State
	keys   string // the applied keys, sorted, each followed by '\n'
	// left is the state a member's departure closes the task in, once
	// one has left: a broker whose copy of the registry has not heard of
	// the departure yet may still make the task, and closes it at once
	// (docs/PROTOCOL.md §13, registrations).
	left wire.State
}

func (s taskState) applied(key string) bool {
	return key != "" && strings.Contains(s.keys, key+"\n")
}

func (s taskState) with(key string) taskState {
	keys := strings.Split(strings.TrimSuffix(s.keys, "\n"), "\n")
	if s.keys == "" {
		keys = nil
	}
	keys = append(keys, key)
	sort.Strings(keys)
	s.keys = strings.Join(keys, "\n") + "\n"
	return s
}

var taskModel = porcupine.Model{
	Partition: partitionBy(func(in any) string { return in.(taskInput).task }),
	Init:      func() any { return taskState{} },
	Step: func(state, input, output any) (bool, any) {
		return stepTask(state.(taskState), input.(taskInput), output.(taskOutput))
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(taskInput), output.(taskOutput)
		s := in.kind.String()
		if in.target != "" {
			s += " " + string(in.target)
		}
		if in.key != "" {
			s += " key " + short(in.key)
		}
		switch out.outcome {
		case outcomeOK:
			if out.state != "" {
				return s + " -> " + string(out.state)
			}
			return s + " -> ok"
		case outcomeFailed:
			return s + " -> " + out.code
		}
		return s + " -> ?"
	},
	DescribeState: func(state any) string {
		s := state.(taskState)
		if !s.exists {
			return "absent"
		}
		return fmt.Sprintf("%s (%d keys)", s.state, strings.Count(s.keys, "\n"))
	},
}

// stepTask is the broker's rules for one task, with the outcome seen.
func stepTask(s taskState, in taskInput, out taskOutput) (bool, taskState) {
	unknown := out.outcome == outcomeUnknown
	if out.outcome == outcomeFailed && (out.code == wire.CodeUnauthorized || out.code == wire.CodeBusy) {
		return true, s // refused before the task was looked at
	}
	switch in.kind {
	case taskCreate:
		if !s.exists {
			n := taskState{exists: true, state: wire.StateSubmitted, left: s.left}.with(in.key)
			if s.left != "" {
				n.state = s.left
			}
			return unknown || (out.outcome == outcomeOK && out.state == wire.StateSubmitted), n
		}
		// Only this create's key makes this task: it exists, so the key
		// was applied, and this is a retry answered with the task as it is.
		return s.applied(in.key) && (unknown || (out.outcome == outcomeOK && out.state == s.state)), s
	case taskUpdate, taskCancel:
		target := in.target
		if in.kind == taskCancel {
			target = wire.StateCanceled
		}
		switch {
		case !s.exists:
			return unknown || out.code == wire.CodeUnknownTask, s
		case s.applied(in.key):
			return unknown || (out.outcome == outcomeOK && out.state == s.state), s
		case !s.state.Terminal():
			n := s.with(in.key)
			n.state = target
			return unknown || (out.outcome == outcomeOK && out.state == target), n
		default:
			return unknown || out.code == wire.CodeInvalidTransition, s
		}
	case taskGet:
		if !s.exists {
			return unknown || out.code == wire.CodeUnknownTask, s
		}
		return unknown || (out.outcome == outcomeOK && out.state == s.state), s
	case taskLeft:
		if s.exists && !s.state.Terminal() {
			s.state = in.target
		}
		if s.left == "" {
			s.left = in.target
		}
		return true, s
	}
	return false, s
}

// partitionBy partitions a history by a key of each operation's input.
func partitionBy(key func(input any) string) func([]porcupine.Operation) [][]porcupine.Operation {
	return func(ops []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var order []string
		for _, op := range ops {
			k := key(op.Input)
			if _, ok := by[k]; !ok {
				order = append(order, k)
			}
			by[k] = append(by[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(order))
		for _, k := range order {
			out = append(out, by[k])
		}
		return out
	}
}

func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// never is the return time of an operation that was not answered: it
// may take effect at any time after its call.
const never = math.MaxInt64 / 2

func retOf(r rpc) int64 {
	if r.outcome == outcomeUnknown {
		return never
	}
	return r.ret
}

// models turns the history into operations of the names model and of
// the task model. reads are the final reads of the tasks, by id; a
// deregistration closes the open tasks of the instance that read names
// as a member. It also returns what it could not place: calls whose
// outcome is unknown and whose task or agentId no answer tells.
func (h *history) models(reads map[string]finalRead) (names, tasks []porcupine.Operation, unplaced int) {
	rpcs := h.snapshot()
	h.mu.Lock()
	h.reads = reads
	h.mu.Unlock()
	type reg struct{ instance, session, agentID string }
	byToken := map[string]reg{}
	keyTask := map[string]string{} // a create's key -> the task it made
	for _, r := range rpcs {
		switch {
		case r.method == wire.MethodRegister && r.outcome == outcomeOK:
			var p wire.RegisterParams
			var res wire.RegisterResult
			if json.Unmarshal(r.params, &p) == nil && json.Unmarshal(r.result, &res) == nil {
				byToken[res.Token] = reg{res.InstanceID, p.ContextID, res.AgentID}
			}
		case r.method == wire.MethodSend && r.outcome == outcomeOK:
			var p wire.SendParams
			var res wire.SendResult
			if json.Unmarshal(r.params, &p) == nil && json.Unmarshal(r.result, &res) == nil && p.TaskID == "" && res.Task != nil {
				keyTask[p.Message.MessageID] = res.Task.ID
			}
		}
	}
	// A create whose answer was lost names its task by its key, which
	// the task's record keeps.
	for id, rd := range reads {
		if rd.rec != nil && rd.rec.SendKey != "" {
			keyTask[rd.rec.SendKey] = id
		}
	}
	// Members of each task, by instance, from the final reads.
	memberOf := map[string][]string{} // instance -> tasks
	for id, rd := range reads {
		if rd.rec != nil {
			memberOf[rd.rec.RequesterInstance] = append(memberOf[rd.rec.RequesterInstance], id)
			if rd.rec.AssigneeInstance != rd.rec.RequesterInstance {
				memberOf[rd.rec.AssigneeInstance] = append(memberOf[rd.rec.AssigneeInstance], id)
			}
		}
	}
	named := map[string]string{} // instance -> the agentId it last registered under
	for _, r := range rpcs {
		taskOut := taskOutput{outcome: r.outcome, code: r.code}
		addTask := func(in taskInput) {
			if r.outcome == outcomeOK {
				var res wire.TaskResult
				if json.Unmarshal(r.result, &res) == nil && res.Task != nil {
					taskOut.state = res.Task.Status.State
				}
			}
			tasks = append(tasks, porcupine.Operation{ClientId: r.actor, Input: in, Output: taskOut, Call: r.call, Return: retOf(r), Metadata: r.historyIdx})
		}
		switch r.method {
		case wire.MethodRegister:
			if r.outcome != outcomeOK {
				if r.outcome == outcomeUnknown {
					unplaced++
				}
				continue
			}
			var p wire.RegisterParams
			var res wire.RegisterResult
			if json.Unmarshal(r.params, &p) != nil || json.Unmarshal(r.result, &res) != nil {
				continue
			}
			if was := named[res.InstanceID]; was != "" && was != res.AgentID {
				// Registered again under another agentId: the one it
				// held is let go with the registration that held it.
				names = append(names, porcupine.Operation{ClientId: r.actor, Input: nameInput{name: was, release: true, instance: res.InstanceID, session: p.ContextID},
					Output: nameOutput{r.outcome}, Call: r.call, Return: r.ret, Metadata: r.historyIdx})
			}
			named[res.InstanceID] = res.AgentID
			names = append(names, porcupine.Operation{ClientId: r.actor, Input: nameInput{name: res.AgentID, instance: res.InstanceID, session: p.ContextID},
				Output: nameOutput{r.outcome}, Call: r.call, Return: r.ret, Metadata: r.historyIdx})
		case wire.MethodDeregister:
			if r.outcome == outcomeFailed {
				continue
			}
			var p wire.TokenParams
			if json.Unmarshal(r.params, &p) != nil {
				continue
			}
			g, ok := byToken[p.Token]
			if !ok {
				continue
			}
			names = append(names, porcupine.Operation{ClientId: r.actor, Input: nameInput{name: g.agentID, release: true, instance: g.instance, session: g.session},
				Output: nameOutput{r.outcome}, Call: r.call, Return: retOf(r), Metadata: r.historyIdx})
			for _, id := range memberOf[g.instance] {
				target := wire.StateFailed
				if reads[id].rec.RequesterInstance == g.instance {
					target = wire.StateCanceled
				}
				tasks = append(tasks, porcupine.Operation{ClientId: r.actor, Input: taskInput{task: id, kind: taskLeft, target: target},
					Output: taskOutput{outcome: r.outcome}, Call: r.call, Return: retOf(r), Metadata: r.historyIdx})
			}
		case wire.MethodSend:
			var p wire.SendParams
			if json.Unmarshal(r.params, &p) != nil || p.TaskID != "" || p.Oneway || p.Message == nil {
				continue
			}
			if r.outcome == outcomeFailed {
				continue
			}
			id, ok := keyTask[p.Message.MessageID]
			if !ok {
				unplaced++
				continue
			}
			addTask(taskInput{task: id, kind: taskCreate, key: p.Message.MessageID})
		case wire.MethodUpdateTask:
			var p wire.UpdateParams
			if json.Unmarshal(r.params, &p) == nil {
				addTask(taskInput{task: p.TaskID, kind: taskUpdate, key: p.MessageID, target: p.State})
			}
		case wire.MethodCancelTask:
			var p wire.CancelParams
			if json.Unmarshal(r.params, &p) == nil {
				addTask(taskInput{task: p.TaskID, kind: taskCancel, key: p.MessageID})
			}
		case wire.MethodGetTask:
			var p wire.TaskParams
			if json.Unmarshal(r.params, &p) == nil {
				addTask(taskInput{task: p.TaskID, kind: taskGet})
			}
		}
	}
	h.mu.Lock()
	gone := slices.Clone(h.gone)
	h.mu.Unlock()
	for _, g := range gone {
		names = append(names, porcupine.Operation{Input: nameInput{name: g.agentID, release: true, instance: g.instance, session: g.session},
			Output: nameOutput{outcomeUnknown}, Call: g.at, Return: never, Metadata: -1})
		for _, id := range memberOf[g.instance] {
			target := wire.StateFailed
			if reads[id].rec.RequesterInstance == g.instance {
				target = wire.StateCanceled
			}
			tasks = append(tasks, porcupine.Operation{Input: taskInput{task: id, kind: taskLeft, target: target},
				Output: taskOutput{outcome: outcomeUnknown}, Call: g.at, Return: never, Metadata: -1})
		}
	}
	auditor := len(h.actors)
	for id, rd := range reads {
		out := taskOutput{outcome: outcomeFailed, code: wire.CodeUnknownTask}
		if rd.rec != nil {
			out = taskOutput{outcome: outcomeOK, state: rd.rec.Task.Status.State}
		}
		tasks = append(tasks, porcupine.Operation{ClientId: auditor, Input: taskInput{task: id, kind: taskGet}, Output: out, Call: rd.call, Return: rd.ret, Metadata: -1})
	}
	return names, tasks, unplaced
}

// checkLinearizable checks ops against model and, when they are not
// linearizable, writes porcupine's visualization of them to the test's
// artifact directory, logs its path and fails the test.
func checkLinearizable(t testing.TB, what string, model porcupine.Model, ops []porcupine.Operation) porcupine.CheckResult {
	t.Helper()
	res, info := porcupine.CheckOperationsVerbose(model, ops, 60*time.Second)
	if res == porcupine.Ok {
		return res
	}
	path := filepath.Join(t.ArtifactDir(), strings.ReplaceAll(what, " ", "-")+".html")
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		t.Errorf("porcupine's visualization of %s: %v", what, err)
	}
	t.Errorf("%s: %d operations are not linearizable (%s): see %s (kept with go test -artifacts)", what, len(ops), res, path)
	shown := 0
	for _, part := range model.Partition(ops) {
		if shown == 3 || porcupine.CheckOperations(model, part) {
			continue
		}
		shown++
		part = slices.Clone(part)
		slices.SortFunc(part, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
		var b strings.Builder
		for _, op := range part {
			ret := "never"
			if op.Return != never {
				ret = fmt.Sprint(time.Duration(op.Return))
			}
			fmt.Fprintf(&b, "\n  [%v, %s] client %d (call %v): %s", time.Duration(op.Call), ret, op.ClientId, op.Metadata, model.DescribeOperation(op.Input, op.Output))
		}
		t.Logf("%s: a partition that is not linearizable:%s", what, b.String())
	}
	return res
}

// TestHistoryModels feeds the models histories made by hand, right and
// wrong, so that a check that passes is known to be able to fail.
func TestHistoryModels(t *testing.T) {
	t.Parallel()
	op := func(client int, in, out any, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret}
	}
	claim := func(inst string) nameInput { return nameInput{name: "worker", instance: inst, session: "s-" + inst} }
	release := func(inst string) nameInput {
		return nameInput{name: "worker", release: true, instance: inst, session: "s-" + inst}
	}
	ok, unknown := nameOutput{outcomeOK}, nameOutput{outcomeUnknown}
	nameCases := []struct {
		name string
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"a name let go then taken by another", []porcupine.Operation{
			op(0, claim("a"), ok, 0, 10), op(0, release("a"), ok, 20, 30), op(1, claim("b"), ok, 40, 50),
		}, porcupine.Ok},
		{"two instances hold one name at once", []porcupine.Operation{
			op(0, claim("a"), ok, 0, 10), op(1, claim("b"), ok, 20, 30), op(0, release("a"), ok, 40, 50),
		}, porcupine.Illegal},
		{"a name taken while its deregistration is under way", []porcupine.Operation{
			op(0, claim("a"), ok, 0, 10), op(0, release("a"), ok, 20, 50), op(1, claim("b"), ok, 30, 40),
		}, porcupine.Ok},
		{"a deregistration without an answer may have let it go", []porcupine.Operation{
			op(0, claim("a"), ok, 0, 10), op(0, release("a"), unknown, 20, never), op(1, claim("b"), ok, 40, 50),
		}, porcupine.Ok},
		{"an answered deregistration of a name another holds", []porcupine.Operation{
			op(0, claim("a"), ok, 0, 10), op(1, release("b"), ok, 20, 30),
		}, porcupine.Illegal},
		{"the same instance registers again", []porcupine.Operation{
			op(0, claim("a"), ok, 0, 10), op(0, claim("a"), ok, 20, 30), op(1, claim("b"), ok, 40, 50),
		}, porcupine.Illegal},
	}
	for _, tc := range nameCases {
		t.Run("names/"+tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, porcupine.CheckOperationsTimeout(nameModel, tc.ops, 10*time.Second))
		})
	}

	const id = "t1"
	create := taskInput{task: id, kind: taskCreate, key: "k0"}
	upd := func(key string, s wire.State) taskInput {
		return taskInput{task: id, kind: taskUpdate, key: key, target: s}
	}
	cancel := func(key string) taskInput { return taskInput{task: id, kind: taskCancel, key: key} }
	get := taskInput{task: id, kind: taskGet}
	left := func(s wire.State) taskInput { return taskInput{task: id, kind: taskLeft, target: s} }
	is := func(s wire.State) taskOutput { return taskOutput{outcome: outcomeOK, state: s} }
	refused := func(code string) taskOutput { return taskOutput{outcome: outcomeFailed, code: code} }
	lost := taskOutput{outcome: outcomeUnknown}
	taskCases := []struct {
		name string
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"submitted, working, completed", []porcupine.Operation{
			op(0, create, is(wire.StateSubmitted), 0, 10), op(1, upd("k1", wire.StateWorking), is(wire.StateWorking), 20, 30),
			op(1, upd("k2", wire.StateCompleted), is(wire.StateCompleted), 40, 50), op(0, get, is(wire.StateCompleted), 60, 70),
			op(0, cancel("k3"), refused(wire.CodeInvalidTransition), 80, 90),
		}, porcupine.Ok},
		{"completed then working", []porcupine.Operation{
			op(0, create, is(wire.StateSubmitted), 0, 10), op(1, upd("k1", wire.StateCompleted), is(wire.StateCompleted), 20, 30),
			op(1, upd("k2", wire.StateWorking), is(wire.StateWorking), 40, 50),
		}, porcupine.Illegal},
		{"a read of a completed task finds it working", []porcupine.Operation{
			op(0, create, is(wire.StateSubmitted), 0, 10), op(1, upd("k1", wire.StateWorking), is(wire.StateWorking), 20, 30),
			op(1, upd("k2", wire.StateCompleted), is(wire.StateCompleted), 40, 50), op(0, get, is(wire.StateWorking), 60, 70),
		}, porcupine.Illegal},
		{"an acknowledged create then no task", []porcupine.Operation{
			op(0, create, is(wire.StateSubmitted), 0, 10), op(0, get, refused(wire.CodeUnknownTask), 20, 30),
		}, porcupine.Illegal},
		{"a cancel and a completion race: one wins", []porcupine.Operation{
			op(0, create, is(wire.StateSubmitted), 0, 10), op(0, cancel("k1"), is(wire.StateCanceled), 20, 50),
			op(1, upd("k2", wire.StateCompleted), refused(wire.CodeInvalidTransition), 30, 40), op(0, get, is(wire.StateCanceled), 60, 70),
		}, porcupine.Ok},
		{"a cancel and a completion both acknowledged", []porcupine.Operation{
			op(0, create, is(wire.StateSubmitted), 0, 10), op(0, cancel("k1"), is(wire.StateCanceled), 20, 50),
			op(1, upd("k2", wire.StateCompleted), is(wire.StateCompleted), 30, 40),
		}, porcupine.Illegal},
		{"a retried update is answered with the task as it is", []porcupine.Operation{
			op(0, create, is(wire.StateSubmitted), 0, 10), op(1, upd("k1", wire.StateWorking), lost, 20, never),
			op(0, cancel("k2"), is(wire.StateCanceled), 40, 50), op(1, upd("k1", wire.StateWorking), is(wire.StateCanceled), 60, 70),
		}, porcupine.Ok},
		{"an update applied twice", []porcupine.Operation{
			op(0, create, is(wire.StateSubmitted), 0, 10), op(1, upd("k1", wire.StateInputRequired), is(wire.StateInputRequired), 20, 30),
			op(1, upd("k2", wire.StateWorking), is(wire.StateWorking), 40, 50), op(1, upd("k1", wire.StateInputRequired), is(wire.StateInputRequired), 60, 70),
		}, porcupine.Illegal},
		{"an update without an answer may not have happened", []porcupine.Operation{
			op(0, create, is(wire.StateSubmitted), 0, 10), op(1, upd("k1", wire.StateCompleted), lost, 20, never),
			op(0, get, is(wire.StateSubmitted), 40, 50),
		}, porcupine.Ok},
		{"the assignee left: the task failed", []porcupine.Operation{
			op(0, create, is(wire.StateSubmitted), 0, 10), op(1, left(wire.StateFailed), taskOutput{}, 20, 30),
			op(0, get, is(wire.StateFailed), 40, 50),
		}, porcupine.Ok},
		{"a task made for an agent that had left is closed at once", []porcupine.Operation{
			op(1, left(wire.StateFailed), taskOutput{}, 0, 10), op(0, create, is(wire.StateSubmitted), 20, 30),
			op(0, get, is(wire.StateFailed), 40, 50),
		}, porcupine.Ok},
		{"a task made for an agent that had left stays open", []porcupine.Operation{
			op(1, left(wire.StateFailed), taskOutput{}, 0, 10), op(0, create, is(wire.StateSubmitted), 20, 30),
			op(0, get, is(wire.StateSubmitted), 40, 50),
		}, porcupine.Illegal},
		{"the assignee left and the task stayed open", []porcupine.Operation{
			op(0, create, is(wire.StateSubmitted), 0, 10), op(1, left(wire.StateFailed), taskOutput{}, 20, 30),
			op(0, get, is(wire.StateSubmitted), 40, 50),
		}, porcupine.Illegal},
	}
	for _, tc := range taskCases {
		t.Run("tasks/"+tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, porcupine.CheckOperationsTimeout(taskModel, tc.ops, 10*time.Second))
		})
	}

	// A history that is not linearizable is drawn for whoever looks into it.
	t.Run("visualization", func(t *testing.T) {
		ft := &fakeT{TB: t, dir: t.TempDir()}
		res := checkLinearizable(ft, "wrong history", nameModel, nameCases[1].ops)
		assert.Equal(t, porcupine.Illegal, res)
		require.Len(t, ft.errors, 1)
		path := filepath.Join(ft.dir, "wrong-history.html")
		assert.Contains(t, ft.errors[0], path)
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.Contains(t, string(data), "register worker")
	})
}

// fakeT is a TB whose Errorf is recorded, not failed, and whose artifact
// directory is dir.
type fakeT struct {
	testing.TB
	dir    string
	errors []string
}

func (f *fakeT) Errorf(format string, args ...any) {
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}
func (f *fakeT) ArtifactDir() string { return f.dir }

// writeOnFailure writes the history, one call a line, to the test's
// artifact directory if the test has failed by its end, and logs where.
func (h *history) writeOnFailure(t testing.TB) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		path := filepath.Join(t.ArtifactDir(), "history.jsonl")
		f, err := os.Create(path)
		if err != nil {
			t.Logf("the history: %v", err)
			return
		}
		defer f.Close()
		enc := json.NewEncoder(f)
		for _, r := range h.snapshot() {
			_ = enc.Encode(map[string]any{"i": r.historyIdx, "host": r.host, "actor": h.actors[r.actor], "method": r.method,
				"call": r.call, "ret": r.ret, "outcome": r.outcome.String(), "code": r.code,
				"params": r.params, "result": r.result})
		}
		h.mu.Lock()
		reads := h.reads
		h.mu.Unlock()
		for id, rd := range reads {
			line := map[string]any{"final": id, "call": rd.call, "ret": rd.ret}
			if rd.rec != nil {
				line["state"], line["requester"], line["assignee"], line["sendKey"] = rd.rec.Task.Status.State, rd.rec.RequesterInstance, rd.rec.AssigneeInstance, rd.rec.SendKey
			}
			_ = enc.Encode(line)
		}
		t.Logf("the history of calls, then the final reads of the tasks: %s (kept with go test -artifacts)", path)
	})
}

// TestHistoryToModels checks the reading of a history of calls into the
// models' operations, with histories of calls made by hand.
func TestHistoryToModels(t *testing.T) {
	t.Parallel()
	add := func(h *history, method string, params, result any, call, ret int64, err error) {
		p, _ := json.Marshal(params)
		r, _ := json.Marshal(result)
		o, code := classify(err)
		if err != nil {
			r = nil
		}
		h.add(rpc{method: method, params: p, result: r, call: call, ret: ret, outcome: o, code: code})
	}
	register := func(h *history, instance, agentID, token string, call, ret int64) {
		add(h, wire.MethodRegister, wire.RegisterParams{ContextID: "s-" + instance, Card: &wire.AgentCard{Name: "worker"}, InstanceID: instance},
			wire.RegisterResult{AgentID: agentID, Token: token, InstanceID: instance}, call, ret, nil)
	}
	task := func(state wire.State) wire.TaskResult {
		return wire.TaskResult{Task: &wire.Task{ID: "t1", Status: wire.TaskStatus{State: state}}}
	}
	send := func(h *history, token string, call, ret int64, err error) {
		add(h, wire.MethodSend, wire.SendParams{Token: token, To: "worker", Message: &wire.Message{MessageID: "m1", Parts: []wire.Part{wire.TextPart("x")}}},
			task(wire.StateSubmitted), call, ret, err)
	}
	read := func(state wire.State, requester, assignee string) map[string]finalRead {
		if state == "" {
			return map[string]finalRead{"t1": {call: 1000, ret: 1010}}
		}
		return map[string]finalRead{"t1": {call: 1000, ret: 1010, rec: &store.Record{Task: wire.Task{ID: "t1", Status: wire.TaskStatus{State: state}},
			RequesterInstance: requester, AssigneeInstance: assignee}}}
	}
	check := func(model porcupine.Model, ops []porcupine.Operation) porcupine.CheckResult {
		return porcupine.CheckOperationsTimeout(model, ops, 10*time.Second)
	}

	t.Run("one name registered to two instances", func(t *testing.T) {
		h := newHistory()
		register(h, "a", "worker", "ta", 0, 10)
		register(h, "b", "worker", "tb", 20, 30)
		names, _, _ := h.models(nil)
		assert.Equal(t, porcupine.Illegal, check(nameModel, names))
		add(h, wire.MethodDeregister, wire.TokenParams{Token: "ta"}, struct{}{}, 12, 15, nil)
		names, _, _ = h.models(nil)
		assert.Equal(t, porcupine.Ok, check(nameModel, names), "let go first")
	})
	t.Run("an instance registered again under another name lets the first go", func(t *testing.T) {
		h := newHistory()
		register(h, "a", "worker", "ta", 0, 10)
		register(h, "a", "worker-2", "ta2", 20, 30)
		register(h, "b", "worker", "tb", 40, 50)
		names, _, _ := h.models(nil)
		assert.Equal(t, porcupine.Ok, check(nameModel, names))
		register(h, "c", "worker-2", "tc", 60, 70)
		names, _, _ = h.models(nil)
		assert.Equal(t, porcupine.Illegal, check(nameModel, names), "worker-2 is a's")
	})
	t.Run("an acknowledged create, then no task", func(t *testing.T) {
		h := newHistory()
		register(h, "a", "asker", "ta", 0, 10)
		send(h, "ta", 20, 30, nil)
		_, tasks, _ := h.models(read("", "", ""))
		assert.Equal(t, porcupine.Illegal, check(taskModel, tasks))
		_, tasks, _ = h.models(read(wire.StateSubmitted, "a", "b"))
		assert.Equal(t, porcupine.Ok, check(taskModel, tasks))
	})
	t.Run("a create whose answer was lost, then its retry", func(t *testing.T) {
		h := newHistory()
		register(h, "a", "asker", "ta", 0, 10)
		send(h, "ta", 20, 30, errors.New("transport: broker unavailable"))
		send(h, "ta", 40, 50, nil)
		_, tasks, unplaced := h.models(read(wire.StateSubmitted, "a", "b"))
		assert.Zero(t, unplaced)
		assert.Len(t, tasks, 3)
		assert.Equal(t, porcupine.Ok, check(taskModel, tasks))
	})
	t.Run("a create whose answer was lost, found by its key", func(t *testing.T) {
		h := newHistory()
		register(h, "a", "asker", "ta", 0, 10)
		send(h, "ta", 20, 30, errors.New("transport: broker unavailable"))
		add(h, wire.MethodUpdateTask, wire.UpdateParams{Token: "tb", TaskID: "t1", State: wire.StateCompleted, MessageID: "u1"},
			task(wire.StateCompleted), 40, 50, nil)
		reads := read(wire.StateCompleted, "a", "b")
		_, tasks, unplaced := h.models(reads)
		assert.Equal(t, 1, unplaced, "without the key in the record")
		assert.Equal(t, porcupine.Illegal, check(taskModel, tasks), "an update of a task never made")
		reads["t1"].rec.SendKey = "m1"
		_, tasks, unplaced = h.models(reads)
		assert.Zero(t, unplaced)
		assert.Equal(t, porcupine.Ok, check(taskModel, tasks))
	})
	t.Run("a departed requester's task left open", func(t *testing.T) {
		h := newHistory()
		register(h, "a", "asker", "ta", 0, 10)
		send(h, "ta", 20, 30, nil)
		add(h, wire.MethodDeregister, wire.TokenParams{Token: "ta"}, struct{}{}, 40, 50, nil)
		_, tasks, _ := h.models(read(wire.StateSubmitted, "a", "b"))
		assert.Equal(t, porcupine.Illegal, check(taskModel, tasks))
		_, tasks, _ = h.models(read(wire.StateCanceled, "a", "b"))
		assert.Equal(t, porcupine.Ok, check(taskModel, tasks))
	})
	t.Run("a dead host's agent's task, closed or not yet", func(t *testing.T) {
		h := newHistory()
		register(h, "a", "asker", "ta", 0, 10)
		send(h, "ta", 20, 30, nil)
		h.hostDied("b", "s-b", "worker", 40)
		_, tasks, _ := h.models(read(wire.StateFailed, "a", "b"))
		assert.Equal(t, porcupine.Ok, check(taskModel, tasks))
		_, tasks, _ = h.models(read(wire.StateSubmitted, "a", "b"))
		assert.Equal(t, porcupine.Ok, check(taskModel, tasks))
		_, tasks, _ = h.models(read(wire.StateCanceled, "a", "b"))
		assert.Equal(t, porcupine.Illegal, check(taskModel, tasks), "the assignee left: failed, not canceled")
	})
}
