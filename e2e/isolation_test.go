package e2e_test

// What one session can do to another, tried against a real `a2a-bus
// serve` as a hostile or careless client would: each test is one finding
// of the review behind docs/RELIABILITY.md's "what one session can do to
// another".

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	neturl "net/url"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/wire"
)

// TestIsolation_ATaskNeverOutgrowsWhatTheBusCarries: a task grown by large
// messages is refused (-32602) before it passes what a response can carry;
// what was accepted stays readable by both members, its events arrive,
// and the replay of them has no gap.
func TestIsolation_ATaskNeverOutgrowsWhatTheBusCarries(t *testing.T) {
	t.Parallel()
	s := startSidecar(t)
	ca, cb := s.open("big-a"), s.open("big-b")
	events := ca.events()
	ta, _ := ca.register("writer", nil)
	tb, _ := cb.register("reader", nil)
	raw, err := ca.call(wire.MethodSend, wire.SendParams{Token: ta, To: "reader", Message: textMessage("start")})
	require.NoError(t, err)
	var created wire.TaskResult
	require.NoError(t, json.Unmarshal(raw, &created))
	id := created.Task.ID

	appendChunk, err := json.Marshal(wire.SendParams{Token: ta, TaskID: id, Message: textMessage(strings.Repeat("x", 900_000))})
	require.NoError(t, err)
	appended := 0
	for ; appended < 40; appended++ {
		_, err = ca.call(wire.MethodSend, json.RawMessage(appendChunk))
		if err != nil {
			break
		}
	}
	require.True(t, isCode(err, wire.ErrInvalidParams), "the append past the limit is refused as invalid, not failed: %v", err)
	assert.Greater(t, appended, 3, "a task holds several MB")
	// The assignee completes it, with a message, and both read it back.
	_, err = cb.call(wire.MethodUpdateTask, wire.UpdateParams{Token: tb, TaskID: id, State: wire.StateCompleted, Message: textMessage("done")})
	require.NoError(t, err)
	for _, c := range []struct {
		c     *client
		token string
	}{{ca, ta}, {cb, tb}} {
		raw, err := c.c.call(wire.MethodGetTask, wire.TaskParams{Token: c.token, TaskID: id})
		require.NoError(t, err)
		var got wire.TaskResult
		require.NoError(t, json.Unmarshal(raw, &got))
		assert.Len(t, got.Task.History, appended+2)
		assert.Equal(t, wire.StateCompleted, got.Task.Status.State)
		_, err = c.c.call(wire.MethodListTasks, wire.ListTasksParams{Token: c.token})
		require.NoError(t, err)
	}
	// The requester's session got every event, in seq order, and can
	// replay them all.
	msg, err := events.NextMsg(10 * time.Second)
	require.NoError(t, err, "the requester hears that its task completed")
	ev, err := wire.DecodeEvent(msg.Data)
	require.NoError(t, err)
	require.True(t, ev.TaskEvent.Final)
	epoch := ev.Head().Epoch
	after := uint64(0)
	for {
		raw, err := ca.call(wire.MethodReplay, wire.ReplayParams{ContextID: "big-a", Epoch: &epoch, AfterSeq: &after})
		require.NoError(t, err, "replay has no gap")
		var r wire.ReplayResult
		require.NoError(t, json.Unmarshal(raw, &r))
		after += uint64(len(r.Events))
		if after >= r.LastSeq || len(r.Events) == 0 {
			assert.Equal(t, r.LastSeq, after)
			break
		}
	}
}

// TestIsolation_ListsArePagedAndBoundedInMemory builds over 100 MB of
// terminal tasks, then lists them six at a time: every list succeeds, a
// page at a time, and the broker's memory grows by a few pages, not by the
// tasks.
func TestIsolation_ListsArePagedAndBoundedInMemory(t *testing.T) {
	s := startSidecar(t)
	ca, cb := s.open("lists-a"), s.open("lists-b")
	ta, _ := ca.register("hoarder", nil)
	tb, _ := cb.register("worker", nil)
	const n = 110
	// Encoded once: the client's JSON work is not what is measured.
	send := ca.encode(wire.MethodSend, wire.SendParams{Token: ta, To: "worker", Message: textMessage(strings.Repeat("y", 950_000))})
	for i := range n {
		resp, err := rawRequest(ca, wire.MethodSend, send)
		require.NoError(t, err, "task %d", i)
		_, err = rawCall(cb, wire.MethodUpdateTask, wire.UpdateParams{Token: tb, TaskID: stringAfter(resp, `"task":{"id":"`), State: wire.StateCompleted})
		require.NoError(t, err)
	}
	built := time.Now()
	before, _ := s.memory()
	s.resetPeak()
	var wg sync.WaitGroup
	counts := make([]int, 6)
	errs := make([]error, 6)
	for w := range 6 {
		wg.Go(func() {
			// The pages are read as bytes: decoding 600 MB of JSON in the
			// test (under -race) would take longer than the broker's work.
			p := wire.ListTasksParams{Token: ta}
			for pages := 0; pages < 1000; pages++ {
				page, err := rawCall(ca, wire.MethodListTasks, p)
				if err != nil {
					errs[w] = err
					return
				}
				counts[w] += bytes.Count(page, []byte(`"agentContextId":`))
				if p.PageToken = nextPageToken(page); p.PageToken == "" {
					return
				}
			}
		})
	}
	wg.Wait()
	for w := range 6 {
		require.NoError(t, errs[w])
		assert.Equal(t, n, counts[w])
	}
	_, peak := s.memory()
	t.Logf("listed in %v", time.Since(built))
	growth := peak - before
	t.Logf("six concurrent lists of %d MB of tasks: resident %d MiB before, peak %d MiB (+%d MiB)", n*95/100, before>>20, peak>>20, growth>>20)
	// A page is one 1 MB task here; each list in flight holds it a few
	// times over (decoded, encoded, in the server's buffer), and the
	// garbage collector lets the heap grow to twice what is live.
	page := int64(wire.NewLimits(0).Page())
	assert.Less(t, growth, 6*16*page, "memory grows by a few pages per list, not by the store")
}

