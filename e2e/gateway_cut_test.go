package e2e_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/gateway"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/wire"
)

// gatewayScene is a real serve with its gateway, a delegate, and a task
// the delegate grew to 6.3 MB (in updates within the message limit).
type gatewayScene struct {
	s    *sidecar
	logs *syncBuffer
	d    *runtime.Delegate
	c    *a2aclient.Client
	hc   *http.Client
	big  string
}

func newGatewayScene(t *testing.T, logLevel string) *gatewayScene {
	s, logs := startSidecarLogged(t, logLevel, "--a2a-listen", "127.0.0.1:0")
	h := joinHost(t, s)
	g := &gatewayScene{s: s, logs: logs, d: spawn(t, h, "chat-1", "scribe")}
	g.c, g.hc = gatewayClient(t, s, g.d.ID())
	t.Cleanup(func() { g.c.Destroy() })
	g.big = g.start(t, "write it all down")
	chunk := strings.Repeat("x", 900_000)
	for i := range 7 {
		_, err := g.d.Update(gwCtx(t), g.big, wire.StateWorking, nil, wire.Artifact{Name: fmt.Sprint("part-", i), Parts: []wire.Part{wire.TextPart(chunk)}})
		require.NoError(t, err)
	}
	return g
}

// start has a client give the delegate a task, and returns its id once
// the delegate has it.
func (g *gatewayScene) start(t *testing.T, text string) string {
	t.Helper()
	res, err := g.c.SendMessage(gwCtx(t), &a2a.SendMessageRequest{Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(text)),
		Config: &a2a.SendMessageConfig{ReturnImmediately: true}})
	require.NoError(t, err)
	id := string(res.(*a2a.Task).ID)
	for {
		ev, err := g.d.Wait(gwCtx(t))
		require.NoError(t, err)
		if ev.Task != nil && ev.Task.TaskID == id && ev.Task.Kind == wire.EventCreated {
			return id
		}
	}
}

// stream opens a stream on a task and returns where the last state it
// told comes when it ends.
func (g *gatewayScene) stream(t *testing.T, id string) <-chan a2a.TaskState {
	streamed := make(chan a2a.TaskState, 1)
	streaming := make(chan struct{})
	// The stream outlives a flood, and a stop of serve: it gets the
	// flood's bound, not a single request's.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	go func() {
		last := a2a.TaskStateUnspecified
		defer func() { streamed <- last }()
		for ev, err := range g.c.SubscribeToTask(ctx, &a2a.SubscribeToTaskRequest{ID: a2a.TaskID(id)}) {
			if err != nil {
				t.Logf("the stream ended: %v", err)
				return
			}
			switch v := ev.(type) {
			case *a2a.Task:
				last = v.Status.State
				close(streaming)
			case *a2a.TaskStatusUpdateEvent:
				last = v.Status.State
			}
		}
	}()
	select {
	case <-streaming:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not start")
	}
	return streamed
}

// ends completes the task, and checks that its stream heard it.
func (g *gatewayScene) ends(t *testing.T, id string, streamed <-chan a2a.TaskState) {
	t.Helper()
	_, err := g.d.Update(gwCtx(t), id, wire.StateCompleted, &wire.Message{Parts: []wire.Part{wire.TextPart("noted")}})
	require.NoError(t, err)
	select {
	case st := <-streamed:
		assert.Equal(t, a2a.TaskStateCompleted, st, "the stream saw its task end")
	case <-time.After(20 * time.Second):
		t.Fatal("the stream never ended")
	}
}

