package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/cluster"
	"github.com/a2a-bus/a2a-bus/internal/natscluster"
	"github.com/a2a-bus/a2a-bus/natsbus"
	a2art "github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/store/storetest"
	"github.com/a2a-bus/a2a-bus/transport/bustest"
	"github.com/a2a-bus/a2a-bus/wire"
)

// clusterNodes is the cluster's size, and every stream's replicas.
const clusterNodes = 3

// clusterCallers is how many callers create tasks at once, and how many
// publishers publish at once beside them, spread over the nodes.
const clusterCallers = 16

// clusterCounted is how many ops the tap counts the messages of.
const clusterCounted = 20

// clusterOpenTimeout bounds the brokers' opening of the cluster's state.
const clusterOpenTimeout = 60 * time.Second

// clusterWait bounds each wait of the cluster section (a call, an event):
// it ends a run that would otherwise hang, it times nothing.
const clusterWait = 30 * time.Second

// cluster: the cluster mode on one three-node JetStream cluster of real
// nats-server processes on loopback, every stream R3, with three brokers
// in this process (one a node, its state and its bus on its node's
// connections, serving in the cluster's queue group, as serve
// --state=jetstream does): a cross-host round trip beside the bare
// request/reply between the same two nodes, and durable creates a second
// beside the bare JetStream publish to an R3 stream, on the same cluster
// in the same run. Each row counts what one op sent (a tap on every
// subject; stderr has the breakdown) and the CPU it took; the round trip
// is also set beside its floor, the JetStream writes, stream reads and
// requests it made at the cost of the bare ones. Last, the round trip
// again with one broker left serving.
func (r *runner) cluster() error {
	began := time.Now()
	defer func() {
		fmt.Fprintf(os.Stderr, "bench: cluster: the section took %v\n", time.Since(began).Round(100*time.Millisecond))
	}()
	// A cluster round trip takes milliseconds: --quick's 150 ms would
	// time a dozen.
	benchtime := map[bool]string{true: "1s", false: "3s"}[r.quick]
	old := flag.Lookup("test.benchtime").Value.String()
	flag.Set("test.benchtime", benchtime)
	defer flag.Set("test.benchtime", old)

	bin, cleanup, err := build("github.com/nats-io/nats-server/v2", "nats-server")
	if err != nil {
		return err
	}
	defer cleanup()
	fmt.Fprintf(os.Stderr, "bench: %-12s starting %d nats-server nodes and %d brokers\n", "cluster", clusterNodes, clusterNodes)
	nc, err := natscluster.Launch(bin, clusterNodes, natscluster.Options{Name: "bench"})
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	defer nc.Close()
	c, err := openBenchCluster(nc)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	defer c.close()

	bareRR := r.run("nats-cluster", "limit: request/reply bare, a client on node 0, an echo on node 2", c.withCPU(c.bareRequestReply))
	r.add(bareRR)
	pub1 := r.run("nats-cluster", "limit: JetStream publish bare, one at a time from node 0, an R3 file stream", c.withCPU(c.barePublish(1)))
	r.add(pub1)
	rtOp, err := c.roundTripOp("rt")
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	rt, err := r.runCounted(c, "cluster", "cross-host round trip (send, worker's event, update, asker's final event), runtimes: asker on node 0, worker on node 2; 3 brokers", rtOp, latencyOf(rtOp))
	if err != nil {
		return err
	}
	rt.compare(bareRR, latency, 0)
	r.add(rt)
	r.againstFloor(rt, roundTripFloor(rt, bareRR, pub1))

	pubN := r.run("nats-cluster", fmt.Sprintf("limit: JetStream publish bare, %d publishers over the %d nodes, an R3 file stream", clusterCallers, clusterNodes), c.withCPU(c.barePublish(clusterCallers)))
	r.add(pubN)
	creators, err := c.creators()
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	creates, err := r.runCounted(c, "cluster", fmt.Sprintf("durable creates (a2a.message.send), %d runtimes over the %d nodes, each to its own worker; 3 brokers", clusterCallers, clusterNodes), creators[0], inParallelOf(creators, "tasks/s"))
	if err != nil {
		return err
	}
	creates.compare(pubN, throughput, 0)
	r.add(creates)

	// The brokers guess a task's or a session's last revision from their
	// own last write, which another broker's write makes stale: with one
	// broker, every guess holds.
	c.keepOneBroker()
	oneOp, err := c.roundTripOp("rt1")
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	one, err := r.runCounted(c, "cluster", "the same cross-host round trip, 1 broker (on node 0) left serving", oneOp, latencyOf(oneOp))
	if err != nil {
		return err
	}
	one.compare(rt, latency, 0)
	r.add(one)
	return nil
}

