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
	"github.com/a2a-bus/a2a-bus/transport"
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
	// Registry claims names, and reads, writes and watches the
	// registrations.
	Registry SharedRegistry
	// Events numbers and keeps each session's notifications.
	Events SharedEvents
	// Leases tell which brokers are alive; an agent belongs to its
	// host's broker (transport.Caller.HomeBroker, when live; else the
	// broker it registered through, or that took it over), and is let go
	// OrphanTimeout after that broker's lease lapsed.
	Leases SharedLeases
	// LeaseEvery is how often the broker renews its lease and looks at
	// the others'. 0 means DefaultLeaseEvery. The lease's term, the
	// store's, must be a few times longer.
	LeaseEvery time.Duration
}

// SharedRegistry is the cluster's registry: a name is claimed here
// first, so that no two agents of the cluster hold it; a registration is
// written here, only as it was read: the broker reads an instance's
// registration under the instance's lock, judges on it, and writes at
// its revision, so that what another broker wrote meanwhile is never
// undone unseen (on store.ErrChanged it reads again and judges again).
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
	// RegistrationRev is Registration with the registration's revision,
	// which PutRegistrationAt and DeleteRegistrationAt take: 0 with
	// store.ErrNotFound.
	RegistrationRev(ctx context.Context, instance string) (*store.Registration, uint64, error)
	// PutRegistrationAt stores reg if the registration of its instance is
	// still the one of revision rev, or, for rev 0, if there is none;
	// else it stores nothing and returns store.ErrChanged.
	PutRegistrationAt(ctx context.Context, reg store.Registration, rev uint64) error
	// DeleteRegistrationAt removes the registration of instance if it is
	// still the one of revision rev; else it removes nothing and returns
	// store.ErrChanged.
	DeleteRegistrationAt(ctx context.Context, instance string, rev uint64) error
	// WatchRegistrations calls fn with the instance of every stored
	// registration, then returns; then, on a goroutine of its own until
	// stop, with the instance of every registration put or deleted, in
	// the order they were stored. fn must not block for long.
	WatchRegistrations(ctx context.Context, fn func(instance string)) (stop func(), err error)
	// Sync returns once the watch has called fn for every change stored
	// before Sync was called, with the instances whose registrations are
	// stored as of then (one removed a moment before may be among them),
	// against which the broker checks its copy.
	Sync(ctx context.Context) (stored map[string]bool, err error)
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
	// The copy is checked against the cluster now and then, not only
	// when a request catches up (checkCopy).
	b.wg.Go(func() {
		tick := time.NewTicker(copyCheckEvery)
		defer tick.Stop()
		for {
			select {
			case <-b.ctx.Done():
				return
			case <-tick.C:
				b.catchUp()
			}
		}
	})
	b.wg.Go(func() {
		for {
			select {
			case <-b.ctx.Done():
				return
			case <-m.wake:
			}
			failed := false
			m.batch.Lock()
			for _, instance := range m.take() {
				if !b.mirror(instance) {
					m.note(instance)
					failed = true
				}
			}
			m.batch.Unlock()
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
	// waiting holds, by instance, the instances whose registrations wait
	// to be copied because it holds their agentId here: each is brought
	// in line again once that one has been.
	waiting map[string]map[string]bool
	// batch is held while pending instances taken are brought in line,
	// so that a catch-up that finds none left waits for those the
	// mirror's goroutine is bringing in.
	batch sync.Mutex
	wake  chan struct{}
	stop  func()    // ends the watch
	once  sync.Once // of stop, at Close
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

// wait notes that instance waits for holder to be brought in line.
func (m *mirrorState) wait(holder, instance string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.waiting == nil {
		m.waiting = map[string]map[string]bool{}
	}
	if m.waiting[holder] == nil {
		m.waiting[holder] = map[string]bool{}
	}
	m.waiting[holder][instance] = true
}

// unblock marks the instances that waited for holder as pending again,
// and wakes the goroutine that brings them in line.
func (m *mirrorState) unblock(holder string) {
	m.mu.Lock()
	waiting := m.waiting[holder]
	delete(m.waiting, holder)
	if len(waiting) > 0 && m.pending == nil {
		m.pending = map[string]bool{}
	}
	for instance := range waiting {
		m.pending[instance] = true
	}
	m.mu.Unlock()
	if len(waiting) > 0 {
		m.signal()
	}
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
	return b.align(ctx, instance, cur)
}

// align makes the registry's entry of instance cur, the cluster's
// registration of it as read under the instance's lock, which the caller
// holds (nil: there is none). The caller holds no agent: a copy the
// cluster has moved on from is revoked, which waits for its holds.
//
// An agentId is one instance's: cur is not copied while another
// instance holds its agentId here. When that one's copy is stale (its
// departure or new name not copied yet), it is brought in line, and cur
// after it. When the cluster holds that agentId for both (which it
// never should), cur waits, logged, until that one is gone: not read
// again and again meanwhile.
func (b *Broker) align(ctx context.Context, instance string, cur *store.Registration) error {
	m := &b.mirrorState
	// Whatever becomes of instance's entry, those that waited for it are
	// judged again.
	defer m.unblock(instance)
	r := &b.reg
	r.mu.RLock()
	local := r.byInstance[instance]
	r.mu.RUnlock()
	var fresh *agent
	if cur != nil {
		h, err := hex.DecodeString(cur.TokenHash)
		if err != nil || len(h) != 32 {
			return fmt.Errorf("broker: the stored registration of %q has no token hash", instance)
		}
		if local != nil && cur.TokenHash == tokenHashHex(local.tokenHash) && cur.AgentID == local.id {
			// The same agent, taken over by another broker.
			r.mu.Lock()
			local.broker = cur.Broker
			r.mu.Unlock()
			return nil
		}
		fresh = &agent{id: cur.AgentID, name: cur.Name, instance: cur.Instance, session: cur.Session,
			card: cur.Card, hidden: b.hiddenSession(cur.Session), broker: cur.Broker}
		copy(fresh.tokenHash[:], h)
	}
	if local != nil {
		local.revoke()
	}
	r.mu.Lock()
	if local != nil {
		r.remove(local)
	}
	var other *agent
	if fresh != nil {
		if other = r.byID[fresh.id]; other == nil {
			r.add(fresh)
		}
	}
	r.mu.Unlock()
	if other == nil {
		return nil
	}
	// Noted before other's registration is read: a change of it stored
	// after this read is brought in line after this note, and wakes
	// instance.
	m.wait(other.instance, instance)
	held, err := b.cfg.Cluster.Registry.Registration(ctx, other.instance)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	if held != nil && held.AgentID == fresh.id {
		b.log.Error("the cluster holds one agentId for two instances: the second is not copied until the first is gone",
			"agentId", fresh.id, "instanceId", other.instance, "waiting", instance)
		return nil
	}
	m.note(other.instance)
	m.signal()
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

// releaseUnused lets the cluster's claim of id by instance go unless the
// instance's registration uses it: a name claimed for a registration
// that was not stored, or the name of one deleted, which a registration
// of the instance stored through another broker meanwhile may use
// (claims are by instance). A name that cannot be checked stays taken.
func (b *Broker) releaseUnused(ctx context.Context, id, instance string) {
	cur, err := b.cfg.Cluster.Registry.Registration(ctx, instance)
	switch {
	case err != nil && !errors.Is(err, store.ErrNotFound):
		b.log.Error("a name could not be checked against its instance's registration; it stays taken in the cluster", "agentId", id, "error", err)
	case cur == nil || cur.AgentID != id:
		b.releaseName(ctx, id, instance)
	}
}

// deleteOwn deletes a's registration from the cluster at rev, reading it
// again while another broker changes it first (a take-over keeps a's
// token). It reports false, deleting nothing, once the stored
// registration is no longer a's: replaced, or deleted, meanwhile. The
// caller holds the instance's lock.
func (b *Broker) deleteOwn(ctx context.Context, a *agent, rev uint64) (bool, error) {
	for try := 1; ; try++ {
		err := b.cfg.Cluster.Registry.DeleteRegistrationAt(ctx, a.instance, rev)
		if !errors.Is(err, store.ErrChanged) {
			return err == nil, err
		}
		if try == maxRegisterTries {
			return false, fmt.Errorf("broker: the registration of %q kept changing: %w", a.instance, err)
		}
		var cur *store.Registration
		cur, rev, err = b.cfg.Cluster.Registry.RegistrationRev(ctx, a.instance)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return false, nil
		case err != nil:
			return false, err
		case cur.TokenHash != tokenHashHex(a.tokenHash):
			return false, nil
		}
	}
}

// landed reports whether a's registration is stored, after a write of
// it failed in a way that leaves that unknown (its answer lost).
func (b *Broker) landed(ctx context.Context, a *agent) bool {
	cur, err := b.cfg.Cluster.Registry.Registration(context.WithoutCancel(ctx), a.instance)
	return err == nil && cur.TokenHash == tokenHashHex(a.tokenHash)
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

// SharedLeases tell which brokers of the cluster are alive: each renews
// its own lease, which lapses when it stops renewing (the store's TTL,
// not a timer of the broker that died).
type SharedLeases interface {
	// Renew keeps broker's lease for another term.
	Renew(ctx context.Context, broker string) error
	// Live returns the brokers whose leases hold.
	Live(ctx context.Context) (map[string]bool, error)
}

// DefaultLeaseEvery is Cluster.LeaseEvery's default.
const DefaultLeaseEvery = time.Second

// startLeases renews the broker's lease every LeaseEvery, and lets go of
// the agents of brokers whose leases have lapsed for OrphanTimeout: their
// registrations deleted, their names freed, their open tasks closed as
// if they had deregistered. An agent of a lapsed broker that calls
// another broker meanwhile (its host lived, its broker did not) is taken
// over by that broker, and kept. Every broker that notices does the same;
// each step is one a second broker finds done.
func (b *Broker) startLeases(ctx context.Context) error {
	c := b.cfg.Cluster
	if err := c.Leases.Renew(ctx, c.Broker); err != nil {
		return fmt.Errorf("broker: take the broker's lease in the cluster: %w", err)
	}
	// The live brokers as of the start: a registration names its host's
	// broker from the first request on (ownerFor).
	if live, err := c.Leases.Live(ctx); err == nil {
		live[c.Broker] = true
		b.live.Store(&live)
	}
	every := c.LeaseEvery
	if every <= 0 {
		every = DefaultLeaseEvery
	}
	b.wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		lapsed := map[string]time.Time{} // broker -> when first seen lapsed
		for n := 0; ; n++ {
			select {
			case <-b.ctx.Done():
				return
			case <-tick.C:
			}
			if err := c.Leases.Renew(b.ctx, c.Broker); err != nil && b.ctx.Err() == nil {
				b.log.Warn("renewing the broker's lease failed", "error", err)
			}
			b.sweepLapsed(lapsed)
			if n%departedEvery == 0 {
				b.sweepDeparted()
			}
		}
	})
	return nil
}

// departedEvery is how many lease renewals apart the broker looks for
// the open tasks of agents that left (a minute, by default), and the
// first look is at the first renewal.
const departedEvery = 60

// sweepDeparted closes the open tasks of members whose registrations are
// gone from the cluster, as their departure would have: a departure
// deletes the registration before it closes the tasks, so a broker that
// dies in between leaves them open, and no one else would close them.
// A member is taken for gone only on the cluster's latest word (a
// leader read), never on this broker's copy, which may lag a
// registration made a moment ago; a departure still under way elsewhere
// closes the same tasks, and each task is closed once (the second finds
// it ended).
func (b *Broker) sweepDeparted() {
	members, err := b.openMembers(b.ctx)
	if err != nil {
		if b.ctx.Err() == nil {
			b.log.Warn("listing the open tasks' members failed; the departed agents' tasks are looked for again later", "error", err)
		}
		return
	}
	for _, inst := range members {
		if b.reg.liveInstance(inst) != nil {
			continue
		}
		_, err := b.cfg.Cluster.Registry.Registration(b.ctx, inst)
		if !errors.Is(err, store.ErrNotFound) {
			continue // registered (this broker's copy lags), or not known now
		}
		var failed *wire.Error
		closed := 0
		err = b.eachPage(b.ctx, store.Query{Instance: inst, OpenOnly: true}, func(recs []*store.Record) error {
			for _, rec := range recs {
				session := rec.Task.ContextID
				if rec.AssigneeInstance == inst {
					session = rec.Task.AgentContextID
				}
				b.closeTasks(b.ctx, []*store.Record{rec}, inst, session, &failed)
				closed++
			}
			return nil
		})
		if err == nil && failed != nil {
			err = failed
		}
		switch {
		case err != nil:
			if b.ctx.Err() == nil {
				b.log.Warn("closing a departed agent's tasks failed; trying again later", "instanceId", inst, "error", err)
			}
		case closed > 0:
			b.log.Info("the open tasks of an agent whose departure was cut short are closed", "instanceId", inst, "tasks", closed)
		}
	}
}

// openMembers returns the instances that are members of an open task:
// from the store's index when it can tell them without reading the
// tasks (the cluster's), else from the open tasks.
func (b *Broker) openMembers(ctx context.Context) ([]string, error) {
	if s, ok := b.store.(interface {
		OpenMembers(context.Context) ([]string, error)
	}); ok {
		return s.OpenMembers(ctx)
	}
	seen := map[string]bool{}
	var out []string
	err := b.eachPage(ctx, store.Query{OpenOnly: true}, func(recs []*store.Record) error {
		for _, r := range recs {
			for _, inst := range []string{r.RequesterInstance, r.AssigneeInstance} {
				if !seen[inst] {
					seen[inst] = true
					out = append(out, inst)
				}
			}
		}
		return nil
	})
	return out, err
}

// sweepLapsed looks for the agents of brokers whose leases lapsed, and
// lets go of those lapsed for OrphanTimeout. lapsed is the sweep's own.
func (b *Broker) sweepLapsed(lapsed map[string]time.Time) {
	live, err := b.cfg.Cluster.Leases.Live(b.ctx)
	if err != nil {
		if b.ctx.Err() == nil {
			b.log.Warn("reading the cluster's leases failed", "error", err)
		}
		return
	}
	live[b.cfg.Cluster.Broker] = true
	b.live.Store(&live)
	now := b.cfg.Now()
	byBroker := map[string][]*agent{}
	b.reg.mu.RLock()
	for _, a := range b.reg.byInstance {
		if a.broker != "" && !live[a.broker] {
			byBroker[a.broker] = append(byBroker[a.broker], a)
		}
	}
	b.reg.mu.RUnlock()
	for broker := range lapsed {
		if byBroker[broker] == nil {
			delete(lapsed, broker)
		}
	}
	// A broker is taken for lapsed (its agents taken over when they call,
	// follow) only once two looks in a row found no lease: the first may
	// have read the leases before a broker that had just started wrote
	// its own, and its agents reached this copy after.
	sure := map[string]bool{}
	for broker, agents := range byBroker {
		if _, ok := lapsed[broker]; ok {
			sure[broker] = true
			continue
		}
		lapsed[broker] = now
		if b.cfg.OrphanTimeout != Forever {
			b.log.Info("a broker of the cluster has stopped renewing its lease; its agents are held for it", "broker", broker, "agents", len(agents), "timeout", b.orphanTimeout())
		}
	}
	b.lapsed.Store(&sure)
	if b.cfg.OrphanTimeout == Forever {
		return
	}
	for broker, agents := range byBroker {
		if now.Sub(lapsed[broker]) < b.cfg.OrphanTimeout {
			continue
		}
		for _, a := range agents {
			b.releaseLapsed(a)
		}
	}
}

// releaseLapsed lets go of a, an agent of a broker whose lease lapsed,
// unless another broker has taken it over since: its open tasks are
// closed and its name freed, then its registration is deleted, last, at
// the revision read before, so that a release cut short (the broker
// dies, or the store fails it) leaves the registration, and is done
// again by the next broker that sees it; each step is one the next
// finds done. A registration changed meanwhile (taken over, registered
// again) is kept, with its name.
func (b *Broker) releaseLapsed(a *agent) {
	unlock := b.lockInstance(a.instance)
	defer unlock()
	ctx := b.ctx
	b.reg.mu.RLock()
	from := a.broker
	b.reg.mu.RUnlock()
	cur, rev, err := b.cfg.Cluster.Registry.RegistrationRev(ctx, a.instance)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return // gone already; the watch tells this broker's copy
	case err != nil:
		b.log.Warn("reading an orphaned agent's registration failed; trying again later", "agentId", a.id, "error", err)
		return
	case cur.Broker != from || cur.TokenHash != tokenHashHex(a.tokenHash):
		return // taken over, or registered again
	}
	// This broker's copy goes first, as at a departure: what its
	// requests do as a is done before a's tasks are closed. Its name is
	// given to no one here until the registration is gone.
	if !a.revoke() {
		return
	}
	b.reg.mu.Lock()
	b.reg.remove(a)
	b.reg.reserved[a.id] = true
	b.reg.mu.Unlock()
	gone := b.letGo(ctx, a, from, rev)
	b.reg.mu.Lock()
	delete(b.reg.reserved, a.id)
	b.reg.free(a.id)
	b.reg.mu.Unlock()
	if !gone {
		// Kept, or to let go again: the copy is made again from what
		// the cluster stores.
		b.mirrorState.note(a.instance)
		b.mirrorState.signal()
		return
	}
	b.log.Info("agent of a lapsed broker let go", "agentId", a.id, "contextId", a.session, "broker", from)
}

// letGo is releaseLapsed's work in the cluster, a's registration being
// the one of revision rev: it reports whether the registration is gone.
func (b *Broker) letGo(ctx context.Context, a *agent, from string, rev uint64) bool {
	if werr := b.closeTasksOf(ctx, a.instance, a.session); werr != nil {
		b.log.Warn("closing an orphaned agent's tasks failed; trying again later", "agentId", a.id, "error", werr.Message)
		return false
	}
	b.releaseName(ctx, a.id, a.instance)
	// keepName claims the name again for a registration that stays.
	keepName := func() {
		if err := b.cfg.Cluster.Registry.ClaimName(ctx, a.id, a.instance); err != nil {
			b.log.Error("the name of an agent that was not let go could not be claimed again", "agentId", a.id, "error", err)
		}
	}
	for try := 1; ; try++ {
		err := b.cfg.Cluster.Registry.DeleteRegistrationAt(ctx, a.instance, rev)
		if err == nil {
			// A broker whose copy still had a live may have made it a
			// task since its open tasks were closed, and found its
			// registration there (closeIfDeparted): those are closed
			// now that it is gone.
			if werr := b.closeTasksOf(ctx, a.instance, a.session); werr != nil {
				b.log.Warn("closing an orphaned agent's last tasks failed", "agentId", a.id, "error", werr.Message)
			}
			return true
		}
		if !errors.Is(err, store.ErrChanged) || try == maxRegisterTries {
			b.log.Warn("deleting an orphaned agent's registration failed; trying again later", "agentId", a.id, "error", err)
			keepName()
			return false
		}
		var cur *store.Registration
		cur, rev, err = b.cfg.Cluster.Registry.RegistrationRev(ctx, a.instance)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return true // let go by another broker
		case err != nil:
			b.log.Warn("reading an orphaned agent's registration failed; trying again later", "agentId", a.id, "error", err)
			keepName()
			return false
		case cur.Broker == from && cur.TokenHash == tokenHashHex(a.tokenHash):
			continue // still to let go
		case cur.AgentID == a.id:
			// Taken over, or registered again under the name, meanwhile.
			keepName()
		}
		return false
	}
}

