package main_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/pipebus"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

func startPipeBroker(t *testing.T, dataDir string) *pipebus.Child {
	t.Helper()
	cmd := exec.Command(testbin.A2ABus(t), "serve", "--bus=pipe", "--data-dir", dataDir, "--log-level=warn")
	cmd.Env = testEnv(t)
	ch, err := pipebus.Start(cmd, pipebus.ClientConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { ch.Close() })
	// Once it answers, it holds its data dir.
	s, err := ch.Session(context.Background(), "ping")
	require.NoError(t, err)
	epochOf(t, s)
	return ch
}

type member struct {
	session, name, instance, token, id string
}

func (m *member) register(t *testing.T, c transport.Client) transport.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.Session(ctx, m.session)
	require.NoError(t, err)
	res, err := s.Call(ctx, wire.MethodRegister, wire.RegisterParams{ContextID: m.session, Card: &wire.AgentCard{Name: m.name}, InstanceID: m.instance})
	require.NoError(t, err)
	var r wire.RegisterResult
	require.NoError(t, json.Unmarshal(res, &r))
	m.token, m.id = r.Token, r.AgentID
	return s
}

func epochOf(t *testing.T, s transport.Session) string {
	t.Helper()
	empty, zero := "", uint64(0)
	_, err := s.Call(context.Background(), wire.MethodReplay, wire.ReplayParams{ContextID: s.ID(), Epoch: &empty, AfterSeq: &zero})
	var we *wire.Error
	require.True(t, errors.As(err, &we) && we.Data != nil, "replay with no epoch tells the current one: %v", err)
	return we.Data.Epoch
}

// Stages of a task in the burst: 1 created, 2 a message appended by the
// requester, 3 working, 4 completed. stateAt is the state each leaves.
var stateAt = []wire.State{"", wire.StateSubmitted, wire.StateSubmitted, wire.StateWorking, wire.StateCompleted}

// stageOf reads how far a task got from what the broker has.
func stageOf(t *wire.Task) int {
	switch {
	case t.Status.State == wire.StateCompleted:
		return 4
	case t.Status.State == wire.StateWorking:
		return 3
	case len(t.History) >= 2:
		return 2
	}
	return 1
}

