package liveview_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/a2a-bus/a2a-bus/host"
	"github.com/a2a-bus/a2a-bus/liveview"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const token = "0123456789abcdef0123456789abcdef"

// wait is the generous deadline of every wait on a condition.
const wait = 20 * time.Second

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return ctx
}

// env is a broker on an embedded NATS server (in this process, tasks in
// memory) and its live view, served on loopback.
type env struct {
	t      *testing.T
	h      *host.Host
	client *natsbus.Client // the host credential's, the view's
	view   *liveview.View
	srv    *httptest.Server
	http   *http.Client
}

func newEnv(t *testing.T, cfg liveview.Config, wrap ...func(net.Listener) net.Listener) *env {
	t.Helper()
	h, err := host.Open(ctxT(t), host.Config{Bus: host.NATS, Memory: true})
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() })
	c, ok := h.Client().(*natsbus.Client)
	require.True(t, ok, "an embedded broker's host client")
	cfg.Token = token
	v, err := liveview.New(c, cfg)
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(v.Handler())
	for _, w := range wrap {
		srv.Listener = w(srv.Listener)
	}
	srv.Start()
	tr := &http.Transport{}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		srv.Close()
	})
	t.Cleanup(func() { v.Close() }) // first: it ends the streams srv.Close waits for
	return &env{t: t, h: h, client: c, view: v, srv: srv, http: &http.Client{Transport: tr}}
}

// delegate spawns an agent in a session of its own.
func (e *env) delegate(session, name string) *runtime.Delegate {
	d, _ := e.delegateIn(session, name)
	return d
}

// delegateIn is delegate, and returns the session's runtime.
func (e *env) delegateIn(session, name string) (*runtime.Delegate, *runtime.Runtime) {
	rt, err := e.h.Session(ctxT(e.t), session)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { rt.Close() })
	d, err := rt.Spawn(ctxT(e.t), wire.AgentCard{Name: name})
	require.NoError(e.t, err)
	return d, rt
}

// get asks path with the token given ("" for none), and returns the
// answer with its body read.
func (e *env) get(path, bearer string, header ...string) (*http.Response, []byte) {
	e.t.Helper()
	req, err := http.NewRequestWithContext(ctxT(e.t), http.MethodGet, e.srv.URL+path, nil)
	require.NoError(e.t, err)
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1]
		} else {
			req.Header.Set(header[i], header[i+1])
		}
	}
	res, err := e.http.Do(req)
	require.NoError(e.t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(e.t, err)
	return res, body
}

func (e *env) snapshot() liveview.Snapshot {
	e.t.Helper()
	res, body := e.get("/api/snapshot", token)
	require.Equal(e.t, http.StatusOK, res.StatusCode, "%s", body)
	var s liveview.Snapshot
	require.NoError(e.t, json.Unmarshal(body, &s))
	return s
}

// line is one line of the event stream.
type line struct {
	Type    string           `json:"type"`
	Entry   *liveview.Entry  `json:"entry"`
	Entries []liveview.Entry `json:"entries"`
}

// stream is a page following the event stream.
type stream struct {
	t     *testing.T
	lines chan line
	res   *http.Response
}

func (e *env) follow() *stream {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.srv.URL+"/api/events", nil)
	require.NoError(e.t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := e.http.Do(req)
	if err != nil {
		cancel()
		require.NoError(e.t, err)
	}
	if !assert.Equal(e.t, http.StatusOK, res.StatusCode) {
		res.Body.Close()
		cancel()
		e.t.FailNow()
	}
	assert.Equal(e.t, "application/x-ndjson; charset=utf-8", res.Header.Get("Content-Type"))
	s := &stream{t: e.t, lines: make(chan line, 1<<16), res: res}
	go func() {
		defer close(s.lines)
		sc := bufio.NewScanner(res.Body)
		sc.Buffer(nil, 1<<22)
		for sc.Scan() {
			var l line
			if json.Unmarshal(sc.Bytes(), &l) != nil {
				l.Type = "garbage: " + sc.Text()
			}
			s.lines <- l
		}
	}()
	e.t.Cleanup(func() {
		cancel()
		res.Body.Close()
		for range s.lines {
		}
	})
	return s
}