// TestIsolation_AgentListsArePaged: 1,000 cards of 15.5 KB, more than a
// payload's worth: every session's agents.list and admin.agents work, a
// page at a time.
func TestIsolation_AgentListsArePaged(t *testing.T) {
	t.Parallel()
	s := startSidecar(t)
	desc := strings.Repeat("d", 15_500)
	var clients []*client
	for i := range 16 {
		clients = append(clients, s.open(fmt.Sprint("cards-", i)))
	}
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			for j := range 62 {
				c.register(fmt.Sprintf("card-%d-%d", i, j), &wire.AgentCard{Description: desc})
			}
		})
	}
	wg.Wait()
	viewer, _ := clients[0].register("viewer", nil)
	// The pages are read as bytes (each card's agentId counted), as in
	// the tasks' lists: decoding 30 MB of JSON under -race took the test
	// longer than the broker's work.
	seen, pages := 0, 0
	p := wire.ListAgentsParams{Token: viewer, PageParams: wire.PageParams{PageSize: wire.MaxPageSize}}
	for {
		page, err := rawCall(clients[0], wire.MethodListAgents, p)
		require.NoError(t, err)
		seen += bytes.Count(page, []byte(`"agentId":`))
		pages++
		if p.PageToken = nextPageToken(page); p.PageToken == "" {
			break
		}
	}
	assert.Equal(t, 16*62, seen)
	assert.Greater(t, pages, 1, "15 MB of cards take more than one page")
	admin := 0
	pp := wire.PageParams{PageSize: wire.MaxPageSize}
	for {
		body, err := wire.EncodeRequest(uint64(rpcIDs.Add(1)), wire.MethodAdminAgents, pp)
		require.NoError(t, err)
		msg, err := s.host.Request(natsbus.HostRPC, body, 30*time.Second)
		require.NoError(t, err)
		require.Contains(t, string(msg.Data[:min(len(msg.Data), 64)]), `"result":`, "%.200s", msg.Data)
		admin += bytes.Count(msg.Data, []byte(`"agentId":`))
		if pp.PageToken = nextPageToken(msg.Data); pp.PageToken == "" {
			break
		}
	}
	assert.Equal(t, 16*62+1, admin)
}

// TestIsolation_OneSessionCannotTakeTheHostsAgents: a session's agents are
// capped; other sessions still register; closing the session deregisters
// its agents.
func TestIsolation_OneSessionCannotTakeTheHostsAgents(t *testing.T) {
	t.Parallel()
	s := startSidecar(t, "--max-agents-per-session", "8")
	greedy, other := s.open("greedy"), s.open("other")
	for i := range 8 {
		greedy.register(fmt.Sprint("g", i), nil)
	}
	_, err := greedy.call(wire.MethodRegister, wire.RegisterParams{ContextID: "greedy", Card: &wire.AgentCard{Name: "one-more"}})
	require.True(t, isCode(err, wire.ErrAgentLimit), "got %v", err)
	assert.ErrorContains(t, err, "8 live agents")
	other.register("fine", nil)
	raw, err := s.hostCall(wire.MethodSessionClose, wire.SessionCloseParams{ContextID: "greedy"})
	require.NoError(t, err)
	var closed wire.SessionCloseResult
	require.NoError(t, json.Unmarshal(raw, &closed))
	assert.Len(t, closed.Deregistered, 8)
	raw, err = s.hostCall(wire.MethodAdminInfo, nil)
	require.NoError(t, err)
	var info wire.AdminInfo
	require.NoError(t, json.Unmarshal(raw, &info))
	assert.Equal(t, 1, info.Agents, "only the other session's agent is left")
}

