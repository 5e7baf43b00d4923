package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/pipebus"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/transport/fakebus"
	"github.com/a2a-bus/a2a-bus/wire"
)

func fakeRuntimes(t *testing.T, cfg runtime.Config, sessions ...string) []*runtime.Runtime {
	t.Helper()
	bus := fakebus.New(fakebus.Config{})
	b, err := broker.New(context.Background(), bus, broker.Config{MaxTasksPerContext: 10000})
	require.NoError(t, err)
	var rts []*runtime.Runtime
	for _, s := range sessions {
		sess, err := bus.Session(ctxT(t), s)
		require.NoError(t, err)
		rt, err := runtime.New(ctxT(t), sess, cfg)
		require.NoError(t, err)
		rts = append(rts, rt)
	}
	t.Cleanup(func() {
		for _, rt := range rts {
			rt.Close()
		}
		bus.Close()
		b.Close()
	})
	return rts
}

// TestSettleRacingACallLeavesNoRegistration: a call that meets Settle's
// deregistration must not register the delegate again.
func TestSettleRacingACallLeavesNoRegistration(t *testing.T) {
	rts := fakeRuntimes(t, runtime.Config{}, "s1")
	observer, err := rts[0].Spawn(ctxT(t), wire.AgentCard{Name: "observer"})
	require.NoError(t, err)
	for i := range 200 {
		d, err := rts[0].Spawn(ctxT(t), wire.AgentCard{Name: fmt.Sprint("d", i)})
		require.NoError(t, err)
		var wg sync.WaitGroup
		wg.Go(func() { d.Peers(ctxT(t)) })
		wg.Go(func() { assert.NoError(t, d.Settle(ctxT(t))) })
		wg.Wait()
	}
	peers, err := observer.Peers(ctxT(t))
	require.NoError(t, err)
	assert.Empty(t, peers, "every delegate settled")
}

// TestEventsDuringSpawnReachTheNewDelegate: an event sent to a delegate
// the moment its name is registered waits for its routing instead of
// being dropped.
func TestEventsDuringSpawnReachTheNewDelegate(t *testing.T) {
	rts := fakeRuntimes(t, runtime.Config{Feed: runtime.FeedConfig{CheckInterval: 20 * time.Millisecond}}, "s1", "s2")
	asker, err := rts[0].Spawn(ctxT(t), wire.AgentCard{Name: "asker"})
	require.NoError(t, err)
	for i := range 100 {
		name := fmt.Sprint("w", i)
		sent := make(chan struct{})
		go func() {
			defer close(sent)
			for {
				if _, err := asker.Send(context.Background(), name, wire.Message{Parts: []wire.Part{wire.TextPart("job")}}, nil); err == nil {
					return
				}
			}
		}()
		w, err := rts[1].Spawn(ctxT(t), wire.AgentCard{Name: name})
		require.NoError(t, err)
		<-sent
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ev, err := w.Wait(ctx)
		cancel()
		require.NoError(t, err, "the created event for %s was lost", name)
		require.NotNil(t, ev.Task)
		require.NoError(t, w.Settle(ctxT(t)))
	}
}

// TestOverflowResyncNamesTheDroppedTasks: with a queue of one, three
// tasks arrive; each is either handed out as an event or named by the
// Resync that follows the drop.
func TestOverflowResyncNamesTheDroppedTasks(t *testing.T) {
	rts := fakeRuntimes(t, runtime.Config{Queue: 1}, "s1", "s2")
	asker, err := rts[0].Spawn(ctxT(t), wire.AgentCard{Name: "asker"})
	require.NoError(t, err)
	worker, err := rts[1].Spawn(ctxT(t), wire.AgentCard{Name: "worker"})
	require.NoError(t, err)
	var ids []string
	for range 3 {
		task, err := asker.Send(ctxT(t), "worker", wire.Message{Parts: []wire.Part{wire.TextPart("job")}}, nil)
		require.NoError(t, err)
		ids = append(ids, task.ID)
	}
	// The three events reach the worker's queue of one asynchronously.
	require.Eventually(t, worker.Overflowed, 10*time.Second, time.Millisecond, "the queue of one overflows")
	// Events queued before or after the drop come first; then the Resync.
	got := map[string]bool{}
	var rs *runtime.Resync
	for range len(ids) + 1 {
		ev, err := worker.Wait(ctxT(t))
		require.NoError(t, err)
		if ev.Task != nil {
			got[ev.Task.TaskID] = true
		}
		if rs = ev.Resync; rs != nil {
			break
		}
	}
	require.NotNil(t, rs, "after an overflow comes a Resync")
	for _, task := range rs.Changed {
		got[task.ID] = true
	}
	for _, id := range ids {
		assert.True(t, got[id], "task %s was neither delivered nor named by the Resync", id)
	}
}

