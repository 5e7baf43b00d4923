package brokertest

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/transport/bustest"
	"github.com/a2a-bus/a2a-bus/wire"
)

// The benchmarks below run the broker over any bus, so that bench/
// compares buses side by side. Each takes a fresh Harness and starts a
// broker on Harness.Bus unless the broker runs elsewhere.

// benchBroker starts a broker on h.Bus unless the broker runs elsewhere.
func benchBroker(b *testing.B, h bustest.Harness, cfg broker.Config) func() {
	if h.Bus == nil {
		return func() {}
	}
	br, err := broker.New(context.Background(), h.Bus, cfg)
	if err != nil {
		b.Fatal(err)
	}
	return func() { br.Close() }
}

type benchAgent struct {
	sess  transport.Session
	sub   transport.Subscription
	id    string
	token string
	// wait bounds next; one timer, reset for each event, as the raw
	// baselines' NextMsg reuses its timers.
	wait *time.Timer
}

func benchRegister(b *testing.B, h bustest.Harness, session, name string, subscribe bool) *benchAgent {
	ctx := context.Background()
	s, err := h.Client.Session(ctx, session)
	if err != nil {
		b.Fatal(err)
	}
	a := &benchAgent{sess: s}
	if subscribe {
		if a.sub, err = s.Subscribe(ctx); err != nil {
			b.Fatal(err)
		}
	}
	res, err := s.Call(ctx, wire.MethodRegister, wire.RegisterParams{ContextID: session, Card: &wire.AgentCard{Name: name}})
	if err != nil {
		b.Fatal(err)
	}
	var r wire.RegisterResult
	if err := json.Unmarshal(res, &r); err != nil {
		b.Fatal(err)
	}
	a.id, a.token = r.AgentID, r.Token
	return a
}

func (a *benchAgent) next(b *testing.B) *wire.TaskEvent {
	if a.wait == nil {
		a.wait = time.NewTimer(10 * time.Second)
	} else {
		a.wait.Reset(10 * time.Second)
	}
	defer a.wait.Stop()
	select {
	case m, ok := <-a.sub.C():
		if !ok {
			b.Fatal("subscription ended")
		}
		ev, err := wire.DecodeEvent(m)
		if err != nil || ev.TaskEvent == nil {
			b.Fatalf("bad event: %v", err)
		}
		return ev.TaskEvent
	case <-a.wait.C:
		b.Fatal("no event")
		return nil
	}
}

// BenchmarkRoundTrip measures the A2A round trip through the broker: a
// send creates a task, the assignee's session receives the event, the
// assignee completes the task, the requester's session receives the
// event. It reports p50 and p99.
func BenchmarkRoundTrip(b *testing.B, h bustest.Harness) { BenchmarkRoundTripOn(b, h, nil) }

// BenchmarkRoundTripOn is BenchmarkRoundTrip with the broker's tasks in
// st (nil: the memory store): with a durable store, both changes of a
// round trip wait for the disk.
func BenchmarkRoundTripOn(b *testing.B, h bustest.Harness, st store.Store) {
	roundTrips(b, h, st, false)
}

// BenchmarkKeyedRoundTripOn is BenchmarkRoundTripOn with an idempotency
// key on the send and on the update, as the runtime sends them: the
// broker looks each key up and keeps it.
func BenchmarkKeyedRoundTripOn(b *testing.B, h bustest.Harness, st store.Store) {
	roundTrips(b, h, st, true)
}

