// Command bench compares the buses on identical work, each beside the raw
// transport it sits on, in one run, and writes the results as a Markdown
// table, an SVG chart and (with --format json) one JSON object per case.
//
//	go run ./bench                 # full run, results in docs/bench
//	go run ./bench --quick         # about 3 minutes on 2 cores
//	go run ./bench --format json   # JSON on stdout as well
//	go run ./bench --only stores   # one section (written to --out as well)
//	go run ./bench --only idle     # idle CPU and memory per session of serve
//	go run ./bench --only cluster  # the cluster mode on 3 nats-server nodes
//
// The node section runs the Node host package's benchmark
// (clients/node/bench) when node is on PATH and the package is built.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/a2a-bus/a2a-bus/broker/brokertest"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/store/pebblestore"
	"github.com/a2a-bus/a2a-bus/store/storetest"
	"github.com/a2a-bus/a2a-bus/transport/bustest"
)

// Result is one (bus, case) measurement.
type Result struct {
	Bus         string             `json:"bus"`
	Case        string             `json:"case"`
	NsPerOp     float64            `json:"nsPerOp"`
	AllocsPerOp int64              `json:"allocsPerOp"` // -1: not counted (Node counts bytes only)
	BytesPerOp  int64              `json:"bytesPerOp"`
	Metrics     map[string]float64 `json:"metrics,omitempty"`
	// Ratio compares the case with Against (the raw transport, or the
	// one-session case), and Target is the goal for it.
	Ratio   float64 `json:"ratio,omitempty"`
	Against string  `json:"against,omitempty"`
	Target  string  `json:"target,omitempty"`
	// Goal is the target's bound, where the chart draws its line.
	Goal float64 `json:"goal,omitempty"`
	Met  *bool   `json:"met,omitempty"`
}

func main() {
	quick := flag.Bool("quick", false, "short runs and fewer points: about 3 minutes on 2 cores")
	format := flag.String("format", "markdown", "markdown, or json: also print one JSON object per case on stdout")
	only := flag.String("only", "", "run only these sections, comma-separated: events, roundtrips, sessions, agents, stores, durable, startup, idle, node, cluster")
	out := flag.String("out", filepath.Join("docs", "bench"), "the folder the results are written to")
	flag.Parse()
	if *format != "markdown" && *format != "json" {
		fmt.Fprintln(os.Stderr, "bench: --format must be markdown or json")
		os.Exit(2)
	}
	testing.Init()
	benchtime := "1s"
	if *quick {
		benchtime = "150ms"
	}
	flag.Set("test.benchtime", benchtime)

	r := &runner{quick: *quick, only: *only}
	if err := r.all(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	md := r.markdown()
	files := map[string][]byte{"results.md": []byte(md), "chart.svg": []byte(r.chart())}
	js, _ := json.MarshalIndent(r.results, "", "  ")
	files["results.json"] = append(js, '\n')
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(*out, name), data, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
	}
	if *format == "json" {
		enc := json.NewEncoder(os.Stdout)
		for _, res := range r.results {
			enc.Encode(res)
		}
	} else {
		fmt.Print(md)
	}
	fmt.Fprintf(os.Stderr, "bench: wrote results.md, results.json and chart.svg to %s\n", *out)
}

type runner struct {
	quick   bool
	only    string // comma-separated sections; "" runs all
	results []Result
}

func (r *runner) run(bus, name string, fn func(b *testing.B)) Result {
	fmt.Fprintf(os.Stderr, "bench: %-12s %s\n", bus, name)
	br := testing.Benchmark(fn)
	res := Result{Bus: bus, Case: name, AllocsPerOp: br.AllocsPerOp(), BytesPerOp: br.AllocedBytesPerOp(), Metrics: map[string]float64{}}
	if br.N > 0 {
		res.NsPerOp = float64(br.T.Nanoseconds()) / float64(br.N)
	}
	for k, v := range br.Extra {
		res.Metrics[k] = v
	}
	if res.NsPerOp == 0 {
		fmt.Fprintf(os.Stderr, "bench: %s %s failed (see above)\n", bus, name)
	}
	return res
}

func (r *runner) add(res Result) { r.results = append(r.results, res) }

func met(ok bool) *bool { return &ok }

// How a case compares with the case it stands beside.
type comparison int

const (
	throughput comparison = iota // base's time per op over the case's: more is better
	cost                         // the case's time per op over base's: less is better
	latency                      // the case's p50 over base's: less is better
)

