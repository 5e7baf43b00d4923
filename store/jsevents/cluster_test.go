package jsevents_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/store/jsevents"
)

// cluster is three nats-server processes with JetStream, clustered on
// loopback ports, each with its own store dir.
type cluster struct {
	t     testing.TB
	bin   string
	nodes []*node
}

type node struct {
	name              string
	port, clusterPort int
	dir, logFile      string
	cmd               *exec.Cmd
	exited            chan struct{}
}

func (n *node) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// freePorts returns n loopback ports that were free a moment ago.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		_ = l.Close()
	}
	return ports
}

// startCluster starts a 3-node cluster and waits until JetStream answers
// on every node. Every process is killed and waited for at the end.
func startCluster(t testing.TB) *cluster {
	t.Helper()
	c := &cluster{t: t, bin: testbin.Build(t, "github.com/nats-io/nats-server/v2")}
	ports := freePorts(t, 6)
	dir := t.TempDir()
	for i := range 3 {
		c.nodes = append(c.nodes, &node{
			name:        fmt.Sprintf("n%d", i+1),
			port:        ports[2*i],
			clusterPort: ports[2*i+1],
			dir:         filepath.Join(dir, fmt.Sprintf("n%d", i+1)),
			logFile:     filepath.Join(dir, fmt.Sprintf("n%d.log", i+1)),
		})
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			c.kill(n)
		}
		if t.Failed() {
			for _, n := range c.nodes {
				log, _ := os.ReadFile(n.logFile)
				t.Logf("%s's log:\n%s", n.name, log)
			}
		}
	})
	for _, n := range c.nodes {
		c.start(n)
	}
	for _, n := range c.nodes {
		c.waitJetStream(n)
	}
	return c
}

func (c *cluster) start(n *node) {
	c.t.Helper()
	var routes []string
	for _, m := range c.nodes {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", m.clusterPort))
	}
	log, err := os.OpenFile(n.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(c.bin,
		"-a", "127.0.0.1", "-p", fmt.Sprint(n.port),
		"--server_name", n.name,
		"--cluster_name", "jsevents",
		"--cluster", fmt.Sprintf("nats://127.0.0.1:%d", n.clusterPort),
		"--routes", strings.Join(routes, ","),
		"-js", "--sd", n.dir)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start %s: %v", n.name, err)
	}
	n.cmd, n.exited = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(n.exited)
	}()
}

// kill sends SIGKILL to n and waits for it to exit; a node not running is
// left alone.
func (c *cluster) kill(n *node) {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Kill()
	<-n.exited
	n.cmd = nil
}

