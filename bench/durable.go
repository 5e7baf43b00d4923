package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/a2a-bus/a2a-bus/broker/brokertest"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/store/pebblestore"
	"github.com/a2a-bus/a2a-bus/store/storetest"
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
// floor is the memory one plus two syncs. The last piece is the memory
// round trip with such a sync after each change, in the broker's
// goroutine: a store that cost nothing but its syncs; what it takes
// above the floor is the machine's (the round trip's other work, after
// the wait for the disk, runs slower), not a store's.
func floorPieces() []floorPiece {
	tcp := natsTCP()
	return []floorPiece{
		{tcp.name, "round trip, memory store", roundTripOn(tcp, false)},
		{tcp.name, "round trip, durable store", roundTripOn(tcp, true)},
		{"disk", "limit: append + fdatasync of one task's bytes", benchAppendSync},
		{tcp.name, "round trip, memory store, an append + fdatasync after each change", roundTripSyncedMemory(tcp)},
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

// roundTripSyncedMemory is the round trip on a fresh harness of k, with
// the tasks in memory and an append + fdatasync of a task's bytes after
// each change.
func roundTripSyncedMemory(k busKind) func(b *testing.B) {
	return onBus(k, func(b *testing.B, h bustest.Harness) {
		data, err := json.Marshal(storetest.NewRecord("t0000000001", "c0", "r0", "asg", 1))
		if err != nil {
			b.Fatal(err)
		}
		f, err := os.OpenFile(filepath.Join(b.TempDir(), "log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		brokertest.BenchmarkRoundTripOn(b, h, &syncedMemory{Memory: store.NewMemory(), f: f, data: data})
	})
}

// syncedMemory is the memory store whose task changes each append data
// to f and sync it before they return.
type syncedMemory struct {
	*store.Memory
	mu   sync.Mutex
	f    *os.File
	data []byte
}

func (m *syncedMemory) sync() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.f.Write(m.data); err != nil {
		return err
	}
	return syncData(m.f)
}

func (m *syncedMemory) Create(ctx context.Context, rec *store.Record, maxOpen int) error {
	if err := m.Memory.Create(ctx, rec, maxOpen); err != nil {
		return err
	}
	return m.sync()
}

func (m *syncedMemory) Update(ctx context.Context, id string, fn func(*store.Record) error) (*store.Record, error) {
	rec, err := m.Memory.Update(ctx, id, fn)
	if err != nil {
		return nil, err
	}
	return rec, m.sync()
}

// durableFloor: the durable round trip over NATS TCP beside its floor,
// the memory round trip plus two appends and fdatasyncs, each piece run
// floorRounds times in turn; the row of each piece is its median round
// (by p50), and the durable round trip is compared with the floor made
// of the medians, and with the memory store that syncs.
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
	mem, dur, sync, synced := median[0], median[1], median[2], median[3]
	r.add(sync)
	r.add(mem)
	floor := Result{Bus: mem.Bus, Case: "floor: memory round trip + 2 × append + fdatasync",
		Metrics: map[string]float64{"p50-µs": mem.Metrics["p50-µs"] + 2*sync.Metrics["p50-µs"]}}
	floor.NsPerOp = mem.NsPerOp + 2*sync.NsPerOp
	r.add(floor)
	synced.compare(floor, latency, 0)
	r.add(synced)
	dur.compare(floor, latency, 1.15)
	r.add(dur)
	own := dur
	own.Case += " (against the memory store with its syncs: the store's own cost)"
	own.compare(synced, latency, 0)
	r.add(own)
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
