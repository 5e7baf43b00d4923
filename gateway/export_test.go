package gateway

import "time"

// SetPollEvery sets pollEvery for a test, and returns its undo. Call it
// before the gateway starts and undo it after the gateway is closed: it
// is read without a lock.
func SetPollEvery(d time.Duration) (undo func()) {
	was := pollEvery
	pollEvery = d
	return func() { pollEvery = was }
}

// Abandoned returns how many abandoned tasks have their clock running.
func Abandoned(g *Gateway) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.abandoned)
}

// ExpireAbandoned runs out every abandoned task's clock now, as if
// AbandonAfter had passed, and returns once each end is done.
func ExpireAbandoned(g *Gateway) {
	g.mu.Lock()
	var due []func()
	for id, a := range g.abandoned {
		if a.t.Stop() {
			due = append(due, func() { g.endAbandoned(a.c, id) })
		}
	}
	g.mu.Unlock()
	for _, end := range due {
		end()
	}
}
