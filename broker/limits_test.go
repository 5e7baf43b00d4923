package broker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/transport/fakebus"
	"github.com/a2a-bus/a2a-bus/wire"
)

// smallBus is a fake bus that carries at most payload bytes, as a NATS
// server does, and records the largest response and notification it was
// handed.
type smallBus struct {
	*fakebus.Bus
	payload int

	mu                  sync.Mutex
	maxResponse, maxMsg int
}

func (s *smallBus) MaxPayload() int { return s.payload }

func (s *smallBus) Publish(session string, msg []byte) error {
	s.mu.Lock()
	s.maxMsg = max(s.maxMsg, len(msg))
	s.mu.Unlock()
	return s.Bus.Publish(session, msg)
}

func (s *smallBus) Serve(h transport.Handler) error {
	return s.Bus.Serve(transport.HandlerFunc(func(ctx context.Context, from transport.Caller, req []byte) []byte {
		resp := h.ServeRPC(ctx, from, req)
		s.mu.Lock()
		s.maxResponse = max(s.maxResponse, len(resp))
		s.mu.Unlock()
		return resp
	}))
}

func (s *smallBus) largest() (response, notification int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxResponse, s.maxMsg
}

var _ transport.PayloadLimiter = (*smallBus)(nil)

// unescaped encodes params as a client in another language would: "<"
// stays one byte, where encoding/json sends six.
func unescaped(t *testing.T, params any) json.RawMessage {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(params))
	return bytes.TrimSpace(buf.Bytes())
}

// newSmallEnv is an env on a bus of 256 KiB payloads: a message limit of
// 64 KiB and tasks of at most 128 KiB follow from it.
func newSmallEnv(t *testing.T, cfg broker.Config) (*env, *smallBus) {
	var sb *smallBus
	e := newEnvWrapped(t, cfg, fakebus.Config{}, func(b *fakebus.Bus) transport.Bus {
		sb = &smallBus{Bus: b, payload: 256 << 10}
		return sb
	})
	return e, sb
}

func TestLimits_DeriveFromOneSetting(t *testing.T) {
	l := wire.NewLimits(0)
	assert.Equal(t, wire.DefaultMaxMessageBytes, l.Message)
	assert.Equal(t, 8<<20, l.Payload)
	assert.Equal(t, l.Payload-l.Message-wire.Overhead, l.Task)
	require.NoError(t, l.Valid())
	assert.Equal(t, wire.MaxPayload, wire.NewLimits(wire.MaxMessageLimit).Payload)
	require.NoError(t, wire.NewLimits(wire.MaxMessageLimit).Valid())
	require.Error(t, wire.NewLimits(wire.MaxMessageLimit+1).Valid())

	small, err := l.Within(256 << 10)
	require.NoError(t, err)
	assert.Equal(t, wire.Limits{Message: 64 << 10, Payload: 256 << 10, Task: 128 << 10}, small)
	_, err = l.Within(64 << 10)
	require.Error(t, err, "no room for a task")

	e, _ := newSmallEnv(t, broker.Config{})
	assert.Equal(t, small, e.broker.Limits(), "the broker fits the bus's payload limit")
}

// TestLimits_NothingIsStoredThatCannotBeSent grows a task with text that
// encodes to six times its size (HTML characters, as encoding/json escapes
// them) until the broker refuses: every refusal comes before the store,
// and every response and event, up to the completed task, fits the bus.
func TestLimits_NothingIsStoredThatCannotBeSent(t *testing.T) {
	e, sb := newSmallEnv(t, broker.Config{})
	a := e.register("s1", "a")
	b := e.register("s2", "b")
	task := a.mustSend("b", "start")
	chunk := strings.Repeat("<>&", 2000) // 6 KB sent, 36 KB encoded
	appended := 0
	var err error
	for range 100 {
		if _, err = e.call("s1", wire.MethodSend, unescaped(t, map[string]any{"token": a.token, "taskId": task.ID, "message": text(chunk)})); err != nil {
			break
		}
		appended++
	}
	requireCode(t, err, wire.ErrInvalidParams)
	assert.ErrorContains(t, err, "the task would exceed")
	assert.Less(t, appended, 4, "refused by its encoded size, not by what was sent")
	got, err := a.get(task.ID)
	require.NoError(t, err)
	assert.Len(t, got.History, appended+1, "the refused message was not stored")
	// An update with a message that does not fit is refused too; one that
	// does (a closing without a message) goes through.
	_, err = b.update(task.ID, wire.StateWorking, chunk)
	requireCode(t, err, wire.ErrInvalidParams)
	done, err := b.update(task.ID, wire.StateCompleted, "")
	require.NoError(t, err)
	assert.Equal(t, wire.StateCompleted, done.Status.State)
	_, err = a.call(wire.MethodListTasks, nil)
	require.NoError(t, err)
	resp, note := sb.largest()
	limits := e.broker.Limits()
	assert.LessOrEqual(t, resp, limits.Payload)
	assert.LessOrEqual(t, note, limits.Payload)
	assert.Greater(t, resp, limits.Task/2, "the test did fill a task")
}

