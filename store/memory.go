package store

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"
)

// Memory is a Store in memory, for tests and for a broker that keeps
// nothing (--data-dir ""). The zero value is not usable; call NewMemory.
type Memory struct {
	mu     sync.RWMutex
	closed bool
	tasks  map[string]*Record
	// byInstance indexes task ids by member instance.
	byInstance map[string]map[string]struct{}
	// openByContext counts open tasks by requester session.
	openByContext map[string]int
	// sends indexes task ids by requester instance and SendKey.
	sends map[sendKey]string
	// regs holds the registrations by instance.
	regs map[string]Registration
}

type sendKey struct{ instance, key string }

var _ Store = (*Memory)(nil)

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory {
	return &Memory{
		tasks:         map[string]*Record{},
		byInstance:    map[string]map[string]struct{}{},
		openByContext: map[string]int{},
		sends:         map[sendKey]string{},
		regs:          map[string]Registration{},
	}
}

// PutRegistration implements Registry.
func (m *Memory) PutRegistration(_ context.Context, reg Registration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	reg.Card = slices.Clone(reg.Card)
	m.regs[reg.Instance] = reg
	return nil
}

// DeleteRegistration implements Registry.
func (m *Memory) DeleteRegistration(_ context.Context, instance string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	delete(m.regs, instance)
	return nil
}

// Registrations implements Registry.
func (m *Memory) Registrations(context.Context) ([]Registration, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, ErrClosed
	}
	out := make([]Registration, 0, len(m.regs))
	for _, r := range m.regs {
		r.Card = slices.Clone(r.Card)
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Registration) int { return cmp.Compare(a.Instance, b.Instance) })
	return out, nil
}

// Create implements Store.
func (m *Memory) Create(_ context.Context, rec *Record, maxOpen int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if _, ok := m.tasks[rec.Task.ID]; ok {
		return ErrExists
	}
	open := rec.Task.Status.State.Open()
	if open && maxOpen > 0 && m.openByContext[rec.Task.ContextID] >= maxOpen {
		return ErrLimit
	}
	c := rec.Clone()
	m.tasks[c.Task.ID] = c
	m.index(c.RequesterInstance, c.Task.ID)
	m.index(c.AssigneeInstance, c.Task.ID)
	if c.SendKey != "" {
		m.sends[sendKey{c.RequesterInstance, c.SendKey}] = c.Task.ID
	}
	if open {
		m.openByContext[c.Task.ContextID]++
	}
	return nil
}

func (m *Memory) index(instance, id string) {
	s := m.byInstance[instance]
	if s == nil {
		s = map[string]struct{}{}
		m.byInstance[instance] = s
	}
	s[id] = struct{}{}
}

// Get implements Store.
func (m *Memory) Get(_ context.Context, id string) (*Record, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, ErrClosed
	}
	r, ok := m.tasks[id]
	if !ok {
		return nil, ErrNotFound
	}
	return r.Clone(), nil
}

// FindSend implements Store.
func (m *Memory) FindSend(_ context.Context, instance, key string) (*Record, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, ErrClosed
	}
	r, ok := m.tasks[m.sends[sendKey{instance, key}]]
	if !ok {
		return nil, ErrNotFound
	}
	return r.Clone(), nil
}

// Update implements Store: fn runs without the lock, on a copy of the
// stored record, which is kept only if the task still holds that record
// (a stored record is never changed, only replaced).
func (m *Memory) Update(_ context.Context, id string, fn func(*Record) error) (*Record, error) {
	for {
		out, retry, err := m.update(id, fn)
		if !retry {
			return out, err
		}
	}
}

// update is one try of Update: retry when the task changed meanwhile.
func (m *Memory) update(id string, fn func(*Record) error) (out *Record, retry bool, err error) {
	m.mu.RLock()
	r, ok := m.tasks[id]
	closed := m.closed
	m.mu.RUnlock()
	switch {
	case closed:
		return nil, false, ErrClosed
	case !ok:
		return nil, false, ErrNotFound
	}
	c := r.Clone()
	if err := fn(c); err != nil {
		return nil, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, false, ErrClosed
	}
	if m.tasks[id] != r {
		return nil, true, nil
	}
	wasOpen, isOpen := r.Task.Status.State.Open(), c.Task.Status.State.Open()
	switch {
	case wasOpen && !isOpen:
		m.openByContext[r.Task.ContextID]--
		if m.openByContext[r.Task.ContextID] == 0 {
			delete(m.openByContext, r.Task.ContextID)
		}
	case !wasOpen && isOpen:
		m.openByContext[r.Task.ContextID]++
	}
	m.tasks[id] = c
	return c.Clone(), false, nil
}

