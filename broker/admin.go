package broker

import (
	"context"
	"encoding/json"
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
	return map[string]method{
		wire.MethodAdminInfo:     {host: true, serve: b.adminInfo},
		wire.MethodAdminAgents:   {host: true, serve: b.adminAgents},
		wire.MethodAdminTasks:    {host: true, serve: b.adminTasks},
		wire.MethodAdminSessions: {host: true, serve: b.adminSessions},
	}
}

func (b *Broker) adminInfo(ctx context.Context, _ transport.Caller, params json.RawMessage) (any, *wire.Error) {
	open, err := b.store.List(ctx, store.Query{OpenOnly: true})
	if err != nil {
		return nil, b.internal("list open tasks", err)
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
		OpenTasks:     len(open),
	}, nil
}

func (b *Broker) adminAgents(context.Context, transport.Caller, json.RawMessage) (any, *wire.Error) {
	b.reg.mu.RLock()
	all := make([]*agent, 0, len(b.reg.byID))
	for _, a := range b.reg.byID {
		all = append(all, a)
	}
	b.reg.mu.RUnlock()
	slices.SortFunc(all, func(x, y *agent) int { return strings.Compare(x.id, y.id) })
	cards := make([]wire.AgentCard, 0, len(all))
	for _, a := range all {
		var c wire.AgentCard
		if json.Unmarshal(a.card, &c) == nil {
			cards = append(cards, c)
		}
	}
	return wire.AdminAgents{Agents: cards}, nil
}

func (b *Broker) adminTasks(ctx context.Context, _ transport.Caller, _ json.RawMessage) (any, *wire.Error) {
	recs, err := b.store.List(ctx, store.Query{OpenOnly: true})
	if err != nil {
		return nil, b.internal("list open tasks", err)
	}
	res := wire.AdminTasks{Open: []wire.AdminTask{}, Counts: map[string]map[wire.State]int{}}
	for _, r := range recs {
		t := &r.Task
		res.Open = append(res.Open, wire.AdminTask{ID: t.ID, State: t.Status.State, ContextID: t.ContextID,
			RequesterName: t.RequesterName, AgentName: t.AgentName, AgentContextID: t.AgentContextID, UpdatedAt: t.UpdatedAt})
		if res.Counts[t.ContextID] == nil {
			res.Counts[t.ContextID] = map[wire.State]int{}
		}
		res.Counts[t.ContextID][t.Status.State]++
	}
	return res, nil
}

func (b *Broker) adminSessions(context.Context, transport.Caller, json.RawMessage) (any, *wire.Error) {
	rows := map[string]*wire.AdminSession{}
	row := func(id string) *wire.AdminSession {
		if rows[id] == nil {
			rows[id] = &wire.AdminSession{ContextID: id}
		}
		return rows[id]
	}
	b.reg.mu.RLock()
	for id, agents := range b.reg.bySession {
		row(id).Agents = len(agents)
	}
	b.reg.mu.RUnlock()
	b.events.mu.Lock()
	logs := make(map[string]*sessionLog, len(b.events.sessions))
	for id, s := range b.events.sessions {
		logs[id] = s
	}
	b.events.mu.Unlock()
	for id, s := range logs {
		s.mu.Lock()
		r := row(id)
		r.LastSeq, r.Kept = s.seq, s.n
		s.mu.Unlock()
	}
	counter, _ := b.bus.(transport.SubscriberCounter)
	res := wire.AdminSessions{Epoch: b.epoch, Sessions: make([]wire.AdminSession, 0, len(rows))}
	for _, r := range rows {
		if r.Agents == 0 && r.Kept == 0 {
			continue // a session seen once, with nothing left in it
		}
		if counter != nil {
			if n, ok := counter.Subscribers(r.ContextID); ok {
				r.Subscribers = &n
			}
		}
		res.Sessions = append(res.Sessions, *r)
	}
	slices.SortFunc(res.Sessions, func(x, y wire.AdminSession) int { return strings.Compare(x.ContextID, y.ContextID) })
	return res, nil
}
