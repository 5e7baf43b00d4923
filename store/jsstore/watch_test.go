package jsstore_test

import (
	"encoding/base64"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/internal/natscluster"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/store/jsstore"
)

// cutProxy forwards TCP connections to a server; cut closes them all and
// refuses new ones until mend, as a network that drops a host does.
type cutProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup
	mu     sync.Mutex
	down   bool
	conns  []net.Conn
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &cutProxy{ln: ln, target: target}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			down := p.down
			p.mu.Unlock()
			if down {
				c.Close()
				continue
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			p.wg.Go(func() { _, _ = io.Copy(u, c); u.Close() })
			p.wg.Go(func() { _, _ = io.Copy(c, u); c.Close() })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) url() string { return "nats://" + p.ln.Addr().String() }

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *cutProxy) mend() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

// A broker's registrations' watch whose connection is cut for a few
// seconds (its host's network, a node restarted) cannot see the removal
// of a registration made meanwhile by another broker as a message: a
// removal is a marker that lives two seconds (markerTTL), and the watch,
// resumed after the cut from where it was, finds nothing left of it.
// Sync tells it all the same (it compares what the watch told with the
// stored keys), so that the broker's copy does not keep the agent: its
// token, deregistered (or its session closed) through another broker,
// would go on working on this one.
//
// WatchRegistrations promises fn "with the instance of every registration
// put or deleted", and Sync "once the watch has called fn for every
// change stored before Sync was called".
func TestAWatchCutLongerThanARemovalMarkerLivesStillTellsTheRemoval(t *testing.T) {
	ctx := ctxT(t)
	nodes := natscluster.Start(t, 3, natscluster.Options{})
	direct, err := nats.Connect(nodes.URL(0))
	require.NoError(t, err)
	t.Cleanup(direct.Close)
	p := newCutProxy(t, nodes.URL(0)[len("nats://"):])
	cutConn, err := nats.Connect(p.url(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.IgnoreDiscoveredServers())
	require.NoError(t, err)
	t.Cleanup(cutConn.Close)

	const prefix = "review"
	open := func(nc *nats.Conn) *jsstore.Store {
		s, err := jsstore.Open(ctx, nc, jsstore.Config{Replicas: 3, Prefix: prefix})
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		return s
	}
	other := open(direct)    // another broker's
	watched := open(cutConn) // the broker whose network is cut
	reg := func(instance string) store.Registration {
		return store.Registration{Instance: instance, Session: "s", AgentID: instance, Name: instance, Card: []byte(`{}`)}
	}
	require.NoError(t, other.PutRegistration(ctx, reg("gone")))

	var mu sync.Mutex
	calls := map[string]int{}
	stop, err := watched.WatchRegistrations(ctx, func(instance string) {
		mu.Lock()
		calls[instance]++
		mu.Unlock()
	})
	require.NoError(t, err)
	t.Cleanup(stop)
	count := func(instance string) int {
		mu.Lock()
		defer mu.Unlock()
		return calls[instance]
	}
	require.Equal(t, 1, count("gone"))

	p.cut()
	waitFor(t, "the watched store's connection is cut", func() bool { return !cutConn.IsConnected() })
	require.NoError(t, other.DeleteRegistration(ctx, "gone"))
	// The removal marker expires; then another registration is stored.
	js, err := jetstream.New(direct)
	require.NoError(t, err)
	str, err := js.Stream(ctx, "KV_"+prefix+"_agents")
	require.NoError(t, err)
	goneSubj := "$KV." + prefix + "_agents.r." + base64.RawURLEncoding.EncodeToString([]byte("gone"))
	waitFor(t, "the removal marker expires", func() bool {
		_, err := str.GetLastMsgForSubject(ctx, goneSubj)
		return err != nil
	})
	require.NoError(t, other.PutRegistration(ctx, reg("later")))

	p.mend()
	waitFor(t, "the watched store's connection is back", cutConn.IsConnected)
	_, err = watched.Sync(ctx)
	require.NoError(t, err)
	waitFor(t, "the watch tells the registration stored after the cut", func() bool { return count("later") > 0 })

	assert.Equal(t, 2, count("gone"),
		"the watch never told the removal of a registration stored before Sync: the broker's copy keeps it")
}

// waitFor polls cond until it holds, or fails the test after a generous
// deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: never", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
