package runtime

// FeedStats counts what a Feed recovered, for the tests.
type FeedStats struct {
	// Replayed counts events fetched by replay rather than received.
	Replayed uint64
	// Resets counts the Resets returned.
	Resets uint64
}

// Stats returns what the feed has recovered so far.
func (f *Feed) Stats() FeedStats { return FeedStats{Replayed: f.replayed, Resets: f.resets} }

// Waiting reports whether a Wait of the delegate is blocked for an event.
func (d *Delegate) Waiting() bool { return d.waiters.Load() > 0 }