// next returns the next line that is not a ping or a hint.
func (s *stream) next() line {
	s.t.Helper()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-s.lines:
			require.True(s.t, ok, "the stream ended")
			if l.Type == "ping" || l.Type == "changed" {
				continue
			}
			return l
		case <-timer.C:
			s.t.Fatal("no line came")
		}
	}
}

// entry returns the next entry line's entry.
func (s *stream) entry() liveview.Entry {
	s.t.Helper()
	l := s.next()
	require.Equal(s.t, "entry", l.Type)
	return *l.Entry
}

func textMessage(s string) wire.Message {
	return wire.Message{Parts: []wire.Part{wire.TextPart(s)}}
}

func TestThePageNeedsNoTokenTheDataDoes(t *testing.T) {
	e := newEnv(t, liveview.Config{})
	for _, tc := range []struct{ path, contentType, has string }{
		{"/", "text/html; charset=utf-8", "data-task-id"},
		{"/app.js", "text/javascript; charset=utf-8", "Authorization"},
		{"/style.css", "text/css; charset=utf-8", "#timeline"},
	} {
		res, body := e.get(tc.path, "")
		assert.Equal(t, http.StatusOK, res.StatusCode, tc.path)
		assert.Equal(t, tc.contentType, res.Header.Get("Content-Type"), tc.path)
		assert.Contains(t, string(body), tc.has, tc.path)
		assert.Equal(t, "no-store", res.Header.Get("Cache-Control"))
		assert.Equal(t, "nosniff", res.Header.Get("X-Content-Type-Options"))
		assert.Equal(t, "no-referrer", res.Header.Get("Referrer-Policy"))
		assert.Contains(t, res.Header.Get("Content-Security-Policy"), "default-src 'self'")
	}
	res, _ := e.get("/nothing-here", "")
	assert.Equal(t, http.StatusNotFound, res.StatusCode)

	for _, path := range []string{"/api/snapshot", "/api/events"} {
		for _, tc := range []struct{ name, header string }{
			{"none", ""},
			{"a wrong token", "Bearer " + strings.Repeat("0", len(token))},
			{"the token cut short", "Bearer " + token[:10]},
			{"the token in another scheme", "Basic " + token},
			{"the token alone", token},
		} {
			t.Run(path+" with "+tc.name, func(t *testing.T) {
				res, body := e.get(path, "", "Authorization", tc.header)
				assert.Equal(t, http.StatusUnauthorized, res.StatusCode)
				assert.Contains(t, res.Header.Get("WWW-Authenticate"), "Bearer")
				assert.Contains(t, string(body), "token")
				assert.Equal(t, "no-store", res.Header.Get("Cache-Control"))
			})
		}
	}
	res, _ = e.get("/api/snapshot", token)
	assert.Equal(t, http.StatusOK, res.StatusCode)
	res, _ = e.get("/api/snapshot", "", "Authorization", "bearer "+token)
	assert.Equal(t, http.StatusOK, res.StatusCode, "the scheme in any case")

	head, err := http.NewRequestWithContext(ctxT(t), http.MethodHead, e.srv.URL+"/api/events", nil)
	require.NoError(t, err)
	head.Header.Set("Authorization", "Bearer "+token)
	res, err = e.http.Do(head)
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusOK, res.StatusCode, "a HEAD is answered, without a stream")
	assert.Equal(t, 0, e.view.Viewers())
}

