package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/a2a-bus/a2a-bus/store/storetest"
)

// benchAppendSync is the disk's limit for a durable store: one append of a
// task's bytes (a new task as the store benchmark creates it, encoded)
// and one sync of the data, per operation, on the same disk.
func benchAppendSync(b *testing.B) {
	data, err := json.Marshal(storetest.NewRecord("t0000000001", "c0", "r0", "asg", 1))
	if err != nil {
		b.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(b.TempDir(), "log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	took := make([]time.Duration, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if _, err := f.Write(data); err != nil {
			b.Fatal(err)
		}
		if err := syncData(f); err != nil {
			b.Fatal(err)
		}
		took[i] = time.Since(start)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tasks/s")
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(took[len(took)*99/100].Nanoseconds())/1e3, "p99-µs")
	b.ReportMetric(float64(len(data)), "bytes")
}
