package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestNeverAbandonStartsNoClock: with NeverAbandon, a task whose client
// stopped waiting gets no clock; with AbandonAfter, it does.
func TestNeverAbandonStartsNoClock(t *testing.T) {
	for _, c := range []struct {
		cfg    Config
		clocks int
	}{
		{Config{NeverAbandon: true}, 0},
		{Config{AbandonAfter: time.Hour}, 1},
	} {
		g := &Gateway{cfg: c.cfg, abandoned: map[string]*abandonClock{}}
		g.ctx, g.cancel = context.WithCancel(context.Background())
		g.abandon(&clientState{}, "task-1")
		assert.Len(t, g.abandoned, c.clocks, "%+v", c.cfg)
		g.cancel()
		g.stopAbandoned()
	}
}