func TestRequestsToAnotherHostAreRefused(t *testing.T) {
	e := newEnv(t, liveview.Config{})
	_, port, err := net.SplitHostPort(e.srv.Listener.Addr().String())
	require.NoError(t, err)
	for _, h := range []string{"attacker.example:" + port, "attacker.example", "127.0.0.1.attacker.example", "localhost.attacker.example:" + port, "10.0.0.1:" + port, "[fe80::1]:" + port} {
		for _, path := range []string{"/", "/api/snapshot"} {
			res, body := e.get(path, token, "Host", h)
			assert.Equal(t, http.StatusForbidden, res.StatusCode, "Host %s %s", h, path)
			assert.Contains(t, string(body), "loopback", "Host %s", h)
		}
	}
	for _, h := range []string{"127.0.0.1:" + port, "localhost:" + port, "LOCALHOST", "[::1]:" + port, "127.0.0.2"} {
		res, _ := e.get("/api/snapshot", token, "Host", h)
		assert.Equal(t, http.StatusOK, res.StatusCode, "Host %s", h)
	}

	remote := newEnv(t, liveview.Config{AllowRemote: true})
	res, _ := remote.get("/api/snapshot", token, "Host", "attacker.example")
	assert.Equal(t, http.StatusOK, res.StatusCode, "AllowRemote takes any Host")
	res, _ = remote.get("/api/snapshot", "", "Host", "attacker.example")
	assert.Equal(t, http.StatusUnauthorized, res.StatusCode, "and still wants the token")
}

func TestSnapshotShowsSessionsAgentsAndWhoWaitsOnWhom(t *testing.T) {
	e := newEnv(t, liveview.Config{})
	planner := e.delegate("chat-1", "planner")
	coder := e.delegate("chat-2", "coder")
	task, err := planner.Send(ctxT(t), coder.ID(), textMessage("write the parser"), nil)
	require.NoError(t, err)

	s := e.snapshot()
	assert.Equal(t, "nats", s.Info.Bus)
	assert.Equal(t, 1, s.Info.OpenTasks)
	var sessions []string
	for _, x := range s.Sessions {
		sessions = append(sessions, x.ContextID)
	}
	assert.Subset(t, sessions, []string{"chat-1", "chat-2"})
	agents := map[string]string{}
	for _, a := range s.Agents {
		agents[a.AgentID] = a.ContextID
	}
	assert.Equal(t, map[string]string{"planner": "chat-1", "coder": "chat-2"}, agents)
	require.Len(t, s.OpenTasks, 1)
	open := s.OpenTasks[0]
	assert.Equal(t, task.ID, open.ID)
	assert.Equal(t, wire.StateSubmitted, open.State)
	assert.Equal(t, [4]string{"planner", "chat-1", "coder", "chat-2"}, [4]string{open.RequesterName, open.ContextID, open.AgentName, open.AgentContextID})

	// A snapshot serves the pages that ask for a while, but not past a
	// change the view took: a page that asks on its hint sees it.
	liveview.SetSnapshotFresh(e.view, time.Hour)
	page := e.follow()
	require.Equal(t, "reset", page.next().Type)
	require.Len(t, e.snapshot().OpenTasks, 1)
	_, err = coder.Update(ctxT(t), task.ID, wire.StateCompleted, nil)
	require.NoError(t, err)
	assert.Equal(t, wire.StateCompleted, page.entry().State)
	assert.Empty(t, e.snapshot().OpenTasks, "a completed task leaves the open tasks")
}

