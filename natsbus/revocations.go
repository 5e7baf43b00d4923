package natsbus

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"sync"
)

// Revocations keeps, per session, the generation of its credentials on a
// server the broker does not embed (Config.Callout): a credential
// carries the generation it was issued in, and is valid only while that
// generation is the session's current one. a2a.sessions.close moves the
// session to a new generation, which revokes every credential issued
// before, whichever broker issued it and whichever broker is asked to
// check it.
//
// Generations, not times, so that no broker's clock decides whether a
// credential outlived its revocation. Every broker of a cluster must use
// one shared Revocations (a key-value bucket of the cluster, one key per
// session); each broker's own MemoryRevocations would revoke only on
// that broker.
//
// Methods are safe for concurrent use. An error fails closed: a credential
// that cannot be checked is refused, a session whose revocation cannot be
// recorded answers a2a.sessions.close with the error.
type Revocations interface {
	// Current returns the session's current generation: a credential
	// issued now carries it.
	Current(ctx context.Context, session string) (uint64, error)
	// Revoke moves the session to a new generation, different from every
	// earlier one, and returns the generation it ended.
	Revoke(ctx context.Context, session string) (ended uint64, err error)
}

// MemoryRevocations is a Revocations in this process's memory: for a
// single broker. Its generations start at a value drawn when it is made,
// so the credentials issued under an earlier MemoryRevocations (an
// earlier run of the broker) are refused, as the embedded server's are
// after a restart. It keeps one entry per session ever revoked.
type MemoryRevocations struct {
	mu    sync.Mutex
	base  uint64
	bySID map[string]uint64
}

var _ Revocations = (*MemoryRevocations)(nil)

// NewMemoryRevocations returns an empty MemoryRevocations.
func NewMemoryRevocations() *MemoryRevocations {
	return &MemoryRevocations{base: randomGeneration(), bySID: map[string]uint64{}}
}

// Current implements Revocations.
func (r *MemoryRevocations) Current(_ context.Context, session string) (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.current(session), nil
}

// current is the session's generation. r.mu is held.
func (r *MemoryRevocations) current(session string) uint64 {
	if g, ok := r.bySID[session]; ok {
		return g
	}
	return r.base
}

// Revoke implements Revocations.
func (r *MemoryRevocations) Revoke(_ context.Context, session string) (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ended := r.current(session)
	next := randomGeneration()
	for next == ended || next == r.base {
		next = randomGeneration()
	}
	r.bySID[session] = next
	return ended, nil
}

// randomGeneration draws a generation: random, so that a store that lost
// its entries cannot hand out an old one again.
func randomGeneration() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:])
}