// runCounted counts the messages of clusterCounted calls of op, then
// runs fn as a row with the counts among its figures.
func (r *runner) runCounted(c *benchCluster, bus, name string, op func() error, fn func(b *testing.B)) (Result, error) {
	counts, err := c.count(clusterCounted, op)
	if err != nil {
		return Result{}, fmt.Errorf("cluster: %s: %w", name, err)
	}
	res := r.run(bus, name, c.withCPU(fn))
	maps.Copy(res.Metrics, counts)
	return res, nil
}

// withCPU runs fn and reports the CPU time it took per op (Linux only):
// this process's (the brokers, the hosts, the callers) and the three
// nats-servers' (server-cpu-ms/op) together as cpu-ms/op. Where every
// process runs on one machine, its cores bound the ops a second at 1,000
// ms of CPU a second each.
func (c *benchCluster) withCPU(fn func(b *testing.B)) func(b *testing.B) {
	return func(b *testing.B) {
		pids := c.nats.PIDs()
		self0, servers0, ok := cpuTime(pids)
		fn(b)
		self1, servers1, ok1 := cpuTime(pids)
		if !ok || !ok1 || b.N == 0 {
			return
		}
		n := float64(b.N)
		servers := float64((servers1 - servers0).Microseconds()) / 1000 / n
		b.ReportMetric(servers+float64((self1-self0).Microseconds())/1000/n, "cpu-ms/op")
		b.ReportMetric(servers, "server-cpu-ms/op")
	}
}

// againstFloor adds floor, and res again beside it (their p50s).
func (r *runner) againstFloor(res, floor Result) {
	r.add(floor)
	again := res
	again.Metrics = maps.Clone(res.Metrics)
	again.Case += " (against its floor)"
	again.compare(floor, latency, 0)
	r.add(again)
}

// roundTripFloor is the round trip's own work done bare, one step after
// another: its JetStream writes (each acknowledged once a quorum stored
// it) at the bare publish's p50, its stream reads and its requests at the
// bare request/reply's.
func roundTripFloor(rt, bareRR, pub1 Result) Result {
	m := rt.Metrics
	p50 := m["js-writes/op"]*pub1.Metrics["p50-µs"] + (m["js-reads/op"]+m["rpc/op"])*bareRR.Metrics["p50-µs"]
	return Result{Bus: "nats-cluster", AllocsPerOp: -1,
		Case:    fmt.Sprintf("floor: the round trip's %.2f JetStream writes × the bare publish p50 + its %.2f stream reads and %.2f requests × the bare request/reply p50", m["js-writes/op"], m["js-reads/op"], m["rpc/op"]),
		NsPerOp: p50 * 1000, Metrics: map[string]float64{"p50-µs": p50}}
}

// benchCluster is the brokers of the cluster and what the rows share.
type benchCluster struct {
	nats       *natscluster.Cluster
	stateConns []*nats.Conn
	states     []*cluster.Cluster
	buses      []*natsbus.Bus
	brokers    []*broker.Broker
	hosts      []*natsbus.Client // one host client a node
	runtimes   []*a2art.Runtime
	conns      []*nats.Conn // bare connections, one a node
	next       atomic.Int64
}

