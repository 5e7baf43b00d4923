package pipebus

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// Defaults of Config's zero fields.
const (
	DefaultQueue        = 4096
	DefaultMaxInFlight  = 256
	DefaultWriteTimeout = 30 * time.Second
)

// Config configures the broker end. The zero value is the default
// everywhere; no setting is turned off by a sign: a negative one is an
// error (Validate).
type Config struct {
	// MaxMessageBytes is the longest line read; a longer one is answered
	// -32600 (id null) without being buffered whole. 0 means
	// wire.DefaultMaxMessageBytes.
	MaxMessageBytes int
	// Queue is how many outgoing lines wait for the writer. When it is
	// full a notification is dropped (its session replays it) and a
	// response waits. 0 means DefaultQueue.
	Queue int
	// MaxInFlight bounds the requests being handled at once; past it the
	// bus stops reading, so a flood cannot grow memory without bound.
	// 0 means DefaultMaxInFlight.
	MaxInFlight int
	// WriteTimeout is how long one write may block before the reader at
	// the other end is taken for dead and the bus fails, when the writer
	// supports deadlines (os.Pipe, sockets, Stdio). 0 means
	// DefaultWriteTimeout.
	WriteTimeout time.Duration
	// CloseGrace is how long Close lets the requests being served finish
	// (and answers them) before it cancels them. 0 means
	// DefaultCloseGrace.
	CloseGrace time.Duration
	// Logger receives the bus's logs. nil discards them.
	Logger *slog.Logger
}

// Validate reports the first setting of cfg that is out of range.
func (cfg Config) Validate() error {
	if err := validMessageBytes("Config", cfg.MaxMessageBytes); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"Queue", int64(cfg.Queue)},
		{"MaxInFlight", int64(cfg.MaxInFlight)},
		{"WriteTimeout", int64(cfg.WriteTimeout)},
		{"CloseGrace", int64(cfg.CloseGrace)},
	} {
		if f.v < 0 {
			return fmt.Errorf("pipebus: Config.%s is negative: want 0 (the default) or more", f.name)
		}
	}
	return nil
}

// validMessageBytes checks a MaxMessageBytes: the broker's bounds, or 0.
func validMessageBytes(config string, n int) error {
	if n < 0 || n > wire.MaxMessageLimit {
		return fmt.Errorf("pipebus: %s.MaxMessageBytes is %d: want 0 (wire.DefaultMaxMessageBytes) to %d", config, n, wire.MaxMessageLimit)
	}
	return nil
}

// Bus is the broker end of a pipe. It implements transport.Bus.
type Bus struct {
	cfg Config
	r   io.Reader
	w   io.Writer
	log *slog.Logger

	ctx    context.Context // canceled when the bus stops: the writer drains and ends
	cancel context.CancelFunc
	// hctx is the handlers' context: canceled when the bus stops on a
	// failure, or when Close's grace runs out.
	hctx    context.Context
	hcancel context.CancelFunc
	closing atomic.Bool // Close has begun: the reader's end is expected
	out     chan []byte // lines for the writer, without "\n"

	mu      sync.Mutex
	serving bool
	closed  bool
	err     error // why the bus stopped, when it stopped by itself

	done     chan struct{} // closed when the bus has stopped
	stopOnce sync.Once
	readerWG sync.WaitGroup // the reader
	writerWG sync.WaitGroup // the writer
	handlers sync.WaitGroup // running handler calls
	// work hands a request to an idle worker; workers are the goroutines
	// that run them, ended by the bus's stop (or their idleness).
	work    chan func()
	workers sync.WaitGroup

	dropped atomic.Uint64
}

var (
	_ transport.Bus            = (*Bus)(nil)
	_ transport.PayloadLimiter = (*Bus)(nil)
)

// MaxPayload implements transport.PayloadLimiter: the longest line the
// broker end writes, wire.NewLimits(MaxMessageBytes).Payload. The host
// end reads lines up to wire.MaxPayload, whatever its own settings.
func (b *Bus) MaxPayload() int { return wire.NewLimits(b.cfg.MaxMessageBytes).Payload }

// ErrPeerGone is the stop reason when the other end stops reading: a write
// failed or blocked past the write timeout.
var ErrPeerGone = errors.New("pipebus: the other end stopped reading")