// TestOverflowResyncEndsWithTheDelegate: a Resync due on a delegate that
// settles does not keep Wait busy.
func TestOverflowResyncEndsWithTheDelegate(t *testing.T) {
	rts := fakeRuntimes(t, runtime.Config{Queue: 1}, "s1", "s2")
	asker, err := rts[0].Spawn(ctxT(t), wire.AgentCard{Name: "asker"})
	require.NoError(t, err)
	worker, err := rts[1].Spawn(ctxT(t), wire.AgentCard{Name: "worker"})
	require.NoError(t, err)
	for range 3 {
		_, err := asker.Send(ctxT(t), "worker", wire.Message{Parts: []wire.Part{wire.TextPart("job")}}, nil)
		require.NoError(t, err)
	}
	require.Eventually(t, worker.Overflowed, 10*time.Second, time.Millisecond, "a Resync is due")
	require.NoError(t, worker.Settle(ctxT(t)))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = worker.Wait(ctx)
	assert.ErrorIs(t, err, runtime.ErrSettled)
}

// TestWaitEndsWhenThePipeBrokerIsGone: once the pipe's broker end is gone
// for good, a waiting delegate is told, not left waiting.
func TestWaitEndsWhenThePipeBrokerIsGone(t *testing.T) {
	bus, client, err := pipebus.Pair(pipebus.Config{}, pipebus.ClientConfig{})
	require.NoError(t, err)
	b, err := broker.New(context.Background(), bus, broker.Config{})
	require.NoError(t, err)
	defer client.Close()
	sess, err := client.Session(ctxT(t), "s1")
	require.NoError(t, err)
	rt, err := runtime.New(ctxT(t), sess, runtime.Config{Feed: runtime.FeedConfig{CheckInterval: 50 * time.Millisecond}})
	require.NoError(t, err)
	defer rt.Close()
	d, err := rt.Spawn(ctxT(t), wire.AgentCard{Name: "a"})
	require.NoError(t, err)
	bus.Close()
	b.Close()
	<-client.Done()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = d.Wait(ctx)
	require.Error(t, err)
	assert.NotErrorIs(t, err, context.DeadlineExceeded, "Wait ends with the broker, not with its own deadline")
}

// TestADelegateHasNoWayToSpawn: no nested delegation (ADR 0162), by
// construction.
func TestADelegateHasNoWayToSpawn(t *testing.T) {
	_, ok := reflect.TypeFor[*runtime.Delegate]().MethodByName("Spawn")
	assert.False(t, ok)
}

// TestSettleEndsABlockedWait: a Wait already blocked when the delegate
// settles returns ErrSettled.
func TestSettleEndsABlockedWait(t *testing.T) {
	e := newFaultEnv(t)
	d, err := e.runtime(t, "chat-1").Spawn(ctxT(t), wire.AgentCard{Name: "worker"})
	require.NoError(t, err)
	waiting := make(chan error, 1)
	go func() { _, err := d.Wait(context.Background()); waiting <- err }()
	require.Eventually(t, d.Waiting, 10*time.Second, time.Millisecond, "the Wait is blocked before Settle")
	require.NoError(t, d.Settle(context.Background()))
	select {
	case err := <-waiting:
		assert.ErrorIs(t, err, runtime.ErrSettled)
	case <-time.After(10 * time.Second):
		t.Fatal("Wait outlived Settle")
	}
}

