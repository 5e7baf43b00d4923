package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// losingSession delivers every call to the broker, but loses the answer
// of the next lose calls of the methods it watches: the caller gets
// transport.ErrUnavailable for a change the broker made.
type losingSession struct {
	transport.Session
	mu    sync.Mutex
	watch map[string]bool
	lose  int
	lost  int
}

func (s *losingSession) Call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	res, err := s.Session.Call(ctx, method, params)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && s.watch[method] && s.lose > 0 {
		s.lose--
		s.lost++
		return nil, fmt.Errorf("%w: the answer was lost", transport.ErrUnavailable)
	}
	return res, err
}

func (s *losingSession) loseNext(n int, methods ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lose = n
	s.watch = map[string]bool{}
	for _, m := range methods {
		s.watch[m] = true
	}
}

func (e *faultEnv) losingRuntime(t *testing.T, session string) (*runtime.Runtime, *losingSession) {
	t.Helper()
	sess, err := e.bus.Session(ctxT(t), session)
	require.NoError(t, err)
	ls := &losingSession{Session: sess}
	rt, err := runtime.New(ctxT(t), ls, runtime.Config{Retry: runtime.Retry{Attempts: 4, Backoff: time.Millisecond}})
	require.NoError(t, err)
	e.rts[session] = rt
	return rt, ls
}

// count is how many tasks the store holds.
func (e *faultEnv) count(t *testing.T) int {
	t.Helper()
	recs, _, err := e.store.List(context.Background(), store.Query{})
	require.NoError(t, err)
	return len(recs)
}

// TestChangesWhoseAnswerWasLostAreRetriedAndAppliedOnce: each kind of
// change has its first answers lost; the runtime retries with the same
// key, and the broker applies each change once.
func TestChangesWhoseAnswerWasLostAreRetriedAndAppliedOnce(t *testing.T) {
	e := newFaultEnv(t)
	rtA, lossA := e.losingRuntime(t, "s1")
	rtB, lossB := e.losingRuntime(t, "s2")
	asker, err := rtA.Spawn(ctxT(t), wire.AgentCard{Name: "asker"})
	require.NoError(t, err)
	worker, err := rtB.Spawn(ctxT(t), wire.AgentCard{Name: "worker"})
	require.NoError(t, err)

	lossA.loseNext(2, wire.MethodSend)
	task, err := asker.Send(ctxT(t), "worker", wire.Message{Parts: []wire.Part{wire.TextPart("job")}}, nil)
	require.NoError(t, err, "two lost answers, then the third attempt is answered")
	assert.Equal(t, 1, e.count(t), "exactly one task for the intent")
	ev, err := worker.Wait(ctxT(t))
	require.NoError(t, err)
	require.Equal(t, task.ID, ev.Task.TaskID)

	lossA.loseNext(1, wire.MethodSend)
	task2, err := asker.Reply(ctxT(t), task.ID, wire.Message{Parts: []wire.Part{wire.TextPart("more")}})
	require.NoError(t, err)
	assert.Len(t, task2.History, 2, "one reply, not two")

	lossB.loseNext(3, wire.MethodUpdateTask)
	done, err := worker.Update(ctxT(t), task.ID, wire.StateCompleted, nil, wire.Artifact{Parts: []wire.Part{wire.TextPart("result")}})
	require.NoError(t, err, "a retried completion is not an invalid transition")
	assert.Equal(t, wire.StateCompleted, done.Status.State)
	assert.Len(t, done.Artifacts, 1, "one artifact, not four")

	task3, err := asker.Send(ctxT(t), "worker", wire.Message{Parts: []wire.Part{wire.TextPart("job 2")}}, nil)
	require.NoError(t, err)
	lossA.loseNext(2, wire.MethodCancelTask)
	canceled, err := asker.Cancel(ctxT(t), task3.ID)
	require.NoError(t, err)
	assert.Equal(t, wire.StateCanceled, canceled.Status.State)

	lossA.loseNext(1, wire.MethodSend)
	_, err = asker.Push(ctxT(t), "worker", wire.Message{Parts: []wire.Part{wire.TextPart("fyi")}})
	require.NoError(t, err)
	pushes := 0
	for {
		ctx, cancel := context.WithTimeout(ctxT(t), 300*time.Millisecond)
		ev, err := worker.Wait(ctx)
		cancel()
		if err != nil {
			break
		}
		if ev.Push != nil {
			pushes++
		}
	}
	assert.Equal(t, 1, pushes, "the push arrived once")
	assert.Equal(t, 2, e.count(t))
	lossA.mu.Lock()
	assert.Equal(t, 6, lossA.lost, "2 sends, a reply, 2 cancels and a push lost their answers")
	lossA.mu.Unlock()
}

