package broker

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/wire"
)

// Cluster is what a broker shares with the other brokers of a cluster
// (docs/PROTOCOL.md, the cluster binding). With it, any broker of the
// cluster can serve any request: the agents, their names and tokens, the
// tasks and each session's notifications are in shared state, and each
// broker's registry is a copy of the cluster's, kept up to date by a
// watch. Config.Store must then be the cluster's store too.
type Cluster struct {
	// Broker names this broker among the cluster's; it stays the same
	// across the broker's restarts.
	Broker string
	// Epoch is the cluster's epoch: the same on every broker, for as long
	// as the cluster's state lives, so that a runtime whose requests move
	// from one broker to another replays without a gap.
	Epoch string
	// Registry claims names and reads and watches the registrations.
	Registry SharedRegistry
	// Events numbers and keeps each session's notifications.
	Events SharedEvents
}

// SharedRegistry is the cluster's registry: the registrations themselves
// are written through the broker's store (store.Registry); a name is
// claimed here first, so that no two agents of the cluster hold it.
type SharedRegistry interface {
	// ClaimName takes agentID for instance: store.ErrNameTaken when
	// another instance holds it. A name instance holds already is no
	// error.
	ClaimName(ctx context.Context, agentID, instance string) error
	// ReleaseName lets agentID go if instance holds it; a name another
	// instance holds is left alone.
	ReleaseName(ctx context.Context, agentID, instance string) error
	// Registration returns the stored registration of instance, or
	// store.ErrNotFound, as of a moment after the call began (not a
	// lagging copy).
	Registration(ctx context.Context, instance string) (*store.Registration, error)
	// WatchRegistrations calls fn with the instance of every stored
	// registration, then returns; then, on a goroutine of its own until
	// stop, with the instance of every registration put or deleted, in
	// the order they were stored. fn must not block for long.
	WatchRegistrations(ctx context.Context, fn func(instance string)) (stop func(), err error)
}

// SharedEvents keeps each session's notifications for the cluster and
// publishes them to the session: a notification is published only once
// it is kept, and a session's are published in seq order.
type SharedEvents interface {
	// Append numbers the session's next notification: build makes it
	// with that seq (an error from build aborts the append, and takes no
	// number). It returns once the notification is kept.
	Append(ctx context.Context, session string, build func(seq uint64) ([]byte, error)) (uint64, error)
	// Since returns the kept notifications of session after afterSeq, in
	// order, within maxBytes (the first whatever its size); the oldest
	// seq kept (last+1 when none) and the last seq given.
	Since(ctx context.Context, session string, afterSeq uint64, maxBytes int) (msgs []json.RawMessage, oldest, last uint64, err error)
	// Forget drops the kept notifications of session; its seq goes on.
	Forget(ctx context.Context, session string) error
}

// clustered reports whether the broker shares its state with a cluster.
func (b *Broker) clustered() bool { return b.cfg.Cluster != nil }

// tokenHashHex is how a shared registration holds an agent's token: its
// SHA-256, from which the token cannot be found.
func tokenHashHex(h [32]byte) string { return hex.EncodeToString(h[:]) }

