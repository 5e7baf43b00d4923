package broker

import (
	"context"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/a2a-bus/a2a-bus/internal/version"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// The admin extension: host-only methods that let an operator see what
// the broker is doing. They read; they change nothing.

func (b *Broker) adminMethods() map[string]method {
	m := map[string]method{
		wire.MethodAdminInfo:     {host: true, serve: b.adminInfo},
		wire.MethodAdminAgents:   {host: true, serve: b.adminAgents},
		wire.MethodAdminTasks:    {host: true, serve: b.adminTasks},
		wire.MethodAdminSessions: {host: true, serve: b.adminSessions},
	}
	if r, ok := b.bus.(transport.SessionRevoker); ok {
		m[wire.MethodSessionClose] = method{host: true, serve: b.closeSession(r)}
	}
	return m
}

func (b *Broker) adminInfo(ctx context.Context, _ transport.Caller, req *wire.Request) (any, *wire.Error) {
	open, err := b.store.OpenCount(ctx)
	if err != nil {
		return nil, b.storeFailure("count open tasks", err)
	}
	b.reg.mu.RLock()
	agents, sessions := len(b.reg.byID), len(b.reg.bySession)
	b.reg.mu.RUnlock()
	return wire.AdminInfo{
		Version:       version.String(),
		Epoch:         b.epoch,
		Bus:           b.cfg.BusName,
		StartedAt:     wire.NewTime(b.started),
		UptimeSeconds: b.cfg.Now().Sub(b.started).Round(time.Millisecond).Seconds(),
		Agents:        agents,
		Sessions:      sessions,
		OpenTasks:     open,
	}, nil
}

// adminPage decodes the paging params of an admin list.
func adminPage(req *wire.Request) (wire.PageParams, int, *wire.Error) {
	var p wire.PageParams
	if err := req.DecodeParams(&p); err != nil {
		return p, 0, err
	}
	size, err := pageSize(p)
	return p, size, err
}

func (b *Broker) adminAgents(_ context.Context, _ transport.Caller, req *wire.Request) (any, *wire.Error) {
	p, size, err := adminPage(req)
	if err != nil {
		return nil, err
	}
	return b.agentsPage(nil, p.PageToken, size), nil
}

func (b *Broker) adminTasks(ctx context.Context, _ transport.Caller, req *wire.Request) (any, *wire.Error) {
	p, size, werr := adminPage(req)
	if werr != nil {
		return nil, werr
	}
	recs, more, err := b.store.List(ctx, store.Query{OpenOnly: true, After: p.PageToken, Limit: size, MaxBytes: b.limits.Page()})
	if err != nil {
		return nil, b.storeFailure("list open tasks", err)
	}
	res := wire.AdminTasks{Open: make([]wire.AdminTask, 0, len(recs))}
	for _, r := range recs {
		t := &r.Task
		res.Open = append(res.Open, wire.AdminTask{ID: t.ID, State: t.Status.State, ContextID: t.ContextID,
			RequesterName: t.RequesterName, AgentName: t.AgentName, AgentContextID: t.AgentContextID, UpdatedAt: t.UpdatedAt})
	}
	if more && len(recs) > 0 {
		res.NextPageToken = recs[len(recs)-1].Task.ID
	}
	return res, nil
}

func (b *Broker) adminSessions(_ context.Context, _ transport.Caller, req *wire.Request) (any, *wire.Error) {
	p, size, werr := adminPage(req)
	if werr != nil {
		return nil, werr
	}
	rows := map[string]*wire.AdminSession{}
	row := func(id string) *wire.AdminSession {
		if rows[id] == nil {
			rows[id] = &wire.AdminSession{ContextID: id}
		}
		return rows[id]
	}
	b.reg.mu.RLock()
	for id, agents := range b.reg.bySession {
		if id > p.PageToken {
			row(id).Agents = len(agents)
		}
	}
	b.reg.mu.RUnlock()
	for id, s := range b.events.all() {
		if id <= p.PageToken {
			continue
		}
		s.mu.Lock()
		if s.n > 0 || rows[id] != nil {
			r := row(id)
			r.LastSeq, r.Kept = s.seq, s.n
		}
		s.mu.Unlock()
	}
	ids := slices.Sorted(maps.Keys(rows))
	res := wire.AdminSessions{Epoch: b.epoch, Sessions: make([]wire.AdminSession, 0, min(len(ids), size))}
	if len(ids) > size {
		ids = ids[:size]
		res.NextPageToken = ids[size-1]
	}
	counter, _ := b.bus.(transport.SubscriberCounter)
	for _, id := range ids {
		r := rows[id]
		if counter != nil {
			if n, ok := counter.Subscribers(id); ok {
				r.Subscribers = &n
			}
		}
		res.Sessions = append(res.Sessions, *r)
	}
	return res, nil
}

// closeSession serves a2a.sessions.close: the bus revokes the session's
// credentials (closing their connections), then the session's agents are
// deregistered unless the host keeps them, and its notifications are
// forgotten.
func (b *Broker) closeSession(revoker transport.SessionRevoker) func(context.Context, transport.Caller, *wire.Request) (any, *wire.Error) {
	return func(ctx context.Context, _ transport.Caller, req *wire.Request) (any, *wire.Error) {
		var p wire.SessionCloseParams
		if err := req.DecodeParams(&p); err != nil {
			return nil, err
		}
		if err := wire.ValidateID("contextId", p.ContextID); err != nil {
			return nil, wire.ErrInvalidParams.Withf("%v", err)
		}
		if err := revoker.RevokeSession(ctx, p.ContextID); err != nil {
			return nil, b.storeFailure("revoke the session's credentials", err)
		}
		res := wire.SessionCloseResult{Deregistered: []string{}}
		if !p.KeepAgents {
			if b.clustered() {
				// The session's agents are the cluster's as of the call:
				// one registered through another broker a moment ago
				// too. No agent is held: a catch-up may revoke copies.
				b.catchUp()
			}
			b.reg.mu.RLock()
			agents := slices.Collect(maps.Values(b.reg.bySession[p.ContextID]))
			b.reg.mu.RUnlock()
			slices.SortFunc(agents, func(x, y *agent) int { return strings.Compare(x.id, y.id) })
			var failed *wire.Error
			for _, a := range agents {
				gone, err := b.depart(ctx, a)
				if gone {
					res.Deregistered = append(res.Deregistered, a.id)
				}
				if err != nil && failed == nil {
					failed = err
				}
			}
			// Agents of the session that have not come back since the
			// broker started are let go too.
			for _, h := range b.heldIn(p.ContextID) {
				unlock := b.lockInstance(h.instance)
				b.reg.mu.RLock()
				still := b.reg.held[h.instance] == h
				b.reg.mu.RUnlock()
				var err *wire.Error
				gone := false
				if still {
					gone, err = b.release(ctx, h.instance, h.session)
				}
				unlock()
				if gone && h.id != "" {
					res.Deregistered = append(res.Deregistered, h.id)
				}
				if err != nil && failed == nil {
					failed = err
				}
			}
			if failed != nil {
				return nil, failed
			}
		}
		if b.clustered() {
			if err := b.cfg.Cluster.Events.Forget(ctx, p.ContextID); err != nil {
				return nil, b.storeFailure("forget the session's notifications", err)
			}
		}
		b.events.forget(p.ContextID)
		return res, nil
	}
}
