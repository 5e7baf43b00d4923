package main

import (
	"bufio"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/transport/bustest"
)

// rawPipe carries the same JSON lines over an os.Pipe, read as lines
// (and decoded, with decode).
func rawPipe(decode bool) func(b *testing.B) {
	return func(b *testing.B) { benchRawPipe(b, decode) }
}

func benchRawPipe(b *testing.B, decode bool) {
	r, w, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	msg := bustest.SampleEvent("bench", 1)
	credits := bustest.NewCredits()
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	b.ResetTimer()
	done := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for i := 0; i < b.N; i++ {
			if !sc.Scan() {
				done <- fmt.Errorf("after %d lines: %v", i, sc.Err())
				return
			}
			if err := bustest.Check(sc.Bytes(), len(msg), decode); err != nil {
				done <- err
				return
			}
			credits.Give()
		}
		done <- nil
	}()
	bw := bufio.NewWriterSize(w, 64<<10)
	for i := 0; i < b.N; i++ {
		if len(credits) == cap(credits) {
			bw.Flush() // the reader waits for what is buffered
		}
		credits.Take()
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

// natsConns starts a fresh embedded server and returns a maker of
// connections to it. A connection on the broker's side is in-process, as
// the broker's own are; a client's is over TCP with tcp and in-process
// otherwise. undo closes every connection made and then the server.
func natsConns(b *testing.B, tcp bool) (conn func(brokerSide bool) *nats.Conn, undo func()) {
	bus, err := natsbus.New(natsbus.Config{})
	if err != nil {
		b.Fatal(err)
	}
	srv := bus.Server()
	var made []*nats.Conn
	conn = func(brokerSide bool) *nats.Conn {
		opts := []nats.Option{nats.Token(srv.Token())}
		if brokerSide || !tcp {
			opts = append(opts, nats.InProcessServer(srv))
		}
		nc, err := nats.Connect(srv.URL(), opts...)
		if err != nil {
			b.Fatal(err)
		}
		made = append(made, nc)
		return nc
	}
	return conn, func() {
		for _, nc := range made {
			nc.Close()
		}
		bus.Close()
	}
}

// The two sides of a connection from natsConns.
const (
	clientSide = false
	brokerSide = true
)

// rawNATS carries the same bytes with nats.go publish/subscribe (and
// decodes them, with decode).
func rawNATS(tcp, decode bool) func(b *testing.B) {
	return func(b *testing.B) {
		conn, undo := natsConns(b, tcp)
		defer undo()
		pub, sub := conn(brokerSide), conn(clientSide)
		msg := bustest.SampleEvent("bench", 1)
		credits := bustest.NewCredits()
		s, err := sub.Subscribe("a2a.session.bench.events", func(m *nats.Msg) {
			if err := bustest.Check(m.Data, len(msg), decode); err != nil {
				b.Error(err)
			}
			credits.Give()
		})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Unsubscribe()
		sub.Flush()
		b.SetBytes(int64(len(msg)))
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			credits.Take()
			if err := pub.Publish("a2a.session.bench.events", msg); err != nil {
				b.Fatal(err)
			}
		}
		for range cap(credits) { // every credit back: every event delivered
			credits.Take()
		}
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	}
}

