package natsbus_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// natsProc is a nats-server process of a test, started from a
// configuration file, with the addresses it listens on.
type natsProc struct {
	url   string // clients
	route string // cluster routes, "" without a cluster block
	leaf  string // leaf nodes, "" without a leafnodes block
}

var listening = regexp.MustCompile(`Listening for (route|leafnode) connections on (\S+)`)

// runNATS starts nats-server with the configuration conf (every listen
// address on 127.0.0.1:-1, so that it picks its ports) and returns once
// it is ready. The process is stopped and waited for at the end of the
// test.
func runNATS(t *testing.T, conf string) *natsProc {
	t.Helper()
	bin := testbin.Build(t, "github.com/nats-io/nats-server/v2")
	file := filepath.Join(t.TempDir(), "nats.conf")
	require.NoError(t, os.WriteFile(file, []byte(conf), 0o600))
	log := &serverLog{ready: make(chan struct{})}
	cmd := exec.Command(bin, "-c", file)
	cmd.Stdout, cmd.Stderr = io.Discard, log
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	})
	select {
	case <-log.ready:
	case <-time.After(10 * time.Second):
		t.Fatalf("nats-server did not start: %s", log.lines())
	}
	p := &natsProc{url: log.clientURL()}
	require.NotEmpty(t, p.url, "nats-server logged no client address: %s", log.lines())
	// The route listener may start after "Server is ready".
	wantRoute, wantLeaf := strings.Contains(conf, "cluster {"), strings.Contains(conf, "leafnodes { listen")
	require.Eventually(t, func() bool {
		for _, m := range listening.FindAllStringSubmatch(log.lines(), -1) {
			if m[1] == "route" {
				p.route = "nats://" + m[2]
			} else {
				p.leaf = "nats://" + m[2]
			}
		}
		return (p.route != "") == wantRoute && (p.leaf != "") == wantLeaf
	}, 10*time.Second, 5*time.Millisecond, "nats-server logged not all its addresses: %s", log.lines())
	return p
}

// clusterBlock is the cluster block of a node of the test cluster named
// c, with routes to the given nodes.
func clusterBlock(routes ...*natsProc) string {
	var list string
	for _, r := range routes {
		list += fmt.Sprintf("%q, ", r.route)
	}
	return fmt.Sprintf("cluster { name: c, listen: \"127.0.0.1:-1\", routes: [%s] }\n", list)
}

// twoNodes starts a cluster of two nodes; extra goes into both
// configurations (it must not listen on fixed ports).
func twoNodes(t *testing.T, extra string) (n1, n2 *natsProc) {
	t.Helper()
	n1 = runNATS(t, "listen: \"127.0.0.1:-1\"\nserver_name: n1\n"+extra+clusterBlock())
	n2 = runNATS(t, "listen: \"127.0.0.1:-1\"\nserver_name: n2\n"+extra+clusterBlock(n1))
	return n1, n2
}

// connect connects a plain client, closed at the end of the test.
func connect(t *testing.T, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// waitRouted waits until a subscriber on from's server is reached from
// each of the others: the route between them is up.
func waitRouted(t *testing.T, from *nats.Conn, others ...*nats.Conn) {
	t.Helper()
	subject := nats.NewInbox()
	sub, err := from.Subscribe(subject, func(m *nats.Msg) { m.Respond(nil) })
	require.NoError(t, err)
	defer sub.Unsubscribe()
	require.NoError(t, from.Flush())
	for _, nc := range others {
		require.Eventually(t, func() bool {
			_, err := nc.Request(subject, nil, 200*time.Millisecond)
			return err == nil
		}, 10*time.Second, 10*time.Millisecond, "the route never carried a request")
	}
}

// served records which bus served each request, by its JSON-RPC id.
type served struct {
	mu   sync.Mutex
	byID map[string][]string
}

// handler is the broker side of the bus named name: it answers every
// request with that name.
func (s *served) handler(name string) transport.Handler {
	return transport.HandlerFunc(func(_ context.Context, _ transport.Caller, raw []byte) []byte {
		req, _ := wire.ParseRequest(raw, 0)
		s.mu.Lock()
		s.byID[string(req.ID)] = append(s.byID[string(req.ID)], name)
		s.mu.Unlock()
		resp, _ := wire.EncodeResult(req.ID, map[string]string{"by": name})
		return resp
	})
}

// servers returns, per request, the buses that served it.
func (s *served) servers() map[string][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]string{}
	for id, by := range s.byID {
		out[id] = append([]string(nil), by...)
	}
	return out
}

// asker sends host requests with fresh ids and says which bus answered.
type asker struct {
	mu   sync.Mutex
	next uint64
}

func (a *asker) ask(nc *nats.Conn, timeout time.Duration) (string, error) {
	a.mu.Lock()
	a.next++
	id := a.next
	a.mu.Unlock()
	req, err := wire.EncodeRequest(id, "test.who", nil)
	if err != nil {
		return "", err
	}
	msg, err := nc.Request(natsbus.HostRPC, req, timeout)
	if err != nil {
		return "", err
	}
	res, err := wire.DecodeResult(msg.Data)
	if err != nil {
		return "", err
	}
	var got struct{ By string }
	err = json.Unmarshal(res, &got)
	return got.By, err
}

// serveOn starts a bus on url, in group, that answers with its name.
func serveOn(t *testing.T, url, group, name string, s *served) *natsbus.Bus {
	t.Helper()
	b, err := natsbus.New(natsbus.Config{URL: url, QueueGroup: group, CloseGrace: testGrace})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	require.NoError(t, b.Serve(s.handler(name)))
	return b
}