func TestTheTimelineHasEachMoveOnce(t *testing.T) {
	e := newEnv(t, liveview.Config{})
	planner, rt1 := e.delegateIn("chat-1", "planner")
	coder, rt2 := e.delegateIn("chat-2", "coder")
	page := e.follow()
	reset := page.next()
	require.Equal(t, "reset", reset.Type)
	assert.Empty(t, reset.Entries)

	// Capture the notifications as the view gets them, to tell them
	// again below.
	raws := make(chan *nats.Msg, 64)
	sub, err := e.client.Conn().ChanSubscribe("a2a.session.*.events", raws)
	require.NoError(t, err)
	defer sub.Unsubscribe()
	require.NoError(t, e.client.Conn().Flush())

	task, err := planner.Send(ctxT(t), coder.ID(), textMessage("write the parser"), nil)
	require.NoError(t, err)
	_, err = coder.Update(ctxT(t), task.ID, wire.StateWorking, nil)
	require.NoError(t, err)
	_, err = coder.Update(ctxT(t), task.ID, wire.StateCompleted, &wire.Message{Parts: []wire.Part{wire.TextPart("parsed")}})
	require.NoError(t, err)

	type move struct {
		kind, state, from, to string
		final                 bool
	}
	want := []move{
		{"created", "submitted", "planner@chat-1", "coder@chat-2", false},
		{"status", "working", "coder@chat-2", "planner@chat-1", false},
		{"status", "completed", "coder@chat-2", "planner@chat-1", true},
	}
	moveOf := func(x liveview.Entry) move {
		return move{x.Kind, string(x.State), x.From.AgentID + "@" + x.From.ContextID, x.To.AgentID + "@" + x.To.ContextID, x.Final}
	}
	var got []liveview.Entry
	for range want {
		x := page.entry()
		assert.Equal(t, task.ID, x.TaskID)
		got = append(got, x)
	}
	for i, x := range got {
		assert.Equal(t, want[i], moveOf(x))
		assert.Equal(t, &liveview.Member{AgentID: "planner", ContextID: "chat-1"}, x.Requester)
		assert.Equal(t, &liveview.Member{AgentID: "coder", ContextID: "chat-2"}, x.Assignee)
	}
	assert.Equal(t, "write the parser", got[0].Text)
	assert.Equal(t, "parsed", got[2].Text)

	// Each change told again, to the task's other member too, as a
	// broker that told both, or a delivery made twice, would: the view
	// keeps each once. A push told after them on the same connection
	// marks the end (one publisher's messages arrive in order). The
	// sessions' runtimes are closed first: they would take what is told
	// again for a broker gone wrong.
	rt1.Close()
	rt2.Close()
	var told [][]byte
	for len(told) < len(want) {
		select {
		case m := <-raws:
			told = append(told, m.Data)
		case <-time.After(wait):
			t.Fatal("the notifications did not come")
		}
	}
	for _, raw := range told {
		var n struct {
			Params map[string]any `json:"params"`
		}
		require.NoError(t, json.Unmarshal(raw, &n))
		require.NoError(t, e.client.Conn().Publish(natsbus.EventsSubject(n.Params["recipientContextId"].(string)), raw), "to the same recipient")
		other := map[string]string{"chat-1": "chat-2", "chat-2": "chat-1"}[n.Params["recipientContextId"].(string)]
		n.Params["recipientContextId"] = other
		n.Params["recipient"] = map[string]string{"chat-1": "planner", "chat-2": "coder"}[other]
		n.Params["seq"] = 1000
		again, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": wire.NotifyTaskEvent, "params": n.Params})
		require.NoError(t, err)
		require.NoError(t, e.client.Conn().Publish(natsbus.EventsSubject(other), again), "to the other member")
	}
	end, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": wire.NotifyPush, "params": wire.Push{
		EventHead: wire.EventHead{Recipient: "coder", RecipientContextID: "chat-2", ContextID: "chat-1", Seq: 2000, Epoch: "end"},
		From:      "planner", Message: &wire.Message{Parts: []wire.Part{wire.TextPart("the end")}}}})
	require.NoError(t, err)
	require.NoError(t, e.client.Conn().Publish(natsbus.EventsSubject("chat-2"), end))
	last := page.entry()
	assert.Equal(t, "push", last.Kind, "nothing told again came before the end: %+v", last)
	assert.Equal(t, "the end", last.Text)

	// A page that comes later gets the timeline, newest first: the
	// completed task stays in it with its state, each move once.
	later := e.follow().next()
	require.Equal(t, "reset", later.Type)
	require.Len(t, later.Entries, len(want)+1)
	assert.Equal(t, "push", later.Entries[0].Kind)
	for i, x := range later.Entries[1:] {
		assert.Equal(t, want[len(want)-1-i], moveOf(x))
	}
	assert.Empty(t, e.snapshot().OpenTasks, "the open tasks no longer show it")
}