// TestAcknowledgedChangesSurviveSIGKILL kills the broker with SIGKILL in
// the middle of a burst of changes from concurrent clients. After a
// restart on the same data dir every acknowledged change is there, the
// tasks come back to their members when they register again with the same
// instance ids, and the epoch is new.
func TestAcknowledgedChangesSurviveSIGKILL(t *testing.T) {
	dir := t.TempDir()
	child := startPipeBroker(t, dir)
	const pairs = 8
	type pair struct{ req, asg *member }
	var ps []pair
	sessions := map[*member]transport.Session{}
	for i := range pairs {
		p := pair{
			req: &member{session: fmt.Sprint("s", i), name: "req", instance: fmt.Sprint("req-", i)},
			asg: &member{session: fmt.Sprint("s", (i+1)%pairs), name: "asg", instance: fmt.Sprint("asg-", i)},
		}
		sessions[p.req] = p.req.register(t, child)
		sessions[p.asg] = p.asg.register(t, child)
		ps = append(ps, p)
	}
	firstEpoch := epochOf(t, sessions[ps[0].req])

	var mu sync.Mutex
	acked := map[string]int{} // task id -> highest acknowledged stage
	owner := map[string]pair{}
	const enough = 200              // tasks acknowledged before the kill
	underWay := make(chan struct{}) // closed at enough
	ack := func(id string, stage int, p pair) {
		mu.Lock()
		defer mu.Unlock()
		_, known := acked[id]
		acked[id] = max(acked[id], stage)
		owner[id] = p
		if !known && len(acked) == enough {
			close(underWay)
		}
	}
	var wg sync.WaitGroup
	ctx := context.Background()
	for _, p := range ps {
		wg.Go(func() {
			rs, as := sessions[p.req], sessions[p.asg]
			for {
				res, err := rs.Call(ctx, wire.MethodSend, wire.SendParams{Token: p.req.token, To: p.asg.id, Message: &wire.Message{Parts: []wire.Part{wire.TextPart("job")}}, Metadata: nil})
				if err != nil {
					return // the broker is gone
				}
				var r wire.TaskResult
				if json.Unmarshal(res, &r) != nil {
					return
				}
				ack(r.Task.ID, 1, p)
				if _, err := rs.Call(ctx, wire.MethodSend, wire.SendParams{Token: p.req.token, TaskID: r.Task.ID, Message: &wire.Message{Parts: []wire.Part{wire.TextPart("more")}}}); err != nil {
					return
				}
				ack(r.Task.ID, 2, p)
				for stage := 3; stage <= 4; stage++ {
					if _, err := as.Call(ctx, wire.MethodUpdateTask, wire.UpdateParams{Token: p.asg.token, TaskID: r.Task.ID, State: stateAt[stage]}); err != nil {
						return
					}
					ack(r.Task.ID, stage, p)
				}
			}
		})
	}
	// Let the burst run, then kill the broker in the middle of it.
	select {
	case <-underWay:
	case <-time.After(10 * time.Second):
	}
	require.NoError(t, kill(child.Pid()))
	wg.Wait()
	<-child.Exited()
	child.Close()

	changes := 0
	for _, s := range acked {
		changes += s
	}
	t.Logf("acknowledged before SIGKILL: %d tasks, %d changes", len(acked), changes)
	require.GreaterOrEqual(t, len(acked), enough)

	// Restart on the same data dir; the members come back by instance id.
	child2 := startPipeBroker(t, dir)
	for _, p := range ps {
		sessions[p.req] = p.req.register(t, child2)
		sessions[p.asg] = p.asg.register(t, child2)
	}
	assert.NotEqual(t, firstEpoch, epochOf(t, sessions[ps[0].req]), "a new epoch")

	found := 0
	for id, stage := range acked {
		p := owner[id]
		res, err := sessions[p.req].Call(ctx, wire.MethodGetTask, wire.TaskParams{Token: p.req.token, TaskID: id})
		require.NoError(t, err, "acknowledged task %s is lost", id)
		var r wire.TaskResult
		require.NoError(t, json.Unmarshal(res, &r))
		got := stageOf(r.Task)
		require.GreaterOrEqual(t, got, stage, "task %s: acknowledged stage %d, found %d (%s, %d messages)", id, stage, got, r.Task.Status.State, len(r.Task.History))
		found += stage
	}
	assert.GreaterOrEqual(t, found, changes, "every acknowledged change is there")

	// Each member lists its tasks again.
	for _, p := range ps {
		res, err := sessions[p.asg].Call(ctx, wire.MethodListTasks, wire.ListTasksParams{Token: p.asg.token, Role: wire.ListAssignee})
		require.NoError(t, err)
		var l wire.ListTasksResult
		require.NoError(t, json.Unmarshal(res, &l))
		ids := map[string]bool{}
		for _, task := range l.Tasks {
			ids[task.ID] = true
		}
		for id, o := range owner {
			if o == p {
				assert.True(t, ids[id], "task %s is back with its assignee", id)
			}
		}
	}
}