func TestLimits_APushTooLargeOnceEncodedIsRefused(t *testing.T) {
	e, _ := newSmallEnv(t, broker.Config{})
	a := e.register("s1", "a")
	e.register("s2", "b")
	huge := strings.Repeat("<", 60<<10) // under the 64 KiB message limit; 360 KiB encoded
	_, err := e.call("s1", wire.MethodSend, unescaped(t, map[string]any{"token": a.token, "to": "b", "oneway": true, "message": text(huge)}))
	requireCode(t, err, wire.ErrInvalidParams)
	e.noEvent("s2")
	// The session's numbering has no hole for it.
	_, err = a.call(wire.MethodSend, map[string]any{"to": "b", "oneway": true, "message": text("small")})
	require.NoError(t, err)
	assert.Equal(t, uint64(1), e.event("s2").Push.Seq)
}

func TestPaging_TasksList(t *testing.T) {
	e := newEnv(t, broker.Config{MaxTasksPerContext: 100})
	a := e.register("s1", "a")
	e.register("s2", "b")
	var want []string
	for i := range 7 {
		want = append(want, a.mustSend("b", fmt.Sprint("task ", i)).ID)
	}
	page := func(params map[string]any) wire.ListTasksResult {
		res, err := a.call(wire.MethodListTasks, params)
		require.NoError(t, err)
		var r wire.ListTasksResult
		require.NoError(t, json.Unmarshal(res, &r))
		return r
	}
	var got []string
	token := ""
	for n := 0; ; n++ {
		require.Less(t, n, 5)
		r := page(map[string]any{"pageSize": 3, "pageToken": token})
		for _, t := range r.Tasks {
			got = append(got, t.ID)
		}
		if r.NextPageToken == "" {
			break
		}
		assert.Len(t, r.Tasks, 3)
		token = r.NextPageToken
	}
	assert.Equal(t, want, got, "pages in creation order, nothing twice, nothing missed")
	r := page(nil)
	assert.Len(t, r.Tasks, 7)
	assert.Empty(t, r.NextPageToken, "the default page holds them all")

	for _, bad := range []map[string]any{{"pageSize": -1}, {"pageSize": wire.MaxPageSize + 1}, {"pageSize": "ten"}, {"pageToken": 7}} {
		_, err := a.call(wire.MethodListTasks, bad)
		requireCode(t, err, wire.ErrInvalidParams)
	}
}

// TestPaging_ATaskPageStaysWithinThePayload: pages of large tasks are cut
// by their bytes, not only by their count.
func TestPaging_ATaskPageStaysWithinThePayload(t *testing.T) {
	e, sb := newSmallEnv(t, broker.Config{MaxTasksPerContext: 100})
	a := e.register("s1", "a")
	e.register("s2", "b")
	big := strings.Repeat("x", 60<<10)
	for range 10 {
		a.mustSend("b", big)
	}
	total, pages, token := 0, 0, ""
	for {
		res, err := a.call(wire.MethodListTasks, map[string]any{"pageSize": 100, "pageToken": token})
		require.NoError(t, err)
		var r wire.ListTasksResult
		require.NoError(t, json.Unmarshal(res, &r))
		require.NotEmpty(t, r.Tasks)
		total += len(r.Tasks)
		pages++
		if token = r.NextPageToken; token == "" {
			break
		}
	}
	assert.Equal(t, 10, total)
	assert.GreaterOrEqual(t, pages, 3, "600 KB of tasks take several 256 KiB pages")
	resp, _ := sb.largest()
	assert.LessOrEqual(t, resp, 256<<10)
}

func TestPaging_AgentsList(t *testing.T) {
	e := newEnv(t, broker.Config{})
	self := e.register("s1", "me")
	var want []string
	for i := range 8 {
		want = append(want, e.register(fmt.Sprint("s", i%3), fmt.Sprint("agent-", i)).id)
	}
	var got []string
	token := ""
	for n := 0; ; n++ {
		require.Less(t, n, 5)
		res, err := self.call(wire.MethodListAgents, map[string]any{"pageSize": 3, "pageToken": token})
		require.NoError(t, err)
		var r wire.ListAgentsResult
		require.NoError(t, json.Unmarshal(res, &r))
		assert.LessOrEqual(t, len(r.Agents), 3)
		for _, c := range r.Agents {
			got = append(got, c.AgentID)
		}
		if token = r.NextPageToken; token == "" {
			break
		}
	}
	assert.Equal(t, want, got, "every other agent once, by agentId, never the caller")
}