func TestAPageThatStopsReadingHoldsUpNoOneAndIsCut(t *testing.T) {
	// Small socket buffers on the view's side, so that a page that
	// reads nothing fills them with a few kilobytes.
	small := func(ln net.Listener) net.Listener { return smallBuffers{ln} }
	e := newEnv(t, liveview.Config{Buffer: 64}, small)
	sender := e.delegate("chat-1", "sender")
	receiver := e.delegate("chat-2", "receiver")
	good := e.follow()
	require.Equal(t, "reset", good.next().Type)

	stuck, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	require.NoError(t, err)
	defer stuck.Close()
	require.NoError(t, stuck.(*net.TCPConn).SetReadBuffer(4096))
	_, err = fmt.Fprintf(stuck, "GET /api/events HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n", e.srv.Listener.Addr(), token)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return e.view.Viewers() == 2 }, wait, 10*time.Millisecond)

	// Pushes in batches, each received by the good page before the
	// next: it is never further behind than a batch, while the stuck
	// one falls behind until it is cut. A view that waited for the stuck
	// page would stop the good one's lines after its buffer (64 lines)
	// and the socket's few kilobytes.
	text := strings.Repeat("x", liveview.MaxText)
	const batch, most = 16, 4000
	sent := 0
	for e.view.Viewers() == 2 {
		require.Less(t, sent, most, "the stuck page was never cut")
		for range batch {
			sent++
			_, err := sender.Push(ctxT(t), receiver.ID(), textMessage(fmt.Sprintf("%d %s", sent, text)))
			require.NoError(t, err, "the broker answers")
		}
		for n := sent - batch + 1; n <= sent; n++ {
			x := good.entry()
			require.Equal(t, "push", x.Kind)
			require.True(t, strings.HasPrefix(x.Text, fmt.Sprintf("%d ", n)), "push %d in order, each once: %.12q", n, x.Text)
		}
	}
	t.Logf("the stuck page was cut after %d pushes", sent)
	var info wire.AdminInfo
	raw, err := e.client.CallHost(ctxT(t), wire.MethodAdminInfo, nil)
	require.NoError(t, err, "the broker answers")
	require.NoError(t, json.Unmarshal(raw, &info))

	// The stuck page's connection is closed: what it holds reads to
	// its end.
	require.NoError(t, stuck.SetReadDeadline(time.Now().Add(wait)))
	_, err = io.Copy(io.Discard, stuck)
	var timeout net.Error
	assert.False(t, errors.As(err, &timeout) && timeout.Timeout(), "the connection stays open: %v", err)

	// The good page goes on.
	_, err = sender.Push(ctxT(t), receiver.ID(), textMessage("after"))
	require.NoError(t, err)
	assert.Equal(t, "after", good.entry().Text)
}

// smallBuffers gives each connection it accepts a small send buffer.
type smallBuffers struct{ net.Listener }

func (l smallBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(4096)
	}
	return c, err
}

func TestViewersAreBounded(t *testing.T) {
	e := newEnv(t, liveview.Config{MaxViewers: 2})
	first := e.follow()
	require.Equal(t, "reset", first.next().Type)
	second := e.follow()
	require.Equal(t, "reset", second.next().Type)
	res, body := e.get("/api/events", token)
	assert.Equal(t, http.StatusServiceUnavailable, res.StatusCode)
	assert.Equal(t, "5", res.Header.Get("Retry-After"))
	assert.Contains(t, string(body), "too many")
	res, _ = e.get("/api/snapshot", token)
	assert.Equal(t, http.StatusOK, res.StatusCode, "the snapshot is not a viewer")

	first.res.Body.Close()
	require.Eventually(t, func() bool { return e.view.Viewers() == 1 }, wait, 10*time.Millisecond, "a page that leaves frees its place")
	third := e.follow()
	require.Equal(t, "reset", third.next().Type)
}