// openBenchCluster starts a broker on each node of nc: its state on a
// connection of its own (cluster.Open), its bus on another, in the
// cluster's queue group; and a host client and a bare connection on each
// node.
func openBenchCluster(nc *natscluster.Cluster) (c *benchCluster, err error) {
	c = &benchCluster{nats: nc}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), clusterOpenTimeout)
	defer cancel()
	for i := range clusterNodes {
		url := nc.URL(i)
		sc, err := nats.Connect(url, nats.Name(fmt.Sprint("bench state host", i)))
		if err != nil {
			return nil, err
		}
		c.stateConns = append(c.stateConns, sc)
		st, err := cluster.Open(ctx, sc, cluster.Config{Broker: fmt.Sprint("host", i), Replicas: clusterNodes})
		if err != nil {
			return nil, err
		}
		c.states = append(c.states, st)
		bus, err := natsbus.New(natsbus.Config{URL: url, QueueGroup: cluster.QueueGroup})
		if err != nil {
			return nil, err
		}
		c.buses = append(c.buses, bus)
		br, err := broker.New(context.Background(), bus, broker.Config{Store: st.Store(), Cluster: st.Broker(), MaxTasksPerContext: 1 << 30})
		if err != nil {
			return nil, err
		}
		c.brokers = append(c.brokers, br)
	}
	for i := range clusterNodes {
		h, err := natsbus.Dial(natsbus.ClientConfig{URL: nc.URL(i)})
		if err != nil {
			return nil, err
		}
		c.hosts = append(c.hosts, h)
		conn, err := nats.Connect(nc.URL(i))
		if err != nil {
			return nil, err
		}
		c.conns = append(c.conns, conn)
	}
	return c, nil
}

// keepOneBroker closes every broker but the first (its bus first, so
// that it takes no more requests), as a broker stops.
func (c *benchCluster) keepOneBroker() {
	for i := 1; i < len(c.brokers); i++ {
		c.buses[i].Close()
		c.brokers[i].Close()
		c.states[i].Close()
		c.stateConns[i].Close()
	}
	c.buses, c.brokers, c.states, c.stateConns = c.buses[:1], c.brokers[:1], c.states[:1], c.stateConns[:1]
}

// close closes the runtimes, the hosts, the brokers, their buses and
// states, and the connections. Idempotent.
func (c *benchCluster) close() {
	for _, rt := range c.runtimes {
		rt.Close()
	}
	c.runtimes = nil
	for _, h := range c.hosts {
		h.Close()
	}
	c.hosts = nil
	for _, b := range c.brokers {
		b.Close()
	}
	c.brokers = nil
	for _, b := range c.buses {
		b.Close()
	}
	c.buses = nil
	for _, s := range c.states {
		s.Close()
	}
	c.states = nil
	for _, nc := range append(c.stateConns, c.conns...) {
		nc.Close()
	}
	c.stateConns, c.conns = nil, nil
}

// delegate spawns a delegate named name in a runtime of its own, in
// session, on node's host client.
func (c *benchCluster) delegate(node int, session, name string) (*a2art.Delegate, error) {
	ctx, cancel := context.WithTimeout(context.Background(), clusterOpenTimeout)
	defer cancel()
	s, err := c.hosts[node].Session(ctx, session)
	if err != nil {
		return nil, err
	}
	rt, err := a2art.New(context.Background(), s, a2art.Config{})
	if err != nil {
		return nil, err
	}
	c.runtimes = append(c.runtimes, rt)
	return rt.Spawn(ctx, wire.AgentCard{Name: name})
}

// sendRequest is a send's request, the bare request/reply's payload.
var sendRequest = []byte(`{"jsonrpc":"2.0","id":1,"method":"a2a.message.send","params":{"token":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef","to":"worker","message":{"role":"user","parts":[{"kind":"text","text":"take seat 2?"}],"messageId":"0192a0b1-7c3d-7e4f-8a9b-0c1d2e3f4a5b"}}}`)