// compare sets res's ratio to base. A bound > 0 makes it a target: at
// least bound for throughput, at most bound otherwise. It replaces any
// comparison res had, so that a result can be added once per base.
func (res *Result) compare(base Result, how comparison, bound float64) {
	res.Ratio, res.Against, res.Target, res.Goal, res.Met = 0, "", "", 0, nil
	var a, b float64
	switch how {
	case throughput:
		a, b = base.NsPerOp, res.NsPerOp
	case cost:
		a, b = res.NsPerOp, base.NsPerOp
	case latency:
		a, b = res.Metrics["p50-µs"], base.Metrics["p50-µs"]
	}
	if a <= 0 || b <= 0 {
		return // a case that failed has no ratio
	}
	res.Ratio = a / b
	res.Against = base.Case
	if how == latency {
		res.Against += " p50"
	}
	if bound <= 0 {
		return
	}
	res.Goal = bound
	switch {
	case how == throughput:
		res.Target = fmt.Sprintf("≥ %g × that", bound)
		res.Met = met(res.Ratio >= bound)
	case how == latency:
		res.Target = fmt.Sprintf("p50 ≤ %g × that", bound)
		res.Met = met(res.Ratio <= bound)
	default:
		res.Target = fmt.Sprintf("≤ %g × that", bound)
		res.Met = met(res.Ratio <= bound)
	}
}

// all runs every benchmark (or those r.only names), in the order the
// report shows them.
func (r *runner) all() error {
	sections := []struct {
		name string
		run  func() error
	}{
		{"events", func() error { r.events(); return nil }},
		{"roundtrips", func() error { r.roundTrips(); return nil }},
		{"sessions", func() error { r.sessionScaling(); return nil }},
		{"agents", func() error { r.agentsList(); return nil }},
		{"stores", func() error { r.stores(); return nil }},
		{"durable", func() error { r.durableFloor(); return nil }},
		{"startup", r.serveStartup},
		{"idle", r.idle},
		{"node", r.nodeHost},
		{"cluster", r.cluster},
	}
	for _, sec := range sections {
		if r.only != "" && !slices.Contains(strings.Split(r.only, ","), sec.name) {
			continue
		}
		if err := sec.run(); err != nil {
			return err
		}
	}
	return nil
}

// events: event throughput on each bus, beside its raw transport: the
// bytes carried, then the same with each event decoded as a session does
// (the targets are on those), beside a tight loop of the decode alone.
func (r *runner) events() {
	rawNames := map[string]string{"fake": "Go channel", "pipe": "JSON lines over os.Pipe", "nats-inproc": "nats.go pub/sub in-process", "nats-tcp": "nats.go pub/sub over TCP"}
	r.add(r.run("json", "limit: decode one event (wire.DecodeEvent)", bustest.BenchmarkDecodeEvent))
	for _, decode := range []bool{false, true} {
		raws := map[string]func(b *testing.B){
			"fake":        bustest.BenchmarkRawChannel,
			"pipe":        rawPipe(decode),
			"nats-inproc": rawNATS(false, decode),
			"nats-tcp":    rawNATS(true, decode),
		}
		events, suffix := bustest.BenchmarkEvents, ""
		if decode {
			raws["fake"] = bustest.BenchmarkRawChannelDecoded
			events, suffix = bustest.BenchmarkEventsDecoded, ", decoded"
		}
		for _, k := range buses {
			raw := r.run(k.name, "events raw: "+rawNames[k.name]+suffix, raws[k.name])
			bus := r.run(k.name, "events"+suffix, onBus(k, events))
			bus.compare(raw, throughput, map[bool]float64{true: 0.8}[decode])
			r.add(raw)
			r.add(bus)
		}
	}
}

// pushSenders is how many agents push at once in the push benchmark.
const pushSenders = 8

