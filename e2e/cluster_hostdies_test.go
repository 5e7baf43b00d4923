package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/wire"
)

// TestClusterHostDies: a host dies whole, its broker (kill -9) and its
// connections (its delegates gone without a word). The brokers that live
// let its agents go once the orphan timeout has passed: their names are
// free again, the tasks assigned to them fail, those they asked for are
// canceled, the other members are told, and nothing acknowledged is
// lost. The agents of the hosts that live are kept, idle or not.
func TestClusterHostDies(t *testing.T) {
	began := time.Now()
	c := startTestCluster(t, "--orphan-timeout=3s")
	tap := c.seqTap(0)
	l := newLoad(t, c)
	ctx, cancel := context.WithTimeout(as(context.Background(), l.h.actor("test")), 3*faultsDeadline)
	defer cancel()

	asker := l.spawn(0, "h0-ask", "asker")
	worker0 := l.spawn(0, "h0-work", "worker")
	worker1 := l.spawn(1, "h1-work", "worker")
	doomedWorker := l.spawn(2, "h2-chat", "doomed-worker")
	doomedAsker := l.spawn(2, "h2-chat", "doomed-asker")
	survivors := []*runtime.Delegate{asker, worker0, worker1}
	doomed := []*runtime.Delegate{doomedWorker, doomedAsker}
	send := func(from, to *runtime.Delegate, text string) *wire.Task {
		task, err := from.Send(ctx, to.ID(), clusterText(text), nil)
		require.NoError(t, err)
		return task
	}
	update := func(d *runtime.Delegate, id string, s wire.State) {
		_, err := d.Update(ctx, id, s, nil)
		require.NoError(t, err)
	}
	assigned := send(asker, doomedWorker, "assigned to the dying host")
	requested := send(doomedAsker, worker1, "asked by the dying host")
	begun := send(doomedAsker, worker0, "asked by the dying host, begun")
	update(worker0, begun.ID, wire.StateWorking)
	done := send(asker, doomedWorker, "done before the host died")
	update(doomedWorker, done.ID, wire.StateWorking)
	update(doomedWorker, done.ID, wire.StateCompleted)
	between := send(asker, worker1, "between the hosts that live")
	what := map[string]string{
		assigned.ID:  "assigned to the dead host's agent",
		requested.ID: "asked for by the dead host's agent",
		begun.ID:     "asked for by the dead host's agent, begun",
		done.ID:      "completed by the dead host's agent before it died",
		between.ID:   "between the hosts that live",
	}
	want := map[string]wire.State{
		assigned.ID:  wire.StateFailed,    // its assignee is gone
		requested.ID: wire.StateCanceled,  // its requester is gone
		begun.ID:     wire.StateCanceled,  // the same, begun
		done.ID:      wire.StateCompleted, // acknowledged before: kept
		between.ID:   wire.StateSubmitted, // not the dead host's business
	}

	st := l.openStore()
	owners := func() string {
		var b strings.Builder
		for _, d := range append(slices.Clone(survivors), doomed...) {
			reg, err := st.Registration(ctx, d.InstanceID())
			if err == nil {
				fmt.Fprintf(&b, " %s:%s", d.ID(), reg.Broker)
			} else {
				fmt.Fprintf(&b, " %s:(%v)", d.ID(), err)
			}
		}
		return b.String()
	}
	t.Logf("agents by the broker they belong to:%s", owners())

	// Host 2 dies: its broker is killed, its connections closed.
	t0 := time.Now()
	c.killBroker(2)
	require.NoError(t, l.hosts[2].Close())
	for _, d := range doomed {
		l.h.hostDied(d.InstanceID(), d.SessionID(), d.ID(), l.h.now())
	}

	// Wait for the orphan timeout to let the dead host's agents go (its
	// broker's lease lapses 5 s after its last renewal, then 3 s), and
	// a while longer, or until everything is as wanted.
	settled := func() bool {
		for _, d := range doomed {
			if _, err := st.Registration(ctx, d.InstanceID()); !errors.Is(err, store.ErrNotFound) {
				return false
			}
		}
		for id, s := range want {
			rec, err := st.Get(ctx, id)
			if err != nil || rec.Task.Status.State != s {
				return false
			}
		}
		return true
	}
	for !settled() && time.Since(t0) < 45*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%v after the host died: agents by the broker they belong to:%s", time.Since(t0).Round(time.Millisecond), owners())
	ok := true
	for _, d := range doomed {
		_, err := st.Registration(ctx, d.InstanceID())
		ok = assert.ErrorIs(t, err, store.ErrNotFound, "the dead host's agent %s is still registered", d.ID()) && ok
		_, err = st.NameHolder(ctx, d.ID())
		ok = assert.ErrorIs(t, err, store.ErrNotFound, "the dead host's agent's name %s is still taken", d.ID()) && ok
	}
	for _, d := range survivors {
		_, err := st.Registration(ctx, d.InstanceID())
		ok = assert.NoError(t, err, "%s, on a host that lives, was let go", d.ID()) && ok
	}
	for id, s := range want {
		rec, err := st.Get(ctx, id)
		if assert.NoError(t, err, "task %s", id) {
			ok = assert.Equal(t, s, rec.Task.Status.State, "task %s: %s", id, what[id]) && ok
		} else {
			ok = false
		}
	}
	require.True(t, ok, "the dead host's agents and tasks are not as they should be")

	// The members that live were told how their tasks ended.
	assert.Equal(t, wire.StateFailed, waitFinal(t, asker, assigned.ID), "the task assigned to the dead host's agent")
	assert.Equal(t, wire.StateCanceled, waitFinal(t, worker1, requested.ID), "the task the dead host's agent asked for")
	assert.Equal(t, wire.StateCanceled, waitFinal(t, worker0, begun.ID), "the task the dead host's agent asked for, begun")

	// Their names are free: another host gets each without a suffix.
	for _, d := range doomed {
		again := l.spawn(1, "h1-again-"+d.ID(), d.ID())
		assert.Equal(t, d.ID(), again.ID(), "the dead host's agent's name, registered again on another host")
	}

	// The task between the hosts that live goes on.
	update(worker1, between.ID, wire.StateCompleted)
	assert.Equal(t, wire.StateCompleted, waitFinal(t, asker, between.ID))

	// Nothing acknowledged is lost, and the history is linearizable.
	reads := l.readTasks(st)
	l.checkAcknowledged(reads)
	l.checkNames(st, survivors)
	tap.check(t)
	names, tasks, _ := l.h.models(reads)
	checkLinearizable(t, "names", nameModel, names)
	checkLinearizable(t, "tasks", taskModel, tasks)
	t.Logf("the test in %v", time.Since(began).Round(time.Millisecond))
}