// ownerFor is the broker an agent registered by the caller from belongs
// to: the broker of the caller's own host, as its client names it, when
// that broker's lease is live, else this broker. A host's agents so
// live and die with its broker, whichever broker serves them; a host
// that names none, or one that is not live (a typo, or its broker
// restarting), gets the broker that serves it, whose lease holds.
//
// The leases are as of this broker's last look (LeaseEvery ago at
// most); with fresh, a home not live then is looked up again, so that a
// host whose broker started a moment ago registers with it.
func (b *Broker) ownerFor(ctx context.Context, from transport.Caller, fresh bool) string {
	own := b.cfg.Cluster.Broker
	h := from.HomeBroker
	if h == "" || h == own {
		return own
	}
	if live := b.live.Load(); live != nil && (*live)[h] {
		return h
	}
	if fresh {
		if live, err := b.cfg.Cluster.Leases.Live(ctx); err == nil && live[h] {
			return h
		}
	}
	return own
}

// follow moves a, which has just called through from, to the broker it
// should belong to when that is not the one it belongs to: to the
// caller's own host's broker when the caller names one that is live (an
// agent registered while its host's broker was away goes home), and to
// this broker when the one it belongs to has lapsed (its host lived, its
// broker did not). An agent whose broker lives and whose caller names no
// live one stays where it is.
func (b *Broker) follow(from transport.Caller, a *agent) {
	b.reg.mu.RLock()
	cur := a.broker
	b.reg.mu.RUnlock()
	to := b.ownerFor(b.ctx, from, false)
	if cur == "" || cur == to {
		return
	}
	if to != from.HomeBroker {
		// Not the caller's home: taken over only from a lapsed broker.
		if lapsed := b.lapsed.Load(); lapsed == nil || !(*lapsed)[cur] {
			return
		}
	}
	b.adopt(a, cur, to)
}

