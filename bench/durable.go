package main

import (
	"fmt"
	"slices"
	"testing"

	"github.com/a2a-bus/a2a-bus/broker/brokertest"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/store/pebblestore"
	"github.com/a2a-bus/a2a-bus/transport/bustest"
)

// floorRounds is how many times durableFloor runs each of its pieces,
// in turn, so that they share the machine's state.
const floorRounds = 3

// A piece of the durable round trip's floor, run in turn with the others.
type floorPiece struct {
	bus, name string
	fn        func(b *testing.B)
}

// floorPieces are the durable round trip over NATS TCP and its floor's
// parts: the memory round trip on the same bus, and one append and
// fdatasync of a task's bytes on the same disk. The round trip makes two
// changes, each acknowledged once synced (docs/PROTOCOL.md §9), so its
// floor is the memory one plus two syncs.
func floorPieces() []floorPiece {
	tcp := natsTCP()
	return []floorPiece{
		{tcp.name, "round trip, memory store", roundTripOn(tcp, false)},
		{tcp.name, "round trip, durable store", roundTripOn(tcp, true)},
		{"disk", "limit: append + fdatasync of one task's bytes", benchAppendSync},
	}
}

// natsTCP is the bus the floor is measured on: NATS over TCP, as a host
// in another process reaches the broker.
func natsTCP() busKind {
	i := slices.IndexFunc(buses, func(k busKind) bool { return k.name == "nats-tcp" })
	return buses[i]
}

// roundTripOn is the round trip on a fresh harness of k, with the tasks
// in a new durable store (durable) or in memory.
func roundTripOn(k busKind, durable bool) func(b *testing.B) {
	return onBus(k, func(b *testing.B, h bustest.Harness) {
		var st store.Store
		if durable {
			s, err := pebblestore.Open(b.TempDir(), pebblestore.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			st = s
		}
		brokertest.BenchmarkRoundTripOn(b, h, st)
	})
}

// durableFloor: the durable round trip over NATS TCP beside its floor,
// the memory round trip plus two appends and fdatasyncs, each piece run
// floorRounds times in turn; the row of each piece is its median round
// (by p50), and the durable round trip is compared with the floor made
// of the medians.
func (r *runner) durableFloor() {
	pieces := floorPieces()
	runs := make([][]Result, len(pieces))
	for round := range floorRounds {
		for i, p := range pieces {
			runs[i] = append(runs[i], r.run(p.bus, fmt.Sprintf("%s (%d of %d)", p.name, round+1, floorRounds), p.fn))
		}
	}
	median := make([]Result, len(pieces))
	for i, rs := range runs {
		slices.SortFunc(rs, func(a, b Result) int {
			return cmpFloat(a.Metrics["p50-µs"], b.Metrics["p50-µs"])
		})
		median[i] = rs[len(rs)/2]
		median[i].Case = fmt.Sprintf("%s (median of %d)", pieces[i].name, floorRounds)
	}
	mem, dur, sync := median[0], median[1], median[2]
	r.add(sync)
	r.add(mem)
	floor := Result{Bus: mem.Bus, Case: "floor: memory round trip + 2 × append + fdatasync",
		Metrics: map[string]float64{"p50-µs": mem.Metrics["p50-µs"] + 2*sync.Metrics["p50-µs"]}}
	floor.NsPerOp = mem.NsPerOp + 2*sync.NsPerOp
	r.add(floor)
	dur.compare(floor, latency, 1.15)
	r.add(dur)
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
