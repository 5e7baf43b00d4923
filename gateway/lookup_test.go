package gateway_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/gateway"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/transport/fakebus"
	"github.com/a2a-bus/a2a-bus/wire"
)

// listWatch is the broker's bus, watching the a2a.agents.list calls: how
// many, and the bytes of their answers.
type listWatch struct {
	*fakebus.Bus
	calls, bytes atomic.Int64
}

func (w *listWatch) Serve(h transport.Handler) error {
	return w.Bus.Serve(transport.HandlerFunc(func(ctx context.Context, from transport.Caller, req []byte) []byte {
		list := bytes.Contains(req, []byte(`"`+wire.MethodListAgents+`"`))
		res := h.ServeRPC(ctx, from, req)
		if list {
			w.calls.Add(1)
			w.bytes.Add(int64(len(res)))
		}
		return res
	}))
}

// cardEnv is a broker with n agents of 15 KB cards, spread over sessions,
// and a gateway in front of it; it returns the gateway's handler, the
// agents' ids and the watch.
func cardEnv(tb testing.TB, n int) (http.Handler, []string, *listWatch) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bus := &listWatch{Bus: fakebus.New(fakebus.Config{})}
	b, err := broker.New(context.Background(), bus, broker.Config{HiddenSessions: []string{gateway.DefaultSession}})
	require.NoError(tb, err)
	g, err := gateway.New(ctx, bus.Bus, gateway.Config{Token: token, BaseURL: "http://gateway.test", Version: "test"})
	require.NoError(tb, err)
	tb.Cleanup(func() {
		g.Close()
		bus.Close()
		b.Close()
	})
	desc := strings.Repeat("a card of fifteen kilobytes. ", 15<<10/29)
	ids := make([]string, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	errs := make(chan error, n)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s, err := bus.Session(ctx, fmt.Sprint("chat-", i/50))
			if err != nil {
				errs <- err
				return
			}
			raw, err := s.Call(ctx, wire.MethodRegister, wire.RegisterParams{ContextID: s.ID(), Card: &wire.AgentCard{Name: fmt.Sprintf("agent-%04d", i), Description: desc}})
			if err != nil {
				errs <- err
				return
			}
			var r wire.RegisterResult
			if err := wire.Unmarshal(raw, &r); err != nil {
				errs <- err
				return
			}
			ids[i] = r.AgentID
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(tb, err)
	}
	return g.Handler(), ids, bus
}

func getCard(h http.Handler, id string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/agents/"+id+"/.well-known/agent-card.json", nil)
	r.Header.Set("Authorization", "Bearer "+token)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// A card lookup reads that one card from the broker, not every live
// agent's (issue #30: 1,280 agents of 15 KB cards made one lookup move
// 19 MB).
func TestACardLookupReadsOneCard(t *testing.T) {
	h, ids, watch := cardEnv(t, 300)
	watch.calls.Store(0)
	watch.bytes.Store(0)

	w := getCard(h, ids[150])
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	assert.Contains(t, w.Body.String(), `"name":"`+ids[150]+`"`)
	assert.Equal(t, int64(1), watch.calls.Load(), "one call to the broker")
	assert.Less(t, watch.bytes.Load(), int64(2*wire.MaxCardBytes), "one card's bytes, not 300 cards'")

	// No live agent: 404, with no more read.
	watch.bytes.Store(0)
	w = getCard(h, "nobody")
	assert.Equal(t, http.StatusNotFound, w.Code)
	assert.Equal(t, int64(2), watch.calls.Load())
	assert.Less(t, watch.bytes.Load(), int64(1<<10))
}

// The cost of a card lookup, with 10 and 1,280 agents of 15 KB cards
// registered: the same (issue #30).
func BenchmarkCardLookup(b *testing.B) {
	for _, n := range []int{10, 1280} {
		b.Run(fmt.Sprint("agents=", n), func(b *testing.B) {
			h, ids, _ := cardEnv(b, n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if w := getCard(h, ids[i%n]); w.Code != http.StatusOK {
					b.Fatal(w.Code, w.Body.String())
				}
			}
		})
	}
}

// A stream closes when its task is canceled through the same gateway, at
// the cancel: the broker tells a cancel to the other member only, and the
// gateway's poll (a minute here) must not be what ends the stream.
func TestAStreamClosesAtTheGatewaysOwnCancel(t *testing.T) {
	t.Cleanup(gateway.SetPollEvery(time.Minute)) // undone after the gateway closes
	e := newEnv(t)
	d := e.delegate("chat-1", "scribe")
	_, c := e.client(d.ID())

	res, err := c.SendMessage(ctxT(t), &a2a.SendMessageRequest{Message: userMessage("take seat 2"), Config: &a2a.SendMessageConfig{ReturnImmediately: true}})
	require.NoError(t, err)
	task := res.(*a2a.Task)
	next, stop := iterPull(c.SubscribeToTask(ctxT(t), &a2a.SubscribeToTaskRequest{ID: task.ID}))
	defer stop()
	first, err := next()
	require.NoError(t, err)
	require.IsType(t, &a2a.Task{}, first, "a subscription starts with the task")

	canceled, err := c.CancelTask(ctxT(t), &a2a.CancelTaskRequest{ID: task.ID})
	require.NoError(t, err)
	require.Equal(t, a2a.TaskStateCanceled, canceled.Status.State)

	// The stream's next events come from the cancel, not from a poll a
	// minute away (the test's context ends at 20 s).
	var last a2a.Event
	for {
		ev, err := next()
		require.NoError(t, err, "the stream ends at the cancel, not at the poll")
		if ev == nil {
			break
		}
		last = ev
	}
	require.IsType(t, &a2a.TaskStatusUpdateEvent{}, last)
	assert.Equal(t, a2a.TaskStateCanceled, last.(*a2a.TaskStatusUpdateEvent).Status.State)
}