// TestBrokersInAQueueGroupShareTheRequests: two brokers on two nodes of a
// cluster, in one queue group, serve each request once, and when one
// goes the other serves them all.
//
// Within one cluster the server does not prefer the queue member on the
// publisher's own server: in (*client).processMsgResults
// (server/client.go of nats-server), a message from a CLIENT picks a
// queue subscription at random among all of them (weightedQSubIndex,
// each remote server's members weighted by their count) and, when it
// lands on a ROUTER's, forwards it there ("Pick this one and be done");
// only a message that arrives from a route prefers a local member, and
// only a LEAF member is kept as a fallback behind local ones. So a
// host's requests are spread over the brokers of the cluster; the test
// checks that they are, so that a server that changes this is noticed.
// (TestALeafNodeKeepsRequestsWithItsBroker shows the topology in which a
// host's own broker is preferred.)
func TestBrokersInAQueueGroupShareTheRequests(t *testing.T) {
	n1, n2 := twoNodes(t, "")
	c1, c2 := connect(t, n1.url), connect(t, n2.url)
	waitRouted(t, c1, c2)
	waitRouted(t, c2, c1)

	t.Run("without a queue group every broker serves every request", func(t *testing.T) {
		s := &served{byID: map[string][]string{}}
		b1 := serveOn(t, n1.url, "", "b1", s)
		b2 := serveOn(t, n2.url, "", "b2", s)
		var a asker
		// Both subscriptions are known on both nodes once a request has
		// been served by both.
		require.Eventually(t, func() bool {
			if _, err := a.ask(c1, time.Second); err != nil {
				return false
			}
			for _, by := range s.servers() {
				if len(by) == 2 {
					return true
				}
			}
			return false
		}, 10*time.Second, 10*time.Millisecond)
		b1.Close()
		b2.Close()
	})

	s := &served{byID: map[string][]string{}}
	b1 := serveOn(t, n1.url, "brokers", "b1", s)
	serveOn(t, n2.url, "brokers", "b2", s)
	var a asker
	// From each node, requests reach both brokers: the one on the
	// client's own server and the one across the route.
	for _, c := range []*nats.Conn{c1, c2} {
		byBus := map[string]int{}
		require.Eventually(t, func() bool {
			by, err := a.ask(c, time.Second)
			if err == nil {
				byBus[by]++
			}
			return byBus["b1"] > 0 && byBus["b2"] > 0
		}, 10*time.Second, time.Millisecond, "requests from %s reached only %v", c.ConnectedUrl(), byBus)
	}
	const n = 100
	for i := range n {
		_, err := a.ask([]*nats.Conn{c1, c2}[i%2], 5*time.Second)
		require.NoError(t, err)
	}

	// b1 goes: once the cluster knows, b2 serves every request.
	require.NoError(t, b1.Close())
	for _, c := range []*nats.Conn{c1, c2} {
		require.Eventually(t, func() bool {
			by, err := a.ask(c, 200*time.Millisecond)
			return err == nil && by == "b2"
		}, 10*time.Second, time.Millisecond)
		for range n {
			by, err := a.ask(c, 5*time.Second)
			require.NoError(t, err)
			require.Equal(t, "b2", by)
		}
	}
	for id, by := range s.servers() {
		assert.Len(t, by, 1, "request %s was served by %v", id, by)
	}
}

// TestALeafNodeKeepsRequestsWithItsBroker: where each host has a leaf
// node of its own, connected to the cluster, with its broker and its
// clients on it, a host's requests go to its own broker while it serves,
// and to another across the cluster when it is gone. In
// (*client).processMsgResults (server/client.go of nats-server), a
// message from a CLIENT that meets a LEAF queue subscription only
// remembers it ("Remember that leaf in case we don't find any other
// candidate") and delivers to a local member when there is one.
func TestALeafNodeKeepsRequestsWithItsBroker(t *testing.T) {
	h1, h2 := twoNodes(t, "leafnodes { listen: \"127.0.0.1:-1\" }\n")
	leaf := func(name string, hub *natsProc) *natsProc {
		return runNATS(t, fmt.Sprintf("listen: \"127.0.0.1:-1\"\nserver_name: %s\nleafnodes { remotes: [ { url: %q } ] }\n", name, hub.leaf))
	}
	l1, l2 := leaf("l1", h1), leaf("l2", h2)
	c1, c2 := connect(t, l1.url), connect(t, l2.url)
	waitRouted(t, c1, c2)
	waitRouted(t, c2, c1)

	s := &served{byID: map[string][]string{}}
	b1 := serveOn(t, l1.url, "brokers", "b1", s)
	serveOn(t, l2.url, "brokers", "b2", s)
	var a asker
	const n = 100
	for _, tc := range []struct {
		c    *nats.Conn
		want string
	}{{c1, "b1"}, {c2, "b2"}} {
		for range n {
			by, err := a.ask(tc.c, 5*time.Second)
			require.NoError(t, err)
			require.Equal(t, tc.want, by, "a request from %s", tc.c.ConnectedUrl())
		}
	}

	// b1 goes: l1's host is served by b2, across the cluster.
	require.NoError(t, b1.Close())
	require.Eventually(t, func() bool {
		by, err := a.ask(c1, 200*time.Millisecond)
		return err == nil && by == "b2"
	}, 10*time.Second, time.Millisecond)
	for _, c := range []*nats.Conn{c1, c2} {
		for range n {
			by, err := a.ask(c, 5*time.Second)
			require.NoError(t, err)
			require.Equal(t, "b2", by)
		}
	}
	for id, by := range s.servers() {
		assert.Len(t, by, 1, "request %s was served by %v", id, by)
	}
}
