package jsstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/internal/natscluster"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/store/storetest"
	"github.com/a2a-bus/a2a-bus/wire"
)

// benchSenders is how many callers create or update at once, spread over
// the three nodes.
const benchSenders = 16

// BenchmarkCluster measures, on a three-node cluster with R3 buckets,
// task creates and updates per second, and beside them the bare
// JetStream publish of a record-sized message to an R3 stream, so that
// the store's cost reads as a ratio to the floor of the same run: once
// with the servers' default sync (every two minutes), once with every
// write fsynced (sync_interval: always).
func BenchmarkCluster(b *testing.B) {
	for _, sync := range []bool{false, true} {
		b.Run(map[bool]string{false: "sync=2m", true: "sync=always"}[sync], func(b *testing.B) {
			benchCluster(b, startCluster(b, natscluster.Options{SyncAlways: sync}))
		})
	}
}

func benchCluster(b *testing.B, c *cluster) {
	b.Run("Create", func(b *testing.B) {
		storetest.BenchmarkCreate(b, func(b *testing.B) store.Tasks {
			return c.open(b, int(c.next.Add(1))%c.N(), c.prefix(b))
		}, benchSenders)
	})
	b.Run("Update", func(b *testing.B) {
		p := c.prefix(b)
		stores := []store.Tasks{c.open(b, 0, p), c.open(b, 1, p), c.open(b, 2, p)}
		ctx := context.Background()
		for w := range benchSenders {
			require.NoError(b, stores[0].Create(ctx, storetest.NewRecord(fmt.Sprint("t", w), fmt.Sprint("c", w), "a", "b", w), 0))
		}
		run(b, "updates/s", func(w int) error {
			_, err := stores[w%3].Update(ctx, fmt.Sprint("t", w), func(r *store.Record) error {
				// Open to open: the task's compare-and-set alone, as a
				// message or an artifact makes it.
				r.Task.Status.State = map[bool]wire.State{true: wire.StateWorking, false: wire.StateSubmitted}[r.Task.Status.State == wire.StateSubmitted]
				r.Task.UpdatedAt = wire.NewTime(time.Now())
				return nil
			})
			return err
		})
	})
	b.Run("BareJetStreamPublish", func(b *testing.B) {
		p := fmt.Sprint("bench", c.n.Add(1))
		js, err := jetstream.New(c.conns[0])
		require.NoError(b, err)
		ctx := context.Background()
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: p, Subjects: []string{p + ".>"}, Replicas: 3})
		require.NoError(b, err)
		b.Cleanup(func() { _ = js.DeleteStream(context.Background(), p) })
		rec, err := storetest.NewRecord("t0000000001", "c", "a", "b", 0).Encode()
		require.NoError(b, err)
		jss := make([]jetstream.JetStream, c.N())
		for i := range jss {
			jss[i], err = jetstream.New(c.conns[i])
			require.NoError(b, err)
		}
		run(b, "msgs/s", func(w int) error {
			_, err := jss[w%3].Publish(ctx, fmt.Sprintf("%s.%d", p, w), rec)
			return err
		})
	})
}

// run calls op b.N times from benchSenders goroutines, and reports the
// calls per second as unit.
func run(b *testing.B, unit string, op func(w int) error) {
	var next atomic.Int64
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := range benchSenders {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := op(w); err != nil {
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
