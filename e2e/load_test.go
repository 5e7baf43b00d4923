package e2e_test

import (
	"context"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/wire"
)

// loadDuration is how long the load test sends: A2A_LOAD_DURATION (a Go
// duration) for a longer run by hand, else a bounded two seconds.
func loadDuration(t *testing.T) time.Duration {
	if s := os.Getenv("A2A_LOAD_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		require.NoError(t, err)
		return d
	}
	return 2 * time.Second
}

// TestLoad runs 200 sessions of 4 delegates over NATS, every delegate
// sending tasks to delegates of other sessions and completing the tasks
// sent to it, for a bounded time. Then: no round trip lost, no event
// delivered to another session or delegate (a spy on every session
// subject checks the subject too), no seq gap left unrecovered.
func TestLoad(t *testing.T) {
	const sessions, perSession, outstanding = 200, 4, 2
	bus, err := natsbus.New(natsbus.Config{})
	require.NoError(t, err)
	b, err := broker.New(context.Background(), bus, broker.Config{MaxTasksPerContext: 1000})
	require.NoError(t, err)
	defer func() { bus.Close(); b.Close() }()

	// The spy sees every notification, with its subject.
	spy, err := nats.Connect(bus.URL(), nats.Token(bus.Server().Token()))
	require.NoError(t, err)
	defer spy.Close()
	var misrouted, spied atomic.Int64
	spySub, err := spy.Subscribe("a2a.session.*.events", func(m *nats.Msg) {
		spied.Add(1)
		token := strings.TrimSuffix(strings.TrimPrefix(m.Subject, natsbus.EventsPrefix), natsbus.EventsSuffix)
		session, err := natsbus.SessionID(token)
		h, herr := wire.DecodeNotificationHead(m.Data)
		if err != nil || herr != nil || h.RecipientContextID != session {
			misrouted.Add(1)
		}
	})
	require.NoError(t, err)
	require.NoError(t, spySub.SetPendingLimits(-1, -1))
	require.NoError(t, spy.Flush())

	client, err := bus.Connect(natsbus.ClientConfig{})
	require.NoError(t, err)
	defer client.Close()
	ctx := context.Background()
	var all []*runtime.Delegate
	var rts []*runtime.Runtime
	for s := range sessions {
		sess, err := client.Session(ctx, "load-"+itoa(s))
		require.NoError(t, err)
		rt, err := runtime.New(ctx, sess, runtime.Config{Feed: runtime.FeedConfig{PollInterval: 200 * time.Millisecond}})
		require.NoError(t, err)
		rts = append(rts, rt)
		for range perSession {
			d, err := rt.Spawn(ctx, wire.AgentCard{Name: "worker"})
			require.NoError(t, err)
			all = append(all, d)
		}
	}
	defer func() {
		for _, rt := range rts {
			rt.Close()
		}
	}()

	var (
		sent, completed, wrongRecipient, resyncs atomic.Int64
		mu                                       sync.Mutex
		latencies                                []time.Duration
	)
	stopSending := time.Now().Add(loadDuration(t))
	drainBy := stopSending.Add(60 * time.Second)
	start := time.Now()
	var wg sync.WaitGroup
	for i, d := range all {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(i), 1))
			pending := map[string]time.Time{}
			for time.Now().Before(drainBy) {
				if time.Now().Before(stopSending) && len(pending) < outstanding {
					peer := all[r.IntN(len(all))]
					if peer.SessionID() != d.SessionID() {
						task, err := d.Send(ctx, peer.ID(), wire.Message{Parts: []wire.Part{wire.TextPart("work")}}, nil)
						if !assert.NoError(t, err) {
							return
						}
						pending[task.ID] = time.Now()
						sent.Add(1)
					}
					continue
				}
				if len(pending) == 0 && !time.Now().Before(stopSending) {
					// Done sending; keep serving others until they are done.
					if sent.Load() == completed.Load() {
						return
					}
				}
				wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
				ev, err := d.Wait(wctx)
				cancel()
				if err != nil {
					continue
				}
				switch {
				case ev.Resync != nil:
					resyncs.Add(1)
				case ev.Task != nil:
					te := ev.Task
					if te.Recipient != d.ID() || te.RecipientContextID != d.SessionID() {
						wrongRecipient.Add(1)
					}
					if te.Kind == wire.EventCreated {
						if _, err := d.Update(ctx, te.TaskID, wire.StateCompleted, nil); !assert.NoError(t, err) {
							return
						}
					} else if te.Final {
						if at, ok := pending[te.TaskID]; ok {
							mu.Lock()
							latencies = append(latencies, time.Since(at))
							mu.Unlock()
							delete(pending, te.TaskID)
							completed.Add(1)
						}
					}
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(latencies)
	p := func(q float64) time.Duration {
		if len(latencies) == 0 {
			return 0
		}
		return latencies[min(len(latencies)-1, int(q*float64(len(latencies))))]
	}
	t.Logf("%d sessions x %d delegates: %d round trips in %v (%.0f/s), p50 %v, p99 %v; %d notifications seen by the spy",
		sessions, perSession, completed.Load(), elapsed.Round(time.Millisecond), float64(completed.Load())/elapsed.Seconds(), p(0.5), p(0.99), spied.Load())
	assert.Positive(t, sent.Load())
	assert.Equal(t, sent.Load(), completed.Load(), "every round trip came back")
	assert.Zero(t, wrongRecipient.Load(), "events went to their recipient only")
	assert.Zero(t, misrouted.Load(), "every event on its recipient session's subject")
	assert.Zero(t, resyncs.Load(), "no gap was left for a resync to paper over")
}

func itoa(i int) string {
	return strings.TrimLeft(string(rune('0'+i/100%10))+string(rune('0'+i/10%10))+string(rune('0'+i%10)), "")
}