// bareRequestReply: a request of a send's size from a client on node 0
// to a responder on node 2 that echoes it.
func (c *benchCluster) bareRequestReply(b *testing.B) {
	subject := fmt.Sprint("bench.echo.", c.next.Add(1))
	s, err := c.conns[2].Subscribe(subject, func(m *nats.Msg) { m.Respond(m.Data) })
	if err != nil {
		b.Fatal(err)
	}
	defer s.Unsubscribe()
	if err := c.conns[2].Flush(); err != nil {
		b.Fatal(err)
	}
	// The responder's interest reaches node 0 over the route a moment
	// after the flush.
	for deadline := time.Now().Add(clusterWait); ; time.Sleep(5 * time.Millisecond) {
		_, err := c.conns[0].Request(subject, sendRequest, clusterWait)
		if err == nil {
			break
		}
		if !errors.Is(err, nats.ErrNoResponders) || time.Now().After(deadline) {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if _, err := c.conns[0].Request(subject, sendRequest, clusterWait); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	bustest.ReportLatency(b, lat)
}

// barePublish: publishers publish a task record's bytes to an R3 stream
// on file storage (as the cluster's buckets are), each to a subject of
// its own, publisher i on node i mod 3, each waiting for its
// acknowledgement before the next. One publisher reports its latency,
// several their publishes a second.
func (c *benchCluster) barePublish(publishers int) func(b *testing.B) {
	return func(b *testing.B) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		name := fmt.Sprint("BENCH", c.next.Add(1))
		jss := make([]jetstream.JetStream, clusterNodes)
		for i := range jss {
			var err error
			if jss[i], err = jetstream.New(c.conns[i]); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := jss[0].CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Replicas: clusterNodes, Storage: jetstream.FileStorage}); err != nil {
			b.Fatal(err)
		}
		defer jss[0].DeleteStream(context.Background(), name)
		rec, err := storetest.NewRecord("01929c6e-7f7c-7a10-9c7b-3f2f0a4d5e6f", "asker", "asker", "worker", 0).Encode()
		if err != nil {
			b.Fatal(err)
		}
		ops := make([]func() error, publishers)
		for w := range ops {
			js, subject := jss[w%clusterNodes], fmt.Sprintf("%s.%d", name, w)
			ops[w] = func() error {
				_, err := js.Publish(ctx, subject, rec)
				return err
			}
		}
		if publishers == 1 {
			latencyOf(ops[0])(b)
			return
		}
		inParallelOf(ops, "msgs/s")(b)
	}
}

// roundTripOp is one cross-host round trip between two new delegates
// (in sessions named after prefix): an asker's runtime on node 0 sends a
// task to a worker's runtime on node 2; the worker waits for it and
// completes it; the asker waits for the final event.
func (c *benchCluster) roundTripOp(prefix string) (func() error, error) {
	asker, err := c.delegate(0, prefix+"-asker", prefix+"-asker")
	if err != nil {
		return nil, err
	}
	worker, err := c.delegate(2, prefix+"-worker", prefix+"-worker")
	if err != nil {
		return nil, err
	}
	msg := wire.Message{Parts: []wire.Part{wire.TextPart("take seat 2?")}}
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), clusterOpenTimeout)
		defer cancel()
		task, err := asker.Send(ctx, worker.ID(), msg, nil)
		if err != nil {
			return fmt.Errorf("send: %w", err)
		}
		if _, err := waitTask(ctx, worker, task.ID, false); err != nil {
			return fmt.Errorf("the worker's event: %w", err)
		}
		if _, err := worker.Update(ctx, task.ID, wire.StateCompleted, nil); err != nil {
			return fmt.Errorf("update: %w", err)
		}
		if _, err := waitTask(ctx, asker, task.ID, true); err != nil {
			return fmt.Errorf("the asker's event: %w", err)
		}
		return nil
	}, nil
}