// adopt moves a from broker from to broker to: its registration names to
// from now on, so that it is let go with to, not with from. It runs once
// per agent at a time, off the caller's path. The registration is
// changed only as it was read: one changed meanwhile (let go, taken
// over, registered again) is left as it is.
func (b *Broker) adopt(a *agent, from, to string) {
	if !a.adopting.CompareAndSwap(false, true) {
		return
	}
	// Under the lock Close cancels under: no goroutine starts once the
	// broker is closing.
	b.republish.mu.Lock()
	defer b.republish.mu.Unlock()
	if b.ctx.Err() != nil {
		a.adopting.Store(false)
		return
	}
	b.wg.Go(func() {
		defer a.adopting.Store(false)
		unlock := b.lockInstance(a.instance)
		defer unlock()
		for try := 1; ; try++ {
			cur, rev, err := b.cfg.Cluster.Registry.RegistrationRev(b.ctx, a.instance)
			if err != nil || cur.Broker != from || cur.TokenHash != tokenHashHex(a.tokenHash) {
				return
			}
			cur.Broker = to
			err = b.cfg.Cluster.Registry.PutRegistrationAt(b.ctx, *cur, rev)
			if errors.Is(err, store.ErrChanged) && try < maxRegisterTries {
				continue
			}
			if err != nil {
				b.log.Warn("moving an agent to another broker failed", "agentId", a.id, "error", err)
				return
			}
			b.reg.mu.Lock()
			a.broker = cur.Broker
			b.reg.mu.Unlock()
			b.log.Info("agent moved to another broker", "agentId", a.id, "contextId", a.session, "from", from, "to", to)
			return
		}
	})
}

