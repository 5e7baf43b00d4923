// Package store is the broker's task store: the interface the broker is
// written against, and Memory, its in-memory reference implementation.
//
// A store holds Records: a task as the wire shows it, plus what the
// broker must know but never shows (the members' instance ids); and
// Registrations, so that a restarted broker gives every agent its name
// back (docs/PROTOCOL.md §4.1). Every
// method is safe for concurrent use, returns copies the caller may change,
// and reports a change as done only once it is as durable as the store
// promises to make it.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/a2a-bus/a2a-bus/wire"
)

// Named errors.
var (
	// ErrNotFound is returned by Get and Update for a task id the store
	// does not hold, and by Names.NameHolder for a name no instance holds.
	ErrNotFound = errors.New("store: task not found")
	// ErrLimit is returned by Create when the requester's session already
	// has the given number of open tasks.
	ErrLimit = errors.New("store: open-task limit reached")
	// ErrExists is returned by Create for a task id already stored.
	ErrExists = errors.New("store: task already exists")
	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("store: closed")
	// ErrNameTaken is returned by Names.ClaimName when another instance
	// holds the name.
	ErrNameTaken = errors.New("store: name held by another instance")
	// ErrChanged is returned by a write that holds only if what it
	// changes is as it was read (a compare-and-set on a revision), when
	// it is not: another write came first. Read again, and judge again.
	ErrChanged = errors.New("store: changed since it was read")
)

// Record is one stored task.
type Record struct {
	Task wire.Task `json:"task"`
	// RequesterInstance and AssigneeInstance are the members' instance ids:
	// membership is checked against them, never against names. (The
	// assignee's JSON name is older than the Go name; data dirs keep it.)
	RequesterInstance string `json:"requesterInstance"`
	AssigneeInstance  string `json:"agentInstance"`
	// Size is the length of the task's JSON encoding as the broker sends
	// it (an upper bound), so that the broker keeps every task within the
	// limit of what a response can carry. Records written by earlier
	// versions hold an estimate.
	Size int `json:"size,omitempty"`

	// SendKey is the messageId the requester gave the send that created
	// the task ("" when the broker chose it): with RequesterInstance, the
	// key FindSend finds the task by. SendDigest is that send's digest, so
	// that a retry can be told from another message under the same id.
	SendKey    string `json:"sendKey,omitempty"`
	SendDigest string `json:"sendDigest,omitempty"`
	// Applied are the idempotency keys of the latest changes made to the
	// task after its creation (messages, updates, cancels), oldest first:
	// at most MaxApplied per member, so that neither member's changes can
	// push the other's keys out.
	Applied []Applied `json:"applied,omitempty"`
}

// MaxApplied bounds a member's keys in Record.Applied: a retry of a
// change older than that member's last MaxApplied keyed changes to the
// task is no longer recognized.
const MaxApplied = 64

// Applied is one change's idempotency key, with the instance that made
// the change and its digest.
type Applied struct {
	By     string `json:"by"`
	Key    string `json:"key"`
	Digest string `json:"digest"`
}

// maxSizeHint bounds the room Encode makes ahead for a record's task.
const maxSizeHint = 1 << 20

