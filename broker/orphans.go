package broker

import (
	"context"
	"time"

	"github.com/a2a-bus/a2a-bus/store"
)

// startOrphanSweep looks for open tasks left in the store by an earlier
// run. Their members get OrphanTimeout to register again (by instance id);
// the tasks of those that do not are then closed as if they had
// deregistered.
func (b *Broker) startOrphanSweep(ctx context.Context) error {
	if b.cfg.OrphanTimeout < 0 {
		return nil
	}
	type member struct{ instance, session string }
	var members []member
	waiting := map[string]bool{}
	tasks := 0
	// A page at a time: the open tasks of an earlier run may be many.
	err := b.eachPage(ctx, store.Query{OpenOnly: true}, func(recs []*store.Record) error {
		for _, r := range recs {
			tasks++
			for _, m := range []member{{r.RequesterInstance, r.Task.ContextID}, {r.AssigneeInstance, r.Task.AgentContextID}} {
				if !waiting[m.instance] {
					waiting[m.instance] = true
					members = append(members, m)
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if tasks == 0 {
		return nil
	}
	// ctx bounded the reading above; the sweep runs under the broker's.
	b.reg.mu.Lock()
	b.reg.orphans = waiting
	b.reg.mu.Unlock()
	b.log.Info("open tasks from an earlier run wait for their members", "tasks", tasks, "members", len(members), "timeout", b.cfg.OrphanTimeout)
	timer := time.NewTimer(b.cfg.OrphanTimeout)
	b.wg.Go(func() {
		defer timer.Stop()
		select {
		case <-b.ctx.Done():
			return
		case <-timer.C:
		}
		for _, m := range members {
			b.sweepOrphan(m.instance, m.session)
		}
		b.reg.mu.Lock()
		b.reg.orphans = nil
		b.reg.mu.Unlock()
	})
	return nil
}

// sweepOrphan closes the tasks of an instance that has not come back,
// holding the instance so that it cannot come back halfway.
func (b *Broker) sweepOrphan(instance, session string) {
	unlock := b.lockInstance(instance)
	defer unlock()
	b.reg.mu.RLock()
	back := !b.reg.orphans[instance]
	b.reg.mu.RUnlock()
	if back {
		return
	}
	if err := b.closeTasksOf(b.ctx, instance, session); err != nil {
		b.log.Warn("closing orphaned tasks failed", "error", err.Message)
	}
}