// startMirror fills the registry with the cluster's registrations and
// keeps it a copy of them until Close: the watch only notes which
// instances changed; a goroutine of the broker's brings each in line.
func (b *Broker) startMirror(ctx context.Context) error {
	m := &b.mirrorState
	m.wake = make(chan struct{}, 1)
	stop, err := b.cfg.Cluster.Registry.WatchRegistrations(ctx, func(instance string) {
		m.note(instance)
		m.signal()
	})
	if err != nil {
		return fmt.Errorf("broker: watch the cluster's registrations: %w", err)
	}
	m.stop = stop
	// What is stored now is in the registry before the broker serves.
	for _, instance := range m.take() {
		if err := b.reconcile(ctx, instance); err != nil {
			stop()
			return fmt.Errorf("broker: read the cluster's registration of %q: %w", instance, err)
		}
	}
	b.wg.Go(func() {
		for {
			select {
			case <-b.ctx.Done():
				return
			case <-m.wake:
			}
			failed := false
			for _, instance := range m.take() {
				if !b.mirror(instance) {
					m.note(instance)
					failed = true
				}
			}
			if failed { // try again in a while
				t := time.NewTimer(time.Second)
				select {
				case <-b.ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
				m.signal()
			}
		}
	})
	return nil
}

// mirrorState is the instances whose registrations changed in the
// cluster and have not been brought in line here yet.
type mirrorState struct {
	mu      sync.Mutex
	pending map[string]bool
	wake    chan struct{}
	stop    func()    // ends the watch
	once    sync.Once // of stop, at Close
}

// note marks instance as pending.
func (m *mirrorState) note(instance string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pending == nil {
		m.pending = map[string]bool{}
	}
	m.pending[instance] = true
}

// signal wakes the goroutine that brings the pending instances in line.
func (m *mirrorState) signal() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// take returns the pending instances, and forgets them.
func (m *mirrorState) take() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := slices.Sorted(maps.Keys(m.pending))
	clear(m.pending)
	return out
}

// mirror brings instance in line with the cluster. It reports false,
// logging why, when the cluster could not be read: the caller tries
// again later.
func (b *Broker) mirror(instance string) bool {
	err := b.reconcile(b.ctx, instance)
	if err != nil && b.ctx.Err() == nil {
		b.log.Warn("the cluster's registration of an agent could not be read; trying again", "instanceId", instance, "error", err)
	}
	return err == nil || b.ctx.Err() != nil
}