// TestIsolation_RepliesStayInTheirSessionsInbox: a session's request whose
// reply subject names another session's inbox is not answered there.
func TestIsolation_RepliesStayInTheirSessionsInbox(t *testing.T) {
	t.Parallel()
	s := startSidecar(t)
	a, b := s.open("inbox-a"), s.open("inbox-b")
	token, _ := a.register("a", nil)
	spy, err := b.nc.SubscribeSync(natsbus.SessionInbox("inbox-b") + ".>")
	require.NoError(t, err)
	require.NoError(t, b.nc.Flush())
	body, err := wire.EncodeRequest(1, wire.MethodListAgents, wire.ListAgentsParams{Token: token})
	require.NoError(t, err)
	require.NoError(t, a.nc.PublishRequest(natsbus.RPCSubject("inbox-a"), natsbus.SessionInbox("inbox-b")+".planted", body))
	// A proper request after it is answered: the broker has seen both.
	_, err = a.call(wire.MethodListAgents, wire.ListAgentsParams{Token: token})
	require.NoError(t, err)
	_, err = spy.NextMsg(200 * time.Millisecond)
	assert.Error(t, err, "session b's inbox received a reply to session a's request")
}

// stalledSubscriber is a raw NATS connection with a session's credential
// that subscribes to the session's events and then never reads again.
func stalledSubscriber(t *testing.T, url, user, pass, session string) (net.Conn, bool) {
	t.Helper()
	u, err := neturl.Parse(url)
	require.NoError(t, err)
	conn, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	r := bufio.NewReader(conn)
	_, err = r.ReadString('\n') // INFO
	require.NoError(t, err)
	connect, _ := json.Marshal(map[string]any{"user": user, "pass": pass, "verbose": false, "pedantic": false})
	fmt.Fprintf(conn, "CONNECT %s\r\nSUB %s 1\r\nPING\r\n", connect, natsbus.EventsSubject(session))
	line, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "PONG") {
		return conn, false // refused: the session has its connections already
	}
	return conn, true
}

// TestIsolation_StalledSubscribersAreCut: connections of one session that
// subscribe and never read, then hundreds of large pushes to that session:
// the broker cuts them instead of holding gigabytes, gives the memory back,
// and the other session goes on.
func TestIsolation_StalledSubscribersAreCut(t *testing.T) {
	s := startSidecar(t)
	raw, err := s.hostCall(wire.MethodSessionOpen, wire.SessionParams{ContextID: "stalled"})
	require.NoError(t, err)
	var creds wire.SessionCredentials
	require.NoError(t, json.Unmarshal(raw, &creds))
	stalled := s.open("stalled")
	stalled.register("sink", nil)
	accepted := 0
	for range 40 {
		if _, ok := stalledSubscriber(t, s.url, creds.User, creds.Password, "stalled"); ok {
			accepted++
		}
	}
	t.Logf("%d of 40 stalled connections accepted", accepted)
	sender := s.open("sender")
	token, _ := sender.register("source", nil)
	before, _ := s.memory()
	s.resetPeak()
	// Encoded once (under -race, an encoding per push cost the test more
	// than the broker's work on it).
	push := sender.encode(wire.MethodSend, wire.SendParams{Token: token, To: "sink", Oneway: true, Message: textMessage(strings.Repeat("z", 900_000))})
	for i := range 389 {
		_, err := sender.request(wire.MethodSend, push)
		require.NoError(t, err, "push %d", i)
	}
	_, peak := s.memory()
	// The other session goes on, and the stalled ones are gone.
	_, err = sender.call(wire.MethodListAgents, wire.ListAgentsParams{Token: token})
	require.NoError(t, err)
	subscribers := -1
	// The server closes them on its own schedule.
	poll(5*time.Second, 100*time.Millisecond, func() bool {
		raw, err := s.hostCall(wire.MethodAdminSessions, nil)
		require.NoError(t, err)
		var r wire.AdminSessions
		require.NoError(t, json.Unmarshal(raw, &r))
		for _, row := range r.Sessions {
			if row.ContextID == "stalled" && row.Subscribers != nil {
				subscribers = *row.Subscribers
			}
		}
		return subscribers == 0
	})
	assert.Equal(t, 0, subscribers, "the stalled subscribers were cut")
	var after int64
	poll(10*time.Second, 100*time.Millisecond, func() bool {
		after, _ = s.memory()
		return after-before < 128<<20
	})
	t.Logf("350 MB pushed to %d stalled subscribers: resident %d MiB before, peak %d MiB, %d MiB after", accepted, before>>20, peak>>20, after>>20)
	assert.Less(t, peak-before, int64(natsbus.DefaultMaxSessionPending)+int64(accepted)*int64(2*wire.NewLimits(0).Payload),
		"held at most the bounds: per connection and in all")
	assert.Less(t, after-before, int64(128<<20), "the memory comes back")
}