// closeIfDeparted closes rec, a task this broker has just made, if one
// of its members has left the cluster meanwhile. Both members were live
// in this broker's copy of the registry, which follows the cluster's a
// moment late: a member may have deregistered (or been let go) through
// another broker, which closed the open tasks it found before this one
// was made. A departure deletes the registration before it looks for
// the tasks, so a registration still there now means that the
// departure, if any, will find this task; one gone means it may not
// have, and the task is closed here as the departure would have closed
// it (a task it did close is left as it is).
func (b *Broker) closeIfDeparted(ctx context.Context, rec *store.Record) {
	ctx = context.WithoutCancel(ctx)
	members := []struct{ instance, session string }{
		{rec.RequesterInstance, rec.Task.ContextID},
		{rec.AssigneeInstance, rec.Task.AgentContextID},
	}
	for _, m := range members {
		_, err := b.cfg.Cluster.Registry.Registration(ctx, m.instance)
		if err == nil {
			continue
		}
		if !errors.Is(err, store.ErrNotFound) {
			b.log.Warn("reading a new task's member's registration failed; the task stays open", "taskId", rec.Task.ID, "error", err)
			continue
		}
		var failed *wire.Error
		b.closeTasks(ctx, []*store.Record{rec}, m.instance, m.session, &failed)
		if failed != nil {
			b.log.Warn("closing a new task of a departed agent failed", "taskId", rec.Task.ID, "error", failed.Message)
		}
		return
	}
}