// rawRequestReply measures nats.go request/reply with an echo responder.
func rawRequestReply(tcp bool) func(b *testing.B) {
	return func(b *testing.B) {
		conn, undo := natsConns(b, tcp)
		defer undo()
		pub, sub := conn(clientSide), conn(brokerSide)
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

// rawExchange is the round trip's bare exchange: the same four messages
// as a round trip through the broker, on nats.go and the same server, with
// a responder that only echoes. The requester sends (a request of a
// send's size, answered with a task's size) and the responder publishes
// the created event to the assignee; the assignee sends an update,
// answered likewise, and the responder publishes the final event to the
// requester. The requester and the assignee share one client
// connection, as the host client's sessions do in the benchmarks through
// the broker; the responder is on the broker's side.
func rawExchange(tcp bool) func(b *testing.B) {
	return func(b *testing.B) {
		conn, undo := natsConns(b, tcp)
		defer undo()
		client, sub := conn(clientSide), conn(brokerSide)
		requester, assignee := client, client
		event := bustest.SampleEvent("bench", 1)
		answer := event[:len(event)*3/4] // a task's size
		responder := func(subject, notify string) {
			s, err := sub.Subscribe(subject, func(m *nats.Msg) {
				m.Respond(answer)
				sub.Publish(notify, event)
			})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Unsubscribe() })
		}
		responder("raw.send", "raw.events.assignee")
		responder("raw.update", "raw.events.requester")
		toAssignee, err := assignee.SubscribeSync("raw.events.assignee")
		if err != nil {
			b.Fatal(err)
		}
		toRequester, err := requester.SubscribeSync("raw.events.requester")
		if err != nil {
			b.Fatal(err)
		}
		sub.Flush()
		client.Flush()
		send := []byte(`{"jsonrpc":"2.0","id":1,"method":"a2a.message.send","params":{"token":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef","to":"assignee","message":{"role":"user","parts":[{"kind":"text","text":"take seat 2?"}]}}}`)
		update := []byte(`{"jsonrpc":"2.0","id":2,"method":"a2a.tasks.update","params":{"token":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef","taskId":"01929c6e-7f7c-7a10-9c7b-3f2f0a4d5e6f","state":"completed"}}`)
		lat := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			start := time.Now()
			if _, err := requester.Request("raw.send", send, 5*time.Second); err != nil {
				b.Fatal(err)
			}
			if _, err := toAssignee.NextMsg(5 * time.Second); err != nil {
				b.Fatal(err)
			}
			if _, err := assignee.Request("raw.update", update, 5*time.Second); err != nil {
				b.Fatal(err)
			}
			if _, err := toRequester.NextMsg(5 * time.Second); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		bustest.ReportLatency(b, lat)
	}
}

// rawPushes is the bare exchange of a push: senders send a request of a
// push's size to a responder that answers it and publishes an event of a
// push's size to a receiver's subscription. Every sender and the
// receiver share one client connection, as the host client's sessions
// do in the benchmarks through the broker; the responder is on the
// broker's side.
func rawPushes(tcp bool, senders int) func(b *testing.B) {
	return func(b *testing.B) {
		conn, undo := natsConns(b, tcp)
		defer undo()
		sub, recv := conn(brokerSide), conn(clientSide)
		event := bustest.SampleEvent("bench", 1)[:400] // a push's size
		answer := []byte(`{"jsonrpc":"2.0","id":1,"result":{"delivered":"receiver"}}`)
		s, err := sub.Subscribe("raw.push", func(m *nats.Msg) {
			m.Respond(answer)
			sub.Publish("raw.events.receiver", event)
		})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Unsubscribe()
		received := make(chan struct{}, 1024)
		r, err := recv.Subscribe("raw.events.receiver", func(*nats.Msg) { received <- struct{}{} })
		if err != nil {
			b.Fatal(err)
		}
		defer r.Unsubscribe()
		sub.Flush()
		recv.Flush()
		push := []byte(`{"jsonrpc":"2.0","id":1,"method":"a2a.message.send","params":{"token":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef","to":"receiver","oneway":true,"message":{"role":"user","parts":[{"kind":"text","text":"seat 2 is taken"}]}}}`)
		var next atomic.Int64
		done := make(chan struct{})
		go func() {
			defer close(done)
			for range b.N {
				<-received
			}
		}()
		b.ReportAllocs()
		b.ResetTimer()
		var wg sync.WaitGroup
		for range senders {
			wg.Go(func() {
				for next.Add(1) <= int64(b.N) {
					if _, err := recv.Request("raw.push", push, 5*time.Second); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		<-done
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pushes/s")
	}
}