// TestAChangeIsRetriedABoundedNumberOfTimes: when every answer is lost,
// the runtime gives up after its attempts and reports the failure.
func TestAChangeIsRetriedABoundedNumberOfTimes(t *testing.T) {
	e := newFaultEnv(t)
	rtA, lossA := e.losingRuntime(t, "s1")
	asker, err := rtA.Spawn(ctxT(t), wire.AgentCard{Name: "asker"})
	require.NoError(t, err)
	_, err = e.runtime(t, "s2").Spawn(ctxT(t), wire.AgentCard{Name: "worker"})
	require.NoError(t, err)
	lossA.loseNext(100, wire.MethodSend)
	_, err = asker.Send(ctxT(t), "worker", wire.Message{Parts: []wire.Part{wire.TextPart("job")}}, nil)
	require.ErrorIs(t, err, transport.ErrUnavailable)
	lossA.mu.Lock()
	assert.Equal(t, 4, lossA.lost, "Retry.Attempts in all")
	lossA.mu.Unlock()
	assert.Equal(t, 1, e.count(t), "and still one task")
}

// TestAChangeEndsAtItsCallTimeout: every answer is lost and the retry
// would go on for ever; the call, made with a context that never ends,
// fails at the runtime's CallTimeout with an unavailable error, not after
// its attempts.
func TestAChangeEndsAtItsCallTimeout(t *testing.T) {
	e := newFaultEnv(t)
	sess, err := e.bus.Session(ctxT(t), "s1")
	require.NoError(t, err)
	loss := &losingSession{Session: sess}
	rt, err := runtime.New(ctxT(t), loss, runtime.Config{
		Retry:       runtime.Retry{Attempts: 1 << 30, Backoff: 10 * time.Millisecond},
		CallTimeout: 500 * time.Millisecond,
	})
	require.NoError(t, err)
	e.rts["s1"] = rt
	asker, err := rt.Spawn(ctxT(t), wire.AgentCard{Name: "asker"})
	require.NoError(t, err)
	_, err = e.runtime(t, "s2").Spawn(ctxT(t), wire.AgentCard{Name: "worker"})
	require.NoError(t, err)

	loss.loseNext(1<<30, wire.MethodSend)
	_, err = asker.Send(context.Background(), "worker", wire.Message{Parts: []wire.Part{wire.TextPart("job")}}, nil)
	require.ErrorIs(t, err, transport.ErrUnavailable)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "ended by the call's deadline, not its attempts")
	assert.Contains(t, err.Error(), "CallTimeout")
	loss.mu.Lock()
	assert.Greater(t, loss.lost, 1, "the change was tried again within its deadline")
	loss.mu.Unlock()
	assert.Equal(t, 1, e.count(t), "and applied once")

	// A caller's context that ends sooner ends it sooner, with its own error.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = asker.Send(ctx, "worker", wire.Message{Parts: []wire.Part{wire.TextPart("job 2")}}, nil)
	require.ErrorIs(t, err, context.Canceled)
}

// A delegate that sends on a message it received (which carries the
// broker's messageId) sends a new message: to two peers, two tasks; to the
// same peer after a failure, a new task.
func TestForwardingAReceivedMessageIsANewMessage(t *testing.T) {
	e := newFaultEnv(t)
	user, err := e.runtime(t, "s0").Spawn(ctxT(t), wire.AgentCard{Name: "user"})
	require.NoError(t, err)
	rt := e.runtime(t, "s1")
	router, err := rt.Spawn(ctxT(t), wire.AgentCard{Name: "router"})
	require.NoError(t, err)
	w1, err := e.runtime(t, "s2").Spawn(ctxT(t), wire.AgentCard{Name: "w1"})
	require.NoError(t, err)
	_, err = e.runtime(t, "s3").Spawn(ctxT(t), wire.AgentCard{Name: "w2"})
	require.NoError(t, err)

	_, err = user.Push(ctxT(t), "router", wire.Message{Parts: []wire.Part{wire.TextPart("job")}})
	require.NoError(t, err)
	ev, err := router.Wait(ctxT(t))
	require.NoError(t, err)
	require.NotNil(t, ev.Push)
	in := *ev.Push.Message
	t1, err := router.Send(ctxT(t), "w1", in, nil)
	require.NoError(t, err)
	_, err = router.Send(ctxT(t), "w2", in, nil)
	assert.NoError(t, err, "fan-out of a received message")

	_, err = w1.Update(ctxT(t), t1.ID, wire.StateFailed, nil)
	require.NoError(t, err)
	t3, err := router.Send(ctxT(t), "w1", in, nil)
	require.NoError(t, err)
	assert.NotEqual(t, t1.ID, t3.ID, "re-submitting after a failure makes a new task")
}