// copyCheckEvery is how often the broker checks its copy of the
// registrations against the cluster's, besides the catch-ups requests
// ask for.
const copyCheckEvery = 30 * time.Second

// checkCopy notes, to be brought in line, every instance the registry's
// copy holds that the cluster does not store, and every one stored that
// the copy does not hold. The watch tells each change, and the copy
// follows it; this is the check that whatever went wrong on the way (a
// change the watch could not tell, a read that answered from before the
// change) is mended at the next catch-up, not kept for ever.
func (b *Broker) checkCopy(stored map[string]bool) {
	var off []string
	b.reg.mu.RLock()
	for instance := range b.reg.byInstance {
		if !stored[instance] {
			off = append(off, instance)
		}
	}
	for instance := range stored {
		if b.reg.byInstance[instance] == nil {
			off = append(off, instance)
		}
	}
	b.reg.mu.RUnlock()
	if len(off) == 0 {
		return
	}
	m := &b.mirrorState
	for _, instance := range off {
		m.note(instance)
	}
	m.signal()
}

// catchUpTimeout bounds how long a request with a token the registry does
// not know waits for the cluster's latest registrations.
const catchUpTimeout = 2 * time.Second

// catchUp brings the registry in line with every registration the
// cluster stored before it was called: a token issued by another broker
// a moment ago works here at once (a host's requests may move between
// brokers), not once the watch has come round to it.
//
// The caller holds no agent: bringing an instance in line may revoke its
// copy, which waits for the agent's holds.
//
// Catch-ups are shared: a caller waits for the first one that starts
// after it came, and one runs at a time, so that a flood of unknown
// tokens (a hostile session's guesses) costs the cluster one read per
// round trip of the broker, not one per request.
//
// It reports whether the catch-up it waited for brought the registry in
// line: false when the cluster could not be read in time (a stream
// without a leader, as while a server rejoins), so that what the
// registry does not show may be there all the same.
func (b *Broker) catchUp() bool {
	c := &b.catching
	c.mu.Lock()
	if c.cond.L == nil {
		c.cond.L = &c.mu
	}
	want := c.started + 1 // the first catch-up to start after now
	if testHookCatchingUp != nil {
		testHookCatchingUp() // under c.mu: the caller has chosen want
	}
	for c.done < want {
		if c.running {
			c.cond.Wait()
			continue
		}
		c.running = true
		c.started++
		n := c.started
		c.mu.Unlock()
		ok := b.syncRegistry()
		c.mu.Lock()
		c.running = false
		c.done, c.ok = n, ok
		c.cond.Broadcast()
	}
	ok := c.ok
	c.mu.Unlock()
	return ok
}

// catchUps shares the registry's catch-ups among the requests that need
// one (see catchUp).
type catchUps struct {
	mu      sync.Mutex
	cond    sync.Cond // on mu
	running bool
	started uint64 // catch-ups started
	done    uint64 // the latest finished (they run one at a time)
	ok      bool   // whether the latest finished brought the registry in line
}

// syncRegistry is one catch-up.
func (b *Broker) syncRegistry() bool {
	ctx, cancel := context.WithTimeout(b.ctx, catchUpTimeout)
	defer cancel()
	stored, err := b.cfg.Cluster.Registry.Sync(ctx)
	if err != nil {
		b.log.Debug("catching up with the cluster's registrations failed", "error", err)
		return false
	}
	b.checkCopy(stored)
	// An instance whose agentId another held here waits for that one,
	// which is noted: a next round brings it in, then the instance.
	m := &b.mirrorState
	m.batch.Lock()
	defer m.batch.Unlock()
	for range 3 {
		pending := m.take()
		if len(pending) == 0 {
			return true
		}
		for _, instance := range pending {
			if !b.mirror(instance) {
				m.note(instance)
				m.signal()
				return false
			}
		}
	}
	return true
}