// waitJetStream waits until n answers JetStream API requests (a meta
// leader exists and n knows it).
func (c *cluster) waitJetStream(n *node) {
	c.t.Helper()
	ctx := testContext(c.t)
	for {
		err := func() error {
			nc, err := nats.Connect(n.url(), nats.NoReconnect())
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			actx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			_, err = js.AccountInfo(actx)
			return err
		}()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			log, _ := os.ReadFile(n.logFile)
			c.t.Fatalf("%s: JetStream not ready: %v\n%s", n.name, err, log)
		case <-n.exited:
			log, _ := os.ReadFile(n.logFile)
			c.t.Fatalf("%s exited\n%s", n.name, log)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// urls is every node's URL, n's first: a client of n that fails over to
// the others when n dies.
func (c *cluster) urls(first *node) string {
	u := []string{first.url()}
	for _, m := range c.nodes {
		if m != first {
			u = append(u, m.url())
		}
	}
	return strings.Join(u, ",")
}

func (c *cluster) node(name string) *node {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	c.t.Fatalf("no node %q", name)
	return nil
}

// streamLeader returns the node that leads the stream.
func (c *cluster) streamLeader(nc *nats.Conn, stream string) *node {
	c.t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx := testContext(c.t)
	for {
		s, err := js.Stream(ctx, stream)
		if err == nil && s.CachedInfo().Cluster != nil && s.CachedInfo().Cluster.Leader != "" {
			return c.node(s.CachedInfo().Cluster.Leader)
		}
		select {
		case <-ctx.Done():
			c.t.Fatalf("stream %s: no leader: %v", stream, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Three Logs, one per node (three brokers), append to two sessions at
// once from several goroutines each on an R3 stream: every append gets a
// distinct seq, the seqs are exactly 1..N, each body carries its seq, and
// a live subscriber gets every notification, once, in order. A stale
// append is refused and never published.
func TestClusterAppendsFromThreeNodesStayDense(t *testing.T) {
	c := startCluster(t)
	cfg := jsevents.Config{Replicas: 3}
	var logs []*jsevents.Log
	for _, n := range c.nodes {
		logs = append(logs, open(t, connect(t, c.urls(n)), cfg))
	}
	sessions := []string{"one", "two"}
	sub := connect(t, c.urls(c.nodes[0]))
	recs := map[string]*recorder{}
	for _, id := range sessions {
		recs[id] = record(t, sub, id)
	}

	t.Run("concurrent", func(t *testing.T) {
		res := appendConcurrently(t, "w", logs, sessions, 2, 15, nil)
		for _, id := range sessions {
			checkDense(t, logs[0], id, res[id], recs[id], true)
		}
		logStats(t, logs)
	})

	t.Run("stale", func(t *testing.T) {
		rec := record(t, connect(t, c.urls(c.nodes[2])), "stale")
		a, b := logs[0], logs[1]
		appendID(t, b, "stale", "b1")
		appendID(t, a, "stale", "a2")
		var built []string
		seq, err := b.Append(testContext(t), "stale", func(seq uint64) ([]byte, error) {
			id := fmt.Sprintf("b-attempt-%d-seq-%d", len(built)+1, seq)
			built = append(built, id)
			return body(seq, id, ""), nil
		})
		if err != nil || seq != 3 || len(built) != 2 || built[0] != "b-attempt-1-seq-2" {
			t.Fatalf("stale append: seq %d, %v, attempts %v; want 3 after a refused 2", seq, err, built)
		}
		appendID(t, a, "stale", "a4")
		stored, _, _ := all(t, a, "stale", 0)
		got := rec.waitSeq(t, 4)
		if missed, repeated := checkLive(t, got, stored); missed != 0 || repeated != 0 || len(got) != 4 {
			t.Fatalf("live subscriber: %d messages, missed %d, repeated %d", len(got), missed, repeated)
		}
	})
}

// kill -9 of the stream's leader while three Logs append: no seq is ever
// given to two notifications, no notification is stored twice, every
// acknowledged append is stored at its seq, and once the node is back the
// appends go on densely. A live subscriber may miss a notification the
// dead leader stored but did not republish; what it gets is stored.
func TestClusterKillALeaderDuringAppends(t *testing.T) {
	c := startCluster(t)
	cfg := jsevents.Config{Replicas: 3}
	var logs []*jsevents.Log
	for _, n := range c.nodes {
		logs = append(logs, open(t, connect(t, c.urls(n)), cfg))
	}
	sessions := []string{"k1", "k2"}
	// The subscriber and the checks on a node that is not killed.
	leader := c.streamLeader(connect(t, c.urls(c.nodes[0])), jsevents.DefaultStream)
	var watcher *node
	for _, n := range c.nodes {
		if n != leader {
			watcher = n
			break
		}
	}
	sub := connect(t, watcher.url())
	recs := map[string]*recorder{}
	for _, id := range sessions {
		recs[id] = record(t, sub, id)
	}

	const perWriter = 40
	var killedAt, restartedAt atomic.Int64
	killed := make(chan struct{})
	restart := make(chan struct{})
	res := appendConcurrently(t, "before", logs, sessions, 2, perWriter, func(ok int64) {
		switch {
		case ok == 60 && killedAt.CompareAndSwap(0, ok):
			c.kill(leader)
			close(killed)
		case ok == 150 && restartedAt.CompareAndSwap(0, ok):
			close(restart)
		}
	})
	select {
	case <-killed:
	default:
		t.Fatal("the leader was never killed")
	}
	select {
	case <-restart:
	default:
		t.Fatal("appends did not go on after the leader died")
	}
	// Back with its store; appends go on densely.
	c.start(leader)
	c.waitJetStream(leader)
	after := appendConcurrently(t, "after", logs, sessions, 1, 5, nil)
	for _, id := range sessions {
		for seq, x := range after[id] {
			if prev, dup := res[id][seq]; dup {
				t.Fatalf("session %q: seq %d given to %s and %s", id, seq, prev, x)
			}
			res[id][seq] = x
		}
		// The last seq comes from a calm cluster: the subscriber gets it.
		checkDense(t, logs[0], id, res[id], recs[id], false)
	}
	logStats(t, logs)
}

func logStats(t *testing.T, logs []*jsevents.Log) {
	var sum jsevents.Stats
	for _, l := range logs {
		s := l.Stats()
		sum.Appends += s.Appends
		sum.Conflicts += s.Conflicts
		sum.Retries += s.Retries
		sum.Unanswered += s.Unanswered
		sum.Duplicates += s.Duplicates
	}
	t.Logf("appends: %+v", sum)
}

// BenchmarkClusterAppend compares Append on an R3 stream with a bare
// JetStream publish to an R3 stream on the same cluster: one at a time
// from one connection, then six at a time from three connections (one per
// node), each on its own session, then all on one session. The Logs bound
// each session's bytes as a broker does (4 MiB, which these appends stay
// under); append-over-bound appends to a session over a bound of 64 KiB,
// which it purges every few appends.
func BenchmarkClusterAppend(b *testing.B) {
	c := startCluster(b)
	nc := connect(b, c.urls(c.nodes[0]))
	cfg := jsevents.Config{Replicas: 3, MaxBytes: 4 << 20}
	l := open(b, nc, cfg)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := testContext(b)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BARE", Subjects: []string{"bare.>"}, Replicas: 3}); err != nil {
		b.Fatal(err)
	}
	payload := body(1, "bench", strings.Repeat("p", 250))
	b.Run("bare-publish", func(b *testing.B) {
		for b.Loop() {
			if _, err := js.Publish(ctx, "bare.s", payload); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("append", func(b *testing.B) {
		for b.Loop() {
			if _, err := l.Append(ctx, "bench", func(uint64) ([]byte, error) { return payload, nil }); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("append-over-bound", func(b *testing.B) {
		l := open(b, nc, jsevents.Config{Replicas: 3, MaxBytes: 64 << 10})
		for b.Loop() {
			if _, err := l.Append(ctx, "bounded", func(uint64) ([]byte, error) { return payload, nil }); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(l.Stats().Purges)/float64(b.N), "purges/op")
	})
	logs := []*jsevents.Log{l}
	for _, n := range c.nodes[1:] {
		logs = append(logs, open(b, connect(b, c.urls(n)), cfg))
	}
	// Six at a time, from the three nodes.
	b.Run("bare-publish-parallel", func(b *testing.B) {
		var i atomic.Int64
		b.SetParallelism(3)
		b.RunParallel(func(pb *testing.PB) {
			subj := fmt.Sprint("bare.p", i.Add(1))
			for pb.Next() {
				if _, err := js.Publish(ctx, subj, payload); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("append-parallel-sessions", func(b *testing.B) {
		var i atomic.Int64
		b.SetParallelism(3)
		b.RunParallel(func(pb *testing.PB) {
			n := i.Add(1)
			l, session := logs[n%3], fmt.Sprint("parallel-", n)
			for pb.Next() {
				if _, err := l.Append(ctx, session, func(uint64) ([]byte, error) { return payload, nil }); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("append-parallel-1-session", func(b *testing.B) {
		var i atomic.Int64
		b.SetParallelism(3)
		b.RunParallel(func(pb *testing.PB) {
			l := logs[i.Add(1)%3]
			for pb.Next() {
				if _, err := l.Append(ctx, "contended", func(uint64) ([]byte, error) { return payload, nil }); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// A Log opened while a node of the cluster is offline (just started, or
// restarting) cannot place the stream's three replicas yet: Open waits
// for the node, as it waits for a meta leader, instead of failing.
func TestOpenWaitsForTheNodesToPlaceTheStream(t *testing.T) {
	c := startCluster(t)
	c.kill(c.nodes[2])
	nc := connect(t, c.urls(c.nodes[0]))
	done := make(chan error, 1)
	go func() {
		l, err := jsevents.Open(testContext(t), nc, jsevents.Config{Replicas: 3})
		if err == nil {
			err = l.Close()
		}
		done <- err
	}()
	c.start(c.nodes[2])
	if err := <-done; err != nil {
		t.Fatalf("Open with a node offline, then back: %v", err)
	}
}
