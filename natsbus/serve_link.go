package natsbus

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// sessionLink is the broker's connection that serves one session's
// requests in the sessions account (see sessionsAccount and
// Bus.serveSession): the NATS client protocol over the embedded server's
// in-process pipe, with no more of it than serving takes: one
// subscription, the replies, the server's pings. Every opened session
// has one, idle or not, so it is kept small: one goroutine, and a read
// buffer that is a few hundred bytes while the session is idle. (A
// nats.go connection holds a 32 KiB read buffer and four goroutines,
// which made most of what an idle session cost.)
//
// The server delivers the messages of the one subscription; the link
// reads them in order and hands each to its handler, which must not
// block (the bus hands them to its fair queue). What the link reads
// through is the session's gate (gatedConn), so a session with enough
// requests waiting is not read, and the server holds and slows down what
// it sends.
type sessionLink struct {
	conn    net.Conn
	payload int
	handle  func(inbound)
	// ended is called once the reader has ended, on its goroutine, before
	// Close returns; closed tells whether Close ended it. It must not
	// wait for the link.
	ended func(l *sessionLink, closed bool)

	wmu sync.Mutex // one protocol write at a time

	mu     sync.Mutex
	pongs  []chan error // flushes waiting for their PONG, in the order of their PINGs
	closed bool         // Close was called
	gone   error        // why the reader ended; nil while it reads

	rd        linkReader
	done      chan struct{} // closed when the reader has ended
	closeOnce sync.Once
}

// inbound is a request as the bus receives it, on the broker's main
// connection (nats.go) or on a session's link.
type inbound struct {
	subject, reply string
	data           []byte
	// publish sends a message on the connection the request came by.
	publish func(subject string, data []byte) error
	// home is the request's A2A-Broker header, as it came.
	home string
}

// homeBroker is the broker the request's A2A-Broker header names, or ""
// when it names none or is not a broker's name.
func (m inbound) homeBroker() string {
	if !ValidBrokerName(m.home) {
		return ""
	}
	return m.home
}

// linkConfig is what dialLink needs: the credential and name the link
// connects with, the subject it serves, the server's payload limit, the
// handler of its messages and what to do when it ends.
type linkConfig struct {
	user, password, name string
	subject              string
	payload              int
	handle               func(inbound)
	ended                func(l *sessionLink, closed bool)
}

// The link's protocol bounds.
const (
	// linkSetup bounds the handshake: the server's INFO, then the answer
	// to CONNECT, SUB and PING.
	linkSetup = 10 * time.Second
	// linkBufMin and linkBufMax bound the read buffer: it starts at
	// linkBufMin, doubles while reads fill it, and goes back to
	// linkBufMin once reads come short again and it is empty.
	linkBufMin = 512
	linkBufMax = 64 << 10
	// maxLinkLine bounds a protocol line (an INFO is the longest).
	maxLinkLine = 64 << 10
	// linkSID is the link's one subscription's id.
	linkSID = "1"
)

// errLinkClosed is returned by the writes of a link that has ended.
var errLinkClosed = errors.New("natsbus: the session's link is closed")

// dialLink makes a link over conn: it reads the server's INFO, connects,
// subscribes to cfg.subject, and returns once the server has answered a
// PING after those, so that a request published from then on finds the
// subscription. On an error conn is closed.
func dialLink(conn net.Conn, cfg linkConfig) (*sessionLink, error) {
	l := &sessionLink{conn: conn, payload: cfg.payload, handle: cfg.handle, ended: cfg.ended, done: make(chan struct{})}
	l.rd.r = conn
	if err := l.handshake(cfg); err != nil {
		conn.Close()
		return nil, fmt.Errorf("natsbus: serve session: %w", err)
	}
	go l.read()
	return l, nil
}

