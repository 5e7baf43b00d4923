package pipebus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/a2a-bus/a2a-bus/internal/fanout"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// maxResponseBytes is the longest line the host end reads: the largest
// payload of any broker, whatever its message limit.
const maxResponseBytes = wire.MaxPayload

// ClientConfig configures the host end. The zero value is the default
// everywhere; a negative setting is an error (Validate).
type ClientConfig struct {
	// MaxMessageBytes is the largest request Call sends; a larger one is
	// transport.ErrTooLarge. Responses and notifications up to the same
	// size (at least 1 MiB) are read. 0 means wire.DefaultMaxMessageBytes.
	MaxMessageBytes int
	// Buffer is each subscription's buffer. 0 means
	// transport.DefaultSubscriptionBuffer.
	Buffer int
	// Logger receives the client's logs. nil discards them.
	Logger *slog.Logger
}

// Validate reports the first setting of cfg that is out of range.
func (cfg ClientConfig) Validate() error {
	if err := validMessageBytes("ClientConfig", cfg.MaxMessageBytes); err != nil {
		return err
	}
	if cfg.Buffer < 0 {
		return fmt.Errorf("pipebus: ClientConfig.Buffer is %d: want 0 (transport.DefaultSubscriptionBuffer) or more", cfg.Buffer)
	}
	return nil
}

// Client is the host end of a pipe. It implements transport.Client and
// transport.HostCaller; all its sessions share the pipe.
type Client struct {
	cfg    ClientConfig
	w      io.Writer
	closer io.Closer // closes the pipe (and reaps a child); may be nil
	log    *slog.Logger
	subs   fanout.Set
	nextID atomic.Uint64

	// out holds the request lines for the writer goroutine, the only one
	// that writes: lines never interleave, and a caller waits for room
	// only as long as its context allows.
	out chan []byte

	mu       sync.Mutex
	pending  map[uint64]chan result
	sessions map[*session]struct{}
	closed   bool
	gone     error // set when the broker end went away

	done     chan struct{} // closed when the reader has stopped
	readerWG sync.WaitGroup
	writerWG sync.WaitGroup
	stop     chan struct{} // closed by Close: the writer ends
}

type result struct {
	raw []byte
	err error
}

var (
	_ transport.Client     = (*Client)(nil)
	_ transport.HostCaller = (*Client)(nil)
)

// NewClient returns the host end of a pipe: it reads the broker's output
// from r and writes requests to w. The client owns both: Close closes w
// (the broker sees the end of its input), then r. A config that Validate
// refuses is an error, and r and w are left open.
func NewClient(r io.ReadCloser, w io.WriteCloser, cfg ClientConfig) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return newClient(r, w, nil, cfg), nil
}

// newClient is NewClient with a hook run by Close between closing w and
// closing r: waiting for a child to exit.
func newClient(r io.ReadCloser, w io.WriteCloser, between func() error, cfg ClientConfig) *Client {
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = wire.DefaultMaxMessageBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Client{cfg: cfg, w: w, closer: closerFunc(func() error {
		err := w.Close()
		if between != nil {
			err = errors.Join(err, between())
		}
		return errors.Join(err, r.Close())
	}), log: cfg.Logger, pending: map[uint64]chan result{}, sessions: map[*session]struct{}{}, done: make(chan struct{}),
		out: make(chan []byte, 256), stop: make(chan struct{})}
	c.readerWG.Add(1)
	go c.readLoop(r)
	c.writerWG.Add(1)
	go c.writeLoop()
	return c
}

// writeLoop writes the queued request lines until Close, or until a write
// fails (the broker is gone: its pending calls fail when the reader sees
// the end).
func (c *Client) writeLoop() {
	defer c.writerWG.Done()
	for {
		select {
		case line := <-c.out:
			if _, err := c.w.Write(line); err != nil {
				c.fail(fmt.Errorf("writing to the broker: %w", err))
				return
			}
		case <-c.stop:
			return
		}
	}
}

// closerFunc adapts a function to io.Closer.
type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// Done is closed when the broker end has gone away (or Close was called).
func (c *Client) Done() <-chan struct{} { return c.done }

func (c *Client) readLoop(r io.Reader) {
	defer c.readerWG.Done()
	defer close(c.done)
	// Responses may be far larger than requests (a page of tasks): read
	// lines up to maxResponseBytes.
	lr := newLineReader(r, maxResponseBytes)
	for {
		line, tooLong, err := lr.next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("the broker closed the pipe")
			}
			c.fail(err)
			return
		}
		if tooLong {
			c.log.Warn("over-long line from the broker skipped")
			continue
		}
		if blank(line) {
			continue
		}
		c.dispatch(line)
	}
}