// TestPaging_AnAgentsPageStaysWithinThePayload: cards just under the card
// limit, more than one payload's worth: every page fits.
func TestPaging_AnAgentsPageStaysWithinThePayload(t *testing.T) {
	e, sb := newSmallEnv(t, broker.Config{MaxAgentsPerSession: 100})
	self := e.register("s0", "me")
	desc := strings.Repeat("d", wire.MaxCardBytes-512)
	for i := range 40 { // 40 × 15.5 KB: about 2.5 payloads
		_, err := e.call("s1", wire.MethodRegister, wire.RegisterParams{ContextID: "s1", Card: &wire.AgentCard{Name: fmt.Sprint("big-", i), Description: desc}})
		require.NoError(t, err)
	}
	seen, token := 0, ""
	for {
		res, err := self.call(wire.MethodListAgents, map[string]any{"pageSize": 1000, "pageToken": token})
		require.NoError(t, err)
		var r wire.ListAgentsResult
		require.NoError(t, json.Unmarshal(res, &r))
		seen += len(r.Agents)
		if token = r.NextPageToken; token == "" {
			break
		}
	}
	assert.Equal(t, 40, seen)
	resp, _ := sb.largest()
	assert.LessOrEqual(t, resp, 256<<10)
}

func TestPaging_ReplayStaysWithinThePayload(t *testing.T) {
	e, sb := newSmallEnv(t, broker.Config{ReplayBytes: 4 << 20})
	e.register("s1", "a")
	b := e.register("s2", "b")
	big := strings.Repeat("y", 50<<10)
	for range 12 {
		_, err := b.call(wire.MethodSend, map[string]any{"to": "a", "oneway": true, "message": text(big)})
		require.NoError(t, err)
	}
	after, calls := uint64(0), 0
	for after < 12 {
		calls++
		require.Less(t, calls, 12)
		r, err := replayCall(e, "s1", e.broker.Epoch(), after)
		require.NoError(t, err)
		require.NotEmpty(t, r.Events)
		assert.Equal(t, uint64(12), r.LastSeq)
		for _, raw := range r.Events {
			ev, err := wire.DecodeEvent(raw)
			require.NoError(t, err)
			require.Equal(t, after+1, ev.Push.Seq)
			after = ev.Push.Seq
		}
	}
	assert.GreaterOrEqual(t, calls, 3, "600 KB of events take several pages")
	resp, _ := sb.largest()
	assert.LessOrEqual(t, resp, 256<<10)
}

func TestQuota_AgentsPerSession(t *testing.T) {
	e := newEnv(t, broker.Config{MaxAgentsPerSession: 3})
	var first *agent
	for i := range 3 {
		a := e.registerInstance("greedy", fmt.Sprint("a", i), fmt.Sprint("inst-", i))
		if first == nil {
			first = a
		}
	}
	_, err := e.call("greedy", wire.MethodRegister, wire.RegisterParams{ContextID: "greedy", Card: &wire.AgentCard{Name: "one-more"}})
	requireCode(t, err, wire.ErrAgentLimit)
	assert.ErrorContains(t, err, "session already has 3 live agents")
	// Other sessions are not affected.
	e.register("other", "fine")
	// Replacing a live registration adds no agent.
	e.registerInstance("greedy", "a0", "inst-0")
	// A departure frees a place.
	require.NoError(t, e.registerInstance("greedy", "a1", "inst-1").deregister())
	e.register("greedy", "one-more")
}

// revokingBus is a fake bus with session credentials to revoke, as
// embedded NATS has: the broker serves a2a.sessions.close on it.
type revokingBus struct {
	*fakebus.Bus
	mu      sync.Mutex
	revoked []string
}

func (r *revokingBus) RevokeSession(_ context.Context, session string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.revoked = append(r.revoked, session)
	return nil
}

