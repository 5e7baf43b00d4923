package broker

import (
	"context"
	"encoding/json"
	"errors"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// taskStripes is the number of locks that order the changes of tasks and
// their notifications: a change and its notification happen under the
// task's stripe, so notifications follow the order of the changes.
const taskStripes = 1024

var stripeSeed = maphash.MakeSeed()

func (b *Broker) lockTask(id string) func() {
	m := &b.stripes[maphash.String(stripeSeed, id)%taskStripes]
	m.Lock()
	return m.Unlock
}

func (b *Broker) send(ctx context.Context, from transport.Caller, params json.RawMessage) (any, *wire.Error) {
	var p sendParams
	p.size = len(params)
	// send takes its own holds: a new task needs both members held.
	return b.withCaller(from, params, &p, &p.Token, false, func(self *agent) (any, *wire.Error) {
		if p.Message == nil {
			return nil, wire.ErrInvalidParams.Withf("message: required")
		}
		if err := p.Message.Validate("message"); err != nil {
			return nil, wire.ErrInvalidParams.Withf("%v", err)
		}
		if err := validObject("metadata", p.Metadata); err != nil {
			return nil, err
		}
		if p.size > b.cfg.MaxTaskBytes {
			return nil, wire.ErrInvalidParams.Withf("message: a task holds at most %d bytes", b.cfg.MaxTaskBytes)
		}
		if p.TaskID != "" {
			if p.Oneway {
				return nil, wire.ErrInvalidParams.Withf("oneway cannot be combined with taskId")
			}
			if !self.enter() {
				return nil, errRevoked()
			}
			defer self.leave()
			return b.sendOnTask(ctx, self, &p)
		}
		if p.To == self.id {
			return nil, wire.ErrInvalidParams.Withf("to: an agent cannot send to itself")
		}
		peer, err := b.resolvePeer(self, p.To)
		if err != nil {
			return nil, err
		}
		if p.Oneway {
			return b.push(self, peer, p.Message)
		}
		return b.createTask(ctx, self, peer, &p)
	})
}

func validObject(field string, raw json.RawMessage) *wire.Error {
	if raw == nil {
		return nil
	}
	if !wire.ParamsObject(raw) && string(raw) != "null" {
		return wire.ErrInvalidParams.Withf("%s: must be an object", field)
	}
	return nil
}

// resolvePeer finds the addressee of a new task or push (ADR 0162 rule 2):
// to when given; else the single other agent of the caller's session; else
// the single agent of the other sessions.
func (b *Broker) resolvePeer(self *agent, to string) (*agent, *wire.Error) {
	r := &b.reg
	r.mu.RLock()
	defer r.mu.RUnlock()
	if to != "" {
		peer := r.byID[to]
		if peer == nil {
			return nil, wire.ErrUnknownAgent.Withf("no live agent %s", quote(to))
		}
		return peer, nil
	}
	var local []*agent
	for _, a := range r.bySession[self.session] {
		if a != self {
			local = append(local, a)
		}
	}
	switch {
	case len(local) == 1:
		return local[0], nil
	case len(local) > 1:
		return nil, ambiguous(local, "in this session")
	}
	var remote []*agent
	for _, a := range r.byID {
		if a.session != self.session {
			remote = append(remote, a)
		}
	}
	switch len(remote) {
	case 0:
		return nil, wire.ErrNoPeers.Withf("no other live agent; register a peer or name one with to")
	case 1:
		return remote[0], nil
	}
	return nil, ambiguous(remote, "in other sessions")
}

func ambiguous(candidates []*agent, where string) *wire.Error {
	ids := make([]string, len(candidates))
	for i, a := range candidates {
		ids[i] = a.id
	}
	slices.Sort(ids)
	e := wire.ErrAmbiguousPeer.Withf("%d candidate peers %s; name one with to", len(ids), where)
	e.Data.Candidates = ids
	return e
}

func (b *Broker) push(self, peer *agent, m *wire.Message) (any, *wire.Error) {
	// Hold both, as for a task: a deregistered sender's token has stopped
	// working once deregister returns, and nothing is pushed to an agent
	// already gone.
	if err := holdPair(self, peer); err != nil {
		return nil, err
	}
	defer self.leave()
	defer peer.leave()
	msg := b.stamp(*m, self, wire.RoleUser, "", self.session)
	b.events.emit(b, peer.id, peer.session, self.session, wire.NotifyPush, func(h wire.EventHead) any {
		return &wire.Push{EventHead: h, From: self.id, Message: &msg}
	})
	return wire.SendResult{Delivered: peer.id}, nil
}

// holdPair holds sender and recipient, in lock order; the error says
// which of them is gone.
func holdPair(self, peer *agent) *wire.Error {
	if enterPair(self, peer) {
		return nil
	}
	if self.enter() {
		self.leave()
		return wire.ErrUnknownAgent.Withf("no live agent %s", quote(peer.id))
	}
	return errRevoked()
}

// stamp fills in what the broker sets on a message.
func (b *Broker) stamp(m wire.Message, from *agent, role wire.Role, taskID, contextID string) wire.Message {
	if m.MessageID == "" {
		m.MessageID = uuid.NewString()
	}
	m.Role = role
	m.From = from.id
	m.TaskID = taskID
	m.ContextID = contextID
	return m
}

// sendParams are a2a.message.send's params and their encoded size, which
// a task's size grows by.
type sendParams struct {
	wire.SendParams
	size int
}

// errTooBig aborts an update that would take a task over MaxTaskBytes.
var errTooBig = errors.New("task too big")

func (b *Broker) tooBig() *wire.Error {
	return wire.ErrInvalidParams.Withf("the task would exceed %d bytes; start a new task", b.cfg.MaxTaskBytes)
}

func (b *Broker) createTask(ctx context.Context, self, peer *agent, p *sendParams) (any, *wire.Error) {
	// Hold both members, so that neither can be deregistered before the
	// task exists: a task is never assigned to a dead agent, nor requested
	// by one.
	if err := holdPair(self, peer); err != nil {
		return nil, err
	}
	defer self.leave()
	defer peer.leave()

	id := newTaskID()
	now := wire.NewTime(b.cfg.Now())
	msg := b.stamp(*p.Message, self, wire.RoleUser, id, self.session)
	rec := &store.Record{
		Task: wire.Task{
			ID:             id,
			ContextID:      self.session,
			RequesterName:  self.id,
			AgentName:      peer.id,
			AgentContextID: peer.session,
			Status:         wire.TaskStatus{State: wire.StateSubmitted, Timestamp: now},
			History:        []wire.Message{msg},
			Artifacts:      []wire.Artifact{},
			CreatedAt:      now,
			UpdatedAt:      now,
			Metadata:       p.Metadata,
		},
		RequesterInstance: self.instance,
		AgentInstance:     peer.instance,
		Size:              p.size,
	}
	unlock := b.lockTask(id)
	defer unlock()
	if err := b.store.Create(ctx, rec, b.cfg.MaxTasksPerContext); err != nil {
		if errors.Is(err, store.ErrLimit) {
			return nil, wire.ErrTaskLimit.Withf("session already has %d open tasks", b.cfg.MaxTasksPerContext)
		}
		return nil, b.internal("create task", err)
	}
	b.notifyTask(&rec.Task, peer.id, peer.session, self.session, wire.EventCreated, &msg)
	return wire.TaskResult{Task: &rec.Task}, nil
}

// maxArtifactsPerUpdate bounds the artifacts one update adds.
const maxArtifactsPerUpdate = 100

// member says which side of a task an agent is on.
type member uint8

const (
	stranger member = iota
	requester
	assignee
)

func memberOf(rec *store.Record, a *agent) member {
	switch a.instance {
	case rec.RequesterInstance:
		return requester
	case rec.AgentInstance:
		return assignee
	}
	return stranger
}

// loadTask returns a task the caller is a member of (ADR 0162 rule 3):
// A2A_UNKNOWN_TASK when there is no such task, A2A_UNKNOWN_AGENT when the
// caller is not its requester or assignee.
func (b *Broker) loadTask(ctx context.Context, self *agent, id string) (*store.Record, member, *wire.Error) {
	if id == "" {
		return nil, stranger, wire.ErrInvalidParams.Withf("taskId: required")
	}
	rec, err := b.store.Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, stranger, wire.ErrUnknownTask.Withf("no task %s", quote(id))
	}
	if err != nil {
		return nil, stranger, b.internal("read task", err)
	}
	m := memberOf(rec, self)
	if m == stranger {
		return nil, stranger, wire.ErrUnknownAgent.Withf("%s is not a member of task %s", self.id, id)
	}
	return rec, m, nil
}