// waitTask waits for d's next event of task id (a final one, with
// final), skipping others.
func waitTask(ctx context.Context, d *a2art.Delegate, id string, final bool) (*wire.TaskEvent, error) {
	for {
		ev, err := d.Wait(ctx)
		if err != nil {
			return nil, err
		}
		if ev.Resync != nil {
			return nil, fmt.Errorf("a resync: %s", ev.Resync.Reason)
		}
		if t := ev.Task; t != nil && t.TaskID == id && (t.Final || !final) {
			return t, nil
		}
	}
}

// creators makes clusterCallers askers, each in a session and a runtime
// of its own, asker i on node i mod 3, each with a worker of its own to
// send to (registered in a session of its own, on the next node, not
// listening: its notifications are kept and published to no one), and
// returns each asker's op: one send, which creates a task.
func (c *benchCluster) creators() ([]func() error, error) {
	ctx, cancel := context.WithTimeout(context.Background(), clusterOpenTimeout)
	defer cancel()
	ops := make([]func() error, clusterCallers)
	for i := range ops {
		asker, err := c.delegate(i%clusterNodes, fmt.Sprint("create-asker-", i), fmt.Sprint("creator-", i))
		if err != nil {
			return nil, err
		}
		s, err := c.hosts[(i+1)%clusterNodes].Session(ctx, fmt.Sprint("create-worker-", i))
		if err != nil {
			return nil, err
		}
		res, err := s.Call(ctx, wire.MethodRegister, wire.RegisterParams{ContextID: s.ID(), Card: &wire.AgentCard{Name: fmt.Sprint("taker-", i)}})
		if err != nil {
			return nil, err
		}
		var reg wire.RegisterResult
		if err := json.Unmarshal(res, &reg); err != nil {
			return nil, err
		}
		msg := wire.Message{Parts: []wire.Part{wire.TextPart("take seat 2?")}}
		ops[i] = func() error {
			ctx, cancel := context.WithTimeout(context.Background(), clusterOpenTimeout)
			defer cancel()
			_, err := asker.Send(ctx, reg.AgentID, msg, nil)
			return err
		}
	}
	return ops, nil
}

// latencyOf runs op b.N times, one after another, and reports its p50
// and p99.
func latencyOf(op func() error) func(b *testing.B) {
	return func(b *testing.B) {
		lat := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			start := time.Now()
			if err := op(); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		bustest.ReportLatency(b, lat)
	}
}