// List implements Store. It sorts the selected tasks' pointers, then
// copies only the page.
func (m *Memory) List(_ context.Context, q Query) ([]*Record, bool, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, false, ErrClosed
	}
	var sel []*Record
	consider := func(r *Record) {
		if r.Task.ID > q.After && q.Matches(r) {
			sel = append(sel, r)
		}
	}
	if q.Instance != "" {
		for id := range m.byInstance[q.Instance] {
			consider(m.tasks[id])
		}
	} else {
		for _, r := range m.tasks {
			consider(r)
		}
	}
	slices.SortFunc(sel, func(a, b *Record) int { return cmp.Compare(a.Task.ID, b.Task.ID) })
	var page Pager
	out := []*Record{}
	for _, r := range sel {
		if !page.Take(q, r.Size) {
			return out, true, nil
		}
		out = append(out, r.Clone())
	}
	return out, false, nil
}

// Pager counts a page as a store fills it.
type Pager struct{ n, bytes int }

// Take reports whether a task of size bytes still fits the page q
// bounds, and counts it if it does. The first task always fits.
func (p *Pager) Take(q Query, size int) bool {
	if p.n > 0 && ((q.Limit > 0 && p.n >= q.Limit) || (q.MaxBytes > 0 && p.bytes+size > q.MaxBytes)) {
		return false
	}
	p.n++
	p.bytes += size
	return true
}

// OpenCount implements Store.
func (m *Memory) OpenCount(context.Context) (int, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return 0, ErrClosed
	}
	n := 0
	for _, c := range m.openByContext {
		n += c
	}
	return n, nil
}

// Prune implements Store.
func (m *Memory) Prune(_ context.Context, r Retention, now time.Time) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, ErrClosed
	}
	var terminal []*Record
	for _, rec := range m.tasks {
		if rec.Task.Status.State.Terminal() {
			terminal = append(terminal, rec)
		}
	}
	doomed := PruneSet(terminal, r, now)
	for _, rec := range doomed {
		delete(m.tasks, rec.Task.ID)
		if rec.SendKey != "" {
			delete(m.sends, sendKey{rec.RequesterInstance, rec.SendKey})
		}
		for _, inst := range []string{rec.RequesterInstance, rec.AssigneeInstance} {
			if s := m.byInstance[inst]; s != nil {
				delete(s, rec.Task.ID)
				if len(s) == 0 {
					delete(m.byInstance, inst)
				}
			}
		}
	}
	return len(doomed), nil
}

// PruneSet returns the records of terminal that r deletes: those older
// than MaxAge, and the oldest beyond MaxTerminal. terminal is reordered.
func PruneSet(terminal []*Record, r Retention, now time.Time) []*Record {
	slices.SortFunc(terminal, func(a, b *Record) int {
		if c := a.Task.UpdatedAt.Compare(b.Task.UpdatedAt.Time); c != 0 {
			return c
		}
		return cmp.Compare(a.Task.ID, b.Task.ID)
	})
	n := 0
	if r.MaxAge > 0 {
		cutoff := now.Add(-r.MaxAge)
		for n < len(terminal) && terminal[n].Task.UpdatedAt.Before(cutoff) {
			n++
		}
	}
	if r.MaxTerminal > 0 && len(terminal)-n > r.MaxTerminal {
		n = len(terminal) - r.MaxTerminal
	}
	return terminal[:n]
}

// Close implements Store.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}

// Matches reports whether q selects r.
func (q Query) Matches(r *Record) bool {
	if q.Instance != "" {
		req, asg := r.RequesterInstance == q.Instance, r.AssigneeInstance == q.Instance
		switch q.Role {
		case Requester:
			if !req {
				return false
			}
		case Assignee:
			if !asg {
				return false
			}
		default:
			if !req && !asg {
				return false
			}
		}
	}
	if q.State != "" && r.Task.Status.State != q.State {
		return false
	}
	if q.OpenOnly && !r.Task.Status.State.Open() {
		return false
	}
	return true
}
