package host_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/host"
	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/wire"
)

// nextResync runs d's Wait until it returns a Resync, which it hands
// over (nil if Wait failed first); task events on the way are skipped.
func nextResync(t *testing.T, d *runtime.Delegate) <-chan *runtime.Resync {
	c := make(chan *runtime.Resync, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			ev, err := d.Wait(ctx)
			if err != nil {
				c <- nil
				return
			}
			if ev.Resync != nil {
				c <- ev.Resync
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// TestAPipeHostTellsOfTheTasksItsBrokerLost: the pipe child keeps its
// tasks in memory and is killed while the requester waits on a task it
// sent. The host starts another; the waiting Wait returns a Resync whose
// Lost names the task, and so does the assignee's, whose update of it
// fails with A2A_UNKNOWN_TASK.
func TestAPipeHostTellsOfTheTasksItsBrokerLost(t *testing.T) {
	cfg := host.Config{Bus: host.Pipe, Memory: true,
		BrokerCommand: []string{testbin.A2ABus(t), "serve", "--bus=pipe", "--data-dir=", "--log-level=warn"}}
	cfg.Runtime.Feed.CheckInterval = 100 * time.Millisecond
	h, err := host.Open(ctxT(t), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() })
	chat1, chat2 := session(t, h, "chat-1"), session(t, h, "chat-2")
	// Settled while a broker still serves them.
	defer chat1.Close()
	defer chat2.Close()
	asker, worker := spawn(t, chat1, "asker"), spawn(t, chat2, "worker")
	task, err := asker.Send(ctxT(t), worker.ID(), say("work the broker will forget"), nil)
	require.NoError(t, err)
	require.NotNil(t, wait(t, worker).Task, "the worker has its task")
	askerRS, workerRS := nextResync(t, asker), nextResync(t, worker)

	old := h.BrokerPID()
	killed := time.Now()
	require.NoError(t, kill(old))
	for _, c := range []struct {
		who string
		rs  <-chan *runtime.Resync
	}{{"the requester", askerRS}, {"the assignee", workerRS}} {
		select {
		case rs := <-c.rs:
			require.NotNil(t, rs, "%s's Wait failed before a Resync", c.who)
			assert.Equal(t, []string{task.ID}, rs.Lost, "%s is told the task is lost", c.who)
			t.Logf("%s was told %v after the kill", c.who, time.Since(killed).Round(time.Millisecond))
		case <-time.After(20 * time.Second):
			t.Fatalf("%s was never told", c.who)
		}
	}
	assert.NotEqual(t, old, h.BrokerPID())
	_, err = worker.Update(ctxT(t), task.ID, wire.StateCompleted, &wire.Message{Parts: []wire.Part{wire.TextPart("done")}})
	assert.ErrorIs(t, err, wire.ErrUnknownTask)
}