// inParallelOf runs b.N ops, each of ops in a goroutine of its own
// taking the next until b.N are taken, and reports the ops a second as
// unit.
func inParallelOf(ops []func() error, unit string) func(b *testing.B) {
	return func(b *testing.B) {
		var next atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		var wg sync.WaitGroup
		for _, op := range ops {
			wg.Go(func() {
				for next.Add(1) <= int64(b.N) {
					if err := op(); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), unit)
	}
}

// count runs op n times, one after another, with a tap on every subject
// of the cluster's account (on node 1), and returns what one op sent, on
// average: its requests to the brokers (rpc/op), the JetStream writes it
// waited for (js-writes/op: publishes to a stream with a reply, each a
// single write or a batch's commit, acknowledged once a quorum stored
// it), the messages those stored (js-msgs/op: a batch's other parts
// too), its reads from a stream's leader (js-reads/op) and the events
// delivered (events/op). The whole breakdown, by subject, goes to
// stderr; the brokers' lease renewals, on their own timers, are not
// counted as the op's.
func (c *benchCluster) count(n int, op func() error) (map[string]float64, error) {
	var mu sync.Mutex
	counts := map[string]int{}
	seen := map[string]bool{} // markers, by round and node
	marker := fmt.Sprint("bench.marker.", c.next.Add(1))
	tap, err := nats.Connect(c.nats.URL(1))
	if err != nil {
		return nil, err
	}
	defer tap.Close()
	if _, err := tap.Subscribe(">", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		if m.Subject == marker {
			seen[string(m.Data)] = true
			return
		}
		counts[subjectKind(m)]++
	}); err != nil {
		return nil, err
	}
	if err := tap.Flush(); err != nil {
		return nil, err
	}
	// mark publishes a marker from every node until the tap has one from
	// each: what those nodes had sent before, it has seen too (one
	// account's messages take one route between two nodes). The first
	// round also waits for the tap's interest to reach every node.
	round := 0
	mark := func() error {
		round++
		deadline := time.Now().Add(clusterWait)
		for {
			for i, nc := range c.conns {
				nc.Publish(marker, fmt.Appendf(nil, "%d-%d", round, i))
				nc.Flush()
			}
			for wait := time.Now().Add(200 * time.Millisecond); time.Now().Before(wait); time.Sleep(2 * time.Millisecond) {
				mu.Lock()
				all := true
				for i := range c.conns {
					all = all && seen[fmt.Sprintf("%d-%d", round, i)]
				}
				mu.Unlock()
				if all {
					return nil
				}
			}
			if time.Now().After(deadline) {
				return errors.New("the tap does not see the markers")
			}
		}
	}
	if err := mark(); err != nil {
		return nil, err
	}
	mu.Lock()
	clear(counts)
	mu.Unlock()
	for range n {
		if err := op(); err != nil {
			return nil, err
		}
	}
	if err := mark(); err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	per := func(prefixes ...string) float64 {
		total := 0
		for k, v := range counts {
			for _, p := range prefixes {
				if strings.HasPrefix(k, p) {
					total += v
					break
				}
			}
		}
		return float64(total) / float64(n)
	}
	var lines []string
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		lines = append(lines, fmt.Sprintf("%s %.2f", k, per(k)))
	}
	fmt.Fprintf(os.Stderr, "bench: cluster: one op's messages, by subject (mean of %d): %s\n", n, strings.Join(lines, "; "))
	return map[string]float64{
		"rpc/op":       per("rpc request"),
		"js-writes/op": per("stream write"),
		"js-msgs/op":   per("stream write", "stream batch part"),
		"js-reads/op":  per("stream read"),
		"events/op":    per("event"),
	}, nil
}

// subjectKind sorts a message the tap saw: its kind, then what it
// concerns (a stream write's bucket and first key token, a read's
// stream).
func subjectKind(m *nats.Msg) string {
	s := m.Subject
	f := strings.Split(s, ".")
	switch {
	case strings.HasPrefix(s, "a2a.rpc."):
		return "rpc request"
	case strings.HasPrefix(s, "a2a.host."):
		return "host request"
	case strings.HasPrefix(s, "a2a.session.") && strings.HasSuffix(s, ".events"):
		return "event"
	case strings.HasPrefix(s, "$KV.") && len(f) >= 3, strings.HasPrefix(s, "a2a.log."):
		where := "a2a.log.*." + f[len(f)-1]
		if f[0] == "$KV" {
			where = "$KV." + f[1] + "." + f[2]
		}
		switch {
		case strings.HasPrefix(s, "$KV."+cluster.DefaultPrefix+"_leases."):
			return "lease renewal (a broker's timer) " + where
		case m.Reply == "":
			return "stream batch part " + where
		}
		return "stream write " + where
	case strings.HasPrefix(s, "$JS.API.DIRECT.GET.") && len(f) >= 5:
		return "stream read DIRECT.GET " + f[4]
	case strings.HasPrefix(s, "$JS.API.STREAM.MSG.GET.") && len(f) >= 6:
		return "stream read MSG.GET " + f[5]
	case strings.HasPrefix(s, "$JS.API.") && len(f) >= 4 && (f[2] == "STREAM" || f[2] == "CONSUMER"):
		return "JS API " + f[2] + "." + f[3]
	case strings.HasPrefix(s, "$JS.EVENT.") && len(f) >= 4:
		return "JS event " + strings.Join(f[2:min(5, len(f))], ".")
	case strings.HasPrefix(s, "_INBOX."):
		return "reply"
	}
	return "other " + strings.Join(f[:min(2, len(f))], ".")
}
