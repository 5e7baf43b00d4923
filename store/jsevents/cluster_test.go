package jsevents_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/a2a-bus/a2a-bus/internal/natscluster"
	"github.com/a2a-bus/a2a-bus/store/jsevents"
)

// startCluster starts three nats-server processes clustered with
// JetStream on loopback, each with its own store dir, ready to place a
// stream's replica on every node. Every process is killed and waited for
// at the end.
func startCluster(t testing.TB) *natscluster.Cluster {
	t.Helper()
	return natscluster.Start(t, 3, natscluster.Options{Name: "jsevents"})
}

// clusterURLs is every node's URL, node first's first: a client of that node
// that fails over to the others when it dies.
func clusterURLs(c *natscluster.Cluster, first int) string {
	u := []string{c.URL(first)}
	for i := range c.N() {
		if i != first {
			u = append(u, c.URL(i))
		}
	}
	return strings.Join(u, ",")
}

// streamLeader returns the node that leads the stream.
func streamLeader(t testing.TB, c *natscluster.Cluster, nc *nats.Conn, stream string) int {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	for {
		s, err := js.Stream(ctx, stream)
		if err == nil && s.CachedInfo().Cluster != nil && s.CachedInfo().Cluster.Leader != "" {
			leader := s.CachedInfo().Cluster.Leader
			for i := range c.N() {
				if c.Name(i) == leader {
					return i
				}
			}
			t.Fatalf("stream %s: led by %q, no node of the cluster", stream, leader)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("stream %s: no leader: %v", stream, err)
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
	for i := range c.N() {
		logs = append(logs, open(t, connect(t, clusterURLs(c, i)), cfg))
	}
	sessions := []string{"one", "two"}
	sub := connect(t, clusterURLs(c, 0))
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
		rec := record(t, connect(t, clusterURLs(c, 2)), "stale")
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
	for i := range c.N() {
		logs = append(logs, open(t, connect(t, clusterURLs(c, i)), cfg))
	}
	sessions := []string{"k1", "k2"}
	// The subscriber and the checks on a node that is not killed.
	leader := streamLeader(t, c, connect(t, clusterURLs(c, 0)), jsevents.DefaultStream)
	watcher := (leader + 1) % c.N()
	sub := connect(t, c.URL(watcher))
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
			c.Kill(leader)
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
	c.Restart(leader)
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
	nc := connect(b, clusterURLs(c, 0))
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
	for i := 1; i < c.N(); i++ {
		logs = append(logs, open(b, connect(b, clusterURLs(c, i)), cfg))
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
// for the node, as it waits for a meta leader, instead of failing. The
// cluster is stopped whole and started again without one node, which the
// others have then never heard from since their start (a node they have
// heard from stays a place for replicas while it is down); Open starts
// once they refuse to place three replicas, and the node comes back.
func TestOpenWaitsForTheNodesToPlaceTheStream(t *testing.T) {
	c := startCluster(t)
	for i := range c.N() {
		c.Stop(i)
	}
	c.Restart(0, 1)
	nc := connect(t, clusterURLs(c, 0))
	waitUnplaceable(t, nc)
	done := make(chan error, 1)
	go func() {
		l, err := jsevents.Open(testContext(t), nc, jsevents.Config{Replicas: 3})
		if err == nil {
			err = l.Close()
		}
		done <- err
	}()
	c.Restart(2)
	if err := <-done; err != nil {
		t.Fatalf("Open with a node offline, then back: %v", err)
	}
}

// waitUnplaceable waits until the cluster refuses a stream of three
// replicas for want of nodes to place them on (JetStream's error 10005,
// "no suitable peers for placement").
func waitUnplaceable(t *testing.T, nc *nats.Conn) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	cfg := jetstream.StreamConfig{Name: "PLACEMENT", Subjects: []string{"placement"}, Storage: jetstream.MemoryStorage, Replicas: 3}
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := js.CreateStream(actx, cfg)
		if err == nil {
			err = js.DeleteStream(actx, cfg.Name)
		}
		cancel()
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == 10005 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the cluster places three replicas with a node down that it has not heard from: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