// other returns the address of the member that did not act: its live
// registration, else the name and session the task recorded.
func (b *Broker) other(rec *store.Record, actor member) (id, session string) {
	instance, id, session := rec.AgentInstance, rec.Task.AgentName, rec.Task.AgentContextID
	if actor == assignee {
		instance, id, session = rec.RequesterInstance, rec.Task.RequesterName, rec.Task.ContextID
	}
	if a := b.reg.liveInstance(instance); a != nil {
		return a.id, a.session
	}
	return id, session
}

var errTerminal = errors.New("task is terminal")

func (b *Broker) sendOnTask(ctx context.Context, self *agent, p *sendParams) (any, *wire.Error) {
	rec, m, werr := b.loadTask(ctx, self, p.TaskID)
	if werr != nil {
		return nil, werr
	}
	otherID, otherSession := b.other(rec, m)
	if p.To != "" {
		recorded := rec.Task.AgentName
		if m == assignee {
			recorded = rec.Task.RequesterName
		}
		if p.To != otherID && p.To != recorded {
			return nil, wire.ErrInvalidParams.Withf("to: %s is not the other member of task %s", quote(p.To), rec.Task.ID)
		}
	}
	role := wire.RoleUser
	if m == assignee {
		role = wire.RoleAgent
	}
	msg := b.stamp(*p.Message, self, role, rec.Task.ID, rec.Task.ContextID)
	unlock := b.lockTask(rec.Task.ID)
	defer unlock()
	rec, err := b.store.Update(ctx, rec.Task.ID, func(r *store.Record) error {
		if r.Task.Status.State.Terminal() {
			return errTerminal
		}
		if r.Size+p.size > b.cfg.MaxTaskBytes {
			return errTooBig
		}
		r.Size += p.size
		r.Task.History = append(r.Task.History, msg)
		r.Task.UpdatedAt = wire.NewTime(b.cfg.Now())
		return nil
	})
	if errors.Is(err, errTerminal) {
		return nil, wire.ErrInvalidTransition.Withf("task %s is already terminal", p.TaskID)
	}
	if errors.Is(err, errTooBig) {
		return nil, b.tooBig()
	}
	if err != nil {
		return nil, b.internal("append message", err)
	}
	b.notifyTask(&rec.Task, otherID, otherSession, self.session, wire.EventMessage, &msg)
	return wire.TaskResult{Task: &rec.Task}, nil
}