func TestSessionsClose_DeregistersTheSessionsAgents(t *testing.T) {
	var rb *revokingBus
	e := newEnvWrapped(t, broker.Config{}, fakebus.Config{}, func(b *fakebus.Bus) transport.Bus {
		rb = &revokingBus{Bus: b}
		return rb
	})
	a := e.register("s1", "a")
	e.register("s1", "a2")
	b := e.register("s2", "b")
	toB := a.mustSend("b", "work for b")
	fromB := b.mustSend("a2", "work for a2")
	e.event("s2") // created
	e.event("s1") // created
	closeSession := func(params map[string]any) wire.SessionCloseResult {
		res, err := e.bus.CallHost(context.Background(), wire.MethodSessionClose, params)
		require.NoError(t, err)
		var r wire.SessionCloseResult
		require.NoError(t, json.Unmarshal(res, &r))
		return r
	}
	r := closeSession(map[string]any{"contextId": "s1"})
	assert.Equal(t, []string{"a", "a2"}, r.Deregistered)
	assert.Equal(t, []string{"s1"}, rb.revoked)
	_, err := a.call(wire.MethodListAgents, nil)
	requireCode(t, err, wire.ErrUnauthorized)
	// Their tasks closed as at a deregister, and b heard of each.
	got, err := b.get(toB.ID)
	require.NoError(t, err)
	assert.Equal(t, wire.StateCanceled, got.Status.State)
	got, err = b.get(fromB.ID)
	require.NoError(t, err)
	assert.Equal(t, wire.StateFailed, got.Status.State)
	assert.True(t, e.event("s2").TaskEvent.Final)
	assert.True(t, e.event("s2").TaskEvent.Final)
	// The session's events are forgotten.
	_, err = replayCall(e, "s1", e.broker.Epoch(), 0)
	requireCode(t, err, wire.ErrReplayGap)

	// keepAgents leaves them registered.
	c := e.register("s3", "c")
	r = closeSession(map[string]any{"contextId": "s3", "keepAgents": true})
	assert.Empty(t, r.Deregistered)
	assert.NotEmpty(t, c.list())

	_, err = e.bus.CallHost(context.Background(), wire.MethodSessionClose, map[string]any{})
	requireCode(t, err, wire.ErrInvalidParams)
	_, err = e.call("s2", wire.MethodSessionClose, map[string]any{"contextId": "s2"})
	requireCode(t, err, wire.ErrMethodNotFound)
}

func TestSessionsClose_NotServedWithoutCredentials(t *testing.T) {
	e := newEnv(t, broker.Config{})
	_, err := e.bus.CallHost(context.Background(), wire.MethodSessionClose, map[string]any{"contextId": "s1"})
	requireCode(t, err, wire.ErrMethodNotFound)
}

// TestChurnLeavesNothingBehind: registrations and departures with fresh
// instance ids and clashing names leave the registry as empty as it began.
func TestChurnLeavesNothingBehind(t *testing.T) {
	e := newEnv(t, broker.Config{})
	for round := range 300 {
		var live []*agent
		for i := range 4 {
			live = append(live, e.register(fmt.Sprint("s", i%2), fmt.Sprint("name-", round%5)))
		}
		for _, a := range live {
			require.NoError(t, a.deregister())
		}
	}
	agents, hints, orphans, sessions := e.broker.Footprint()
	assert.Zero(t, agents)
	assert.Zero(t, hints, "name hints of names no longer in use")
	assert.Zero(t, orphans)
	assert.Zero(t, sessions)
}

// TestLimits_AFullTaskCanAlwaysBeClosed: a requester fills its task to
// the byte; the assignee, in another session, still completes it (a bare
// closing is never refused for size), and the requester can cancel the
// next one.
func TestLimits_AFullTaskCanAlwaysBeClosed(t *testing.T) {
	e, _ := newSmallEnv(t, broker.Config{})
	req := e.register("hostile", "req")
	asg := e.register("victim", "asg")
	// fill appends to the task until its JSON is one byte short of the
	// limit: the broker counts a task as the JSON it sends.
	fill := func(id string) {
		limit := e.broker.Limits().Task
		for {
			got, err := req.get(id)
			require.NoError(t, err)
			whole, _ := json.Marshal(got)
			last := got.History[len(got.History)-1]
			msg, _ := json.Marshal(last)
			overhead := len(msg) - len(*last.Parts[0].Text) + 1 // the message around its text, and a comma
			n := min(limit-len(whole)-1-overhead, 60_000)
			if n <= 0 {
				return
			}
			_, err = req.reply(id, strings.Repeat("x", n))
			require.NoError(t, err)
		}
	}
	task := req.mustSend(asg.id, "hi")
	_, err := asg.update(task.ID, wire.StateWorking, "")
	require.NoError(t, err)
	fill(task.ID)
	_, err = asg.update(task.ID, wire.StateCompleted, "")
	require.NoError(t, err, "the assignee completes the full task")
	next := req.mustSend(asg.id, "again")
	fill(next.ID)
	_, err = req.cancel(next.ID)
	require.NoError(t, err, "the requester cancels the full task")
}

// TestANewTasksSizeIsItsJSONs: the size a new task is stored with, which
// the task limit counts from, is the length of the task's JSON.
func TestANewTasksSizeIsItsJSONs(t *testing.T) {
	st := store.NewMemory()
	e := newEnv(t, broker.Config{Store: st})
	a := e.register("s1", "a")
	e.register("s2", "b")
	task := a.mustSend("b", "seat <2> & 3")
	rec, err := st.Get(context.Background(), task.ID)
	require.NoError(t, err)
	js, err := wire.Marshal(&rec.Task)
	require.NoError(t, err)
	assert.Equal(t, len(js), rec.Size)
}