// reconcile makes the registry's entry of instance what the cluster
// stores now: a registration stored by another broker (or by this one
// before a restart) becomes an agent here, with the token it was given;
// one replaced or deleted is revoked here. It reads the stored value
// rather than trusting the change that woke it, so that changes seen out
// of order cannot undo a later one. It holds the instance, as a
// registration does.
func (b *Broker) reconcile(ctx context.Context, instance string) error {
	unlock := b.lockInstance(instance)
	defer unlock()
	cur, err := b.cfg.Cluster.Registry.Registration(ctx, instance)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	r := &b.reg
	r.mu.RLock()
	local := r.byInstance[instance]
	r.mu.RUnlock()
	if cur != nil && local != nil && cur.TokenHash == tokenHashHex(local.tokenHash) && cur.AgentID == local.id {
		return nil // the same
	}
	var fresh *agent
	if cur != nil {
		h, err := hex.DecodeString(cur.TokenHash)
		if err != nil || len(h) != 32 {
			return fmt.Errorf("broker: the stored registration of %q has no token hash", instance)
		}
		fresh = &agent{id: cur.AgentID, name: cur.Name, instance: cur.Instance, session: cur.Session,
			card: cur.Card, hidden: b.hiddenSession(cur.Session)}
		copy(fresh.tokenHash[:], h)
	}
	if local != nil {
		local.revoke()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if local != nil {
		r.remove(local)
	}
	if fresh != nil {
		if other := r.byID[fresh.id]; other != nil {
			// The name was another instance's here, and the cluster has
			// moved it on: that one is gone too, or will be shown gone
			// by its own change.
			other.revoke()
			r.remove(other)
		}
		r.add(fresh)
	}
	return nil
}

// claimName takes a's id in the cluster, moving on to the next free id
// while another instance of the cluster holds it. r.mu is not held; a.id
// is reserved in the registry, and stays reserved (under its final
// value) when claimName returns nil.
func (b *Broker) claimName(ctx context.Context, a *agent) *wire.Error {
	var skip map[string]bool
	for {
		err := b.cfg.Cluster.Registry.ClaimName(ctx, a.id, a.instance)
		if err == nil {
			return nil
		}
		r := &b.reg
		r.mu.Lock()
		delete(r.reserved, a.id)
		if !errors.Is(err, store.ErrNameTaken) {
			r.free(a.id)
			r.mu.Unlock()
			return b.storeFailure("claim the agent's name in the cluster", err)
		}
		// Held elsewhere, and not yet seen here: skip it.
		if skip == nil {
			skip = map[string]bool{}
		}
		skip[a.id] = true
		if len(skip) > maxClaimTries {
			r.mu.Unlock()
			return wire.ErrInternal.Withf("no free name for %q after %d tries in the cluster", a.name, maxClaimTries)
		}
		a.id = r.uniqueIDSkipping(a.name, skip)
		r.reserved[a.id] = true
		r.mu.Unlock()
	}
}

// maxClaimTries bounds the names a registration tries in the cluster
// beyond those its broker knows to be taken.
const maxClaimTries = 1000

// uniqueIDSkipping is uniqueID, passing over the ids in skip too. r.mu is
// held.
func (r *registry) uniqueIDSkipping(name string, skip map[string]bool) string {
	if !r.taken(name) && !skip[name] {
		return name
	}
	for n := 2; ; n++ {
		id := name + "-" + itoa(n)
		if !r.taken(id) && !skip[id] {
			return id
		}
	}
}

// releaseName lets the cluster's claim of id by instance go, logging a
// failure: the name then stays taken in the cluster until an operator
// removes it.
func (b *Broker) releaseName(ctx context.Context, id, instance string) {
	if err := b.cfg.Cluster.Registry.ReleaseName(ctx, id, instance); err != nil {
		b.log.Error("a departed agent's name could not be let go in the cluster; it stays taken", "agentId", id, "error", err)
	}
}

// appendShared numbers, encodes and keeps one notification in the
// cluster's log, which publishes it. See post.
func (b *Broker) appendShared(recipient, session, fromSession, method string, params func(wire.EventHead) any) error {
	_, err := b.cfg.Cluster.Events.Append(b.ctx, session, func(seq uint64) ([]byte, error) {
		head := wire.EventHead{
			Recipient:          recipient,
			RecipientContextID: session,
			ContextID:          fromSession,
			Seq:                seq,
			Epoch:              b.epoch,
		}
		msg, err := wire.MarshalNotification(method, params(head))
		if err != nil {
			b.log.Error("encode notification", "method", method, "error", err)
			return nil, err
		}
		if len(msg) > b.limits.Item() {
			if method != wire.NotifyPush {
				b.log.Error("notification over the payload limit not sent", "method", method, "bytes", len(msg))
			}
			return nil, errTooLarge
		}
		return msg, nil
	})
	if err != nil && !errors.Is(err, errTooLarge) {
		b.log.Error("notification not kept in the cluster's log", "method", method, "error", err)
	}
	return err
}

// replayShared is a2a.events.replay from the cluster's log.
func (b *Broker) replayShared(ctx context.Context, p *wire.ReplayParams, where bool) (any, *wire.Error) {
	res := wire.ReplayResult{Epoch: b.epoch, Events: []json.RawMessage{}}
	var after uint64
	if p.AfterSeq != nil && p.Epoch != nil && *p.Epoch == b.epoch {
		after = *p.AfterSeq
	}
	events, oldest, last, err := b.cfg.Cluster.Events.Since(ctx, p.ContextID, after, b.limits.Page())
	if err != nil {
		return nil, b.storeFailure("read the session's notifications", err)
	}
	res.LastSeq = last
	if where {
		return res, nil
	}
	gap := func(why string) *wire.Error {
		e := wire.ErrReplayGap.Withf("%s; re-read your tasks with a2a.tasks.list", why)
		e.Data.Epoch = b.epoch
		e.Data.OldestSeq = oldest
		return e
	}
	if *p.Epoch != b.epoch {
		return nil, gap("the epoch is not the current one")
	}
	if *p.AfterSeq >= last {
		return res, nil
	}
	if *p.AfterSeq+1 < oldest {
		return nil, gap("the events after that seq are no longer kept")
	}
	res.Events = events
	return res, nil
}