func (b *Broker) getTask(ctx context.Context, from transport.Caller, params json.RawMessage) (any, *wire.Error) {
	var p wire.TaskParams
	return b.withCaller(from, params, &p, &p.Token, true, func(self *agent) (any, *wire.Error) {
		rec, _, err := b.loadTask(ctx, self, p.TaskID)
		if err != nil {
			return nil, err
		}
		return wire.TaskResult{Task: &rec.Task}, nil
	})
}

func (b *Broker) listTasks(ctx context.Context, from transport.Caller, params json.RawMessage) (any, *wire.Error) {
	var p wire.ListTasksParams
	return b.withCaller(from, params, &p, &p.Token, true, func(self *agent) (any, *wire.Error) {
		q := store.Query{Instance: self.instance, State: p.State}
		if p.State != "" && !p.State.Valid() {
			return nil, wire.ErrInvalidParams.Withf("state: %s is not a task state", quote(string(p.State)))
		}
		switch p.Role {
		case "":
		case wire.ListRequester:
			q.Role = store.Requester
		case wire.ListAssignee:
			q.Role = store.Assignee
		default:
			return nil, wire.ErrInvalidParams.Withf("role: must be requester or assignee")
		}
		recs, err := b.store.List(ctx, q)
		if err != nil {
			return nil, b.internal("list tasks", err)
		}
		tasks := make([]*wire.Task, len(recs))
		for i, r := range recs {
			tasks[i] = &r.Task
		}
		return wire.ListTasksResult{Tasks: tasks}, nil
	})
}

