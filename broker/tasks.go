package broker

import (
	"context"
	"encoding/json"
	"errors"
	"hash/maphash"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// taskStripes is the number of locks that order the changes of tasks and
// their notifications: a change is made, and its notification numbered,
// under the task's stripe, so notifications follow the order of the
// changes. The notification is published after the stripe is let go.
const taskStripes = 1024

var stripeSeed = maphash.MakeSeed()

// lockTask locks the stripe of task id and returns it, to be unlocked.
func (b *Broker) lockTask(id string) *sync.Mutex {
	m := &b.stripes[maphash.String(stripeSeed, id)%taskStripes]
	m.Lock()
	return m
}

func (b *Broker) send(ctx context.Context, from transport.Caller, req *wire.Request) (any, *wire.Error) {
	var p wire.SendParams
	// send takes its own holds: a new task needs both members held.
	self, err := b.caller(from, req, &p, &p.Token)
	if err != nil {
		return nil, err
	}
	if p.Message == nil {
		return nil, wire.ErrInvalidParams.Withf("message: required")
	}
	if err := p.Message.Validate("message"); err != nil {
		return nil, wire.ErrInvalidParams.Withf("%v", err)
	}
	if err := validObject("metadata", p.Metadata); err != nil {
		return nil, err
	}
	// A client's messageId is the send's idempotency key (PROTOCOL §4.11).
	k := key{by: self.instance, name: p.Message.MessageID}
	if k.name != "" {
		k.digest = sendDigest(&p)
	}
	if p.TaskID != "" {
		if p.Oneway {
			return nil, wire.ErrInvalidParams.Withf("oneway cannot be combined with taskId")
		}
		if !self.enter() {
			return nil, errRevoked()
		}
		defer self.leave()
		return b.sendOnTask(ctx, self, &p, k)
	}
	if k.name != "" {
		// Before anything about the addressee is checked: a retry returns
		// what the first attempt made, even if the peer has gone or been
		// renamed since. One key names one send, a push or a task: each
		// looks in both, under the key's lock.
		unlock := b.lockSend(self.instance, k.name)
		defer unlock()
		if seen, ok := b.pushes.find(self.instance, k.name); ok {
			if seen.digest != k.digest {
				return nil, keyReused(k.name)
			}
			return wire.SendResult{Delivered: seen.delivered}, nil
		}
		rec, err := b.store.FindSend(ctx, self.instance, k.name)
		switch {
		case err == nil:
			if rec.SendDigest != k.digest {
				return nil, keyReused(k.name)
			}
			return wire.TaskResult{Task: &rec.Task}, nil
		case !errors.Is(err, store.ErrNotFound):
			return nil, b.storeFailure("find a sent task", err)
		}
	}
	if p.To == self.id {
		return nil, wire.ErrInvalidParams.Withf("to: an agent cannot send to itself")
	}
	if k.name != "" && p.Oneway {
		res, err := b.pushTo(self, p.To, p.Message)
		if err == nil && self.enter() {
			// Held, so that a departure's forget of the window follows.
			b.pushes.record(self.instance, k.name, pushSeen{digest: k.digest, delivered: res.Delivered})
			self.leave()
		}
		return res, err
	}
	peer, err := b.resolvePeer(self, p.To)
	if err != nil {
		return nil, err
	}
	if p.Oneway {
		return b.push(self, peer, p.Message)
	}
	return b.createTask(ctx, self, peer, &p, k)
}

// pushTo resolves the addressee of a push and pushes.
func (b *Broker) pushTo(self *agent, to string, m *wire.Message) (wire.SendResult, *wire.Error) {
	peer, err := b.resolvePeer(self, to)
	if err != nil {
		return wire.SendResult{}, err
	}
	res, err := b.push(self, peer, m)
	if err != nil {
		return wire.SendResult{}, err
	}
	return res.(wire.SendResult), nil
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

// resolvePeer finds the addressee of a new task or push (addressing rule 2, docs/PROTOCOL.md):
// to when given; else the single other agent of the caller's session; else
// the single agent of the other sessions.
//
// In a cluster the registry is a copy of the cluster's that may lag
// behind it: the broker catches up with the registrations stored before
// the call before it answers that to is no live agent, and before it
// picks among the candidates of a send without to, so that an agent
// registered through another broker a moment ago is found, and counted,
// at once.
func (b *Broker) resolvePeer(self *agent, to string) (*agent, *wire.Error) {
	if !b.clustered() {
		return b.resolveKnownPeer(self, to)
	}
	if to == "" {
		b.catchUp()
		return b.resolveKnownPeer(self, to)
	}
	peer, err := b.resolveKnownPeer(self, to)
	if peer == nil {
		caught := b.catchUp()
		peer, err = b.resolveKnownPeer(self, to)
		if peer == nil && !caught {
			return nil, errNotCaughtUp()
		}
	}
	return peer, err
}

// resolveKnownPeer is resolvePeer among the agents the registry holds.
func (b *Broker) resolveKnownPeer(self *agent, to string) (*agent, *wire.Error) {
	r := &b.reg
	r.mu.RLock()
	defer r.mu.RUnlock()
	if to != "" {
		peer := r.byID[to]
		if peer == nil || (peer.hidden && !self.hidden) {
			// A hidden agent is no delegate's peer, not even by name.
			return nil, wire.ErrUnknownAgent.Withf("no live agent %s", wire.Quote(to))
		}
		return peer, nil
	}
	var local []*agent
	for _, a := range r.bySession[self.session] {
		if a != self && !a.hidden {
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
		if a.session != self.session && !a.hidden {
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
	err := b.emit(peer.id, peer.session, self.session, wire.NotifyPush, func(h wire.EventHead) any {
		return &wire.Push{EventHead: h, From: self.id, Message: &msg}
	})
	if errors.Is(err, errTooLarge) {
		return nil, wire.ErrInvalidParams.Withf("message: over %d bytes once encoded as a notification; send it as a task, or smaller", b.limits.Payload)
	}
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
		return wire.ErrUnknownAgent.Withf("no live agent %s", wire.Quote(peer.id))
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

// errTooBig aborts a change that would take a task over the task limit.
var errTooBig = errors.New("task too big")

func (b *Broker) tooBig() *wire.Error {
	return wire.ErrInvalidParams.Withf("the task would exceed %d bytes (--max-message-bytes sets the limit); start a new task", b.limits.Task)
}

// jsonLen is the length of v's JSON encoding, as the broker sends it. A
// task's Size is the sum of its parts' jsonLen: every response and
// notification that carries the task then fits the payload limit.
func jsonLen(v any) int { return wire.EncodedLen(v) }

// grow adds delta bytes to a task's size, unless that takes it over the
// task limit (errTooBig).
func (b *Broker) grow(r *store.Record, delta int) error {
	if r.Size+delta > b.limits.Task {
		return errTooBig
	}
	r.Size += delta
	return nil
}

func (b *Broker) createTask(ctx context.Context, self, peer *agent, p *wire.SendParams, k key) (any, *wire.Error) {
	// Hold both members, so that neither can be deregistered before the
	// task exists: a task is never assigned to a dead agent, nor requested
	// by one.
	if err := holdPair(self, peer); err != nil {
		return nil, err
	}
	defer self.leave()
	defer peer.leave()

	now := wire.NewTime(b.cfg.Now())
	id := b.taskIDs.next(now.Time)
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
		AssigneeInstance:  peer.instance,
		SendKey:           k.name,
		SendDigest:        k.digest,
	}
	// The task's JSON is its size and its answer: encoded once, as the
	// answer.
	res, err := wire.Marshal(wire.TaskResult{Task: &rec.Task})
	if err != nil {
		return nil, wire.ErrInternal.Withf("cannot encode the task")
	}
	rec.Size = len(res) - len(taskResultHead) - len(taskResultTail)
	if rec.Size > b.limits.Task {
		return nil, b.tooBig()
	}
	stripe := b.lockTask(id)
	err = b.store.Create(ctx, rec, b.cfg.MaxTasksPerContext)
	var n notice
	if err == nil {
		n = b.notifyTask(&rec.Task, peer.id, peer.session, self.session, wire.EventCreated, &msg)
	}
	stripe.Unlock()
	b.publish(n)
	if err == nil && b.clustered() {
		b.closeIfDeparted(ctx, rec)
	}
	if err != nil && k.name != "" && errors.Is(err, store.ErrExists) {
		// The key's task was made meanwhile by another broker of a
		// cluster (the key's lock is this broker's own): this send is a
		// retry of that one.
		rec, ferr := b.store.FindSend(ctx, self.instance, k.name)
		if ferr == nil {
			if rec.SendDigest != k.digest {
				return nil, keyReused(k.name)
			}
			return wire.TaskResult{Task: &rec.Task}, nil
		}
	}
	if err != nil {
		if errors.Is(err, store.ErrLimit) {
			return nil, wire.ErrTaskLimit.Withf("session already has %d open tasks", b.cfg.MaxTasksPerContext)
		}
		return nil, b.storeFailure("create task", err)
	}
	return json.RawMessage(res), nil
}

// changeTime is the time of a change to r: now, but always after its
// last change (times have milliseconds), so that a task's updatedAt and
// status timestamps strictly increase and a reader can tell two changes
// of the same millisecond apart (PROTOCOL §3).
func (b *Broker) changeTime(r *store.Record) wire.Time {
	now := wire.NewTime(b.cfg.Now())
	if !now.After(r.Task.UpdatedAt.Time) {
		now = wire.Time{Time: r.Task.UpdatedAt.Add(time.Millisecond)}
	}
	return now
}

// taskResultHead and taskResultTail are what wire.Marshal writes of a
// wire.TaskResult around its task.
const (
	taskResultHead = `{"task":`
	taskResultTail = `}`
)

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
	case rec.AssigneeInstance:
		return assignee
	}
	return stranger
}

// loadTask returns a task the caller is a member of (addressing rule 3, docs/PROTOCOL.md):
// A2A_UNKNOWN_TASK when there is no such task, A2A_UNKNOWN_AGENT when the
// caller is not its requester or assignee.
func (b *Broker) loadTask(ctx context.Context, self *agent, id string) (*store.Record, member, *wire.Error) {
	if id == "" {
		return nil, stranger, wire.ErrInvalidParams.Withf("taskId: required")
	}
	rec, err := b.store.Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, stranger, wire.ErrUnknownTask.Withf("no task %s", wire.Quote(id))
	}
	if err != nil {
		return nil, stranger, b.storeFailure("read task", err)
	}
	m := memberOf(rec, self)
	if m == stranger {
		return nil, stranger, wire.ErrUnknownAgent.Withf("%s is not a member of task %s", self.id, id)
	}
	return rec, m, nil
}

// counterpart returns the address of the member that did not act: its live
// registration, else the name and session the task recorded.
func (b *Broker) counterpart(rec *store.Record, actor member) (id, session string) {
	instance, id, session := rec.AssigneeInstance, rec.Task.AgentName, rec.Task.AgentContextID
	if actor == assignee {
		instance, id, session = rec.RequesterInstance, rec.Task.RequesterName, rec.Task.ContextID
	}
	if a := b.reg.liveInstance(instance); a != nil {
		return a.id, a.session
	}
	return id, session
}

var errTerminal = errors.New("task is terminal")

func (b *Broker) sendOnTask(ctx context.Context, self *agent, p *wire.SendParams, k key) (any, *wire.Error) {
	rec, m, werr := b.loadTask(ctx, self, p.TaskID)
	if werr != nil {
		return nil, werr
	}
	if err := appliedAs(rec, k); err != nil {
		// A retry: answered before the addressee is checked again, for
		// it may have been renamed since. (Update checks again, under
		// the task's lock, for a retry that races its first attempt.)
		stripe := b.lockTask(rec.Task.ID)
		defer stripe.Unlock()
		res, werr, _ := b.keyOutcome(ctx, rec.Task.ID, k.name, err)
		return res, werr
	}
	otherID, otherSession := b.counterpart(rec, m)
	if p.To != "" {
		recorded := rec.Task.AgentName
		if m == assignee {
			recorded = rec.Task.RequesterName
		}
		if p.To != otherID && p.To != recorded {
			return nil, wire.ErrInvalidParams.Withf("to: %s is not the other member of task %s", wire.Quote(p.To), rec.Task.ID)
		}
	}
	role := wire.RoleUser
	if m == assignee {
		role = wire.RoleAgent
	}
	msg := b.stamp(*p.Message, self, role, rec.Task.ID, rec.Task.ContextID)
	grows := jsonLen(&msg) + 1
	stripe := b.lockTask(rec.Task.ID)
	rec, err := b.store.Update(ctx, rec.Task.ID, func(r *store.Record) error {
		if err := checkKey(r, k); err != nil {
			return err
		}
		if r.Task.Status.State.Terminal() {
			return errTerminal
		}
		if err := b.grow(r, grows); err != nil {
			return err
		}
		r.Task.History = append(r.Task.History, msg)
		r.Task.UpdatedAt = b.changeTime(r)
		return nil
	})
	res, werr, done := b.keyOutcome(ctx, p.TaskID, p.Message.MessageID, err)
	var n notice
	if !done && err == nil {
		n = b.notifyTask(&rec.Task, otherID, otherSession, self.session, wire.EventMessage, &msg)
	}
	stripe.Unlock()
	b.publish(n)
	switch {
	case done:
		return res, werr
	case errors.Is(err, errTerminal):
		return nil, wire.ErrInvalidTransition.Withf("task %s is already terminal", p.TaskID)
	case errors.Is(err, errTooBig):
		return nil, b.tooBig()
	case err != nil:
		return nil, b.storeFailure("append message", err)
	}
	return wire.TaskResult{Task: &rec.Task}, nil
}

func (b *Broker) getTask(ctx context.Context, from transport.Caller, req *wire.Request) (any, *wire.Error) {
	var p wire.TaskParams
	return b.heldCaller(from, req, &p, &p.Token, func(self *agent) (any, *wire.Error) {
		rec, _, err := b.loadTask(ctx, self, p.TaskID)
		if err != nil {
			return nil, err
		}
		return wire.TaskResult{Task: &rec.Task}, nil
	})
}

func (b *Broker) listTasks(ctx context.Context, from transport.Caller, req *wire.Request) (any, *wire.Error) {
	var p wire.ListTasksParams
	return b.heldCaller(from, req, &p, &p.Token, func(self *agent) (any, *wire.Error) {
		q := store.Query{Instance: self.instance, State: p.State}
		if p.State != "" && !p.State.Valid() {
			return nil, wire.ErrInvalidParams.Withf("state: %s is not a task state", wire.Quote(string(p.State)))
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
		size, werr := pageSize(p.PageParams)
		if werr != nil {
			return nil, werr
		}
		q.After, q.Limit, q.MaxBytes = p.PageToken, size, b.limits.Page()
		recs, more, err := b.store.List(ctx, q)
		if err != nil {
			return nil, b.storeFailure("list tasks", err)
		}
		res := wire.ListTasksResult{Tasks: make([]*wire.Task, len(recs))}
		for i, r := range recs {
			res.Tasks[i] = &r.Task
		}
		if more && len(recs) > 0 {
			res.NextPageToken = recs[len(recs)-1].Task.ID
		}
		return res, nil
	})
}

// eachPage calls fn with every page of the tasks q selects, a page at a
// time, so that no more than a page is in memory.
func (b *Broker) eachPage(ctx context.Context, q store.Query, fn func([]*store.Record) error) error {
	q.Limit, q.MaxBytes = wire.MaxPageSize, b.limits.Page()
	for {
		recs, more, err := b.store.List(ctx, q)
		if err != nil {
			return err
		}
		if err := fn(recs); err != nil {
			return err
		}
		if !more || len(recs) == 0 {
			return nil
		}
		q.After = recs[len(recs)-1].Task.ID
	}
}

func (b *Broker) updateTask(ctx context.Context, from transport.Caller, req *wire.Request) (any, *wire.Error) {
	var p wire.UpdateParams
	return b.heldCaller(from, req, &p, &p.Token, func(self *agent) (any, *wire.Error) {
		switch p.State {
		case wire.StateWorking, wire.StateInputRequired, wire.StateCompleted, wire.StateFailed, wire.StateRejected:
		default:
			return nil, wire.ErrInvalidParams.Withf("state: must be working, input-required, completed, failed or rejected (got %s)", wire.Quote(string(p.State)))
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
		k := key{by: self.instance, name: p.MessageID}
		if k.name == "" && p.Message != nil {
			k.name = p.Message.MessageID
		}
		if k.name != "" {
			if len(k.name) > wire.MaxIDBytes {
				return nil, wire.ErrInvalidParams.Withf("messageId: longer than %d bytes", wire.MaxIDBytes)
			}
			k.digest = updateDigest(&p)
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
		return b.transition(ctx, self, rec, m, p.State, msg, p.Artifacts, k)
	})
}

func (b *Broker) cancelTask(ctx context.Context, from transport.Caller, req *wire.Request) (any, *wire.Error) {
	var p wire.CancelParams
	return b.heldCaller(from, req, &p, &p.Token, func(self *agent) (any, *wire.Error) {
		k := key{by: self.instance, name: p.MessageID}
		if k.name != "" {
			if len(k.name) > wire.MaxIDBytes {
				return nil, wire.ErrInvalidParams.Withf("messageId: longer than %d bytes", wire.MaxIDBytes)
			}
			k.digest = digest(updateIntent{Method: wire.MethodCancelTask, State: wire.StateCanceled})
		}
		rec, m, werr := b.loadTask(ctx, self, p.TaskID)
		if werr != nil {
			return nil, werr
		}
		if m != requester {
			return nil, wire.ErrInvalidTransition.Withf("only the requester cancels a task; update it to failed or rejected instead")
		}
		return b.transition(ctx, self, rec, m, wire.StateCanceled, nil, nil, k)
	})
}

// transition moves an open task to state and notifies the other member.
func (b *Broker) transition(ctx context.Context, self *agent, rec *store.Record, m member, state wire.State, msg *wire.Message, artifacts []wire.Artifact, k key) (any, *wire.Error) {
	otherID, otherSession := b.counterpart(rec, m)
	id := rec.Task.ID
	// What the task grows by besides its status: the message in its
	// history, the artifacts.
	grows := 0
	if msg != nil {
		grows += jsonLen(msg) + 1
	}
	for i := range artifacts {
		grows += jsonLen(&artifacts[i]) + 1
	}
	stripe := b.lockTask(id)
	rec, err := b.store.Update(ctx, id, func(r *store.Record) error {
		if err := checkKey(r, k); err != nil {
			return err
		}
		if r.Task.Status.State.Terminal() {
			return errTerminal
		}
		now := b.changeTime(r)
		status := wire.TaskStatus{State: state, Timestamp: now, Message: msg}
		delta := grows + jsonLen(&status) - jsonLen(&r.Task.Status)
		if state.Terminal() && msg == nil && len(artifacts) == 0 {
			// A bare closing is never refused for size (the Overhead
			// covers the bytes a state name may add): a full task can
			// always be ended.
			r.Size += delta
		} else if err := b.grow(r, delta); err != nil {
			return err
		}
		r.Task.Status = status
		if msg != nil {
			r.Task.History = append(r.Task.History, *msg)
		}
		r.Task.Artifacts = append(r.Task.Artifacts, artifacts...)
		r.Task.UpdatedAt = now
		return nil
	})
	res, werr, done := b.keyOutcome(ctx, id, k.name, err)
	var n notice
	if !done && err == nil {
		n = b.notifyTask(&rec.Task, otherID, otherSession, self.session, wire.EventStatus, msg)
	}
	stripe.Unlock()
	b.publish(n)
	switch {
	case done:
		return res, werr
	case errors.Is(err, errTerminal):
		return nil, wire.ErrInvalidTransition.Withf("task %s is already terminal", id)
	case errors.Is(err, errTooBig):
		return nil, b.tooBig()
	case err != nil:
		return nil, b.storeFailure("update task", err)
	}
	return wire.TaskResult{Task: &rec.Task}, nil
}

// keyOutcome answers a keyed change that Update refused for its key: a
// retry gets the task as it is now (read under the task's lock, which
// the caller holds), a reuse -32602. done is false for any other outcome.
func (b *Broker) keyOutcome(ctx context.Context, id, name string, err error) (any, *wire.Error, bool) {
	switch {
	case errors.Is(err, errKeyReused):
		return nil, keyReused(name), true
	case errors.Is(err, errApplied):
		rec, gerr := b.store.Get(ctx, id)
		if errors.Is(gerr, store.ErrNotFound) {
			return nil, wire.ErrUnknownTask.Withf("no task %s: it ended and has been pruned", wire.Quote(id)), true
		}
		if gerr != nil {
			return nil, b.storeFailure("read task", gerr), true
		}
		return wire.TaskResult{Task: &rec.Task}, nil, true
	}
	return nil, nil, false
}

// closeTasksOf closes the open tasks of an instance that is gone (ADR 0162:
// a settled delegate is deregistered): those assigned to it fail, those it
// requested are canceled, and the other member hears of each.
func (b *Broker) closeTasksOf(ctx context.Context, instance, session string) *wire.Error {
	var failed *wire.Error
	err := b.eachPage(ctx, store.Query{Instance: instance, OpenOnly: true}, func(recs []*store.Record) error {
		b.closeTasks(ctx, recs, instance, session, &failed)
		return nil
	})
	if err != nil && failed == nil {
		failed = b.storeFailure("list tasks of a departed agent", err)
	}
	return failed
}

// closeTasks closes recs, the open tasks of a departed instance; the
// first failure goes to *failed.
func (b *Broker) closeTasks(ctx context.Context, recs []*store.Record, instance, session string, failed **wire.Error) {
	for _, rec := range recs {
		m := requester
		state := wire.StateCanceled
		if rec.AssigneeInstance == instance {
			m, state = assignee, wire.StateFailed
		}
		otherID, otherSession := b.counterpart(rec, m)
		stripe := b.lockTask(rec.Task.ID)
		updated, err := b.store.Update(ctx, rec.Task.ID, func(r *store.Record) error {
			if r.Task.Status.State.Terminal() {
				return errTerminal
			}
			now := b.changeTime(r)
			status := wire.TaskStatus{State: state, Timestamp: now}
			// A closing is never refused for size: it shrinks the status
			// or changes it by a few bytes, which the Overhead covers.
			r.Size += jsonLen(&status) - jsonLen(&r.Task.Status)
			r.Task.Status = status
			r.Task.UpdatedAt = now
			return nil
		})
		var n notice
		if err == nil {
			n = b.notifyTask(&updated.Task, otherID, otherSession, session, wire.EventStatus, nil)
		}
		stripe.Unlock()
		b.publish(n)
		if err != nil && !errors.Is(err, errTerminal) && *failed == nil {
			// Go on with the others; report the first failure.
			*failed = b.storeFailure("close task of a departed agent", err)
		}
	}
}

// notifyTask posts an a2a.task.event about task to one member, under
// the task's stripe; the caller publishes it once it has let go of the
// stripe.
func (b *Broker) notifyTask(t *wire.Task, recipient, recipientSession, fromSession string, kind wire.EventKind, msg *wire.Message) notice {
	bare := t.WithoutHistory()
	n, _ := b.post(recipient, recipientSession, fromSession, wire.NotifyTaskEvent, func(h wire.EventHead) any {
		return &wire.TaskEvent{EventHead: h, TaskID: t.ID, Kind: kind, Task: bare, Message: msg, Final: t.Status.State.Terminal()}
	})
	return n
}

func itoa(i int) string { return strconv.Itoa(i) }

// taskIDs mints task ids: version 7 UUIDs whose time is the task's
// createdAt (to the millisecond) followed by a counter, so that task ids
// sort by createdAt, then in creation order: the order in which lists
// return them, and the key of their pages.
type taskIDs struct {
	mu     sync.Mutex
	lastMs uint64
	count  uint32 // 18 bits, from a random start in each millisecond
}

func (g *taskIDs) next(createdAt time.Time) string {
	id := uuid.New() // version 4: the rest stays random
	ms := uint64(createdAt.UnixMilli())
	g.mu.Lock()
	if ms != g.lastMs || g.count >= 1<<18-1 {
		g.lastMs = ms
		g.count = uint32(id[6]&0x0f)<<13 | uint32(id[7])<<5 | uint32(id[8]&0x1f) // below 1<<17
	} else {
		g.count++
	}
	c := g.count
	g.mu.Unlock()
	for i := range 6 {
		id[i] = byte(ms >> (40 - 8*i))
	}
	id[6] = 0x70 | byte(c>>14)&0x0f // version 7, counter bits 17..14
	id[7] = byte(c >> 6)            // counter bits 13..6
	id[8] = 0x80 | byte(c&0x3f)     // RFC 9562 variant, counter bits 5..0
	return id.String()
}
