package runtime_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/transport/fakebus"
	"github.com/a2a-bus/a2a-bus/wire"
)

type faultEnv struct {
	bus   *fakebus.Bus
	store *store.Memory
	rts   map[string]*runtime.Runtime
}

func newFaultEnv(t *testing.T) *faultEnv {
	t.Helper()
	e := &faultEnv{bus: fakebus.New(fakebus.Config{}), store: store.NewMemory(), rts: map[string]*runtime.Runtime{}}
	b, err := broker.New(context.Background(), e.bus, broker.Config{Store: e.store})
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, rt := range e.rts {
			rt.Close()
		}
		e.bus.Close()
		b.Close()
	})
	return e
}

func (e *faultEnv) runtime(t *testing.T, session string) *runtime.Runtime {
	t.Helper()
	sess, err := e.bus.Session(ctxT(t), session)
	require.NoError(t, err)
	rt, err := runtime.New(ctxT(t), sess, runtime.Config{Feed: runtime.FeedConfig{CheckInterval: 30 * time.Millisecond}})
	require.NoError(t, err)
	e.rts[session] = rt
	return rt
}

func waitAsync(d *runtime.Delegate) chan runtime.Event {
	c := make(chan runtime.Event, 4)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for {
			ev, err := d.Wait(ctx)
			if err != nil {
				close(c)
				return
			}
			c <- ev
		}
	}()
	return c
}

// TestWaitingDelegateWakesThoughTheEventWasLost: the requester's session
// is cut off while its task completes, so the event is lost on the bus;
// the waiting delegate still wakes with the outcome (by replay).
func TestWaitingDelegateWakesThoughTheEventWasLost(t *testing.T) {
	e := newFaultEnv(t)
	asker, err := e.runtime(t, "s1").Spawn(ctxT(t), wire.AgentCard{Name: "asker"})
	require.NoError(t, err)
	worker, err := e.runtime(t, "s2").Spawn(ctxT(t), wire.AgentCard{Name: "worker"})
	require.NoError(t, err)
	task, err := asker.Send(ctxT(t), "worker", wire.Message{Parts: []wire.Part{wire.TextPart("job")}}, nil)
	require.NoError(t, err)
	_, err = worker.Wait(ctxT(t))
	require.NoError(t, err)

	events := waitAsync(asker)
	e.bus.Disconnect("s1")
	_, err = worker.Update(ctxT(t), task.ID, wire.StateCompleted, &wire.Message{Parts: []wire.Part{wire.TextPart("done")}})
	require.NoError(t, err)
	e.bus.Reconnect("s1")

	ev, ok := <-events
	require.True(t, ok, "the waiting delegate never woke")
	require.NotNil(t, ev.Task)
	assert.Equal(t, task.ID, ev.Task.TaskID)
	assert.Equal(t, wire.StateCompleted, ev.Task.Task.Status.State)
	assert.Equal(t, "done", *ev.Task.Message.Parts[0].Text)
	asker.Settle(ctxT(t))
}

// TestWaitingDelegateWakesAcrossABrokerRestart: the broker dies while a
// delegate waits for its task and a new one starts on the same store. The
// assignee's next call registers it again; the requester's runtime sees
// the new epoch, registers it again, re-reads its tasks, and wakes it
// with the outcome.
func TestWaitingDelegateWakesAcrossABrokerRestart(t *testing.T) {
	e := newFaultEnv(t)
	asker, err := e.runtime(t, "s1").Spawn(ctxT(t), wire.AgentCard{Name: "asker"})
	require.NoError(t, err)
	worker, err := e.runtime(t, "s2").Spawn(ctxT(t), wire.AgentCard{Name: "worker"})
	require.NoError(t, err)
	task, err := asker.Send(ctxT(t), "worker", wire.Message{Parts: []wire.Part{wire.TextPart("job")}}, nil)
	require.NoError(t, err)
	_, err = worker.Wait(ctxT(t))
	require.NoError(t, err)
	events := waitAsync(asker)

	// The broker dies; a new one starts on the same store.
	e.bus.Unserve()
	b2, err := broker.New(context.Background(), e.bus, broker.Config{Store: e.store})
	require.NoError(t, err)
	defer b2.Close()

	_, err = worker.Update(ctxT(t), task.ID, wire.StateCompleted, &wire.Message{Parts: []wire.Part{wire.TextPart("done")}})
	require.NoError(t, err, "the worker registered again and its update went through")
	assert.Equal(t, "worker", worker.ID())

	var sawResync, sawFinal bool
	for !sawFinal {
		ev, ok := <-events
		require.True(t, ok, "the waiting delegate never woke")
		switch {
		case ev.Resync != nil:
			sawResync = true
			for _, t2 := range ev.Resync.Changed {
				if t2.ID == task.ID && t2.Status.State == wire.StateCompleted {
					sawFinal = true
				}
			}
		case ev.Task != nil && ev.Task.TaskID == task.ID && ev.Task.Final:
			sawFinal = true
		}
	}
	assert.True(t, sawResync, "the delegate is told that the broker restarted")
	got, err := asker.Task(ctxT(t), task.ID)
	require.NoError(t, err, "the asker is registered again with access to its task")
	assert.Equal(t, wire.StateCompleted, got.Status.State)
}

// TestConcurrentWaitersGetOneResyncPerBreak: a broker restart is one
// break, told once: of three waiters on one delegate, one gets the
// Resync, and the others go on waiting for what comes next, through ten
// seconds of polls on synctest's clock.
func TestConcurrentWaitersGetOneResyncPerBreak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newFaultEnv(t)
		d, err := e.runtime(t, "s1").Spawn(ctxT(t), wire.AgentCard{Name: "d"})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan runtime.Event, 8)
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				for {
					ev, err := d.Wait(ctx)
					if err != nil {
						return
					}
					got <- ev
				}
			})
		}
		synctest.Wait() // all three wait
		require.True(t, d.Waiting())

		e.bus.Unserve()
		b2, err := broker.New(context.Background(), e.bus, broker.Config{Store: e.store})
		require.NoError(t, err)
		defer b2.Close()

		first := <-got
		require.NotNil(t, first.Resync, "the break is told")
		select {
		case ev := <-got:
			t.Errorf("a second waiter was told of the same break: %+v", ev)
		case <-time.After(10 * time.Second):
		}
		cancel()
		wg.Wait()
	})
}
