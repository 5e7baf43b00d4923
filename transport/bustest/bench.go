package bustest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// The benchmarks below run identical work on any bus, so that bench/
// compares buses side by side. Each takes a fresh Harness. Those that
// need a broker are in broker/brokertest.

// window bounds the notifications in flight in the throughput benchmarks,
// on the bus and on the raw transports alike, so that a fast publisher
// measures delivery rather than how many a buffer drops.
const window = 1024

// Credits is flow control without sleeps for a throughput benchmark: the
// sender takes a credit before each message (blocking while window are
// in flight), the receiver gives one back for each it received.
type Credits chan struct{}

// NewCredits returns window credits.
func NewCredits() Credits { return make(Credits, window) }

// Take blocks until a message may be sent.
func (c Credits) Take() { c <- struct{}{} }

// Give returns the credit of a message received.
func (c Credits) Give() { <-c }

// SampleEvent returns a typical a2a.task.event of about 600 bytes, as the
// broker encodes it, for session.
func SampleEvent(session string, seq uint64) []byte {
	text := "Shall we share the roundtable? I take seat 1."
	at := wire.NewTime(time.Date(2026, 9, 5, 12, 0, 0, 0, time.UTC))
	task := &wire.Task{ID: "01929c6e-7f7c-7a10-9c7b-3f2f0a4d5e6f", ContextID: "chat-1", RequesterName: "discussant",
		AgentName: "discussant-2", AgentContextID: session, Status: wire.TaskStatus{State: wire.StateSubmitted, Timestamp: at},
		Artifacts: []wire.Artifact{}, CreatedAt: at, UpdatedAt: at}
	ev := &wire.TaskEvent{
		EventHead: wire.EventHead{Recipient: "discussant-2", RecipientContextID: session, ContextID: "chat-1", Seq: seq, Epoch: "5c2f7a8e9b0d4c1f8a6e3b2d1c0f9e8d"},
		TaskID:    task.ID, Kind: wire.EventCreated, Task: task,
		Message: &wire.Message{MessageID: "m-1", Role: wire.RoleUser, Parts: []wire.Part{{Kind: wire.KindText, Text: &text}}, From: "discussant", TaskID: task.ID, ContextID: "chat-1"},
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": wire.NotifyTaskEvent, "params": ev})
	return b
}

// BenchmarkEvents measures notifications delivered to one subscribed
// session: Publish on the broker side, receive on the session side (the
// bytes), at most window in flight.
func BenchmarkEvents(b *testing.B, h Harness) { benchEvents(b, h, false) }

// BenchmarkEventsDecoded is BenchmarkEvents with each event decoded
// (wire.DecodeEvent) as it is received, as a session does.
func BenchmarkEventsDecoded(b *testing.B, h Harness) { benchEvents(b, h, true) }

func benchEvents(b *testing.B, h Harness, decode bool) {
	ctx := context.Background()
	sess, err := h.Client.Session(ctx, "bench")
	if err != nil {
		b.Fatal(err)
	}
	sub, err := sess.Subscribe(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	if err := h.Bus.Serve(transport.HandlerFunc(func(context.Context, transport.Caller, []byte) []byte { return nil })); err != nil {
		b.Fatal(err)
	}
	msg := SampleEvent("bench", 1)
	credits := NewCredits()
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	b.ResetTimer()
	done := make(chan error, 1)
	go func() {
		for i := 0; i < b.N; i++ {
			m, ok := <-sub.C()
			if !ok {
				done <- fmt.Errorf("subscription ended after %d", i)
				return
			}
			if err := Check(m, len(msg), decode); err != nil {
				done <- err
				return
			}
			credits.Give()
		}
		done <- nil
	}()
	for i := 0; i < b.N; i++ {
		credits.Take()
		if err := h.Bus.Publish("bench", msg); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if d := sub.Dropped(); d > 0 {
		b.Fatalf("%d notifications dropped", d)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// Check is what a throughput benchmark's receiver does with a message
// of size bytes: it checks its length, or decodes it.
func Check(m []byte, size int, decode bool) error {
	if decode {
		_, err := wire.DecodeEvent(m)
		return err
	}
	if len(m) != size {
		return fmt.Errorf("received %d bytes, sent %d", len(m), size)
	}
	return nil
}

// BenchmarkRawChannel is the fake bus's raw transport: the same bytes
// through a Go channel of window.
func BenchmarkRawChannel(b *testing.B) { rawChannel(b, false) }

// BenchmarkRawChannelDecoded is BenchmarkRawChannel with each event
// decoded as it is received.
func BenchmarkRawChannelDecoded(b *testing.B) { rawChannel(b, true) }

func rawChannel(b *testing.B, decode bool) {
	msg := SampleEvent("bench", 1)
	ch := make(chan []byte, window)
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	b.ResetTimer()
	done := make(chan error, 1)
	go func() {
		for i := 0; i < b.N; i++ {
			if err := Check(<-ch, len(msg), decode); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for i := 0; i < b.N; i++ {
		ch <- msg
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkDecodeEvent is what a receiver pays to decode one event
// (wire.DecodeEvent, which takes the broker's own events the fast way):
// the row beside the transports'.
func BenchmarkDecodeEvent(b *testing.B) {
	msg := SampleEvent("bench", 1)
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := wire.DecodeEvent(msg); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// Latency summarizes round-trip times.
type Latency struct{ P50, P99 time.Duration }

func percentiles(d []time.Duration) Latency {
	if len(d) == 0 {
		return Latency{}
	}
	slices.Sort(d)
	at := func(p float64) time.Duration { return d[min(len(d)-1, int(p*float64(len(d))))] }
	return Latency{P50: at(0.50), P99: at(0.99)}
}

// ReportLatency adds p50 and p99 (in µs) to a benchmark's results.
func ReportLatency(b *testing.B, d []time.Duration) Latency {
	l := percentiles(d)
	b.ReportMetric(float64(l.P50.Nanoseconds())/1000, "p50-µs")
	b.ReportMetric(float64(l.P99.Nanoseconds())/1000, "p99-µs")
	return l
}

// BenchmarkSessions measures the cost of one event when n sessions are
// live, each subscribed: the broker-side Publish to a session chosen in
// turn, and its delivery.
func BenchmarkSessions(b *testing.B, h Harness, n int) {
	ctx := context.Background()
	if err := h.Bus.Serve(transport.HandlerFunc(func(context.Context, transport.Caller, []byte) []byte { return nil })); err != nil {
		b.Fatal(err)
	}
	subs := make([]transport.Subscription, n)
	msgs := make([][]byte, n)
	ids := make([]string, n)
	for i := range n {
		id := fmt.Sprint("s", i)
		ids[i] = id
		s, err := h.Client.Session(ctx, id)
		if err != nil {
			b.Fatal(err)
		}
		if subs[i], err = s.Subscribe(ctx); err != nil {
			b.Fatal(err)
		}
		msgs[i] = SampleEvent(id, 1)
	}
	credits := NewCredits()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for _, sub := range subs {
		wg.Go(func() {
			for {
				select {
				case _, ok := <-sub.C():
					if !ok {
						return
					}
					credits.Give()
				case <-stop:
					return
				}
			}
		})
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		credits.Take()
		if err := h.Bus.Publish(ids[i%n], msgs[i%n]); err != nil {
			b.Fatal(err)
		}
	}
	// Every credit back: every event delivered.
	for range window {
		credits.Take()
	}
	b.StopTimer()
	close(stop)
	wg.Wait()
	for _, s := range subs {
		if s.Dropped() > 0 {
			b.Fatal("dropped")
		}
	}
}
