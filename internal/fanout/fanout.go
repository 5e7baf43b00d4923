// Package fanout holds the subscriptions of in-process sessions for the
// buses: bounded channels that drop, and count, what a slow receiver
// cannot take, so that a publisher never waits for a receiver.
package fanout

import (
	"sync"
	"sync/atomic"

	"github.com/a2a-bus/a2a-bus/transport"
)

// Sub is one subscription. It implements transport.Subscription.
type Sub struct {
	mu      sync.Mutex
	ch      chan []byte
	closed  bool
	dropped atomic.Uint64
	set     *Set
	session string
	onClose func() // for a Sub made by NewSub
}

// NewSub returns a subscription outside any Set, with a buffer of n
// notifications (n <= 0: transport.DefaultSubscriptionBuffer). onClose,
// when not nil, runs once when it ends by Close.
func NewSub(n int, onClose func()) *Sub {
	if n <= 0 {
		n = transport.DefaultSubscriptionBuffer
	}
	return &Sub{ch: make(chan []byte, n), onClose: onClose}
}

var _ transport.Subscription = (*Sub)(nil)

// C implements transport.Subscription.
func (s *Sub) C() <-chan []byte { return s.ch }

// Dropped implements transport.Subscription.
func (s *Sub) Dropped() uint64 { return s.dropped.Load() }

// Deliver hands msg to the receiver without waiting; it reports false and
// counts a drop when the buffer is full. Deliver after Close does nothing.
func (s *Sub) Deliver(msg []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	select {
	case s.ch <- msg:
		return true
	default:
		s.dropped.Add(1)
		return false
	}
}

// Close implements transport.Subscription.
func (s *Sub) Close() error {
	if s.set != nil {
		s.set.remove(s)
	}
	if s.End() && s.onClose != nil {
		s.onClose()
	}
	return nil
}

// End closes C without running onClose (the owner is ending it); it
// reports whether this call ended it.
func (s *Sub) End() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.closed = true
	close(s.ch)
	return true
}

// Set is the subscriptions of many sessions. The zero Set is ready.
type Set struct {
	mu     sync.RWMutex
	subs   map[string]map[*Sub]struct{}
	closed bool
}

// Add subscribes to session with a buffer of n notifications (n <= 0:
// transport.DefaultSubscriptionBuffer). After Close it returns
// transport.ErrClosed.
func (s *Set) Add(session string, n int) (*Sub, error) {
	if n <= 0 {
		n = transport.DefaultSubscriptionBuffer
	}
	sub := &Sub{ch: make(chan []byte, n), set: s, session: session}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, transport.ErrClosed
	}
	if s.subs == nil {
		s.subs = make(map[string]map[*Sub]struct{})
	}
	m := s.subs[session]
	if m == nil {
		m = make(map[*Sub]struct{})
		s.subs[session] = m
	}
	m[sub] = struct{}{}
	return sub, nil
}

func (s *Set) remove(sub *Sub) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.subs[sub.session]; m != nil {
		delete(m, sub)
		if len(m) == 0 {
			delete(s.subs, sub.session)
		}
	}
}

// Deliver hands msg to every subscriber of session, without waiting.
func (s *Set) Deliver(session string, msg []byte) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for sub := range s.subs[session] {
		sub.Deliver(msg)
	}
}

// Count returns the number of subscriptions of session.
func (s *Set) Count(session string) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.subs[session])
}

// Close ends every subscription; later Adds fail with
// transport.ErrClosed. Idempotent.
func (s *Set) Close() {
	s.mu.Lock()
	all := s.subs
	s.subs = nil
	s.closed = true
	s.mu.Unlock()
	for _, m := range all {
		for sub := range m {
			sub.End()
		}
	}
}

// Group is the subscriptions one session handle made on a Set: they end
// together when the handle closes. The zero Group is not usable; call
// NewGroup.
type Group struct {
	once sync.Once
	done chan struct{}

	mu   sync.Mutex
	subs []*Sub
}

// NewGroup returns an open group.
func NewGroup() *Group { return &Group{done: make(chan struct{})} }

// Done is closed when the group closes.
func (g *Group) Done() <-chan struct{} { return g.done }

// Closed reports whether the group has closed.
func (g *Group) Closed() bool {
	select {
	case <-g.done:
		return true
	default:
		return false
	}
}

// Subscribe adds a subscription to session on set, owned by the group;
// after Close it returns transport.ErrClosed.
func (g *Group) Subscribe(set *Set, session string, n int) (*Sub, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.Closed() {
		return nil, transport.ErrClosed
	}
	sub, err := set.Add(session, n)
	if err != nil {
		return nil, err
	}
	g.subs = append(g.subs, sub)
	return sub, nil
}

// Close closes Done and ends the group's subscriptions. Idempotent.
func (g *Group) Close() {
	g.once.Do(func() {
		g.mu.Lock()
		close(g.done)
		subs := g.subs
		g.subs = nil
		g.mu.Unlock()
		for _, sub := range subs {
			sub.Close()
		}
	})
}