// New returns the broker end of a pipe that reads requests from r and
// writes to w. The bus owns r and w: Close closes them if they are
// io.Closers, which also interrupts a blocked read or write when they are
// pollable (os.Pipe, sockets, Stdio's files). A config that Validate
// refuses is an error, and then r and w stay the caller's.
func New(r io.Reader, w io.Writer, cfg Config) (*Bus, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = wire.DefaultMaxMessageBytes
	}
	if cfg.Queue == 0 {
		cfg.Queue = DefaultQueue
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.CloseGrace == 0 {
		cfg.CloseGrace = DefaultCloseGrace
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &Bus{cfg: cfg, r: r, w: w, log: cfg.Logger, ctx: ctx, cancel: cancel,
		out: make(chan []byte, cfg.Queue), work: make(chan func()), done: make(chan struct{})}
	b.hctx, b.hcancel = context.WithCancel(ctx)
	b.writerWG.Add(1)
	go b.writeLoop()
	return b, nil
}

// Serve implements transport.Bus: it starts reading requests.
func (b *Bus) Serve(h transport.Handler) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.closed:
		return transport.ErrClosed
	case b.serving:
		return transport.ErrServing
	}
	b.serving = true
	b.readerWG.Add(1)
	go b.readLoop(h)
	return nil
}

// Done is closed when the bus has stopped: on Close, at the end of its
// input (the host closed it: a clean shutdown), or on a failure to write.
func (b *Bus) Done() <-chan struct{} { return b.done }

// Err says why the bus stopped: nil after Close or at the end of the
// input, ErrPeerGone (wrapped) when the other end stopped reading, what
// Validate said of a config New was given that it refuses.
func (b *Bus) Err() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// Dropped counts the notifications lost because the writer's queue was
// full.
func (b *Bus) Dropped() uint64 { return b.dropped.Load() }

// stop ends the bus once, for the given reason.
func (b *Bus) stop(err error) {
	b.stopOnce.Do(func() {
		b.mu.Lock()
		b.closed = true
		b.err = err
		b.mu.Unlock()
		b.cancel()
		close(b.done)
	})
}

// Publish implements transport.Bus. Every notification goes down the one
// pipe; the client end routes it by recipientContextId.
func (b *Bus) Publish(_ string, msg []byte) error {
	select {
	case <-b.ctx.Done():
		return transport.ErrClosed
	default:
	}
	select {
	case b.out <- msg:
		return nil
	default:
		if b.dropped.Add(1)%1000 == 1 {
			b.log.Warn("pipe writer is behind: notifications dropped; sessions replay them", "dropped", b.dropped.Load())
		}
		return nil
	}
}

// respond queues a response; it waits for room, not for the write.
func (b *Bus) respond(line []byte) {
	select {
	case b.out <- line:
	case <-b.ctx.Done():
	}
}

// DefaultCloseGrace is Close's wait for the requests being served.
const DefaultCloseGrace = 5 * time.Second

// Close implements transport.Bus: it stops reading, lets the requests
// being served finish for up to CloseGrace (then cancels them), writes
// their answers and what else is queued (briefly), and closes r and w. So
// a request read before Close is answered. Idempotent.
func (b *Bus) Close() error {
	b.closing.Store(true)
	finished := make(chan struct{})
	var grace sync.WaitGroup
	grace.Go(func() {
		select {
		case <-finished:
		case <-time.After(b.cfg.CloseGrace):
			b.hcancel()
		}
	})
	if c, ok := b.r.(io.Closer); ok {
		c.Close()
	}
	b.readerWG.Wait() // the reader may be waiting for the handlers too
	b.handlers.Wait()
	close(finished)
	grace.Wait()
	b.stop(nil)
	b.workers.Wait()
	b.writerWG.Wait()
	if c, ok := b.w.(io.Closer); ok {
		c.Close()
	}
	return nil
}

