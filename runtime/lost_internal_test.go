package runtime

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/a2a-bus/a2a-bus/wire"
)

// TestAnOlderWordOfATaskDoesNotReopenIt: calls and events may be told
// out of order; the latest state of a task, by its updatedAt, is the one
// known, and a task reported lost is not known again.
func TestAnOlderWordOfATaskDoesNotReopenIt(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	task := func(state wire.State, ms int) *wire.Task {
		return &wire.Task{ID: "t1", Status: wire.TaskStatus{State: state}, UpdatedAt: wire.NewTime(t0.Add(time.Duration(ms) * time.Millisecond))}
	}
	tests := []struct {
		name  string
		lost  bool // reported lost before
		notes []*wire.Task
		open  bool
	}{
		{name: "submitted", notes: []*wire.Task{task(wire.StateSubmitted, 0)}, open: true},
		{name: "then working", notes: []*wire.Task{task(wire.StateSubmitted, 0), task(wire.StateWorking, 1)}, open: true},
		{name: "then completed", notes: []*wire.Task{task(wire.StateSubmitted, 0), task(wire.StateCompleted, 1)}},
		{name: "completed, then an older working", notes: []*wire.Task{task(wire.StateCompleted, 2), task(wire.StateWorking, 1)}},
		{name: "completed, then the same again", notes: []*wire.Task{task(wire.StateCompleted, 2), task(wire.StateCompleted, 2)}},
		{name: "reported lost, then a late word", lost: true, notes: []*wire.Task{task(wire.StateWorking, 1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &Delegate{seen: map[string]known{}, lost: map[string]uint64{}}
			if tt.lost {
				d.lost["t1"] = 0
			}
			for _, n := range tt.notes {
				d.noteSeen(n)
			}
			if tt.open {
				assert.Equal(t, []string{"t1"}, d.KnownOpen())
			} else {
				assert.Empty(t, d.KnownOpen())
			}
		})
	}
}
