package broker

import "hash/maphash"

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

// OnRevoking calls fn whenever an agent is about to be revoked (to wait
// for the operations that hold it), for the test's length.
func OnRevoking(t interface{ Cleanup(func()) }, fn func()) {
	testHookRevoking = fn
	t.Cleanup(func() { testHookRevoking = nil })
}

// OnLockingInstance calls fn whenever an instance's lock is about to be
// taken, for the test's length.
func OnLockingInstance(t interface{ Cleanup(func()) }, fn func(instance string)) {
	testHookLockingInstance = fn
	t.Cleanup(func() { testHookLockingInstance = nil })
}

// PushWindows is how many instances have a window of push keys.
func (b *Broker) PushWindows() int { return b.pushes.windows() }

// HashToken is the registry's key of a token.
var HashToken = hashToken

// OnSwept calls fn when an orphan sweep is done, for the test's length.
func OnSwept(t interface{ Cleanup(func()) }, fn func()) {
	testHookSwept = fn
	t.Cleanup(func() { testHookSwept = nil })
}

// InstanceStripe is the lock an instance's registrations and departures
// take.
func InstanceStripe(instance string) uint64 {
	return maphash.String(stripeSeed, instance) % instanceStripes
}

// OnLockingSend calls fn whenever a send's key lock is about to be taken,
// for the test's length.
func OnLockingSend(t interface{ Cleanup(func()) }, fn func(instance, key string)) {
	testHookLockingSend = fn
	t.Cleanup(func() { testHookLockingSend = nil })
}

// OnCatchingUp calls fn whenever a request starts to wait for a catch-up
// with the cluster's registrations, for the test's length.
func OnCatchingUp(t interface{ Cleanup(func()) }, fn func()) {
	testHookCatchingUp = fn
	t.Cleanup(func() { testHookCatchingUp = nil })
}
