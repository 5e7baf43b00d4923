package gateway

import (
	"container/list"
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Connection fairness (docs/PROTOCOL.md §12, Access): a connection is
// unauthenticated until a request on it passes auth. Those are bounded
// apart from the others and closed fast, so that no number of them, held
// or reopened, keeps a client with the token waiting: every connection is
// accepted at once (none waits in the kernel's queue), and the oldest
// unauthenticated one makes room for the newest, which is the last to go.
const (
	// MaxConnections bounds the authenticated connections open at once:
	// a request that would authenticate one more gets 503 and its
	// connection is closed.
	MaxConnections = 256
	// MaxConnectionsPerClient bounds the authenticated connections of one
	// client (the default token's counting as one): no client can take
	// the others' room.
	MaxConnectionsPerClient = 64
	// MaxUnauthenticated bounds the connections open at once on which no
	// request has passed auth yet: a new one beyond closes the oldest.
	// It is how long a client's fresh connection lasts under churn: as
	// many newer ones as this must come before its request is read. At
	// 64, strangers reopening ~5,000 connections a second closed a
	// fresh connection of a client with the token after 10-40 ms, before
	// its request was read; at 256 none was (TestChurningStrangers...).
	// Each costs a goroutine, its buffers (~20 KiB) and a descriptor.
	MaxUnauthenticated = 256
	// FirstRequestTimeout closes a connection on which no request has
	// passed auth this long after it was accepted: its first request's
	// headers have that long to come, not HeaderTimeout.
	FirstRequestTimeout = 2 * time.Second
)

// LimitListener accepts ln's connections at once and bounds them: at most
// MaxUnauthenticated unauthenticated ones that the server has begun to
// read (beyond, the oldest is closed), each closed FirstRequestTimeout
// after it was accepted unless a request on it passed auth by then; at
// most MaxConnections authenticated. It needs the Server's hooks
// (ConnContext), which tell it which are authenticated: serve it with
// Server.
//
// A connection counts from the server's first read on it, not from its
// accept: a client with the token sends its request as it connects, and
// the read that finds it is followed at once by auth. Counted from
// accept, a burst of connections accepted ahead of the server's reads
// would close it before it was read.
func LimitListener(ln net.Listener) net.Listener {
	return &limitListener{Listener: ln, fresh: list.New(), byClient: map[string]int{}}
}

type limitListener struct {
	net.Listener

	mu       sync.Mutex
	fresh    *list.List     // the unauthenticated *limitConn being read, oldest first
	authd    int            // authenticated connections open
	byClient map[string]int // of those, by client ("" the default one)
}

func (l *limitListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c := &limitConn{Conn: nc, l: l}
	l.mu.Lock()
	c.timer = time.AfterFunc(FirstRequestTimeout, c.expire)
	l.mu.Unlock()
	return c, nil
}

// limitConn is a connection of a limitListener. Its fields but started
// are guarded by l.mu.
type limitConn struct {
	net.Conn
	l *limitListener

	started atomic.Bool   // the server has begun to read it
	elem    *list.Element // in l.fresh: unauthenticated, being read, open
	timer   *time.Timer   // FirstRequestTimeout
	authd   bool          // counted in l.authd
	client  string        // the client it is counted for, once authd
	dropped bool          // closed by the listener (evicted or expired)
	closed  bool
}

func (c *limitConn) Read(p []byte) (int, error) {
	if !c.started.Load() && c.started.CompareAndSwap(false, true) {
		c.start()
	}
	return c.Conn.Read(p)
}

// start counts c among the unauthenticated connections being read, and
// closes the oldest if there are too many.
func (c *limitConn) start() {
	l := c.l
	var evict *limitConn
	l.mu.Lock()
	if !c.authd && !c.dropped && !c.closed {
		c.elem = l.fresh.PushBack(c)
		if l.fresh.Len() > MaxUnauthenticated {
			evict = l.fresh.Front().Value.(*limitConn)
			evict.drop()
		}
	}
	l.mu.Unlock()
	if evict != nil {
		// Its server goroutine's read fails at once, and it closes
		// the limitConn.
		_ = evict.Conn.Close()
	}
}

// drop takes c out of the unauthenticated, with l.mu held: the caller
// closes it.
func (c *limitConn) drop() {
	if c.elem != nil {
		c.l.fresh.Remove(c.elem)
		c.elem = nil
	}
	c.timer.Stop()
	c.dropped = true
}

// expire closes c if no request on it passed auth in time.
func (c *limitConn) expire() {
	c.l.mu.Lock()
	stale := !c.authd && !c.dropped && !c.closed
	if stale {
		c.drop()
	}
	c.l.mu.Unlock()
	if stale {
		_ = c.Conn.Close()
	}
}

// authenticate counts c as authenticated; false if it cannot be (too
// many are, or the listener closed it).
func (c *limitConn) authenticate(client string) bool {
	l := c.l
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case c.authd:
		return true
	case c.dropped, c.closed, l.authd >= MaxConnections, l.byClient[client] >= MaxConnectionsPerClient:
		return false
	}
	if c.elem != nil {
		l.fresh.Remove(c.elem)
		c.elem = nil
	}
	c.timer.Stop()
	c.authd, c.client = true, client
	l.authd++
	l.byClient[client]++
	return true
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	l := c.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.closed {
		return err
	}
	c.closed = true
	if c.elem != nil {
		l.fresh.Remove(c.elem)
		c.elem = nil
	}
	c.timer.Stop()
	if c.authd {
		l.authd--
		if l.byClient[c.client]--; l.byClient[c.client] <= 0 {
			delete(l.byClient, c.client)
		}
	}
	return err
}

// connKey carries a request's *limitConn (connContext).
type connKey struct{}

// connContext is the Server's ConnContext: it tells markAuthenticated the
// connection of a request.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if lc, ok := c.(*limitConn); ok {
		return context.WithValue(ctx, connKey{}, lc)
	}
	return ctx
}

// markAuthenticated is what auth does for a request that passed it: its
// connection is authenticated from now on. False if the connection cannot
// be (MaxConnections are, or MaxConnectionsPerClient of the client's),
// with the answer written: 503, and the connection closed. A request not
// served through LimitListener passes. client is the request's client
// ("" the default one).
func markAuthenticated(w http.ResponseWriter, r *http.Request, client string) bool {
	c, _ := r.Context().Value(connKey{}).(*limitConn)
	if c == nil || c.authenticate(client) {
		return true
	}
	w.Header().Set("Connection", "close")
	w.Header().Set("Retry-After", "1")
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
	http.Error(w, "too many connections with the token are open", http.StatusServiceUnavailable)
	return false
}
