package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/a2a-bus/a2a-bus/wire"
)

// settleTimeout bounds the deregistration of delegates when a runtime
// closes.
const settleTimeout = 5 * time.Second

// Event is what a delegate's Wait returns: exactly one of Task, Push and
// Resync.
type Event struct {
	// Task is an a2a.task.event: a task the delegate is a member of was
	// created, got a message, or changed state.
	Task *wire.TaskEvent
	// Push is a oneway message to the delegate.
	Push *wire.Push
	// Resync says that the runtime lost track of events for a while (the
	// broker restarted, events were lost beyond replay, or the wait queue
	// overflowed) and re-read the delegate's tasks: what changed, and
	// which of its open tasks the broker no longer has.
	Resync *Resync
}

// Resync is what a delegate sees after a break: the tasks that changed
// while it could not hear of them, read fresh from the broker, and the
// open tasks that are gone.
type Resync struct {
	// Reason says what happened.
	Reason string
	// Changed holds the delegate's tasks that changed since it last heard
	// of them, or that it did not know: compare their status with what it
	// was waiting for. Pushes sent meanwhile may be lost; tasks the
	// broker keeps are not (Lost names those it does not).
	Changed []*wire.Task
	// Lost holds, in id order, the ids of tasks the delegate knew as open
	// (the last it heard of them, from a call's result, an event, a read
	// or an earlier Resync, they were not terminal) that the broker no
	// longer has: it restarted without a durable store, or the task ended
	// and was pruned before the delegate heard how. No event will come for
	// them and calls on them fail with A2A_UNKNOWN_TASK
	// (wire.ErrUnknownTask): stop waiting, and send the work again if it
	// is still wanted. Each id is confirmed by reading the task (a list
	// that missed a live task never makes it lost; a read that fails
	// otherwise leaves it for the next Resync) and reported once. A task
	// last seen terminal that is gone is not lost: its outcome was told.
	Lost []string
	// RenamedFrom is the delegate's previous agentId when registering
	// again (after a broker restart) gave it a new one; "" otherwise.
	RenamedFrom string
}

// Delegate is one delegate's A2A handle. Its methods are safe for
// concurrent use.
type Delegate struct {
	r        *Runtime
	instance string
	asked    string // the name it asked for

	mu      sync.Mutex
	id      string // the agentId the broker assigned
	token   string
	card    wire.AgentCard
	err     error         // why the delegate stopped (settled, closed)
	leaving bool          // Settle is deregistering it
	dead    chan struct{} // closed when err is set
	// seen is what the delegate has been told of each task: the basis of
	// a Resync's Changed, and, for those it knew open, of Lost. A Resync
	// trims it to the tasks the broker still has, so that it is bounded
	// by them, not by every task the delegate ever saw.
	seen    map[string]known
	resyncs uint64            // Resyncs begun: orders what is seen against their lists
	lost    map[string]uint64 // ids reported lost -> the Resync that did; a late word of them is ignored

	qmu           sync.Mutex
	queue         []item
	overflow      bool   // events were dropped: a Resync is due once the queue drains
	pendingRename string // the old agentId, for the next Resync
	wake          chan struct{}
	waiters       atomic.Int32
}

// ID returns the delegate's peer id: the agentId the broker assigned,
// which may differ from the name it asked for.
func (d *Delegate) ID() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.id
}

// InstanceID returns the delegate's stable instance id.
func (d *Delegate) InstanceID() string { return d.instance }

// SessionID returns the session the delegate belongs to.
func (d *Delegate) SessionID() string { return d.r.sess.ID() }

// Card returns the delegate's card as the broker registered it.
func (d *Delegate) Card() wire.AgentCard {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.card
}

// Prompt returns the sentence that tells the delegate who it is on the
// bus, for its system prompt.
func (d *Delegate) Prompt() string {
	id := d.ID()
	if id != d.asked {
		return fmt.Sprintf("Your A2A peer id is %s (%s was taken on this host). Your session is %s.", id, d.asked, d.SessionID())
	}
	return fmt.Sprintf("Your A2A peer id is %s. Your session is %s.", id, d.SessionID())
}

// register registers (again) under the delegate's instance id and adopts
// what the broker assigns.
func (d *Delegate) register(ctx context.Context) error {
	d.r.naming.Lock()
	defer d.r.naming.Unlock()
	return d.registerLocked(ctx)
}