// TestASpawnRacingCloseLeavesNoAgentBehind: a delegate still registering
// when its runtime closes is deregistered before the session closes, not
// left live with no one holding it.
func TestASpawnRacingCloseLeavesNoAgentBehind(t *testing.T) {
	sessions := []string{"observer"}
	for i := range 100 {
		sessions = append(sessions, fmt.Sprint("r", i))
	}
	rts := fakeRuntimes(t, runtime.Config{}, sessions...)
	observer, err := rts[0].Spawn(ctxT(t), wire.AgentCard{Name: "observer"})
	require.NoError(t, err)
	for _, rt := range rts[1:] {
		var wg sync.WaitGroup
		wg.Go(func() {
			if _, err := rt.Spawn(ctxT(t), wire.AgentCard{Name: "ghost"}); err != nil {
				assert.ErrorIs(t, err, runtime.ErrClosed)
			}
		})
		wg.Go(func() { assert.NoError(t, rt.Close()) })
		wg.Wait()
	}
	peers, err := observer.Peers(ctxT(t))
	require.NoError(t, err)
	assert.Empty(t, peers, "every spawn the close cut short was taken back")
}

// holdingSession holds the answer of each a2a.tasks.list until released.
type holdingSession struct {
	transport.Session
	listed  chan struct{} // a list's answer is being held
	release chan struct{}
}

func (s *holdingSession) Call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	res, err := s.Session.Call(ctx, method, params)
	if method == wire.MethodListTasks {
		select {
		case s.listed <- struct{}{}:
		default:
		}
		<-s.release
	}
	return res, err
}

// TestEventsDroppedDuringAnOverflowResyncAreNotLost: events dropped while
// an overflow's Resync reads the tasks (whose answer predates them) make
// the next Resync; they are not forgotten when the first one ends.
func TestEventsDroppedDuringAnOverflowResyncAreNotLost(t *testing.T) {
	bus := fakebus.New(fakebus.Config{})
	b, err := broker.New(context.Background(), bus, broker.Config{})
	require.NoError(t, err)
	defer func() { bus.Close(); b.Close() }()
	open := func(id string, wrap func(transport.Session) transport.Session) *runtime.Runtime {
		sess, err := bus.Session(ctxT(t), id)
		require.NoError(t, err)
		rt, err := runtime.New(ctxT(t), wrap(sess), runtime.Config{Queue: 1})
		require.NoError(t, err)
		t.Cleanup(func() { rt.Close() })
		return rt
	}
	held := &holdingSession{listed: make(chan struct{}, 1), release: make(chan struct{})}
	asker, err := open("s1", func(s transport.Session) transport.Session { return s }).Spawn(ctxT(t), wire.AgentCard{Name: "asker"})
	require.NoError(t, err)
	worker, err := open("s2", func(s transport.Session) transport.Session { held.Session = s; return held }).Spawn(ctxT(t), wire.AgentCard{Name: "worker"})
	require.NoError(t, err)
	var ids []string
	send := func() {
		task, err := asker.Send(ctxT(t), "worker", wire.Message{Parts: []wire.Part{wire.TextPart("job")}}, nil)
		require.NoError(t, err)
		ids = append(ids, task.ID)
	}
	for range 3 {
		send()
	}
	require.Eventually(t, worker.Overflowed, 10*time.Second, time.Millisecond)
	got := map[string]bool{}
	take := func(ev runtime.Event) {
		if ev.Task != nil {
			got[ev.Task.TaskID] = true
		}
		if ev.Resync != nil {
			for _, task := range ev.Resync.Changed {
				got[task.ID] = true
			}
		}
	}
	ev, err := worker.Wait(ctxT(t)) // the one queued event
	require.NoError(t, err)
	take(ev)
	resynced := make(chan []runtime.Event, 1)
	go func() {
		// Up to the overflow's Resync, whose list is held (an event still
		// on its way may come first).
		var evs []runtime.Event
		for {
			ev, err := worker.Wait(ctxT(t))
			if !assert.NoError(t, err) || ev.Resync != nil {
				resynced <- append(evs, ev)
				return
			}
			evs = append(evs, ev)
		}
	}()
	<-held.listed
	for range 3 { // answered after the list was read: one queued, two dropped
		send()
	}
	require.Eventually(t, worker.Overflowed, 10*time.Second, time.Millisecond)
	close(held.release)
	for _, ev := range <-resynced {
		take(ev)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for len(got) < len(ids) {
		ev, err := worker.Wait(ctx)
		if err != nil {
			break
		}
		take(ev)
	}
	for _, id := range ids {
		assert.True(t, got[id], "task %s was neither delivered nor named by a Resync", id)
	}
}