func (b *Broker) updateTask(ctx context.Context, from transport.Caller, params json.RawMessage) (any, *wire.Error) {
	var p wire.UpdateParams
	size := len(params)
	return b.withCaller(from, params, &p, &p.Token, true, func(self *agent) (any, *wire.Error) {
		switch p.State {
		case wire.StateWorking, wire.StateInputRequired, wire.StateCompleted, wire.StateFailed, wire.StateRejected:
		default:
			return nil, wire.ErrInvalidParams.Withf("state: must be working, input-required, completed, failed or rejected (got %s)", quote(string(p.State)))
		}
		if p.TaskID == "" {
			return nil, wire.ErrInvalidParams.Withf("taskId: required")
		}
		if p.Message != nil {
			if err := p.Message.Validate("message"); err != nil {
				return nil, wire.ErrInvalidParams.Withf("%v", err)
			}
		}
		if len(p.Artifacts) > maxArtifactsPerUpdate {
			return nil, wire.ErrInvalidParams.Withf("artifacts: %d; at most %d per update", len(p.Artifacts), maxArtifactsPerUpdate)
		}
		for i := range p.Artifacts {
			if err := p.Artifacts[i].Validate("artifacts[" + itoa(i) + "]"); err != nil {
				return nil, wire.ErrInvalidParams.Withf("%v", err)
			}
		}
		rec, m, werr := b.loadTask(ctx, self, p.TaskID)
		if werr != nil {
			return nil, werr
		}
		if m != assignee {
			return nil, wire.ErrInvalidTransition.Withf("only the assignee updates a task; cancel it instead")
		}
		var msg *wire.Message
		if p.Message != nil {
			stamped := b.stamp(*p.Message, self, wire.RoleAgent, rec.Task.ID, rec.Task.ContextID)
			msg = &stamped
		}
		for i := range p.Artifacts {
			if p.Artifacts[i].ArtifactID == "" {
				p.Artifacts[i].ArtifactID = uuid.NewString()
			}
		}
		return b.transition(ctx, self, rec, m, p.State, msg, p.Artifacts, size)
	})
}

func (b *Broker) cancelTask(ctx context.Context, from transport.Caller, params json.RawMessage) (any, *wire.Error) {
	var p wire.TaskParams
	return b.withCaller(from, params, &p, &p.Token, true, func(self *agent) (any, *wire.Error) {
		rec, m, werr := b.loadTask(ctx, self, p.TaskID)
		if werr != nil {
			return nil, werr
		}
		if m != requester {
			return nil, wire.ErrInvalidTransition.Withf("only the requester cancels a task; update it to failed or rejected instead")
		}
		return b.transition(ctx, self, rec, m, wire.StateCanceled, nil, nil, 0)
	})
}