// reregister registers again after a call met the token stale as
// unknown, unless the delegate has registered since (the runtime, or a
// concurrent call, did): checked under the naming lock, so that
// concurrent callers register once, not each revoking the other's token.
func (d *Delegate) reregister(ctx context.Context, stale string) error {
	d.r.naming.Lock()
	defer d.r.naming.Unlock()
	if now, err := d.credentials(); err != nil || now != stale {
		return err
	}
	return d.registerLocked(ctx)
}

// registerLocked is register with the runtime's naming lock held. A
// delegate that is settling or gone never registers again.
func (d *Delegate) registerLocked(ctx context.Context) error {
	d.mu.Lock()
	card := d.card
	oldID := d.id
	if d.leaving || d.err != nil {
		d.mu.Unlock()
		return ErrSettled
	}
	d.mu.Unlock()
	card.Name = d.asked
	card.AgentID, card.ContextID, card.RegisteredAt = "", "", nil
	var res wire.RegisterResult
	if err := d.r.call(ctx, wire.MethodRegister, wire.RegisterParams{ContextID: d.r.sess.ID(), Card: &card, InstanceID: d.instance}, &res); err != nil {
		return err
	}
	d.mu.Lock()
	if d.leaving || d.err != nil {
		// Settle began meanwhile: take back this registration.
		d.mu.Unlock()
		_ = d.r.call(ctx, wire.MethodDeregister, wire.TokenParams{Token: res.Token}, nil)
		return ErrSettled
	}
	d.id, d.token, d.card = res.AgentID, res.Token, res.Card
	d.mu.Unlock()
	if oldID != "" && oldID != res.AgentID {
		d.r.rename(d, oldID, res.AgentID)
		d.renamedFrom(oldID)
	}
	return nil
}

func (d *Delegate) renamedFrom(old string) {
	d.qmu.Lock()
	defer d.qmu.Unlock()
	d.pendingRename = old
}

// credentials returns the token, or why the delegate cannot act.
func (d *Delegate) credentials() (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err != nil {
		return "", d.err
	}
	return d.token, nil
}

// known is what a delegate has been told of one task.
type known struct {
	at   wire.Time // its updatedAt
	open bool      // it was not terminal
	gen  uint64    // Delegate.resyncs when it was told: which Resyncs' lists follow
}

// noteSeen records what the delegate now knows of a task from a call's
// result, an event or a Resync.
func (d *Delegate) noteSeen(t *wire.Task) {
	if t == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.noteLocked(t)
}

// noteLocked is noteSeen with d.mu held. Calls and events may be told out
// of order: an older state of a task than the one known is ignored (each
// change of a task moves its updatedAt forward), so that a task seen
// terminal is never taken for open again; so is a task reported lost.
func (d *Delegate) noteLocked(t *wire.Task) {
	if _, gone := d.lost[t.ID]; gone {
		return
	}
	if k, ok := d.seen[t.ID]; ok && t.UpdatedAt.Before(k.at.Time) {
		return
	}
	d.seen[t.ID] = known{at: t.UpdatedAt, open: !t.Status.State.Terminal(), gen: d.resyncs}
}

// callWithToken runs one call with the delegate's token. A token the broker no
// longer knows means that the broker restarted (it keeps no
// registrations): the delegate registers again by instance id, unless
// someone did meanwhile (the runtime does, when it sees the new epoch),
// and the call is tried again with the new token, a few times at most.
func (d *Delegate) callWithToken(ctx context.Context, call func(token string) error) error {
	const attempts = 3
	for attempt := 1; ; attempt++ {
		token, err := d.credentials()
		if err != nil {
			return err
		}
		err = call(token)
		if !errors.Is(err, wire.ErrUnauthorized) || attempt == attempts {
			return err
		}
		if rerr := d.reregister(ctx, token); rerr != nil {
			if errors.Is(rerr, ErrSettled) {
				return ErrSettled
			}
			return err
		}
	}
}

// taskCall makes a call that answers a task; params builds the call's
// params around the token (a copy: what the caller passed is never
// changed).
func (d *Delegate) taskCall(ctx context.Context, method string, params func(token string) any) (*wire.Task, error) {
	var res wire.TaskResult
	err := d.callWithToken(ctx, func(token string) error {
		return d.r.call(ctx, method, params(token), &res)
	})
	if err != nil {
		return nil, err
	}
	d.noteSeen(res.Task)
	return res.Task, nil
}

