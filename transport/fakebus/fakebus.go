// Package fakebus is an in-memory bus for tests: the reference
// implementation of the transport contract, with no I/O, and with
// Disconnect and Connect to inject faults (a session that loses its link
// to the broker and the notifications published meanwhile).
package fakebus

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/a2a-bus/a2a-bus/internal/fanout"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// Config configures a fake bus. The zero value is ready to use.
type Config struct {
	// Buffer is each subscription's buffer; small values let tests make a
	// receiver fall behind. 0 means transport.DefaultSubscriptionBuffer.
	Buffer int
	// MaxMessageBytes is the request size above which Call returns
	// transport.ErrTooLarge without sending. 0 means
	// wire.DefaultMaxMessageBytes.
	MaxMessageBytes int
	// Owner makes every session call with transport.ScopeOwner, as the
	// pipe does, instead of transport.ScopeSession bound to its id.
	Owner bool
}

// Validate reports a negative setting; New panics on one.
func (cfg Config) Validate() error {
	switch {
	case cfg.Buffer < 0:
		return fmt.Errorf("fakebus: Config.Buffer is %d: want 0 (the default) or more", cfg.Buffer)
	case cfg.MaxMessageBytes < 0:
		return fmt.Errorf("fakebus: Config.MaxMessageBytes is %d: want 0 (the default) or more", cfg.MaxMessageBytes)
	}
	return nil
}

// Bus is an in-memory bus. It is both sides: a transport.Bus and a
// transport.Client.
type Bus struct {
	cfg    Config
	ctx    context.Context // canceled by Close; handler calls run under it
	cancel context.CancelFunc
	subs   fanout.Set
	nextID atomic.Uint64

	mu       sync.Mutex
	handler  transport.Handler
	closed   bool
	running  sync.WaitGroup // handler calls in flight
	down     map[string]bool
	sessions map[*session]struct{}
}

var (
	_ transport.Bus               = (*Bus)(nil)
	_ transport.SubscriberCounter = (*Bus)(nil)
	_ transport.Client            = (*Bus)(nil)
	_ transport.HostCaller        = (*Bus)(nil)
)

// New returns a fake bus.
func New(cfg Config) *Bus {
	if err := cfg.Validate(); err != nil {
		panic(err) // a test double: a bad config is the test's bug
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = wire.DefaultMaxMessageBytes
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Bus{cfg: cfg, ctx: ctx, cancel: cancel, down: map[string]bool{}, sessions: map[*session]struct{}{}}
}

// Serve implements transport.Bus.
func (b *Bus) Serve(h transport.Handler) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.closed:
		return transport.ErrClosed
	case b.handler != nil:
		return transport.ErrServing
	}
	b.handler = h
	return nil
}

// Publish implements transport.Bus. Notifications for a disconnected
// session are lost, as they would be on a broken link.
func (b *Bus) Publish(session string, msg []byte) error {
	b.mu.Lock()
	closed, down := b.closed, b.down[session]
	b.mu.Unlock()
	if closed {
		return transport.ErrClosed
	}
	if !down {
		b.subs.Deliver(session, msg)
	}
	return nil
}

// Disconnect cuts session off: its calls fail with transport.ErrUnavailable
// and the notifications published to it are lost, until Connect.
// Subscriptions stay open, as a client library keeps them across a
// reconnect.
func (b *Bus) Disconnect(session string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.down[session] = true
}

// Reconnect restores a session cut off by Disconnect.
func (b *Bus) Reconnect(session string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.down, session)
}

// Unserve takes the broker away, as if its process died: calls fail with
// transport.ErrUnavailable until a handler (a restarted broker) is served
// again with Serve. Handler calls already running finish first.
func (b *Bus) Unserve() {
	b.mu.Lock()
	b.handler = nil
	b.mu.Unlock()
	b.running.Wait()
}

// Subscribers implements transport.SubscriberCounter.
func (b *Bus) Subscribers(session string) (int, bool) { return b.subs.Count(session), true }

// Close implements transport.Bus and transport.Client.
func (b *Bus) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	sessions := b.sessions
	b.sessions = nil
	b.mu.Unlock()
	b.cancel()
	for s := range sessions {
		s.subs.Close()
	}
	b.subs.Close()
	b.running.Wait()
	return nil
}

// Session implements transport.Client.
func (b *Bus) Session(ctx context.Context, id string) (transport.Session, error) {
	if err := wire.ValidateID("session id", id); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, transport.ErrClosed
	}
	s := &session{bus: b, id: id, subs: fanout.NewGroup()}
	b.sessions[s] = struct{}{}
	return s, nil
}

// CallHost implements transport.HostCaller.
func (b *Bus) CallHost(ctx context.Context, method string, params any) (json.RawMessage, error) {
	scope := transport.ScopeHost
	if b.cfg.Owner {
		scope = transport.ScopeOwner
	}
	return b.call(ctx, nil, transport.Caller{Scope: scope}, method, params)
}

func (b *Bus) call(ctx context.Context, s *session, from transport.Caller, method string, params any) (json.RawMessage, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // an ended context sends nothing
	}
	req, err := wire.EncodeRequest(b.nextID.Add(1), method, params)
	if err != nil {
		return nil, err
	}
	if len(req) > b.cfg.MaxMessageBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", transport.ErrTooLarge, len(req), b.cfg.MaxMessageBytes)
	}
	var sessionDone <-chan struct{}
	if s != nil {
		sessionDone = s.subs.Done()
	}
	b.mu.Lock()
	switch {
	case b.closed:
		b.mu.Unlock()
		return nil, transport.ErrClosed
	case s != nil && s.subs.Closed():
		b.mu.Unlock()
		return nil, transport.ErrClosed
	case b.handler == nil:
		b.mu.Unlock()
		return nil, fmt.Errorf("%w: no broker is serving", transport.ErrUnavailable)
	case s != nil && b.down[s.id]:
		b.mu.Unlock()
		return nil, fmt.Errorf("%w: session %q is disconnected", transport.ErrUnavailable, s.id)
	}
	h := b.handler
	b.running.Add(1)
	b.mu.Unlock()

	done := make(chan []byte, 1)
	go func() {
		defer b.running.Done()
		done <- h.ServeRPC(b.ctx, from, req)
	}()
	select {
	case resp := <-done:
		if resp == nil {
			return nil, fmt.Errorf("%w: the broker sent no response", transport.ErrUnavailable)
		}
		return wire.DecodeResult(resp)
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-b.ctx.Done():
		return nil, transport.ErrClosed
	case <-sessionDone:
		return nil, transport.ErrClosed
	}
}

type session struct {
	bus  *Bus
	id   string
	subs *fanout.Group
}

func (s *session) ID() string { return s.id }

func (s *session) Call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	from := transport.Caller{Scope: transport.ScopeSession, Session: s.id}
	if s.bus.cfg.Owner {
		from = transport.Caller{Scope: transport.ScopeOwner}
	}
	return s.bus.call(ctx, s, from, method, params)
}

func (s *session) Subscribe(ctx context.Context) (transport.Subscription, error) {
	return s.subs.Subscribe(&s.bus.subs, s.id, s.bus.cfg.Buffer)
}

func (s *session) Close() error {
	s.bus.mu.Lock()
	delete(s.bus.sessions, s)
	s.bus.mu.Unlock()
	s.subs.Close()
	return nil
}
