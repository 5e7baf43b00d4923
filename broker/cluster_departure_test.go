package broker_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/wire"
)

// A departure and a send that races it on another broker, whose copy of
// the registry has not yet heard of the departure: the departure closes
// the open tasks it finds, and the task the send makes after that must
// not stay open with a member that is gone (no departure would ever
// close it).
func TestClusterATaskMadeForAnAgentThatLeftThroughAnotherBrokerCloses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		leaver  string // who leaves through b1 while bob's or alice's send is served by b2
		want    wire.State
		toldTo  string // the member that lives, and is told
		session string
	}{
		{name: "the assignee left", leaver: "alice", want: wire.StateFailed, toldTo: "bob", session: "s2"},
		{name: "the requester left", leaver: "bob", want: wire.StateCanceled, toldTo: "alice", session: "s1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// b2's copy of the registry lags: it hears of a change only
			// when it catches up, which a send to a live agent does not.
			c := newFakeCluster()
			b1, b2 := c.broker(t, "b1"), c.laggingBroker(t, "b2")
			alice := b1.register("s1", "alice")
			bob := b2.register("s2", "bob")
			seen(t, bob, "alice")
			seen(t, alice, "bob")
			leaver, stays := alice, bob
			if tc.leaver == "bob" {
				leaver, stays = bob, alice
			}
			require.NoError(t, leaver.on(b1).deregister())
			task, err := bob.on(b2).send("alice", "work")
			require.NoError(t, err, "b2 does not know yet that %s left", tc.leaver)

			got, err := stays.on(b1).get(task.ID)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got.Status.State, "the task of an agent that left")
			for {
				ev := stays.e.event(tc.session) // on the bus it registered through
				if ev.TaskEvent != nil && ev.TaskEvent.Final {
					assert.Equal(t, tc.want, ev.TaskEvent.Task.Status.State)
					assert.Equal(t, stays.id, ev.TaskEvent.Recipient)
					break
				}
			}
		})
	}
}