// change makes a call that changes a task and answers it, retried while
// its answer is lost, within the call's deadline: params must build the
// same change, with the same key, every time.
func (d *Delegate) change(ctx context.Context, method string, params func(token string) any) (*wire.Task, error) {
	var t *wire.Task
	err := d.r.bounded(ctx, func(ctx context.Context) error {
		return d.r.retry(ctx, func() error {
			var err error
			t, err = d.taskCall(ctx, method, params)
			return err
		})
	})
	return t, err
}

// keyed returns msg with a messageId, the key that makes its call
// retry-safe: its own when the caller set one, else a new one. A message
// the delegate received (the broker set its from) is a new message when
// sent on: it gets a new id too, so that forwarding one message to two
// peers makes two tasks.
func keyed(msg wire.Message) wire.Message {
	if msg.MessageID == "" || msg.From != "" {
		msg.MessageID = uuid.NewString()
	}
	return msg
}

// Peers lists every other live agent on the host, each with its session,
// following the broker's pages.
func (d *Delegate) Peers(ctx context.Context) ([]wire.AgentCard, error) {
	var all []wire.AgentCard
	err := d.r.bounded(ctx, func(ctx context.Context) error {
		p := wire.ListAgentsParams{PageParams: wire.PageParams{PageSize: wire.MaxPageSize}}
		for {
			var res wire.ListAgentsResult
			err := d.callWithToken(ctx, func(token string) error {
				p.Token = token
				return d.r.call(ctx, wire.MethodListAgents, p, &res)
			})
			if err != nil {
				return err
			}
			all = append(all, res.Agents...)
			if res.NextPageToken == "" {
				return nil
			}
			p.PageToken = res.NextPageToken
		}
	})
	if err != nil {
		return nil, err
	}
	return all, nil
}