// Encode returns r as json.Marshal encodes it, byte for byte, written by
// hand as the wire package writes the task: a durable store encodes a
// record on every change.
func (r *Record) Encode() ([]byte, error) {
	// Size, read back from disk, is only a hint here.
	b := make([]byte, 0, 256+min(max(r.Size, 0), maxSizeHint))
	b = append(b, `{"task":`...)
	b, err := wire.AppendMarshal(b, &r.Task)
	if err != nil {
		return nil, err
	}
	b = append(b, `,"requesterInstance":`...)
	b = wire.AppendString(b, r.RequesterInstance)
	b = append(b, `,"agentInstance":`...)
	b = wire.AppendString(b, r.AssigneeInstance)
	if r.Size != 0 {
		b = append(b, `,"size":`...)
		b = strconv.AppendInt(b, int64(r.Size), 10)
	}
	if r.SendKey != "" {
		b = append(b, `,"sendKey":`...)
		b = wire.AppendString(b, r.SendKey)
	}
	if r.SendDigest != "" {
		b = append(b, `,"sendDigest":`...)
		b = wire.AppendString(b, r.SendDigest)
	}
	if len(r.Applied) > 0 {
		b = append(b, `,"applied":[`...)
		for i, a := range r.Applied {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"by":`...)
			b = wire.AppendString(b, a.By)
			b = append(b, `,"key":`...)
			b = wire.AppendString(b, a.Key)
			b = append(b, `,"digest":`...)
			b = wire.AppendString(b, a.Digest)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	return append(b, '}'), nil
}

// Clone returns a deep copy of r.
func (r *Record) Clone() *Record {
	c := *r
	r.Task.CloneInto(&c.Task)
	c.Applied = slices.Clone(r.Applied)
	return &c
}

// FindApplied returns the digest instance by recorded under key, and
// whether there is one.
func (r *Record) FindApplied(by, key string) (string, bool) {
	for i := len(r.Applied) - 1; i >= 0; i-- {
		if a := r.Applied[i]; a.By == by && a.Key == key {
			return a.Digest, true
		}
	}
	return "", false
}

// Apply records a change's key, dropping by's oldest beyond MaxApplied.
func (r *Record) Apply(by, key, digest string) {
	n := 0
	for _, a := range r.Applied {
		if a.By == by {
			n++
		}
	}
	if n >= MaxApplied {
		for i, a := range r.Applied {
			if a.By == by {
				r.Applied = slices.Delete(r.Applied, i, i+1)
				break
			}
		}
	}
	r.Applied = append(r.Applied, Applied{By: by, Key: key, Digest: digest})
}

// Role selects tasks by the instance's part in them.
type Role uint8

// The roles of Query.
const (
	AnyRole Role = iota
	Requester
	Assignee
)

// Query selects tasks for List, and bounds the page List returns. Zero
// fields select everything and set no bound.
type Query struct {
	// Instance selects the tasks this instance is a member of ("": all).
	Instance string
	// Role narrows Instance to one side of the task.
	Role Role
	// State selects one state ("": any).
	State wire.State
	// OpenOnly selects only tasks in an open state.
	OpenOnly bool

	// After starts the list after the task with this id (the last one of
	// the previous page); "" starts at the first.
	After string
	// Limit bounds how many tasks List returns.
	Limit int
	// MaxBytes bounds the tasks' total size (what the store holds of
	// them when it encodes them, else their Size), so that a page of
	// large tasks fits one response. The first task is returned whatever
	// its size.
	MaxBytes int
}

// Store holds the broker's durable state: its tasks, and the
// registrations of its live agents, under one acknowledgement rule.
type Store interface {
	Tasks
	Registry
}

// Tasks holds tasks.
type Tasks interface {
	// Create stores a new task, unless its requester's session
	// (rec.Task.ContextID) already has maxOpen open tasks (ErrLimit;
	// maxOpen <= 0 means no limit), or the id is taken (ErrExists).
	Create(ctx context.Context, rec *Record, maxOpen int) error

	// Get returns the task with this id, or ErrNotFound.
	Get(ctx context.Context, id string) (*Record, error)

	// FindSend returns the task that instance requested with a send
	// whose messageId was key (Record.SendKey), or ErrNotFound. A task
	// is found for as long as it is stored: until Prune deletes it.
	FindSend(ctx context.Context, instance, key string) (*Record, error)

	// Update applies fn to a copy of the task with this id and stores
	// the result, atomically with respect to every other call: the result
	// is stored only if the task has not changed since Update read it;
	// if it has, Update reads it again and applies fn again. fn runs on
	// the caller's goroutine, with no lock of the store held, so it must
	// not call the store; and, since it may run more than once, it must
	// depend on the record it is given and on nothing an earlier run of
	// it did. It must not change the task's id or its members. An error
	// from fn aborts the update and is returned as it is, once the task
	// fn saw is as durable as a change (a task read before its last
	// change was acknowledged is not judged on that change alone). It
	// returns the stored result; ErrNotFound when there is no such task.
	Update(ctx context.Context, id string, fn func(*Record) error) (*Record, error)

	// List returns the tasks q selects in id order, after q.After, as
	// many as q.Limit and q.MaxBytes allow, and whether more follow. Task
	// ids sort in creation order (the broker makes them so), so this is
	// oldest first. A store reads no more than the page it returns (and
	// the index entries it skips): its memory is bounded by the page, not
	// by the tasks it holds.
	List(ctx context.Context, q Query) (recs []*Record, more bool, err error)

	// OpenCount returns how many tasks are open.
	OpenCount(ctx context.Context) (int, error)

	// Prune deletes terminal tasks beyond the retention, oldest (by
	// UpdatedAt) first, and returns how many it deleted. It never deletes
	// an open task.
	Prune(ctx context.Context, r Retention, now time.Time) (int, error)

	// Close releases the store. Idempotent.
	Close() error
}

// Retention bounds the terminal tasks a store keeps; open tasks are kept
// whatever it says. Zero fields set no bound.
type Retention struct {
	// MaxAge deletes terminal tasks last updated longer ago than this.
	MaxAge time.Duration
	// MaxTerminal keeps at most this many terminal tasks, the most
	// recently updated.
	MaxTerminal int
}

// Registration is one live agent as the store keeps it: what a restarted
// broker needs to hold the agent's name and instance id for it until it
// registers again. No token is kept (but by a cluster: TokenHash): a
// returning agent gets a fresh one.
type Registration struct {
	// Instance is the agent's instance id: the key.
	Instance string `json:"instance"`
	// Session is the session (contextId) the agent registered in.
	Session string `json:"session"`
	// AgentID is the unique name the broker gave it.
	AgentID string `json:"agentId"`
	// Name is the card.name it asked for.
	Name string `json:"name"`
	// Card is its card as a2a.agents.list showed it.
	Card json.RawMessage `json:"card,omitempty"`
	// TokenHash is the hex SHA-256 of the agent's token, kept only by a
	// cluster's store, so that every broker of the cluster can
	// authenticate the agent; a single broker keeps no token, and a
	// returning agent gets a fresh one.
	TokenHash string `json:"tokenHash,omitempty"`
	// Broker is, in a cluster, the broker the agent belongs to: the one
	// it registered through, or the one that took it over when that one
	// stopped.
	Broker string `json:"broker,omitempty"`
}

// Registry keeps the registrations of live agents. A change is
// acknowledged under the same rule as a task's: once it returns, it
// survives whatever the store promises that a task survives.
type Registry interface {
	// PutRegistration stores reg, replacing the registration of its
	// instance.
	PutRegistration(ctx context.Context, reg Registration) error
	// DeleteRegistration removes the registration of instance; there
	// being none is no error.
	DeleteRegistration(ctx context.Context, instance string) error
	// Registrations returns every stored registration, in instance
	// order.
	Registrations(ctx context.Context) ([]Registration, error)
}

// Names holds agent names (agentIds) for the instances that use them, so
// that a name is unique across every broker sharing the store. A store
// shared by brokers on several hosts implements it; a broker finds it by
// a type assertion.
type Names interface {
	// ClaimName gives agentID to instance, unless another instance
	// holds it (ErrNameTaken). Claiming a name the instance already
	// holds is no error. Of concurrent claims of a free name, exactly
	// one succeeds.
	ClaimName(ctx context.Context, agentID, instance string) error
	// ReleaseName frees agentID if instance holds it, and does nothing
	// otherwise: it never frees another instance's claim, even one made
	// while it runs.
	ReleaseName(ctx context.Context, agentID, instance string) error
	// NameHolder returns the instance that holds agentID, or ErrNotFound
	// when none does.
	NameHolder(ctx context.Context, agentID string) (instance string, err error)
}
