package main

import (
	"fmt"
	"testing"
)

// BenchmarkDurableFloor runs the durable round trip and its floor's
// pieces in turn, floorRounds times, in one process:
//
//	go test ./bench -run '^$' -bench DurableFloor -benchtime 2000x
//
// The ratio is the durable p50 over the memory p50 plus twice the sync's;
// memory-synced is the memory store with a sync after each change.
// One piece alone, for a profile:
//
//	go test ./bench -run '^$' -bench 'DurableFloor/1/durable' -cpuprofile cpu.out
func BenchmarkDurableFloor(b *testing.B) {
	short := map[string]string{
		"round trip, memory store":                                          "memory",
		"round trip, durable store":                                         "durable",
		"limit: append + fdatasync of one task's bytes":                     "append-sync",
		"round trip, memory store, an append + fdatasync after each change": "memory-synced",
	}
	for round := range floorRounds {
		for _, p := range floorPieces() {
			b.Run(fmt.Sprintf("%d/%s", round+1, short[p.name]), p.fn)
		}
	}
}