// dispatch routes one line: a response to its call, a notification to its
// session.
func (c *Client) dispatch(line []byte) {
	r, ok := wire.ReadRoute(line)
	if !ok {
		c.log.Warn("unreadable line from the broker skipped")
		return
	}
	if r.Notification {
		c.subs.Deliver(r.Session, line)
		return
	}
	id, err := strconv.ParseUint(string(r.ID), 10, 64)
	if err != nil {
		// id null: the broker could not read a request of ours.
		c.log.Warn("response without a call id", "response", string(bytes.TrimSpace(line[:min(len(line), 200)])))
		return
	}
	c.mu.Lock()
	ch := c.pending[id]
	delete(c.pending, id)
	c.mu.Unlock()
	if ch != nil {
		ch <- result{raw: line}
	}
}

// fail ends every pending call and subscription: the broker is gone.
func (c *Client) fail(cause error) {
	c.mu.Lock()
	if c.gone == nil {
		c.gone = cause
	}
	pending := c.pending
	c.pending = map[uint64]chan result{}
	closed := c.closed
	c.mu.Unlock()
	err := fmt.Errorf("%w: %v", transport.ErrUnavailable, cause)
	if closed {
		err = transport.ErrClosed
	}
	for _, ch := range pending {
		ch <- result{err: err}
	}
	c.subs.Close()
}

// call sends one request and waits for its response.
func (c *Client) call(ctx context.Context, s *session, method string, params any) (json.RawMessage, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // an ended context sends nothing
	}
	id := c.nextID.Add(1)
	req, err := wire.EncodeRequest(id, method, params)
	if err != nil {
		return nil, err
	}
	if len(req) > c.cfg.MaxMessageBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", transport.ErrTooLarge, len(req), c.cfg.MaxMessageBytes)
	}
	ch := make(chan result, 1)
	c.mu.Lock()
	switch {
	case c.closed:
		c.mu.Unlock()
		return nil, transport.ErrClosed
	case c.gone != nil:
		err := c.gone
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: %v", transport.ErrUnavailable, err)
	}
	c.pending[id] = ch
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
	}

	req = append(req, '\n')
	var sessionDone <-chan struct{}
	if s != nil {
		sessionDone = s.subs.Done()
	}
	select {
	case c.out <- req:
	case <-ctx.Done():
		forget()
		return nil, ctx.Err()
	case <-sessionDone:
		forget()
		return nil, transport.ErrClosed
	case <-c.stop:
		forget()
		return nil, transport.ErrClosed
	case <-c.done:
		forget()
		return nil, fmt.Errorf("%w: %v", transport.ErrUnavailable, c.goneErr())
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, r.err
		}
		return wire.DecodeResult(r.raw)
	case <-ctx.Done():
		forget()
		return nil, ctx.Err()
	case <-sessionDone:
		forget()
		return nil, transport.ErrClosed
	}
}

// CallHost implements transport.HostCaller. On the pipe every call is the
// owner's, so a host call is an ordinary one.
func (c *Client) CallHost(ctx context.Context, method string, params any) (json.RawMessage, error) {
	return c.call(ctx, nil, method, params)
}

// Session implements transport.Client.
func (c *Client) Session(ctx context.Context, id string) (transport.Session, error) {
	if err := wire.ValidateID("session id", id); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, transport.ErrClosed
	}
	s := &session{c: c, id: id, subs: fanout.NewGroup()}
	c.sessions[s] = struct{}{}
	return s, nil
}

// Close implements transport.Client: it closes the pipe (the broker sees
// the end of its input and shuts down), fails pending calls with
// transport.ErrClosed and ends every subscription.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	sessions := c.sessions
	c.sessions = nil
	c.mu.Unlock()
	for s := range sessions {
		s.subs.Close()
	}
	close(c.stop)
	// Closing the pipe also ends a write blocked on a broker that does
	// not read.
	err := c.closer.Close()
	c.writerWG.Wait()
	c.fail(transport.ErrClosed)
	c.readerWG.Wait()
	return err
}

type session struct {
	c    *Client
	id   string
	subs *fanout.Group
}

func (s *session) ID() string { return s.id }

func (s *session) Call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	if s.subs.Closed() {
		return nil, transport.ErrClosed
	}
	return s.c.call(ctx, s, method, params)
}

func (s *session) Subscribe(context.Context) (transport.Subscription, error) {
	sub, err := s.subs.Subscribe(&s.c.subs, s.id, s.c.cfg.Buffer)
	if err != nil && !s.subs.Closed() {
		if gone := s.c.goneErr(); gone != nil {
			// The broker end is gone for good: nothing will ever arrive.
			return nil, fmt.Errorf("%w (%w: %v)", transport.ErrClosed, transport.ErrUnavailable, gone)
		}
	}
	return sub, err
}

func (c *Client) goneErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gone
}

func (s *session) Close() error {
	s.c.mu.Lock()
	delete(s.c.sessions, s)
	s.c.mu.Unlock()
	s.subs.Close()
	return nil
}
