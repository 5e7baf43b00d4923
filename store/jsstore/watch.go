package jsstore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/a2a-bus/a2a-bus/store"
)

// Registration returns the stored registration of instance, read from
// the stream leader, or store.ErrNotFound.
func (s *Store) Registration(ctx context.Context, instance string) (*store.Registration, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	reg, err := s.registration(ctx, regKey(instance))
	if err == nil && reg == nil {
		err = store.ErrNotFound
	}
	return reg, err
}

// regWatch is the watch of the registrations: what it has delivered, so
// that Sync can wait for it.
type regWatch struct {
	mu        sync.Mutex
	delivered uint64        // the stream sequence of the latest delivered
	moved     chan struct{} // closed and replaced when delivered moves
}

// WatchRegistrations calls fn with the instance of every stored
// registration (and of registrations removed lately), then returns; then,
// on the consumer's goroutine until stop, with the instance of every
// registration put or removed, in the order they were stored. It is an
// ordered consumer of the registrations' keys, which nats.go recreates
// from where it was after a cut. One watch per Store: Sync waits for it.
func (s *Store) WatchRegistrations(ctx context.Context, fn func(instance string)) (stop func(), err error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	w := &regWatch{moved: make(chan struct{})}
	cons, err := s.agents.str.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{s.agents.pre + "r.>"},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("jsstore: watch the registrations: %w", err)
	}
	info := cons.CachedInfo()
	initial := info.NumPending
	caughtUp := make(chan struct{})
	var once sync.Once
	if initial == 0 {
		once.Do(func() { close(caughtUp) })
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		meta, err := m.Metadata()
		if err != nil {
			return
		}
		if instance, err := lastToken(m.Subject()[len(s.agents.pre):]); err == nil {
			fn(instance)
		}
		w.mu.Lock()
		w.delivered = meta.Sequence.Stream
		close(w.moved)
		w.moved = make(chan struct{})
		w.mu.Unlock()
		if meta.NumPending == 0 {
			once.Do(func() { close(caughtUp) })
		}
	})
	if err != nil {
		return nil, fmt.Errorf("jsstore: watch the registrations: %w", err)
	}
	select {
	case <-caughtUp:
	case <-ctx.Done():
		cc.Stop()
		return nil, fmt.Errorf("jsstore: watch the registrations: %w", ctx.Err())
	}
	s.mu.Lock()
	s.watch = w
	s.mu.Unlock()
	return func() {
		cc.Stop()
		<-cc.Closed()
	}, nil
}

// Sync returns once the watch (WatchRegistrations) has delivered every
// registration change stored before Sync was called.
func (s *Store) Sync(ctx context.Context) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	s.mu.RLock()
	w := s.watch
	s.mu.RUnlock()
	if w == nil {
		return errors.New("jsstore: Sync without WatchRegistrations")
	}
	var last uint64
	err := s.retry(ctx, "read the latest registration", func(ctx context.Context) error {
		m, err := s.agents.str.GetLastMsgForSubject(ctx, s.agents.pre+"r.>")
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			last = 0
			return nil
		case err != nil:
			return err
		}
		last = m.Sequence
		return nil
	})
	if err != nil {
		return err
	}
	for {
		w.mu.Lock()
		done, moved := w.delivered >= last, w.moved
		w.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return fmt.Errorf("jsstore: wait for the registrations' watch: %w", ctx.Err())
		}
	}
}