func (l *sessionLink) handshake(cfg linkConfig) error {
	if err := l.conn.SetDeadline(time.Now().Add(linkSetup)); err != nil {
		return err
	}
	line, err := l.rd.line()
	if err != nil {
		return fmt.Errorf("read the server's INFO: %w", err)
	}
	if !bytes.HasPrefix(line, []byte("INFO ")) {
		return fmt.Errorf("the server sent %.64q, not INFO", line)
	}
	connect, err := json.Marshal(struct {
		Verbose  bool   `json:"verbose"`
		Pedantic bool   `json:"pedantic"`
		User     string `json:"user"`
		Pass     string `json:"pass"`
		Name     string `json:"name"`
		Lang     string `json:"lang"`
		Version  string `json:"version"`
		Protocol int    `json:"protocol"`
		Headers  bool   `json:"headers"`
	}{User: cfg.user, Pass: cfg.password, Name: cfg.name, Lang: "go", Version: "a2a-bus", Protocol: 1})
	if err != nil {
		return err
	}
	out := fmt.Appendf(nil, "CONNECT %s\r\nSUB %s %s\r\nPING\r\n", connect, cfg.subject, linkSID)
	if _, err := l.conn.Write(out); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	for {
		line, err := l.rd.line()
		if err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		switch {
		case bytes.Equal(line, []byte("PONG")):
			return l.conn.SetDeadline(time.Time{})
		case bytes.Equal(line, []byte("PING")):
			if _, err := l.conn.Write([]byte("PONG\r\n")); err != nil {
				return fmt.Errorf("connect: %w", err)
			}
		case bytes.HasPrefix(line, []byte("-ERR")):
			return fmt.Errorf("the server refused the connection: %s", bytes.TrimSpace(line[len("-ERR"):]))
		}
	}
}

// read reads what the server sends until the link ends.
func (l *sessionLink) read() {
	err := l.serve()
	l.mu.Lock()
	if l.gone == nil { // else the server said why (-ERR)
		l.gone = err
	}
	pongs := l.pongs
	l.pongs = nil
	closed := l.closed
	l.mu.Unlock()
	for _, p := range pongs {
		p <- errLinkClosed
	}
	l.conn.Close()
	// Before done: whoever waits in Close knows what ended started.
	if l.ended != nil {
		l.ended(l, closed)
	}
	close(l.done)
}

func (l *sessionLink) serve() error {
	for {
		line, err := l.rd.line()
		if err != nil {
			return err
		}
		switch {
		case bytes.HasPrefix(line, []byte("MSG ")):
			m, err := l.message(line[len("MSG "):])
			if err != nil {
				return err
			}
			l.handle(m)
		case bytes.Equal(line, []byte("PING")):
			if err := l.write([]byte("PONG\r\n")); err != nil {
				return err
			}
		case bytes.Equal(line, []byte("PONG")):
			l.mu.Lock()
			var p chan error
			if len(l.pongs) > 0 {
				p = l.pongs[0]
				l.pongs = l.pongs[1:]
			}
			l.mu.Unlock()
			if p != nil {
				p <- nil
			}
		case bytes.HasPrefix(line, []byte("-ERR")):
			// The server closes the connection after it (a slow
			// consumer, a stale connection): the read that follows ends.
			l.mu.Lock()
			if l.gone == nil {
				l.gone = fmt.Errorf("the server: %s", bytes.TrimSpace(line[len("-ERR"):]))
			}
			l.mu.Unlock()
		}
		// INFO and +OK say nothing the link needs.
	}
}

// message reads the payload of the message whose MSG line's arguments
// are args: subject sid [reply] size.
func (l *sessionLink) message(args []byte) (inbound, error) {
	f := bytes.Fields(args)
	if len(f) != 3 && len(f) != 4 {
		return inbound{}, fmt.Errorf("natsbus: a MSG line with %d arguments", len(f))
	}
	size, err := strconv.Atoi(string(f[len(f)-1]))
	if err != nil || size < 0 || size > l.payload {
		return inbound{}, fmt.Errorf("natsbus: a MSG of size %q (the limit is %d)", f[len(f)-1], l.payload)
	}
	m := inbound{subject: string(f[0]), publish: l.publish}
	if len(f) == 4 {
		m.reply = string(f[2])
	}
	m.data = make([]byte, size+2)
	if err := l.rd.full(m.data); err != nil {
		return inbound{}, err
	}
	if !bytes.HasSuffix(m.data, []byte("\r\n")) {
		return inbound{}, errors.New("natsbus: a MSG payload not followed by CRLF")
	}
	m.data = m.data[:size:size]
	return m, nil
}

// write writes b whole, alone. The reader writes too (PONG, a busy
// answer): that cannot wait on itself, because the server's reader of
// the connection never waits on what it writes to it (it leaves that to
// the connection's writer), so a write returns once the server has read
// it.
func (l *sessionLink) write(b ...[]byte) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return l.writeLocked(b...)
}

// writeLocked writes b; l.wmu is held.
func (l *sessionLink) writeLocked(b ...[]byte) error {
	bufs := net.Buffers(b)
	if _, err := bufs.WriteTo(l.conn); err != nil {
		return fmt.Errorf("%w: %v", errLinkClosed, err)
	}
	return nil
}

