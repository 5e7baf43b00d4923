package broker

// SweepSessions runs the idle-session sweep now, as the housekeeping loop
// does every so often.
func (b *Broker) SweepSessions() { b.sweepSessions() }

// Footprint counts what the registry holds: live agents, name hints,
// instances the orphan sweep waits for, sessions with live agents.
func (b *Broker) Footprint() (agents, hints, orphans, sessions int) {
	b.reg.mu.RLock()
	defer b.reg.mu.RUnlock()
	return len(b.reg.byID), len(b.reg.hint), len(b.reg.orphans), len(b.reg.bySession)
}