func (b *Bus) readLoop(h transport.Handler) {
	defer b.readerWG.Done()
	lr := newLineReader(b.r, b.cfg.MaxMessageBytes)
	sem := make(chan struct{}, b.cfg.MaxInFlight)
	from := transport.Caller{Scope: transport.ScopeOwner}
	for {
		line, tooLong, err := lr.next()
		if err != nil {
			if b.closing.Load() {
				return // Close stopped the reading: it waits for the rest
			}
			if b.ctx.Err() == nil {
				if errors.Is(err, io.EOF) {
					b.log.Info("end of input: shutting down")
				} else {
					b.log.Warn("reading the pipe failed: shutting down", "error", err)
				}
			}
			// Let the answers to what was read go out first.
			b.handlers.Wait()
			b.stop(nil)
			return
		}
		if tooLong {
			b.log.Warn("line over the size limit rejected", "limit", b.cfg.MaxMessageBytes)
			b.respond(wire.ErrorResponse(nil, wire.ErrInvalidRequest.Withf("message over the limit of %d bytes", b.cfg.MaxMessageBytes)))
			continue
		}
		if blank(line) {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-b.ctx.Done():
			return
		}
		b.handlers.Add(1)
		b.run(func() {
			defer b.handlers.Done()
			defer func() { <-sem }()
			if resp := h.ServeRPC(b.hctx, from, line); resp != nil {
				if limit := b.MaxPayload(); len(resp) > limit {
					// The host end would skip the line and its call would
					// wait for ever: answer that it is too large.
					var id json.RawMessage
					if req, _ := wire.ParseRequest(line, len(line)); req != nil {
						id = req.ID
					}
					resp = wire.ErrorResponse(id, wire.ErrInternal.Withf("the response of %d bytes is over the pipe's limit of %d", len(resp), limit))
				}
				b.respond(resp)
			}
		})
	}
}

// workerIdle is how long a worker waits for its next request before it
// ends.
var workerIdle = time.Second

// run runs job on an idle worker, or a new one. Workers stay a while for
// the next request: it then runs on a goroutine whose stack has already
// grown to what serving takes, and no goroutine is started for it. At
// most MaxInFlight jobs run at once, so there are no more workers.
func (b *Bus) run(job func()) {
	select {
	case b.work <- job:
	default:
		b.workers.Go(func() { b.worker(job) })
	}
}

func (b *Bus) worker(job func()) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		job()
		idle.Reset(workerIdle)
		select {
		case job = <-b.work:
		case <-idle.C:
			return
		case <-b.ctx.Done():
			return
		}
	}
}

type deadliner interface{ SetWriteDeadline(time.Time) error }

// finalFlushTimeout bounds the last flush at shutdown, so that Close does
// not wait long for a peer that no longer reads.
const finalFlushTimeout = 2 * time.Second

func (b *Bus) writeLoop() {
	defer b.writerWG.Done()
	bw := bufio.NewWriterSize(b.w, 64<<10)
	dl, _ := b.w.(deadliner)
	if dl != nil && dl.SetWriteDeadline(time.Time{}) != nil {
		dl = nil // a file that is not pollable has no deadlines
	}
	timeout := b.cfg.WriteTimeout
	// write buffers one line; a line larger than the buffer, and Flush,
	// reach w, each under a fresh deadline.
	write := func(line []byte) error {
		if dl != nil && len(line)+1 > bw.Available() { // it reaches w
			dl.SetWriteDeadline(time.Now().Add(timeout))
		}
		if _, err := bw.Write(line); err != nil {
			return err
		}
		return bw.WriteByte('\n')
	}
	flush := func() error {
		if dl != nil {
			dl.SetWriteDeadline(time.Now().Add(timeout))
		}
		return bw.Flush()
	}
	for {
		var err error
		select {
		case line := <-b.out:
			err = write(line)
		case <-b.ctx.Done():
			// Send what is queued, briefly, then stop.
			timeout = min(timeout, finalFlushTimeout)
			for err == nil {
				select {
				case line := <-b.out:
					err = write(line)
					continue
				default:
				}
				break
			}
			if err == nil {
				flush()
			}
			return
		}
		// Take what else is queued into the same flush.
		for more := true; more && err == nil; {
			select {
			case line := <-b.out:
				err = write(line)
			default:
				more = false
			}
		}
		if err == nil {
			err = flush()
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				err = fmt.Errorf("no write went through for %v", timeout)
			}
			b.log.Error("writing the pipe failed: shutting down", "error", err)
			b.stop(fmt.Errorf("%w: %v", ErrPeerGone, err))
			return
		}
	}
}
