package runtime

import "slices"

// FeedStats counts what a Feed recovered, for the tests.
type FeedStats struct {
	// Replayed counts events fetched by replay rather than received.
	Replayed uint64
	// Gaps counts the Gaps returned.
	Gaps uint64
}

// Stats returns what the feed has recovered so far.
func (f *Feed) Stats() FeedStats { return FeedStats{Replayed: f.replayed, Gaps: f.gaps} }

// Waiting reports whether a Wait of the delegate is blocked for an event.
func (d *Delegate) Waiting() bool { return d.waiters.Load() > 0 }

// Overflowed reports whether the delegate's wait queue has dropped
// events that a Resync has yet to report.
func (d *Delegate) Overflowed() bool {
	d.qmu.Lock()
	defer d.qmu.Unlock()
	return d.overflow
}

// KnownOpen returns, in id order, the tasks the delegate knows as open:
// those a Resync checks for Lost.
func (d *Delegate) KnownOpen() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var ids []string
	for id, k := range d.seen {
		if k.open {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// Known returns how many tasks the delegate remembers it was told of.
func (d *Delegate) Known() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.seen)
}
