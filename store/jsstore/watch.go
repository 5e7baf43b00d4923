package jsstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

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
// that Sync can wait for it, and which instances it last told stored.
type regWatch struct {
	fn        func(instance string)
	mu        sync.Mutex
	delivered uint64          // the stream sequence of the latest delivered
	moved     chan struct{}   // closed and replaced when delivered moves
	stored    map[string]bool // instances whose latest delivery was a registration
}

// relistEvery is how often a watch compares what it told with the
// registrations stored (relist).
const relistEvery = 30 * time.Second

// relist tells fn of every instance whose registration the watch last
// told stored but the bucket no longer holds, and of every one stored
// that the watch has not told: the removals a watch misses when its
// connection was cut for longer than a removal marker lives (the
// consumer resumes after the marker is gone). Telling an instance more
// often than needed is harmless: the caller reads what is stored.
func (s *Store) relist(ctx context.Context, w *regWatch) (map[string]bool, error) {
	now := map[string]bool{}
	if err := s.agents.keys(ctx, "r.*", func(key string) error {
		if instance, err := lastToken(key); err == nil {
			now[instance] = true
		}
		return nil
	}); err != nil {
		return nil, err
	}
	var tell []string
	w.mu.Lock()
	for instance := range w.stored {
		if !now[instance] {
			delete(w.stored, instance)
			tell = append(tell, instance)
		}
	}
	for instance := range now {
		if !w.stored[instance] {
			tell = append(tell, instance)
		}
	}
	w.mu.Unlock()
	for _, instance := range tell {
		w.fn(instance)
	}
	return now, nil
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
	w := &regWatch{fn: fn, moved: make(chan struct{}), stored: map[string]bool{}}
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
		instance, err := lastToken(m.Subject()[len(s.agents.pre):])
		w.mu.Lock()
		if err == nil {
			switch m.Headers().Get(hdrKVOp) {
			case "DEL", "PURGE":
				delete(w.stored, instance)
			default:
				w.stored[instance] = true
			}
		}
		w.mu.Unlock()
		if err == nil {
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
	done := make(chan struct{})
	var relisting sync.WaitGroup
	relisting.Go(func() {
		t := time.NewTicker(relistEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			rctx, cancel := context.WithTimeout(context.Background(), s.timeout)
			_, _ = s.relist(rctx, w) // the next round tries again
			cancel()
		}
	})
	var stopOnce sync.Once
	return func() {
		stopOnce.Do(func() {
			close(done)
			relisting.Wait()
			cc.Stop()
			<-cc.Closed()
		})
	}, nil
}

// Sync returns once the watch (WatchRegistrations) has delivered every
// registration change stored before Sync was called, a removal it could
// not deliver as one (see relist) included, with the instances whose
// registrations are stored then (those removed within a marker's life
// included).
func (s *Store) Sync(ctx context.Context) (map[string]bool, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	s.mu.RLock()
	w := s.watch
	s.mu.RUnlock()
	if w == nil {
		return nil, errors.New("jsstore: Sync without WatchRegistrations")
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
		return nil, err
	}
	for {
		w.mu.Lock()
		done, moved := w.delivered >= last, w.moved
		w.mu.Unlock()
		if done {
			break
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return nil, fmt.Errorf("jsstore: wait for the registrations' watch: %w", ctx.Err())
		}
	}
	// A removal whose marker expired before the watch came to it (its
	// connection was cut) is in no message: the stored keys tell it.
	return s.relist(ctx, w)
}