// TestIsolation_AFloodQueuesBehindItself: one session pipelines requests
// as fast as it can; another session's requests all get answered, at a
// p99 within ten times its idle p99.
func TestIsolation_AFloodQueuesBehindItself(t *testing.T) {
	s := startSidecar(t)
	victim := s.open("victim")
	victimToken, _ := victim.register("victim", nil)
	probe := func(n int) time.Duration {
		lat := make([]time.Duration, n)
		for i := range n {
			start := time.Now()
			_, err := victim.call(wire.MethodListAgents, wire.ListAgentsParams{Token: victimToken})
			require.NoError(t, err, "the victim's request %d", i)
			lat[i] = time.Since(start)
		}
		slices.Sort(lat)
		t.Logf("p50 %v p90 %v p99 %v max %v", lat[n/2], lat[n*9/10], lat[n*99/100], lat[n-1])
		return lat[n*99/100]
	}
	probe(50) // warm up
	idle := probe(300)
	// The flood comes from another process, as it would.
	raw, err := s.hostCall(wire.MethodSessionOpen, wire.SessionParams{ContextID: "flood"})
	require.NoError(t, err)
	var creds wire.SessionCredentials
	require.NoError(t, json.Unmarshal(raw, &creds))
	flood := exec.Command(os.Args[0], "-test.run=^$")
	flood.Env = append(os.Environ(), "E2E_FLOOD="+creds.URL+" "+creds.User+" "+creds.Password+" flood")
	out, err := flood.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, flood.Start())
	t.Cleanup(func() { flood.Process.Kill(); flood.Wait() })
	started := make([]byte, 1)
	_, err = out.Read(started) // one byte once 20,000 requests are out
	require.NoError(t, err)
	flooded := probe(300)
	require.NoError(t, flood.Process.Signal(syscall.SIGTERM))
	n, _ := io.ReadAll(out)
	t.Logf("victim p99: %v idle, %v under a flood of %s requests", idle, flooded, strings.TrimSpace(string(n)))
	assert.LessOrEqual(t, flooded, 10*idle)
}

// flood runs in a child process of the test binary (E2E_FLOOD="url user
// password session"): it pipelines requests on the session's subject as
// fast as it can, writes one byte to stdout after 20,000, and on SIGTERM
// the count.
func flood(spec string) {
	f := strings.Fields(spec)
	nc, err := nats.Connect(f[0], nats.UserInfo(f[1], f[2]), nats.CustomInboxPrefix(natsbus.SessionInbox(f[3])))
	if err != nil {
		os.Exit(3)
	}
	body, _ := wire.EncodeRequest(1, wire.MethodListAgents, wire.ListAgentsParams{Token: "not-a-token"})
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	reply := natsbus.SessionInbox(f[3]) + ".ignored"
	for n := 1; ; n++ {
		select {
		case <-stop:
			fmt.Println(n)
			os.Exit(0)
		default:
		}
		if nc.PublishRequest(natsbus.RPCSubject(f[3]), reply, body) != nil {
			os.Exit(4)
		}
		if n == 20_000 {
			os.Stdout.Write([]byte{'!'})
		}
	}
}

// rawCall is client.call returning the whole response, undecoded; an
// error response is an error.
func rawCall(c *client, method string, params any) ([]byte, error) {
	body, err := wire.EncodeRequest(uint64(rpcIDs.Add(1)), method, params)
	if err != nil {
		return nil, err
	}
	return rawRequest(c, method, body)
}

// rawRequest is rawCall with the request encoded already (client.encode).
func rawRequest(c *client, method string, body []byte) ([]byte, error) {
	msg, err := c.nc.Request(natsbus.RPCSubject(c.session), body, 30*time.Second)
	if err != nil {
		return nil, err
	}
	if !bytes.Contains(msg.Data[:min(len(msg.Data), 64)], []byte(`"result":`)) {
		return nil, fmt.Errorf("%s: %.200s", method, msg.Data)
	}
	return msg.Data, nil
}

// nextPageToken finds a list page's nextPageToken, which the broker
// writes last.
func nextPageToken(page []byte) string {
	i := bytes.LastIndex(page, []byte(`"nextPageToken":"`))
	if i < 0 {
		return ""
	}
	return stringAfter(page[i:], `"nextPageToken":"`)
}

// stringAfter returns the string that follows the first prefix in b (up
// to its closing quote; the strings read here have no escapes).
func stringAfter(b []byte, prefix string) string {
	i := bytes.Index(b, []byte(prefix))
	if i < 0 {
		return ""
	}
	rest := b[i+len(prefix):]
	return string(rest[:bytes.IndexByte(rest, '"')])
}