// transition moves an open task to state and notifies the other member.
func (b *Broker) transition(ctx context.Context, self *agent, rec *store.Record, m member, state wire.State, msg *wire.Message, artifacts []wire.Artifact, size int) (any, *wire.Error) {
	otherID, otherSession := b.other(rec, m)
	id := rec.Task.ID
	unlock := b.lockTask(id)
	defer unlock()
	rec, err := b.store.Update(ctx, id, func(r *store.Record) error {
		if r.Task.Status.State.Terminal() {
			return errTerminal
		}
		if msg != nil || len(artifacts) > 0 {
			if r.Size+size > b.cfg.MaxTaskBytes {
				return errTooBig
			}
			r.Size += size
		}
		now := wire.NewTime(b.cfg.Now())
		r.Task.Status = wire.TaskStatus{State: state, Timestamp: now, Message: msg}
		if msg != nil {
			r.Task.History = append(r.Task.History, *msg)
		}
		r.Task.Artifacts = append(r.Task.Artifacts, artifacts...)
		r.Task.UpdatedAt = now
		return nil
	})
	if errors.Is(err, errTerminal) {
		return nil, wire.ErrInvalidTransition.Withf("task %s is already terminal", id)
	}
	if errors.Is(err, errTooBig) {
		return nil, b.tooBig()
	}
	if err != nil {
		return nil, b.internal("update task", err)
	}
	b.notifyTask(&rec.Task, otherID, otherSession, self.session, wire.EventStatus, msg)
	return wire.TaskResult{Task: &rec.Task}, nil
}

// closeTasksOf closes the open tasks of an instance that is gone (ADR 0162:
// a settled delegate is deregistered): those assigned to it fail, those it
// requested are canceled, and the other member hears of each.
func (b *Broker) closeTasksOf(ctx context.Context, instance, session string) *wire.Error {
	recs, err := b.store.List(ctx, store.Query{Instance: instance, OpenOnly: true})
	if err != nil {
		return b.internal("list tasks of a departed agent", err)
	}
	var failed *wire.Error
	for _, rec := range recs {
		m := requester
		state := wire.StateCanceled
		if rec.AgentInstance == instance {
			m, state = assignee, wire.StateFailed
		}
		otherID, otherSession := b.other(rec, m)
		unlock := b.lockTask(rec.Task.ID)
		updated, err := b.store.Update(ctx, rec.Task.ID, func(r *store.Record) error {
			if r.Task.Status.State.Terminal() {
				return errTerminal
			}
			now := wire.NewTime(b.cfg.Now())
			r.Task.Status = wire.TaskStatus{State: state, Timestamp: now}
			r.Task.UpdatedAt = now
			return nil
		})
		if err == nil {
			b.notifyTask(&updated.Task, otherID, otherSession, session, wire.EventStatus, nil)
		}
		unlock()
		if err != nil && !errors.Is(err, errTerminal) && failed == nil {
			// Go on with the others; report the first failure.
			failed = b.internal("close task of a departed agent", err)
		}
	}
	return failed
}

// notifyTask publishes an a2a.task.event about task to one member.
func (b *Broker) notifyTask(t *wire.Task, recipient, recipientSession, fromSession string, kind wire.EventKind, msg *wire.Message) {
	bare := t.WithoutHistory()
	b.events.emit(b, recipient, recipientSession, fromSession, wire.NotifyTaskEvent, func(h wire.EventHead) any {
		return &wire.TaskEvent{EventHead: h, TaskID: t.ID, Kind: kind, Task: bare, Message: msg, Final: t.Status.State.Terminal()}
	})
}

func quote(s string) string {
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"`
}

func itoa(i int) string { return strconv.Itoa(i) }

// newTaskID returns a version 7 UUID: time-ordered, so that ids sort in
// creation order within a millisecond too (the store lists by createdAt,
// then id).
func newTaskID() string {
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.NewString()
	}
	return id.String()
}