// Peer returns the card of the live agent id, as Peers would list it; nil,
// and no error, when Peers would not list it (no live agent has that id,
// or it is the delegate itself or hidden from it). It costs one card
// whatever the number of agents: a2a.agents.list narrowed by agentId.
func (d *Delegate) Peer(ctx context.Context, id string) (*wire.AgentCard, error) {
	if id == "" {
		return nil, nil
	}
	p := wire.ListAgentsParams{AgentID: id}
	var cards []wire.AgentCard
	err := d.r.bounded(ctx, func(ctx context.Context) error {
		var res wire.ListAgentsResult
		err := d.callWithToken(ctx, func(token string) error {
			p.Token = token
			return d.r.call(ctx, wire.MethodListAgents, p, &res)
		})
		cards = res.Agents
		if err == nil && res.NextPageToken != "" {
			// A broker that does not know agentId answered the list's
			// first page: walk the list.
			cards, err = d.Peers(ctx)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	for i := range cards {
		if cards[i].AgentID == id {
			return &cards[i], nil
		}
	}
	return nil, nil
}

// Send creates a task for a peer. to names it; "" lets the broker choose
// the single peer of this session, else the single peer of the others.
// metadata, when not nil, is kept with the task.
//
// Send, Push, Reply, Update and Cancel are retry-safe: each call carries
// an idempotency key (the message's messageId when the caller set one,
// else a new one; docs/PROTOCOL.md §4.11) and is tried again with it
// while its answer is lost (Config.Retry), within Config.CallTimeout in
// all. A caller that sets messageId
// itself says "this is one intent": a second call with the same id and
// content returns the first call's task, and the same id with other
// content fails with -32602. Leave it empty for a new message each call.
func (d *Delegate) Send(ctx context.Context, to string, msg wire.Message, metadata map[string]any) (*wire.Task, error) {
	var meta json.RawMessage
	if metadata != nil {
		var err error
		if meta, err = json.Marshal(metadata); err != nil {
			return nil, fmt.Errorf("runtime: metadata: %w", err)
		}
	}
	msg = keyed(msg)
	return d.change(ctx, wire.MethodSend, func(token string) any {
		return wire.SendParams{Token: token, To: to, Message: &msg, Metadata: meta}
	})
}

// Push sends a oneway message (no task); it returns the recipient's id.
func (d *Delegate) Push(ctx context.Context, to string, msg wire.Message) (string, error) {
	var res wire.SendResult
	msg = keyed(msg)
	err := d.r.bounded(ctx, func(ctx context.Context) error {
		return d.r.retry(ctx, func() error {
			return d.callWithToken(ctx, func(token string) error {
				return d.r.call(ctx, wire.MethodSend, wire.SendParams{Token: token, To: to, Message: &msg, Oneway: true}, &res)
			})
		})
	})
	return res.Delivered, err
}

// Reply adds a message to an open task the delegate is a member of.
func (d *Delegate) Reply(ctx context.Context, taskID string, msg wire.Message) (*wire.Task, error) {
	msg = keyed(msg)
	return d.change(ctx, wire.MethodSend, func(token string) any {
		return wire.SendParams{Token: token, TaskID: taskID, Message: &msg}
	})
}

// Task reads a task the delegate is a member of.
func (d *Delegate) Task(ctx context.Context, taskID string) (*wire.Task, error) {
	var t *wire.Task
	err := d.r.bounded(ctx, func(ctx context.Context) error {
		var err error
		t, err = d.taskCall(ctx, wire.MethodGetTask, func(token string) any {
			return wire.TaskParams{Token: token, TaskID: taskID}
		})
		return err
	})
	return t, err
}

// getTask reads a task without counting it as seen.
func (d *Delegate) getTask(ctx context.Context, taskID string) (*wire.Task, error) {
	var res wire.TaskResult
	err := d.callWithToken(ctx, func(token string) error {
		return d.r.call(ctx, wire.MethodGetTask, wire.TaskParams{Token: token, TaskID: taskID}, &res)
	})
	if err == nil && res.Task == nil {
		err = fmt.Errorf("runtime: bad %s result: no task", wire.MethodGetTask)
	}
	return res.Task, err
}

// Tasks lists the delegate's tasks, oldest first, following the
// broker's pages; state and role ("requester", "assignee") may be empty.
func (d *Delegate) Tasks(ctx context.Context, state wire.State, role wire.ListRole) ([]*wire.Task, error) {
	var tasks []*wire.Task
	err := d.r.bounded(ctx, func(ctx context.Context) error {
		var err error
		tasks, err = d.listTasks(ctx, state, role)
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, t := range tasks {
		d.noteSeen(t)
	}
	return tasks, nil
}

// TasksPage reads one page of the delegate's tasks, oldest first: at most
// size (0: the broker's default), after the page token ("" for the
// first). It returns the next page's token, "" after the last.
func (d *Delegate) TasksPage(ctx context.Context, state wire.State, role wire.ListRole, size int, token string) ([]*wire.Task, string, error) {
	p := wire.ListTasksParams{State: state, Role: role, PageParams: wire.PageParams{PageSize: size, PageToken: token}}
	var res wire.ListTasksResult
	err := d.r.bounded(ctx, func(ctx context.Context) error {
		return d.callWithToken(ctx, func(tok string) error {
			p.Token = tok
			return d.r.call(ctx, wire.MethodListTasks, p, &res)
		})
	})
	if err != nil {
		return nil, "", err
	}
	for _, t := range res.Tasks {
		d.noteSeen(t)
	}
	return res.Tasks, res.NextPageToken, nil
}

// listTasks reads every page of the delegate's tasks.
func (d *Delegate) listTasks(ctx context.Context, state wire.State, role wire.ListRole) ([]*wire.Task, error) {
	var all []*wire.Task
	p := wire.ListTasksParams{State: state, Role: role}
	for {
		var res wire.ListTasksResult
		err := d.callWithToken(ctx, func(token string) error {
			p.Token = token
			return d.r.call(ctx, wire.MethodListTasks, p, &res)
		})
		if err != nil {
			return nil, err
		}
		all = append(all, res.Tasks...)
		if res.NextPageToken == "" {
			return all, nil
		}
		p.PageToken = res.NextPageToken
	}
}

// Update moves a task assigned to the delegate to a new state, with an
// optional message and artifacts.
func (d *Delegate) Update(ctx context.Context, taskID string, state wire.State, msg *wire.Message, artifacts ...wire.Artifact) (*wire.Task, error) {
	key := uuid.NewString()
	if msg != nil {
		m := keyed(*msg)
		msg, key = &m, m.MessageID
	}
	return d.change(ctx, wire.MethodUpdateTask, func(token string) any {
		return wire.UpdateParams{Token: token, TaskID: taskID, State: state, Message: msg, Artifacts: artifacts, MessageID: key}
	})
}

// Cancel cancels a task the delegate requested.
func (d *Delegate) Cancel(ctx context.Context, taskID string) (*wire.Task, error) {
	key := uuid.NewString()
	return d.change(ctx, wire.MethodCancelTask, func(token string) any {
		return wire.CancelParams{Token: token, TaskID: taskID, MessageID: key}
	})
}

// Settle deregisters the delegate: its open tasks are closed (failed if
// assigned to it, canceled if it requested them), and every later call,
// and a Wait in progress, returns ErrSettled.
func (d *Delegate) Settle(ctx context.Context) error {
	d.mu.Lock()
	if d.err != nil {
		d.mu.Unlock()
		return d.err
	}
	d.leaving = true // no call may register it again from now on
	token := d.token
	d.mu.Unlock()
	callErr := d.r.bounded(ctx, func(ctx context.Context) error {
		return d.r.call(ctx, wire.MethodDeregister, wire.TokenParams{Token: token}, nil)
	})
	if callErr != nil && !errors.Is(callErr, wire.ErrUnauthorized) {
		d.mu.Lock()
		d.leaving = false // still registered: it may try again
		d.mu.Unlock()
		return callErr
	}
	d.fail(ErrSettled)
	d.r.forget(d)
	return nil
}

// fail stops the delegate for good.
func (d *Delegate) fail(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err == nil {
		d.err = err
		close(d.dead)
	}
}

func (d *Delegate) signal() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// item is one entry of the wait queue: an event, or a Resync due at that
// point (its reason), which Wait performs when it gets there.
type item struct {
	ev     Event
	resync string
}

// deliver queues an event; past the queue's size it drops it and marks a
// Resync due once the queue drains.
func (d *Delegate) deliver(ev Event, size int) {
	d.qmu.Lock()
	if len(d.queue) >= size {
		d.overflow = true
	} else {
		d.queue = append(d.queue, item{ev: ev})
	}
	d.qmu.Unlock()
	d.signal()
}

// needResync queues a Resync at this point of the stream: events queued
// before the break come before it, events after it after.
func (d *Delegate) needResync(reason string) {
	d.qmu.Lock()
	d.queue = append(d.queue, item{resync: reason})
	d.qmu.Unlock()
	d.signal()
}

// resyncNow re-reads the delegate's tasks and returns the Resync: the
// tasks that changed since the delegate last heard of them, and the open
// ones the broker no longer has.
func (d *Delegate) resyncNow(ctx context.Context, reason string) (*Resync, error) {
	d.mu.Lock()
	gen := d.resyncs // what was seen before now (gen <= this) precedes the list
	d.resyncs++
	d.mu.Unlock()
	// Every page, both roles, any state. Not through Tasks: that would
	// count them as seen before comparing.
	tasks, err := d.listTasks(ctx, "", "")
	if err != nil {
		return nil, err
	}
	present := make(map[string]bool, len(tasks))
	for _, t := range tasks {
		present[t.ID] = true
	}
	// An open task the list lacks is lost only if the broker says so when
	// asked for it: a list that missed a live task (a paging or filter
	// quirk, or a task made since the list was read) never makes it lost.
	d.mu.Lock()
	var missing []string
	for id, k := range d.seen {
		if k.open && !present[id] {
			missing = append(missing, id)
		}
	}
	d.mu.Unlock()
	slices.Sort(missing)
	var gone []string
	for _, id := range missing {
		t, err := d.getTask(ctx, id)
		switch {
		case err == nil:
			tasks = append(tasks, t)
			present[id] = true
		case errors.Is(err, wire.ErrUnknownTask):
			gone = append(gone, id)
		case ctx.Err() != nil || errors.Is(err, ErrSettled) || errors.Is(err, ErrClosed):
			return nil, err
		default:
			// Not known to be gone: the next Resync asks again.
			d.r.log.Debug("reading a task missing from the list failed; kept", "delegate", d.ID(), "task", id, "error", err)
			present[id] = true
		}
	}
	if len(tasks) > 0 && len(missing) > 0 {
		slices.SortStableFunc(tasks, func(a, b *wire.Task) int { return strings.Compare(a.ID, b.ID) })
	}
	d.mu.Lock()
	var changed []*wire.Task
	for _, t := range tasks {
		if k, ok := d.seen[t.ID]; !ok || !k.at.Equal(t.UpdatedAt.Time) {
			changed = append(changed, t)
		}
	}
	var lost []string
	for _, id := range gone {
		// Still open as the delegate knows it: it may have heard it end
		// meanwhile, or another Resync may have reported it.
		if k, ok := d.seen[id]; ok && k.open {
			lost = append(lost, id)
			delete(d.seen, id)
			d.lost[id] = gen
		}
	}
	// Forget what the broker no longer has (pruned, or lost and reported):
	// seen before the list began and absent from it.
	for id, k := range d.seen {
		if k.gen <= gen && !k.open && !present[id] {
			delete(d.seen, id)
		}
	}
	// A lost id is ignored until a later Resync: long enough for a call
	// answered before the break to have been noted.
	for id, g := range d.lost {
		if g < gen {
			delete(d.lost, id)
		}
	}
	d.mu.Unlock()
	d.qmu.Lock()
	rename := d.pendingRename
	d.pendingRename = ""
	d.qmu.Unlock()
	return &Resync{Reason: reason, Changed: changed, Lost: lost, RenamedFrom: rename}, nil
}

// noteDelivered records what the delegate now knows of a task from an event
// Wait gives it.
func (d *Delegate) noteDelivered(ev Event) {
	if ev.Task != nil && ev.Task.Task != nil {
		d.noteSeen(ev.Task.Task)
	}
	if ev.Resync != nil {
		d.mu.Lock()
		for _, t := range ev.Resync.Changed {
			d.noteLocked(t)
		}
		d.mu.Unlock()
	}
}

// resyncRetry is how long Wait waits before trying a failed Resync again.
const resyncRetry = 200 * time.Millisecond

// Wait returns the delegate's next event: a task event or push addressed
// to it (never another session's, never another delegate's), or a Resync
// after a break, whose Lost names the open tasks the broker no longer
// has (a Wait on one of those ends with it). It blocks until one comes,
// ctx ends, or the delegate settles (ErrSettled) or its runtime closes
// (ErrClosed).
func (d *Delegate) Wait(ctx context.Context) (Event, error) {
	d.r.mu.Lock()
	d.r.waiting++
	d.r.mu.Unlock()
	d.waiters.Add(1)
	defer func() {
		d.waiters.Add(-1)
		d.r.mu.Lock()
		d.r.waiting--
		d.r.mu.Unlock()
	}()
	for {
		d.mu.Lock()
		err := d.err
		d.mu.Unlock()
		if err != nil {
			return Event{}, err
		}
		if err := ctx.Err(); err != nil {
			return Event{}, err
		}
		d.qmu.Lock()
		var it item
		fromQueue := false
		switch {
		case len(d.queue) > 0:
			// An event, or a resync: either is this waiter's alone. A
			// resync is taken off the queue (or the overflow cleared) as
			// it starts, so that a second waiter does not repeat it and
			// events dropped while it reads the tasks make a next one; it
			// is put back if it fails.
			it = d.queue[0]
			d.queue[0] = item{}
			d.queue = d.queue[1:]
			fromQueue = true
		case d.overflow:
			it = item{resync: "the wait queue overflowed"}
			d.overflow = false
		}
		more := len(d.queue) > 0
		d.qmu.Unlock()
		switch {
		case it.resync != "":
			rs, err := d.resyncNow(ctx, it.resync)
			if err == nil {
				ev := Event{Resync: rs}
				d.noteDelivered(ev)
				d.signal()
				return ev, nil
			}
			d.qmu.Lock()
			if fromQueue {
				d.queue = append([]item{it}, d.queue...)
			} else {
				d.overflow = true
			}
			d.qmu.Unlock()
			// It stays due: try again shortly, unless the delegate or the
			// caller is done.
			if errors.Is(err, ErrSettled) || errors.Is(err, ErrClosed) {
				return Event{}, err
			}
			d.r.log.Debug("resync failed; retrying", "delegate", d.ID(), "error", err)
			select {
			case <-time.After(resyncRetry):
			case <-d.dead:
			case <-ctx.Done():
				return Event{}, ctx.Err()
			}
			continue
		case it.ev != (Event{}):
			if more {
				d.signal() // another waiter may take the next one
			}
			d.noteDelivered(it.ev)
			return it.ev, nil
		}
		select {
		case <-d.wake:
		case <-d.dead:
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}
