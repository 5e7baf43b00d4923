package main

import (
	"bufio"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/transport/bustest"
	"github.com/a2a-bus/a2a-bus/wire"
)

const window = 1024

// rawPipe carries the same JSON lines over an os.Pipe, decoded.
func rawPipe(b *testing.B) {
	r, w, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	msg := bustest.SampleEvent("bench", 1)
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	b.ResetTimer()
	var received atomic.Int64
	done := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for i := 0; i < b.N; i++ {
			if !sc.Scan() {
				done <- sc.Err()
				return
			}
			if _, err := wire.DecodeEvent(sc.Bytes()); err != nil {
				done <- err
				return
			}
			received.Add(1)
		}
		done <- nil
	}()
	bw := bufio.NewWriterSize(w, 64<<10)
	for i := 0; i < b.N; i++ {
		for int64(i)-received.Load() >= window {
			bw.Flush()
			time.Sleep(10 * time.Microsecond)
		}
		bw.Write(msg)
		bw.WriteByte('\n')
	}
	bw.Flush()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	w.Close()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// natsPair returns a publisher and a subscriber connection to a fresh
// embedded server, in-process or over TCP.
func natsPair(b *testing.B, tcp bool) (pub, sub *nats.Conn, undo func()) {
	bus, err := natsbus.New(natsbus.Config{})
	if err != nil {
		b.Fatal(err)
	}
	srv := bus.Server()
	conn := func() *nats.Conn {
		opts := []nats.Option{nats.Token(srv.Token())}
		if !tcp {
			opts = append(opts, nats.InProcessServer(srv))
		}
		nc, err := nats.Connect(srv.URL(), opts...)
		if err != nil {
			b.Fatal(err)
		}
		return nc
	}
	pub, sub = conn(), conn()
	return pub, sub, func() { pub.Close(); sub.Close(); bus.Close() }
}

// rawNATS carries the same bytes with nats.go publish/subscribe, decoded.
func rawNATS(tcp bool) func(b *testing.B) {
	return func(b *testing.B) {
		pub, sub, undo := natsPair(b, tcp)
		defer undo()
		msg := bustest.SampleEvent("bench", 1)
		var received atomic.Int64
		done := make(chan struct{})
		var n int64
		s, err := sub.Subscribe("a2a.session.bench.events", func(m *nats.Msg) {
			if _, err := wire.DecodeEvent(m.Data); err != nil {
				b.Error(err)
			}
			if received.Add(1) == n {
				close(done)
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Unsubscribe()
		sub.Flush()
		n = int64(b.N)
		b.SetBytes(int64(len(msg)))
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			for int64(i)-received.Load() >= window {
				time.Sleep(10 * time.Microsecond)
			}
			if err := pub.Publish("a2a.session.bench.events", msg); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			b.Fatal("not all received")
		}
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	}
}

// rawRequestReply measures nats.go request/reply with an echo responder.
func rawRequestReply(tcp bool) func(b *testing.B) {
	return func(b *testing.B) {
		pub, sub, undo := natsPair(b, tcp)
		defer undo()
		s, err := sub.Subscribe("raw.echo", func(m *nats.Msg) { m.Respond(m.Data) })
		if err != nil {
			b.Fatal(err)
		}
		defer s.Unsubscribe()
		sub.Flush()
		req := []byte(`{"jsonrpc":"2.0","id":1,"method":"a2a.tasks.get","params":{"token":"0123","taskId":"x"}}`)
		lat := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			start := time.Now()
			if _, err := pub.Request("raw.echo", req, 5*time.Second); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		bustest.ReportLatency(b, lat)
	}
}