// publish sends data to subject: nats.ErrMaxPayload when it is over the
// server's payload limit.
func (l *sessionLink) publish(subject string, data []byte) error {
	if len(data) > l.payload {
		return nats.ErrMaxPayload
	}
	head := fmt.Appendf(make([]byte, 0, len(subject)+24), "PUB %s %d\r\n", subject, len(data))
	if len(data) <= linkBufMin {
		// Small: in one write (each write is a hand-off on the pipe).
		return l.write(append(append(head, data...), '\r', '\n'))
	}
	return l.write(head, data, []byte("\r\n"))
}

// flush returns once the server has processed what the link wrote before
// it and the reader has handled what the server sent before its answer,
// or after timeout.
func (l *sessionLink) flush(timeout time.Duration) error {
	p := make(chan error, 1)
	l.wmu.Lock()
	l.mu.Lock()
	if l.gone != nil || l.closed {
		l.mu.Unlock()
		l.wmu.Unlock()
		return errLinkClosed
	}
	l.pongs = append(l.pongs, p)
	l.mu.Unlock()
	err := l.writeLocked([]byte("PING\r\n"))
	l.wmu.Unlock()
	if err != nil {
		return err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case err := <-p:
		return err
	case <-t.C:
		return nats.ErrTimeout
	}
}

// drain ends the subscription and returns once every message the server
// delivered before that has been handled, or after timeout.
func (l *sessionLink) drain(timeout time.Duration) error {
	if err := l.write([]byte("UNSUB " + linkSID + "\r\n")); err != nil {
		return err
	}
	return l.flush(timeout)
}

// err returns why the reader ended, once it has.
func (l *sessionLink) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.gone
}

// Close closes the link and waits for its reader to end. Idempotent; not
// to be called by its handler or ended.
func (l *sessionLink) Close() {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
		l.conn.Close()
	})
	<-l.done
}

// linkReader reads the server's protocol: lines, and the payloads that
// follow MSG lines. Its buffer grows while reads fill it (a busy
// session), up to linkBufMax, and goes back to linkBufMin once it is
// empty and the last reads came short (an idle one).
type linkReader struct {
	r          io.Reader
	buf        []byte
	start, end int // what is read and not yet taken
	shorts     int // reads in a row that filled less than a quarter of the buffer
}

// line returns the next line, without its CRLF, valid until the next
// call.
func (r *linkReader) line() ([]byte, error) {
	for scanned := 0; ; {
		if i := bytes.IndexByte(r.buf[r.start+scanned:r.end], '\n'); i >= 0 {
			line := r.buf[r.start : r.start+scanned+i]
			r.start += scanned + i + 1
			return bytes.TrimSuffix(line, []byte("\r")), nil
		}
		scanned = r.end - r.start
		if scanned >= maxLinkLine {
			return nil, fmt.Errorf("natsbus: a protocol line of over %d bytes", maxLinkLine)
		}
		if err := r.fill(); err != nil {
			return nil, err
		}
	}
}

// full reads len(p) bytes into p: those buffered, then the rest straight
// from the connection.
func (r *linkReader) full(p []byte) error {
	n := copy(p, r.buf[r.start:r.end])
	r.start += n
	if n == len(p) {
		return nil
	}
	_, err := io.ReadFull(r.r, p[n:])
	return err
}

// fill reads more into the buffer, keeping what is not taken yet.
func (r *linkReader) fill() error {
	switch {
	case r.start == r.end && r.shorts >= 2 && len(r.buf) > linkBufMin:
		r.buf, r.shorts = nil, 0 // made again below, small
		fallthrough
	case r.start == r.end:
		r.start, r.end = 0, 0
	case r.start > 0:
		r.end = copy(r.buf, r.buf[r.start:r.end])
		r.start = 0
	}
	if r.buf == nil {
		r.buf = make([]byte, linkBufMin)
	}
	if r.end == len(r.buf) { // a line longer than the buffer
		r.grow()
	}
	room := len(r.buf) - r.end
	n, err := r.r.Read(r.buf[r.end:])
	r.end += n
	switch {
	case n == room && len(r.buf) < linkBufMax:
		r.grow()
		r.shorts = 0
	case n < len(r.buf)/4:
		r.shorts++
	default:
		r.shorts = 0
	}
	if n > 0 {
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

// grow doubles the buffer.
func (r *linkReader) grow() {
	buf := make([]byte, 2*len(r.buf))
	copy(buf, r.buf[:r.end])
	r.buf = buf
}