// TestDataDirProblemsStopTheStart: a data dir held by another broker, a
// corrupt file and a file of a newer schema each stop serve with one line
// naming the problem, and the file is left as it was.
func TestDataDirProblemsStopTheStart(t *testing.T) {
	serve := func(t *testing.T, dir string, flags ...string) (string, int) {
		cmd := exec.Command(testbin.A2ABus(t), append([]string{"serve", "--bus=pipe", "--data-dir", dir}, flags...)...)
		cmd.Env = testEnv(t)
		cmd.Stdin = strings.NewReader("")
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return string(out), exit.ExitCode()
		}
		require.NoError(t, err)
		return string(out), 0
	}
	t.Run("held by another broker", func(t *testing.T) {
		dir := t.TempDir()
		startPipeBroker(t, dir)
		out, code := serve(t, dir)
		assert.Equal(t, 1, code)
		assert.Contains(t, out, "held by another running broker")
	})
	// An earlier version's bbolt file is migrated, with its own checks.
	t.Run("an earlier version's corrupt file", func(t *testing.T) {
		dir := t.TempDir()
		garbage := []byte(strings.Repeat("not a database ", 4096))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "tasks.db"), garbage, 0o600))
		out, code := serve(t, dir)
		assert.Equal(t, 1, code)
		assert.Contains(t, out, "corrupt")
		after, err := os.ReadFile(filepath.Join(dir, "tasks.db"))
		require.NoError(t, err)
		assert.Equal(t, garbage, after, "left alone, not replaced")
	})
	// A store, made by a first start, then damaged.
	made := func(t *testing.T) string {
		dir := t.TempDir()
		require.NoError(t, startPipeBroker(t, dir).Close())
		return filepath.Join(dir, "tasks")
	}
	t.Run("a corrupt store", func(t *testing.T) {
		store := made(t)
		manifests, err := filepath.Glob(filepath.Join(store, "MANIFEST-*"))
		require.NoError(t, err)
		require.NotEmpty(t, manifests)
		garbage := []byte(strings.Repeat("not a manifest ", 100))
		for _, m := range manifests {
			require.NoError(t, os.WriteFile(m, garbage, 0o600))
		}
		out, code := serve(t, filepath.Dir(store))
		assert.Equal(t, 1, code)
		assert.Contains(t, out, "corrupt")
		assert.Contains(t, out, store)
	})
	t.Run("an emptied store stops the start unless the loss is accepted", func(t *testing.T) {
		store := made(t)
		files, err := filepath.Glob(filepath.Join(store, "*"))
		require.NoError(t, err)
		for _, f := range files {
			require.NoError(t, os.Remove(f))
		}
		out, code := serve(t, filepath.Dir(store))
		assert.Equal(t, 1, code)
		assert.Equal(t, 1, strings.Count(strings.TrimSpace(out), "\n")+1, "one line: %s", out)
		assert.Contains(t, out, store)
		assert.Contains(t, out, "--accept-data-loss")
		out, code = serve(t, filepath.Dir(store), "--accept-data-loss")
		assert.Equal(t, 0, code, out)
		assert.Contains(t, out, "may have lost acknowledged changes")
	})
	t.Run("an empty data dir starts fresh", func(t *testing.T) {
		out, code := serve(t, t.TempDir())
		assert.Equal(t, 0, code, out)
	})
	t.Run("an earlier version's zero-length file stops the start unless the loss is accepted", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "tasks.db")
		require.NoError(t, os.WriteFile(path, nil, 0o600))
		out, code := serve(t, dir)
		assert.Equal(t, 1, code)
		assert.Equal(t, 1, strings.Count(strings.TrimSpace(out), "\n")+1, "one line: %s", out)
		assert.Contains(t, out, path)
		assert.Contains(t, out, "--accept-data-loss")
		out, code = serve(t, dir, "--accept-data-loss")
		assert.Equal(t, 0, code, out)
		assert.Contains(t, out, "may have lost acknowledged changes")
	})
}

// kill kills a process at once (SIGKILL on Unix, TerminateProcess on
// Windows), as a crash would.
func kill(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Kill()
}