func roundTrips(b *testing.B, h bustest.Harness, st store.Store, keyed bool) {
	defer benchBroker(b, h, broker.Config{MaxTasksPerContext: 1 << 30, Store: st})()
	ctx := context.Background()
	req := benchRegister(b, h, "rt-1", "requester", true)
	asg := benchRegister(b, h, "rt-2", "assignee", true)
	send := wire.SendParams{Token: req.token, To: asg.id, Message: &wire.Message{Parts: []wire.Part{wire.TextPart("take seat 2?")}}}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		update := wire.UpdateParams{Token: asg.token, State: wire.StateCompleted}
		if keyed {
			m := *send.Message
			m.MessageID = "send-" + strconv.Itoa(i)
			send.Message, update.MessageID = &m, "update-"+strconv.Itoa(i)
		}
		if _, err := req.sess.Call(ctx, wire.MethodSend, send); err != nil {
			b.Fatal(err)
		}
		created := asg.next(b)
		update.TaskID = created.TaskID
		if _, err := asg.sess.Call(ctx, wire.MethodUpdateTask, update); err != nil {
			b.Fatal(err)
		}
		if done := req.next(b); !done.Final {
			b.Fatal("not final")
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	bustest.ReportLatency(b, lat)
}

// BenchmarkPushes measures oneway sends (a2a.push) from senders agents,
// each in a session of its own, to one subscribed agent: pushes per
// second delivered. A push stores nothing: one request decoded, one
// event encoded and published.
func BenchmarkPushes(b *testing.B, h bustest.Harness, senders int) {
	defer benchBroker(b, h, broker.Config{})()
	ctx := context.Background()
	to := benchRegister(b, h, "push-to", "receiver", true)
	from := make([]*benchAgent, senders)
	for i := range from {
		from[i] = benchRegister(b, h, fmt.Sprint("push-", i), fmt.Sprint("sender-", i), false)
	}
	msg := &wire.Message{Parts: []wire.Part{wire.TextPart("seat 2 is taken")}}
	received := make(chan struct{})
	go func() {
		defer close(received)
		wait := time.NewTimer(10 * time.Second)
		defer wait.Stop()
		for range b.N {
			wait.Reset(10 * time.Second)
			select {
			case _, ok := <-to.sub.C():
				if !ok {
					return
				}
			case <-wait.C:
				return
			}
		}
	}()
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for _, a := range from {
		wg.Go(func() {
			p := wire.SendParams{Token: a.token, To: to.id, Oneway: true, Message: msg}
			for next.Add(1) <= int64(b.N) {
				if _, err := a.sess.Call(ctx, wire.MethodSend, p); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	<-received
	b.StopTimer()
	if d := to.sub.Dropped(); d > 0 {
		b.Fatalf("%d pushes dropped", d)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pushes/s")
}

// BenchmarkListAgents measures a2a.agents.list with n agents registered
// across 100 sessions (the per-session cap is lifted to fit them). A
// list answers one page (docs/PROTOCOL.md §4.10), so past a page this
// measures the first page of n.
func BenchmarkListAgents(b *testing.B, h bustest.Harness, n int) {
	defer benchBroker(b, h, broker.Config{MaxAgentsPerSession: max(n/100+1, broker.DefaultMaxAgentsPerSession)})()
	ctx := context.Background()
	caller := benchRegister(b, h, "lister", "lister", false)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range n - 1 {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s, err := h.Client.Session(ctx, fmt.Sprint("s", i%100))
			if err != nil {
				b.Error(err)
				return
			}
			if _, err := s.Call(ctx, wire.MethodRegister, wire.RegisterParams{ContextID: s.ID(), Card: &wire.AgentCard{Name: fmt.Sprint("agent-", i), Description: "a benchmark agent"}}); err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := caller.sess.Call(ctx, wire.MethodListAgents, wire.TokenParams{Token: caller.token}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRegisterDeregister measures a delegate's arrival and
// departure, a2a.agents.register then a2a.agents.deregister, on st (nil:
// a new memory store), from senders concurrent sessions; one op is the
// pair. With a durable store each is a stored, synced change
// (docs/PROTOCOL.md §4.12), so this is the cost of the durable registry
// beside the memory one. It reports pairs a second.
func BenchmarkRegisterDeregister(b *testing.B, h bustest.Harness, st store.Store, senders int) {
	defer benchBroker(b, h, broker.Config{Store: st})()
	ctx := context.Background()
	sessions := make([]transport.Session, senders)
	for i := range sessions {
		s, err := h.Client.Session(ctx, fmt.Sprint("reg-", i))
		if err != nil {
			b.Fatal(err)
		}
		sessions[i] = s
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for w, s := range sessions {
		wg.Go(func() {
			card := &wire.AgentCard{Name: "planner"}
			instance := fmt.Sprint("bench-inst-", w)
			for next.Add(1) <= int64(b.N) {
				res, err := s.Call(ctx, wire.MethodRegister, wire.RegisterParams{ContextID: s.ID(), Card: card, InstanceID: instance})
				if err != nil {
					b.Error(err)
					return
				}
				var r wire.RegisterResult
				if err := json.Unmarshal(res, &r); err != nil {
					b.Error(err)
					return
				}
				if _, err := s.Call(ctx, wire.MethodDeregister, wire.TokenParams{Token: r.Token}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
}
