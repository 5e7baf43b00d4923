package host_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/a2a-bus/a2a-bus/host"
	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/wire"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(childRole); role != "" {
		// The test binary run again as a child process: a fake broker, or
		// a host of its own.
		os.Exit(runChild(role))
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(testbin.Exit))
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// eachBus runs a test on every bus: the fake, NATS in-process, and the
// pipe to a real child process.
func eachBus(t *testing.T, fn func(t *testing.T, h *host.Host)) {
	configs := map[string]func(t *testing.T) host.Config{
		"fake": func(*testing.T) host.Config { return host.Config{Memory: true} },
		"nats": func(*testing.T) host.Config { return host.Config{Bus: host.NATS, Memory: true} },
		"pipe": func(t *testing.T) host.Config {
			return host.Config{Bus: host.Pipe, BrokerCommand: []string{testbin.A2ABus(t), "serve", "--bus=pipe", "--data-dir=", "--log-level=warn"}}
		},
	}
	for _, name := range []string{"fake", "nats", "pipe"} {
		t.Run(name, func(t *testing.T) {
			cfg := configs[name](t)
			cfg.Runtime.Feed.CheckInterval = 50 * time.Millisecond
			h, err := openBus(ctxT(t), name, cfg)
			require.NoError(t, err)
			t.Cleanup(func() { h.Close() })
			fn(t, h)
		})
	}
}

// openBus opens a host on the named bus: "fake" is the in-memory bus of
// the tests, which only they can give a host.
func openBus(ctx context.Context, name string, cfg host.Config) (*host.Host, error) {
	if name == "fake" {
		return host.OpenFake(ctx, cfg)
	}
	return host.Open(ctx, cfg)
}

func session(t *testing.T, h *host.Host, id string) *runtime.Runtime {
	t.Helper()
	rt, err := h.Session(ctxT(t), id)
	require.NoError(t, err)
	t.Cleanup(func() { rt.Close() })
	return rt
}

func spawn(t *testing.T, rt *runtime.Runtime, name string) *runtime.Delegate {
	t.Helper()
	d, err := rt.Spawn(ctxT(t), wire.AgentCard{Name: name, Description: "a test delegate"})
	require.NoError(t, err)
	return d
}

func say(s string) wire.Message { return wire.Message{Parts: []wire.Part{wire.TextPart(s)}} }

func wait(t *testing.T, d *runtime.Delegate) runtime.Event {
	t.Helper()
	ev, err := d.Wait(ctxT(t))
	require.NoError(t, err)
	return ev
}

// quietFor asserts that a delegate gets no event for a moment. It can
// only fail when an event does come.
func quietFor(t *testing.T, d *runtime.Delegate) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	ev, err := d.Wait(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded, "unexpected event %+v", ev)
}

func TestCrossSessionDiscoveryAndRoundTrip(t *testing.T) {
	eachBus(t, func(t *testing.T, h *host.Host) {
		d1 := spawn(t, session(t, h, "chat-1"), "discussant")
		d2 := spawn(t, session(t, h, "chat-2"), "discussant")
		assert.Equal(t, "discussant", d1.ID())
		assert.Equal(t, "discussant-2", d2.ID())

		peers, err := d1.Peers(ctxT(t))
		require.NoError(t, err)
		require.Len(t, peers, 1)
		assert.Equal(t, "discussant-2", peers[0].AgentID)
		assert.Equal(t, "chat-2", peers[0].ContextID)

		task, err := d1.Send(ctxT(t), "", say("which seat is free?"), nil)
		require.NoError(t, err)
		assert.Equal(t, "discussant-2", task.AgentName)

		ev := wait(t, d2)
		require.NotNil(t, ev.Task)
		assert.Equal(t, wire.EventCreated, ev.Task.Kind)
		assert.Equal(t, "chat-2", ev.Task.RecipientContextID)
		_, err = d2.Update(ctxT(t), ev.Task.TaskID, wire.StateCompleted, &wire.Message{Parts: []wire.Part{wire.TextPart("seat 3")}})
		require.NoError(t, err)

		ev = wait(t, d1)
		require.NotNil(t, ev.Task)
		assert.True(t, ev.Task.Final)
		assert.Equal(t, wire.StateCompleted, ev.Task.Task.Status.State)
		assert.Equal(t, "seat 3", *ev.Task.Message.Parts[0].Text)
	})
}

func TestSameSessionDefaultPeer(t *testing.T) {
	eachBus(t, func(t *testing.T, h *host.Host) {
		rt := session(t, h, "chat-1")
		lead, helper := spawn(t, rt, "lead"), spawn(t, rt, "helper")
		elsewhere := spawn(t, session(t, h, "chat-2"), "elsewhere")
		task, err := lead.Send(ctxT(t), "", say("help"), nil)
		require.NoError(t, err)
		assert.Equal(t, "helper", task.AgentName)
		ev := wait(t, helper)
		assert.Equal(t, task.ID, ev.Task.TaskID)
		quietFor(t, elsewhere)
	})
}