// flood reads the big task n times at once through the gateway, and
// returns how the reads went. underWay, if not nil, is closed when the
// first read is answered: the others are then in the gateway's hands.
//
// A first read, before the flood, is decoded and checked (getTask); the
// flood's reads are only hashed, and each must be that answer byte for
// byte. (Decoding 300 MB of JSON under -race took the test four times
// the CPU that serve spends on the flood.)
func (g *gatewayScene) flood(t *testing.T, n int, underWay chan<- struct{}) map[string]int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a loaded machine's share
	defer cancel()
	url := g.s.a2aURL + "/agents/" + g.d.ID()
	st, want := readTask(ctx, g.hc, url, g.big, true)
	if st != "ok" {
		if underWay != nil {
			close(underWay)
		}
		return map[string]int{"the read before the flood: " + st: 1}
	}
	statuses := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var first sync.Once
	for range n {
		wg.Go(func() {
			st, sum := readTask(ctx, g.hc, url, g.big, false)
			if st == "ok" && sum != want {
				st = "another answer than the first read's"
			}
			if underWay != nil {
				first.Do(func() { close(underWay) })
			}
			mu.Lock()
			statuses[st]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return statuses
}

// TestAFloodOfBigReadsThroughTheGatewayIsServed: 50 concurrent GetTask of
// a 6.3 MB task, which cut the gateway's connection for good in issue
// #29 (the server lets four payloads wait for a connection), are all
// answered, and the gateway's connection is not cut; a stream open
// meanwhile sees its task end.
func TestAFloodOfBigReadsThroughTheGatewayIsServed(t *testing.T) {
	if testing.Short() {
		t.Skip("moves some 300 MB through the gateway")
	}
	g := newGatewayScene(t, "warn")
	small := g.start(t, "and a note")
	streamed := g.stream(t, small)
	began := time.Now()
	statuses := g.flood(t, 50, nil)
	t.Logf("50 reads of 6.3 MB in %v: %v", time.Since(began).Round(time.Millisecond), statuses)
	assert.Equal(t, map[string]int{"ok": 50}, statuses, "every read is answered with the task")
	g.ends(t, small, streamed)
	assert.NotContains(t, g.logs.String(), "connection was cut", "the gateway's connection was not cut")
}

// TestTheGatewayServesAgainAfterItsConnectionIsCut forces a slow-consumer
// cut of the gateway's in-process connection: notifications of 7 MB
// flood its session faster than it reads them, past what the server lets
// wait for a connection. The gateway rejoins: within seconds a request
// through it is answered again, and a stream open across the cut sees its
// task end. (Before #29 it answered 502 "the connection to NATS was
// lost" until serve restarted.)
func TestTheGatewayServesAgainAfterItsConnectionIsCut(t *testing.T) {
	g := newGatewayScene(t, "debug") // the server's notices are at debug
	small := g.start(t, "and a note")
	streamed := g.stream(t, small)

	junk := make([]byte, 7<<20)
	subject := natsbus.EventsSubject(gateway.DefaultSession)
	cut := func() bool { return strings.Contains(g.logs.String(), "Slow Consumer Detected") } // the server's notice
	// The flood must outrun the gateway's reader by 32 MiB, which a
	// reader that the machine lets run can keep up with for a while.
	for began := time.Now(); !cut(); {
		require.Less(t, time.Since(began), time.Minute, "the server never cut the gateway's connection")
		for range 16 {
			require.NoError(t, g.s.host.Publish(subject, junk))
		}
		require.NoError(t, g.s.host.Flush())
	}
	cutAt := time.Now()

	g.answersAgain(t, small, cutAt)
	t.Logf("the gateway answered again %v after the flood", time.Since(cutAt).Round(time.Millisecond))
	assert.Contains(t, g.logs.String(), "nats: the connection was cut; reconnecting", "the flood cut the gateway's connection")
	assert.Equal(t, "ok", getTask(gwCtx(t), g.hc, g.s.a2aURL+"/agents/"+g.d.ID(), g.big), "the big task reads again too")
	g.ends(t, small, streamed)
	g.logCuts(t)
}

// answersAgain waits until the gateway answers a read of the task again,
// within 10 s of since.
func (g *gatewayScene) answersAgain(t *testing.T, id string, since time.Time) {
	t.Helper()
	var last string
	answered := poll(time.Until(since.Add(10*time.Second)), 50*time.Millisecond, func() bool {
		last = getTask(gwCtx(t), g.hc, g.s.a2aURL+"/agents/"+g.d.ID(), id)
		return last == "ok"
	})
	require.True(t, answered, "the gateway still answers %q", last)
}

// logCuts logs serve's lines about its connections being cut.
func (g *gatewayScene) logCuts(t *testing.T) {
	for _, line := range strings.Split(g.logs.String(), "\n") {
		if strings.Contains(line, "nats:") || strings.Contains(line, "Slow Consumer") {
			t.Log(line)
		}
	}
}

// startSidecarLogged is startSidecar with serve's log kept, at level: the
// lines after the connection file's path.
func startSidecarLogged(t *testing.T, level string, args ...string) (*sidecar, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	return startServe(t, level, logs, args...), logs
}

// getTask reads a task through the gateway with a plain JSON-RPC POST and
// says how it went: "ok", an HTTP status, the JSON-RPC error's message,
// or the transport's error.
func getTask(ctx context.Context, hc *http.Client, url, id string) string {
	st, _ := readTask(ctx, hc, url, id, true)
	return st
}

// readTask is getTask that also returns the SHA-256 of the answer's
// body. Unless decode, the body is only read whole and hashed, not
// checked: "ok" then means an HTTP 200 read to its end, whatever it says
// (its first bytes are kept, and told when it is not a result).
func readTask(ctx context.Context, hc *http.Client, url, id string, decode bool) (string, [sha256.Size]byte) {
	var sum [sha256.Size]byte
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":%q}}`, id)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader([]byte(body)))
	if err != nil {
		return err.Error(), sum
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return "transport: " + err.Error(), sum
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		return fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(msg))), sum
	}
	h := sha256.New()
	if !decode {
		head := &headWriter{max: 200}
		if _, err := io.Copy(io.MultiWriter(h, head), resp.Body); err != nil {
			return "the answer's body: " + err.Error(), sum
		}
		h.Sum(sum[:0])
		if !bytes.Contains(head.b, []byte(`"result"`)) {
			return "not a result: " + string(head.b), sum
		}
		return "ok", sum
	}
	raw, err := io.ReadAll(io.TeeReader(resp.Body, h))
	if err != nil {
		return "the answer's body: " + err.Error(), sum
	}
	h.Sum(sum[:0])
	var out struct {
		Result *struct {
			ID string `json:"id"`
		} `json:"result"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return "undecodable: " + err.Error(), sum
	}
	switch {
	case out.Error != nil:
		return "error: " + out.Error.Message, sum
	case out.Result == nil || out.Result.ID != id:
		return "no task in the answer", sum
	}
	return "ok", sum
}

// headWriter keeps the first max bytes written to it.
type headWriter struct {
	b   []byte
	max int
}

func (w *headWriter) Write(p []byte) (int, error) {
	if room := w.max - len(w.b); room > 0 {
		w.b = append(w.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}
