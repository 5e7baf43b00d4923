package broker

import (
	"context"
	"fmt"
	"time"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/wire"
)

// startOrphanSweep takes up what an earlier run left in the store. Every
// stored registration is held for its agent: its name and instance id
// wait for it to register again. The members of open tasks and the held
// agents get OrphanTimeout to come back (by instance id); those that do
// not are then let go: their registrations deleted, their tasks closed
// as if they had deregistered. An OrphanTimeout of Forever holds them
// until they come back or their sessions close.
func (b *Broker) startOrphanSweep(ctx context.Context) error {
	regs, err := b.store.Registrations(ctx)
	if err != nil {
		return fmt.Errorf("broker: read the registrations: %w", err)
	}
	b.reg.mu.Lock()
	for _, reg := range regs {
		b.reg.hold(reg)
	}
	b.reg.mu.Unlock()
	if len(regs) > 0 {
		b.log.Info("names of an earlier run are held for their agents", "agents", len(regs), "timeout", b.orphanTimeout())
	}
	if b.cfg.OrphanTimeout == Forever {
		return nil
	}
	type member struct{ instance, session string }
	var members []member
	waiting := map[string]bool{}
	add := func(m member) {
		if !waiting[m.instance] {
			waiting[m.instance] = true
			members = append(members, m)
		}
	}
	for _, reg := range regs {
		add(member{reg.Instance, reg.Session})
	}
	tasks := 0
	// A page at a time: the open tasks of an earlier run may be many.
	err = b.eachPage(ctx, store.Query{OpenOnly: true}, func(recs []*store.Record) error {
		for _, r := range recs {
			tasks++
			add(member{r.RequesterInstance, r.Task.ContextID})
			add(member{r.AssigneeInstance, r.Task.AgentContextID})
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(members) == 0 {
		return nil
	}
	// ctx bounded the reading above; the sweep runs under the broker's.
	b.reg.mu.Lock()
	b.reg.orphans = waiting
	b.reg.mu.Unlock()
	if tasks > 0 {
		b.log.Info("open tasks from an earlier run wait for their members", "tasks", tasks, "members", len(members), "timeout", b.orphanTimeout())
	}
	timer := time.NewTimer(b.cfg.OrphanTimeout)
	b.wg.Go(func() {
		defer timer.Stop()
		select {
		case <-b.ctx.Done():
			return
		case <-timer.C:
		}
		// What cannot be let go now (the store failed) is tried again,
		// backing off, until it is or the broker closes.
		retry := time.Second
		for len(members) > 0 {
			var failed []member
			for _, m := range members {
				if !b.sweepOrphan(m.instance, m.session) {
					failed = append(failed, m)
				}
			}
			if members = failed; len(members) == 0 {
				break
			}
			wait := time.NewTimer(retry)
			select {
			case <-b.ctx.Done():
				wait.Stop()
				return
			case <-wait.C:
			}
			retry = min(2*retry, time.Minute)
		}
		b.reg.mu.Lock()
		b.reg.orphans = nil
		b.reg.mu.Unlock()
		if testHookSwept != nil {
			testHookSwept()
		}
	})
	return nil
}

// sweepOrphan lets go of an instance that has not come back: its held
// registration, then its tasks. It holds the instance so that it cannot
// come back halfway. It reports false when the store failed it, to be
// tried again.
func (b *Broker) sweepOrphan(instance, session string) bool {
	unlock := b.lockInstance(instance)
	defer unlock()
	b.reg.mu.RLock()
	back := !b.reg.orphans[instance]
	b.reg.mu.RUnlock()
	if back {
		return true
	}
	if _, err := b.release(b.ctx, instance, session); err != nil {
		if b.ctx.Err() == nil {
			b.log.Warn("letting go of an agent that did not come back failed; trying again later", "error", err.Message)
		}
		return false
	}
	return true
}

// release lets go of a held registration: it is deleted from the store,
// its name and instance id are free again, and its open tasks are closed
// as if the agent had deregistered. It reports whether a hold was let
// go. The caller holds the instance's lock.
func (b *Broker) release(ctx context.Context, instance, session string) (bool, *wire.Error) {
	b.reg.mu.RLock()
	h := b.reg.held[instance]
	b.reg.mu.RUnlock()
	if h != nil {
		if err := b.store.DeleteRegistration(ctx, instance); err != nil {
			return false, b.storeFailure("delete a held registration", err)
		}
		b.reg.mu.Lock()
		b.reg.unhold(instance)
		b.reg.mu.Unlock()
		b.log.Info("held name let go", "agentId", h.id, "contextId", h.session)
		session = h.session
	}
	return h != nil, b.closeTasksOf(ctx, instance, session)
}

// heldIn returns the instances held for session.
func (b *Broker) heldIn(session string) []*hold {
	b.reg.mu.RLock()
	defer b.reg.mu.RUnlock()
	var out []*hold
	for _, h := range b.reg.held {
		if h.session == session {
			out = append(out, h)
		}
	}
	return out
}

// orphanTimeout is OrphanTimeout as the logs say it.
func (b *Broker) orphanTimeout() any {
	if b.cfg.OrphanTimeout == Forever {
		return "none"
	}
	return b.cfg.OrphanTimeout
}