func TestTwoSessionsBothSpawnDiscussant(t *testing.T) {
	eachBus(t, func(t *testing.T, h *host.Host) {
		d1 := spawn(t, session(t, h, "chat-1"), "discussant")
		d2 := spawn(t, session(t, h, "chat-2"), "discussant")
		assert.Equal(t, "discussant", d1.ID())
		assert.Equal(t, "discussant-2", d2.ID())
		assert.Equal(t, "discussant", d2.Card().Name)
		assert.Contains(t, d2.Prompt(), "discussant-2")
		assert.Contains(t, d2.Prompt(), "was taken")
		assert.NotContains(t, d1.Prompt(), "was taken")
	})
}

func TestASessionNeverReceivesAnotherSessionsEvent(t *testing.T) {
	eachBus(t, func(t *testing.T, h *host.Host) {
		rt1, rt2, rt3 := session(t, h, "chat-1"), session(t, h, "chat-2"), session(t, h, "chat-3")
		a, bystander := spawn(t, rt1, "a"), spawn(t, rt1, "bystander")
		b := spawn(t, rt2, "b")
		c := spawn(t, rt3, "c")
		task, err := a.Send(ctxT(t), "b", say("x"), nil)
		require.NoError(t, err)
		ev := wait(t, b)
		assert.Equal(t, "b", ev.Task.Recipient)
		_, err = b.Update(ctxT(t), task.ID, wire.StateCompleted, nil)
		require.NoError(t, err)
		ev = wait(t, a)
		assert.Equal(t, "a", ev.Task.Recipient)
		_, err = b.Push(ctxT(t), "a", say("psst"))
		require.NoError(t, err)
		ev = wait(t, a)
		require.NotNil(t, ev.Push)
		assert.Equal(t, "chat-1", ev.Push.RecipientContextID)
		quietFor(t, c)
		quietFor(t, bystander)
		quietFor(t, b)
	})
}

func TestSettleDeregisters(t *testing.T) {
	eachBus(t, func(t *testing.T, h *host.Host) {
		d1 := spawn(t, session(t, h, "chat-1"), "asker")
		d2 := spawn(t, session(t, h, "chat-2"), "worker")
		task, err := d1.Send(ctxT(t), "worker", say("x"), nil)
		require.NoError(t, err)
		wait(t, d2)
		waiting := make(chan error, 1)
		go func() { _, err := d2.Wait(context.Background()); waiting <- err }()
		require.NoError(t, d2.Settle(ctxT(t)))
		select {
		case err := <-waiting:
			assert.ErrorIs(t, err, runtime.ErrSettled, "a pending Wait ends")
		case <-time.After(10 * time.Second):
			t.Fatal("Wait outlived Settle")
		}
		_, err = d2.Peers(ctxT(t))
		assert.ErrorIs(t, err, runtime.ErrSettled)
		assert.ErrorIs(t, d2.Settle(ctxT(t)), runtime.ErrSettled)
		peers, err := d1.Peers(ctxT(t))
		require.NoError(t, err)
		assert.Empty(t, peers, "deregistered")
		ev := wait(t, d1)
		require.NotNil(t, ev.Task)
		assert.Equal(t, task.ID, ev.Task.TaskID)
		assert.Equal(t, wire.StateFailed, ev.Task.Task.Status.State, "its assigned task failed")
	})
}

func TestParseBus(t *testing.T) {
	for in, want := range map[string]host.BusKind{"": host.NATS, "nats": host.NATS, "NATS": host.NATS, "pipe": host.Pipe} {
		got, err := host.ParseBus(in)
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
	for _, in := range []string{"carrier-pigeon", "fake"} {
		_, err := host.ParseBus(in)
		assert.ErrorIs(t, err, host.ErrUnknownBus, "%q: a test double is not a bus of config", in)
	}
	_, err := host.Open(context.Background(), host.Config{})
	assert.True(t, errors.Is(err, host.ErrUnknownBus), "the zero bus is no bus: %v", err)
	assert.True(t, strings.Contains(host.Pipe.String(), "pipe"))
}

// TestTasksFollowThePages: a delegate with more tasks than a page sees
// them all, once each, oldest first, on every bus.
func TestTasksFollowThePages(t *testing.T) {
	eachBus(t, func(t *testing.T, h *host.Host) {
		a := spawn(t, session(t, h, "pages-a"), "asker")
		b := spawn(t, session(t, h, "pages-b"), "answerer")
		var want []string
		for i := range wire.DefaultPageSize + 20 {
			task, err := a.Send(ctxT(t), b.ID(), say("task"), nil)
			require.NoError(t, err, "task %d", i)
			_, err = b.Update(ctxT(t), task.ID, wire.StateCompleted, nil)
			require.NoError(t, err)
			want = append(want, task.ID)
		}
		tasks, err := a.Tasks(ctxT(t), "", "")
		require.NoError(t, err)
		var got []string
		for _, task := range tasks {
			got = append(got, task.ID)
		}
		assert.Equal(t, want, got)
	})
}