// roundTrips: the round trip through the broker (memory store), beside
// raw request/reply on nats.go; on NATS also beside the bare exchange of
// the same four messages, and with the durable store.
func (r *runner) roundTrips() {
	rawRR, bare := map[bool]Result{}, map[bool]Result{}
	for _, tcp := range []bool{false, true} {
		where := map[bool]string{false: "in-process", true: "over TCP"}[tcp]
		rawRR[tcp] = r.run("nats", "limit: request/reply raw, nats.go "+where, rawRequestReply(tcp))
		r.add(rawRR[tcp])
		bare[tcp] = r.run("nats", "limit: the round trip's four messages bare, nats.go "+where, rawExchange(tcp))
		r.add(bare[tcp])
	}
	for _, k := range buses {
		tcp := k.name == "nats-tcp"
		res := r.run(k.name, "round trip, memory store", onBus(k, brokertest.BenchmarkRoundTrip))
		switch k.name {
		case "nats-tcp":
			res.compare(bare[tcp], latency, 1.1)
		case "nats-inproc":
			res.compare(rawRR[tcp], latency, 4)
		default:
			res.compare(rawRR[false], latency, 0)
		}
		r.add(res)
		keyed := r.run(k.name, "round trip, memory store, with messageIds", onBus(k, func(b *testing.B, h bustest.Harness) {
			brokertest.BenchmarkKeyedRoundTripOn(b, h, nil)
		}))
		keyed.compare(res, latency, 0)
		r.add(keyed)
		if !strings.HasPrefix(k.name, "nats") {
			continue
		}
		rawPush := r.run("nats", fmt.Sprintf("limit: %d senders' pushes bare, nats.go %s", pushSenders, map[bool]string{false: "in-process", true: "over TCP"}[tcp]), rawPushes(tcp, pushSenders))
		r.add(rawPush)
		push := r.run(k.name, fmt.Sprintf("oneway pushes, %d senders", pushSenders), onBus(k, func(b *testing.B, h bustest.Harness) { brokertest.BenchmarkPushes(b, h, pushSenders) }))
		push.compare(rawPush, throughput, 0.95)
		r.add(push)
		dur := r.run(k.name, "round trip, durable store", onBus(k, func(b *testing.B, h bustest.Harness) {
			st, err := pebblestore.Open(b.TempDir(), pebblestore.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			brokertest.BenchmarkRoundTripOn(b, h, st)
		}))
		dur.compare(bare[tcp], latency, map[bool]float64{true: 3}[tcp])
		r.add(dur)
		durKeyed := r.run(k.name, "round trip, durable store, with messageIds", onBus(k, func(b *testing.B, h bustest.Harness) {
			st, err := pebblestore.Open(b.TempDir(), pebblestore.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			brokertest.BenchmarkKeyedRoundTripOn(b, h, st)
		}))
		durKeyed.compare(dur, latency, 0)
		r.add(durKeyed)
	}
}

// sessionScaling: the cost of an event with 1 to 1000 live sessions.
func (r *runner) sessionScaling() {
	sessions := []int{1, 10, 100, 1000}
	for _, k := range buses {
		var one Result
		for _, n := range sessions {
			res := r.run(k.name, fmt.Sprintf("event with %d sessions", n), onBus(k, func(b *testing.B, h bustest.Harness) { bustest.BenchmarkSessions(b, h, n) }))
			if n == 1 {
				one = res
			} else {
				bound := 0.0
				if n == 1000 && (k.name == "nats-inproc" || k.name == "nats-tcp") {
					bound = 1.25
				}
				res.compare(one, cost, bound)
			}
			r.add(res)
		}
	}
}

// agentsList: a2a.agents.list with 10 to 10,000 registered agents.
func (r *runner) agentsList() {
	agents := []int{10, 100, 1000, 10000}
	if r.quick {
		agents = []int{10, 1000, 10000}
	}
	for _, k := range buses {
		for _, n := range agents {
			r.add(r.run(k.name, fmt.Sprintf("agents.list of %d", n), onBus(k, func(b *testing.B, h bustest.Harness) { brokertest.BenchmarkListAgents(b, h, n) })))
		}
	}
}

// stores: task creation on the durable store, with one and with 64
// concurrent senders, beside the disk's limit (one append and one sync of
// a task's bytes) and the memory store.
func (r *runner) stores() {
	limit := r.run("disk", "limit: append + fdatasync of one task's bytes", benchAppendSync)
	r.add(limit)
	for _, senders := range []int{1, 64} {
		mem := r.run("store", fmt.Sprintf("create, memory, %d senders", senders), func(b *testing.B) {
			storetest.BenchmarkCreate(b, func(*testing.B) store.Tasks { return store.NewMemory() }, senders)
		})
		r.add(mem)
		res := r.run("store", fmt.Sprintf("create, pebble (the store), %d senders", senders), func(b *testing.B) {
			storetest.BenchmarkCreate(b, func(b *testing.B) store.Tasks {
				s, err := pebblestore.Open(b.TempDir(), pebblestore.Options{})
				if err != nil {
					b.Fatal(err)
				}
				return s
			}, senders)
		})
		if senders == 1 {
			res.compare(limit, latency, 1.5)
		} else {
			res.compare(mem, throughput, 0.3)
		}
		r.add(res)
	}
	r.registrations(limit)
}

// registrations: a delegate's arrival and departure (register, then
// deregister) over NATS TCP, with the registry in memory (as before
// registrations were stored) and in the durable store, where each is
// one synced change: beside the memory one, and beside the disk's limit
// for two changes.
func (r *runner) registrations(limit Result) {
	tcp := buses[len(buses)-1]
	for _, senders := range []int{1, 16} {
		mem := r.run(tcp.name, fmt.Sprintf("register+deregister, memory, %d senders", senders), onBus(tcp, func(b *testing.B, h bustest.Harness) {
			brokertest.BenchmarkRegisterDeregister(b, h, nil, senders)
		}))
		r.add(mem)
		durable := r.run(tcp.name, fmt.Sprintf("register+deregister, pebble, %d senders", senders), onBus(tcp, func(b *testing.B, h bustest.Harness) {
			st, err := pebblestore.Open(b.TempDir(), pebblestore.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			brokertest.BenchmarkRegisterDeregister(b, h, st, senders)
		}))
		durable.compare(mem, throughput, 0)
		r.add(durable)
		if senders == 1 {
			twoSyncs := limit
			twoSyncs.Case, twoSyncs.NsPerOp = "2 × "+limit.Case, 2*limit.NsPerOp
			lone := durable
			lone.Case += " (against two syncs)"
			lone.compare(twoSyncs, cost, 0)
			r.add(lone)
		}
	}
}

// serveStartup: start-up time and resident memory of a2a-bus serve.
func (r *runner) serveStartup() error {
	bin, cleanup, err := buildServe()
	if err != nil {
		return err
	}
	defer cleanup()
	runs := 5
	if r.quick {
		runs = 2
	}
	for _, bus := range []string{"nats", "pipe"} {
		fmt.Fprintf(os.Stderr, "bench: %-12s serve start-up\n", bus)
		ready, rss, err := startup(bin, bus, runs)
		if err != nil {
			return fmt.Errorf("start-up %s: %w", bus, err)
		}
		r.add(Result{Bus: bus, Case: "serve start-up to ready", NsPerOp: float64(ready.Nanoseconds()),
			Metrics: map[string]float64{"ready-ms": float64(ready.Microseconds()) / 1000, "rss-KiB": float64(rss)}})
	}
	return nil
}

func (r *runner) markdown() string {
	s := fmt.Sprintf("Measured by `go run ./bench%s` on %s, %d CPUs, Go %s, %s.\n\n",
		map[bool]string{true: " --quick", false: ""}[r.quick], runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU(), runtime.Version(), time.Now().UTC().Format("2006-01-02"))
	s += "| bus | case | time/op | allocs/op | B/op | figures | ratio | against | target |\n"
	s += "| --- | --- | ---: | ---: | ---: | --- | ---: | --- | --- |\n"
	for _, res := range r.results {
		figs := ""
		for _, k := range []string{"events/s", "tasks/s", "msgs/s", "pushes/s", "p50-µs", "p99-µs", "ready-ms", "rss-KiB", "cpu-%", "broker-cpu-%", "host-cpu-%", "server-cpu-%", "rss-MiB", "KiB/session", "KiB/connection", "MB/s", "bytes", "cpu-ms/op", "server-cpu-ms/op", "rpc/op", "js-writes/op", "js-msgs/op", "js-reads/op", "events/op"} {
			if v, ok := res.Metrics[k]; ok {
				figs += fmt.Sprintf("%s %s; ", k, human(v))
			}
		}
		ratio, target := "", res.Target
		if res.Ratio > 0 {
			ratio = fmt.Sprintf("%.2f", res.Ratio)
		}
		if res.Met != nil {
			target += map[bool]string{true: " ✓", false: " ✗"}[*res.Met]
		}
		s += fmt.Sprintf("| %s | %s | %s | %s | %d | %s | %s | %s | %s |\n", res.Bus, res.Case, duration(res.NsPerOp), allocs(res.AllocsPerOp), res.BytesPerOp, figs, ratio, res.Against, target)
	}
	return s
}

func human(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func duration(ns float64) string {
	switch {
	case ns == 0:
		return "—"
	case ns >= 1e6:
		return fmt.Sprintf("%.2f ms", ns/1e6)
	case ns >= 1e3:
		return fmt.Sprintf("%.2f µs", ns/1e3)
	}
	return fmt.Sprintf("%.0f ns", ns)
}

// allocs prints an allocation count; -1 means not counted.
func allocs(n int64) string {
	if n < 0 {
		return "–"
	}
	return fmt.Sprint(n)
}