// TestRetriedChangesAcrossSIGKILLMakeOneTaskPerIntent: concurrent clients
// send tasks and cancel them, each change with its own messageId, and the
// broker is SIGKILLed mid-load. After a restart on the same data dir,
// every client retries the change it saw no answer for, with the same id:
// afterwards there is exactly one task per send, none missing, none
// doubled, and every cancel is applied.
func TestRetriedChangesAcrossSIGKILLMakeOneTaskPerIntent(t *testing.T) {
	dir := t.TempDir()
	child := startPipeBroker(t, dir)
	const clients = 32
	asg := &member{session: "work", name: "worker", instance: "worker-1"}
	asg.register(t, child)

	type op struct {
		send   bool // else a cancel
		seq    int
		taskID string // of a cancel
	}
	type client struct {
		m       *member
		s       transport.Session
		sent    int            // sends acknowledged
		pending *op            // the change in flight when the broker died
		tasks   map[int]string // seq -> task id, as acknowledged
	}
	sendOf := func(c *client, seq int) wire.SendParams {
		return wire.SendParams{Token: c.m.token, To: asg.id, Message: &wire.Message{
			MessageID: fmt.Sprintf("%s-send-%d", c.m.instance, seq), Parts: []wire.Part{wire.TextPart(fmt.Sprint("job ", seq))}}}
	}
	cancelOf := func(c *client, seq int, taskID string) wire.CancelParams {
		return wire.CancelParams{Token: c.m.token, TaskID: taskID, MessageID: fmt.Sprintf("%s-cancel-%d", c.m.instance, seq)}
	}
	do := func(c *client, o *op) (*wire.Task, error) {
		var res json.RawMessage
		var err error
		if o.send {
			res, err = c.s.Call(context.Background(), wire.MethodSend, sendOf(c, o.seq))
		} else {
			res, err = c.s.Call(context.Background(), wire.MethodCancelTask, cancelOf(c, o.seq, o.taskID))
		}
		if err != nil {
			return nil, err
		}
		var r wire.TaskResult
		if err := json.Unmarshal(res, &r); err != nil || r.Task == nil {
			return nil, fmt.Errorf("not a task: %s", res)
		}
		return r.Task, nil
	}
	cs := make([]*client, clients)
	for i := range cs {
		m := &member{session: fmt.Sprint("chat-", i), name: "asker", instance: fmt.Sprint("asker-", i)}
		cs[i] = &client{m: m, s: m.register(t, child), tasks: map[int]string{}}
	}

	var acked sync.WaitGroup
	var ackedSends atomic.Int64
	const enough = 400              // sends acknowledged before the kill
	underWay := make(chan struct{}) // closed at enough
	for _, c := range cs {
		acked.Go(func() {
			for seq := 0; ; seq++ {
				o := &op{send: true, seq: seq}
				task, err := do(c, o)
				if err != nil {
					c.pending = o
					return
				}
				c.tasks[seq], c.sent = task.ID, c.sent+1
				if ackedSends.Add(1) == enough {
					close(underWay)
				}
				o = &op{seq: seq, taskID: task.ID}
				if _, err := do(c, o); err != nil {
					c.pending = o
					return
				}
			}
		})
	}
	select {
	case <-underWay:
	case <-time.After(20 * time.Second):
	}
	require.NoError(t, kill(child.Pid()))
	acked.Wait()
	<-child.Exited()
	child.Close()
	require.GreaterOrEqual(t, ackedSends.Load(), int64(enough))

	// Restart; everyone comes back by instance id and retries what it
	// did not see answered, with the same id and content.
	child2 := startPipeBroker(t, dir)
	restarted := time.Now()
	asg.register(t, child2)
	var unansweredSends, committedSends, unansweredCancels, committedCancels int
	for _, c := range cs {
		c.s = c.m.register(t, child2)
		o := c.pending
		require.NotNil(t, o, "every client was cut off mid-change")
		task, err := do(c, o)
		require.NoError(t, err, "the retry of %+v", *o)
		committed := task.UpdatedAt.Before(restarted)
		if o.send {
			unansweredSends++
			if committed {
				committedSends++
			}
			c.tasks[o.seq] = task.ID
			c.sent++
			// Finish the intent: cancel it.
			o = &op{seq: o.seq, taskID: task.ID}
			_, err = do(c, o)
			require.NoError(t, err)
		} else {
			unansweredCancels++
			if committed {
				committedCancels++
			}
			assert.Equal(t, wire.StateCanceled, task.Status.State)
		}
	}

	// Exactly one task per send, each canceled; nothing else.
	total := 0
	for _, c := range cs {
		var all []*wire.Task
		p := wire.ListTasksParams{Token: c.m.token, Role: wire.ListRequester, PageParams: wire.PageParams{PageSize: wire.MaxPageSize}}
		for {
			res, err := c.s.Call(context.Background(), wire.MethodListTasks, p)
			require.NoError(t, err)
			var l wire.ListTasksResult
			require.NoError(t, json.Unmarshal(res, &l))
			all = append(all, l.Tasks...)
			if l.NextPageToken == "" {
				break
			}
			p.PageToken = l.NextPageToken
		}
		bySeq := map[int]int{}
		for _, task := range all {
			var seq int
			_, err := fmt.Sscanf(strings.TrimPrefix(task.History[0].MessageID, c.m.instance+"-send-"), "%d", &seq)
			require.NoError(t, err, "task %s has an id no client sent: %s", task.ID, task.History[0].MessageID)
			bySeq[seq]++
			assert.Equal(t, c.tasks[seq], task.ID, "%s send %d: the task its client was given", c.m.instance, seq)
			assert.Equal(t, wire.StateCanceled, task.Status.State, "%s send %d: its cancel applied", c.m.instance, seq)
		}
		require.Len(t, bySeq, c.sent, "%s: one task per send, none missing", c.m.instance)
		for seq, n := range bySeq {
			require.Equal(t, 1, n, "%s send %d: doubled", c.m.instance, seq)
		}
		require.Len(t, all, c.sent, "%s: nothing else", c.m.instance)
		total += len(all)
	}
	intents := 0
	for _, c := range cs {
		intents += c.sent
	}
	require.Equal(t, intents, total)
	t.Logf("%d sends acknowledged before SIGKILL; cut off mid-change: %d sends (%d of them committed before the kill) and %d cancels (%d committed); after the retries: %d tasks for %d sends, none doubled",
		ackedSends.Load(), unansweredSends, committedSends, unansweredCancels, committedCancels, total, intents)
}