func TestCloseEndsTheStreams(t *testing.T) {
	e := newEnv(t, liveview.Config{})
	page := e.follow()
	require.Equal(t, "reset", page.next().Type)
	require.NoError(t, e.view.Close())
	require.NoError(t, e.view.Close(), "idempotent")
	for l := range page.lines {
		assert.Contains(t, []string{"ping", "changed"}, l.Type)
	}
	res, _ := e.get("/api/events", token)
	assert.Equal(t, http.StatusServiceUnavailable, res.StatusCode)
	assert.Equal(t, 0, e.view.Viewers())
}

func TestLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1": true, "127.0.0.1:8080": true, "127.1.2.3:1": true, "localhost": true, "LocalHost:80": true,
		"[::1]": true, "[::1]:8080": true, "::1": true, "[::ffff:127.0.0.1]:80": true,
		"": false, "localhost.": false, "localhost.evil.example": false, "127.0.0.1.evil.example": false,
		"10.0.0.1": false, "0.0.0.0:80": false, "[::]:80": false, "[fe80::1%25lo]:80": false, "example.com": false,
	} {
		assert.Equal(t, want, liveview.LoopbackHost(host), "%q", host)
	}
}

func TestTheViewSubscribesOnlyWhileFollowed(t *testing.T) {
	e := newEnv(t, liveview.Config{})
	e.delegate("chat-1", "planner")
	subscribers := func() int {
		s := e.snapshot()
		for _, x := range s.Sessions {
			if x.ContextID == "chat-1" && x.Subscribers != nil {
				return *x.Subscribers
			}
		}
		return -1
	}
	alone := subscribers()
	require.Positive(t, alone, "the session's runtime")
	page := e.follow()
	require.Equal(t, "reset", page.next().Type)
	require.Eventually(t, func() bool { return subscribers() == alone+1 }, wait, 50*time.Millisecond, "the view subscribes while a page follows")
	page.res.Body.Close()
	require.Eventually(t, func() bool { return subscribers() == alone }, wait, 50*time.Millisecond,
		"and not once none does: it would keep every session's notifications from being dropped as idle")

	// What it did not take meanwhile is a gap in the timeline.
	again := e.follow().next()
	require.Equal(t, "reset", again.Type)
	require.Len(t, again.Entries, 1)
	gap := again.Entries[0]
	assert.Equal(t, "gap", gap.Kind)
	require.NotNil(t, gap.Since)
	assert.False(t, gap.At.Before(gap.Since.Time))
}

// TestPagesAskingAtOnceShareARead: while notifications flow (so no
// snapshot stays fresh), the requests that waited for a read to end take
// the next read, one for all of them, not one read each.
func TestPagesAskingAtOnceShareARead(t *testing.T) {
	e := newEnv(t, liveview.Config{})
	liveview.SetSnapshotFresh(e.view, 0)
	const pages = 8
	var reads atomic.Int32
	came := make(chan struct{}, pages)
	first, release := make(chan struct{}), make(chan struct{})
	liveview.SetSnapshotHooks(e.view, func() { came <- struct{}{} }, func() {
		if reads.Add(1) == 1 {
			close(first)
			<-release // the first read is slow: the others come meanwhile
		}
		liveview.TookNotification(e.view) // and notifications flow
	})
	var wg sync.WaitGroup
	wg.Go(func() { e.snapshot() })
	<-first
	<-came
	for range pages - 1 {
		wg.Go(func() { e.snapshot() })
	}
	for range pages - 1 {
		<-came
	}
	close(release)
	wg.Wait()
	assert.Equal(t, int32(2), reads.Load(), "the first read, then one for the %d pages that waited", pages-1)
}
