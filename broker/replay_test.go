package broker_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/store/storetest"
	"github.com/a2a-bus/a2a-bus/wire"
)

func replayCall(e *env, session, epoch string, after uint64) (*wire.ReplayResult, error) {
	res, err := e.call(session, wire.MethodReplay, map[string]any{"contextId": session, "epoch": epoch, "afterSeq": after})
	if err != nil {
		return nil, err
	}
	var r wire.ReplayResult
	require.NoError(e.t, json.Unmarshal(res, &r))
	return &r, nil
}

func TestReplay_OrderAndGaps(t *testing.T) {
	e := newEnv(t, broker.Config{ReplayWindow: 5})
	a := e.register("s1", "a")
	b := e.register("s2", "b")
	var published [][]byte
	for i := range 8 {
		_, err := b.call(wire.MethodSend, map[string]any{"to": "a", "oneway": true, "message": text(fmt.Sprint("n", i))})
		require.NoError(t, err)
		published = append(published, <-e.session("s1").sub.C())
	}
	epoch := e.broker.Epoch()

	t.Run("the kept window, in order, byte for byte", func(t *testing.T) {
		r, err := replayCall(e, "s1", epoch, 3)
		require.NoError(t, err)
		assert.Equal(t, epoch, r.Epoch)
		assert.Equal(t, uint64(8), r.LastSeq)
		require.Len(t, r.Events, 5)
		for i, ev := range r.Events {
			assert.JSONEq(t, string(published[3+i]), string(ev))
			d, err := wire.DecodeEvent(ev)
			require.NoError(t, err)
			assert.Equal(t, uint64(4+i), d.Push.Seq)
		}
	})
	t.Run("a suffix", func(t *testing.T) {
		r, err := replayCall(e, "s1", epoch, 6)
		require.NoError(t, err)
		require.Len(t, r.Events, 2)
		d, _ := wire.DecodeEvent(r.Events[0])
		assert.Equal(t, uint64(7), d.Push.Seq)
	})
	t.Run("nothing after the last", func(t *testing.T) {
		r, err := replayCall(e, "s1", epoch, 8)
		require.NoError(t, err)
		assert.Empty(t, r.Events)
		assert.NotNil(t, r.Events, "events is [] not null")
	})
	t.Run("older than the window is a gap", func(t *testing.T) {
		_, err := replayCall(e, "s1", epoch, 2)
		requireCode(t, err, wire.ErrReplayGap)
		var we *wire.Error
		require.True(t, errors.As(err, &we))
		assert.Equal(t, epoch, we.Data.Epoch)
		assert.Equal(t, uint64(4), we.Data.OldestSeq)
	})
	t.Run("another epoch is a gap", func(t *testing.T) {
		for _, ep := range []string{"", "0123"} {
			_, err := replayCall(e, "s1", ep, 8)
			requireCode(t, err, wire.ErrReplayGap)
			var we *wire.Error
			require.True(t, errors.As(err, &we))
			assert.Equal(t, epoch, we.Data.Epoch)
		}
	})
	t.Run("beyond the last: no events, and lastSeq says so", func(t *testing.T) {
		r, err := replayCall(e, "s1", epoch, 9)
		require.NoError(t, err)
		assert.Empty(t, r.Events)
		assert.Equal(t, uint64(8), r.LastSeq)
	})
	t.Run("a session with no events", func(t *testing.T) {
		r, err := replayCall(e, "quiet", epoch, 0)
		require.NoError(t, err)
		assert.Zero(t, r.LastSeq)
		assert.Empty(t, r.Events)
		_, err = replayCall(e, "quiet", "", 0)
		var we *wire.Error
		require.True(t, errors.As(err, &we))
		assert.Equal(t, uint64(1), we.Data.OldestSeq, "lastSeq+1 when none is kept")
	})
	t.Run("seq has no gaps across kinds", func(t *testing.T) {
		task := b.mustSend("a", "a task")
		_, err := a.update(task.ID, wire.StateCompleted, "")
		require.NoError(t, err)
		ev := e.event("s1")
		assert.Equal(t, uint64(9), ev.TaskEvent.Seq)
		assert.Equal(t, uint64(1), e.event("s2").TaskEvent.Seq)
	})
}

func TestReplay_RecoversEventsLostOnTheBus(t *testing.T) {
	e := newEnv(t, broker.Config{})
	a := e.register("s1", "a")
	b := e.register("s2", "b")
	task := a.mustSend("b", "x")
	first := e.event("s2")
	e.bus.Disconnect("s2")
	_, err := a.reply(task.ID, "lost one")
	require.NoError(t, err)
	_, err = a.reply(task.ID, "lost two")
	require.NoError(t, err)
	e.bus.Reconnect("s2")
	e.noEvent("s2")
	_, err = a.reply(task.ID, "seen")
	require.NoError(t, err)
	seen := e.event("s2")
	require.Equal(t, first.TaskEvent.Seq+3, seen.TaskEvent.Seq, "the receiver sees a gap")
	r, err := replayCall(e, "s2", seen.TaskEvent.Epoch, first.TaskEvent.Seq)
	require.NoError(t, err)
	require.Len(t, r.Events, 3)
	var texts []string
	for _, raw := range r.Events {
		ev, err := wire.DecodeEvent(raw)
		require.NoError(t, err)
		texts = append(texts, *ev.TaskEvent.Message.Parts[0].Text)
	}
	assert.Equal(t, []string{"lost one", "lost two", "seen"}, texts)
	_ = b
}

// TestOrphanSweep starts a broker on a store holding open tasks of an
// earlier run: the member that comes back keeps its tasks; the tasks of
// the one that does not are closed after the timeout, and the returning
// member hears of it.
func TestOrphanSweep(t *testing.T) {
	st := store.NewMemory()
	back := storetest.NewRecord("t-back", "s1", "inst-req", "inst-gone", 0)
	back.Task.RequesterName, back.Task.AgentName = "req", "gone"
	keep := storetest.NewRecord("t-keep", "s1", "inst-req", "inst-req2", 1)
	require.NoError(t, st.Create(t.Context(), back, 0))
	require.NoError(t, st.Create(t.Context(), keep, 0))

	e := newEnv(t, broker.Config{Store: st, OrphanTimeout: 300 * time.Millisecond})
	req := e.registerInstance("s1", "req", "inst-req")
	e.registerInstance("s1", "req2", "inst-req2")

	// Wait for the sweep's notification to the requester, with a deadline.
	select {
	case raw := <-e.session("s1").sub.C():
		ev, err := wire.DecodeEvent(raw)
		require.NoError(t, err)
		assert.Equal(t, "t-back", ev.TaskEvent.TaskID)
		assert.Equal(t, "req", ev.TaskEvent.Recipient)
		assert.Equal(t, wire.StateFailed, ev.TaskEvent.Task.Status.State)
		assert.True(t, ev.TaskEvent.Final)
	case <-time.After(10 * time.Second):
		t.Fatal("the orphaned task was not closed")
	}
	got, err := req.get("t-keep")
	require.NoError(t, err)
	assert.Equal(t, wire.StateSubmitted, got.Status.State, "tasks whose members came back stay open")
}

func TestReplay_ByteCapKeepsMemoryBounded(t *testing.T) {
	e := newEnv(t, broker.Config{ReplayBytes: 64 << 10})
	e.register("s1", "a")
	b := e.register("s2", "b")
	big := strings.Repeat("x", 20<<10)
	for range 10 {
		_, err := b.call(wire.MethodSend, map[string]any{"to": "a", "oneway": true, "message": text(big)})
		require.NoError(t, err)
		<-e.session("s1").sub.C()
	}
	epoch := e.broker.Epoch()
	_, err := replayCall(e, "s1", epoch, 0)
	requireCode(t, err, wire.ErrReplayGap)
	var we *wire.Error
	require.True(t, errors.As(err, &we))
	assert.Equal(t, uint64(8), we.Data.OldestSeq, "only the last 64 KiB (three 20 KiB events) are kept")
	r, err := replayCall(e, "s1", epoch, 7)
	require.NoError(t, err)
	assert.Len(t, r.Events, 3)
	assert.Equal(t, uint64(10), r.LastSeq)
}

func TestReplay_WindowGrowsAndWraps(t *testing.T) {
	e := newEnv(t, broker.Config{ReplayWindow: 40})
	e.register("s1", "a")
	b := e.register("s2", "b")
	epoch := e.broker.Epoch()
	for i := 1; i <= 100; i++ {
		_, err := b.call(wire.MethodSend, map[string]any{"to": "a", "oneway": true, "message": text(fmt.Sprint(i))})
		require.NoError(t, err)
		<-e.session("s1").sub.C()
		after := uint64(max(0, i-40))
		r, err := replayCall(e, "s1", epoch, after)
		require.NoError(t, err, "after %d events", i)
		require.Len(t, r.Events, i-int(after))
		for j, raw := range r.Events {
			ev, err := wire.DecodeEvent(raw)
			require.NoError(t, err)
			require.Equal(t, fmt.Sprint(int(after)+j+1), *ev.Push.Message.Parts[0].Text)
		}
	}
}

// TestReplay_KeptAcrossAgentChurn: between a settled delegate and the
// next spawn (the ADR's rhythm), a runtime that reconnects still replays
// what it missed.
func TestReplay_KeptAcrossAgentChurn(t *testing.T) {
	e := newEnv(t, broker.Config{})
	a := e.register("s1", "a")
	b := e.register("s2", "b")
	for i := range 3 {
		_, err := b.call(wire.MethodSend, map[string]any{"to": "a", "oneway": true, "message": text(fmt.Sprint(i))})
		require.NoError(t, err)
	}
	epoch := e.broker.Epoch()
	require.NoError(t, a.deregister())
	e.broker.SweepSessions() // no agent now, but the timeout has not passed
	r, err := replayCall(e, "s1", epoch, 0)
	require.NoError(t, err, "the session's events outlive its last agent")
	require.Len(t, r.Events, 3)
	// A new agent in the session continues the numbering.
	e.register("s1", "a2")
	_, err = b.call(wire.MethodSend, map[string]any{"to": "a2", "oneway": true, "message": text("again")})
	require.NoError(t, err)
	r, err = replayCall(e, "s1", epoch, 0)
	require.NoError(t, err)
	require.Len(t, r.Events, 4)
	ev, _ := wire.DecodeEvent(r.Events[3])
	assert.Equal(t, uint64(4), ev.Push.Seq)
}

// TestReplay_AnIdleSessionLetsItsEventsGo: with no agent and no
// subscriber for the orphan timeout, a session's events go; its seq
// stays.
func TestReplay_AnIdleSessionLetsItsEventsGo(t *testing.T) {
	now := time.Date(2026, 9, 5, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	e := newEnv(t, broker.Config{Now: clock, OrphanTimeout: 10 * time.Minute})
	a := e.register("s1", "a")
	b := e.register("s2", "b")
	for i := range 3 {
		_, err := b.call(wire.MethodSend, map[string]any{"to": "a", "oneway": true, "message": text(fmt.Sprint(i))})
		require.NoError(t, err)
	}
	epoch := e.broker.Epoch()
	require.NoError(t, a.deregister())
	kept := func() int {
		r, err := replayCall(e, "s1", epoch, 0)
		if err != nil {
			requireCode(t, err, wire.ErrReplayGap)
			var we *wire.Error
			require.True(t, errors.As(err, &we))
			assert.Equal(t, uint64(4), we.Data.OldestSeq, "the seq stays: nothing kept, next is 4")
			return 0
		}
		return len(r.Events)
	}
	// A subscriber keeps the session busy, however long.
	e.broker.SweepSessions()
	advance(time.Hour)
	e.broker.SweepSessions()
	require.Equal(t, 3, kept(), "a subscribed session keeps its events")
	// Without it, the timeout runs from the first sweep that sees it idle.
	require.NoError(t, e.session("s1").sub.Close())
	e.broker.SweepSessions()
	advance(9 * time.Minute)
	e.broker.SweepSessions()
	require.Equal(t, 3, kept(), "idle for less than the timeout")
	advance(time.Minute)
	e.broker.SweepSessions()
	require.Equal(t, 0, kept(), "idle for the timeout")
	// A new agent continues the numbering.
	e.register("s1", "a2")
	_, err := b.call(wire.MethodSend, map[string]any{"to": "a2", "oneway": true, "message": text("again")})
	require.NoError(t, err)
	r, err := replayCall(e, "s1", epoch, 3)
	require.NoError(t, err)
	require.Len(t, r.Events, 1)
	ev, _ := wire.DecodeEvent(r.Events[0])
	assert.Equal(t, uint64(4), ev.Push.Seq)
}

// TestReplay_WhereTheSessionStands: without epoch and afterSeq, replay
// answers the epoch and the last seq, and no events: where a runtime that
// starts following the session begins.
func TestReplay_WhereTheSessionStands(t *testing.T) {
	e := newEnv(t, broker.Config{})
	e.register("s1", "a")
	b := e.register("s2", "b")
	for range 3 {
		_, err := b.call(wire.MethodSend, map[string]any{"to": "a", "oneway": true, "message": text("x")})
		require.NoError(t, err)
	}
	res, err := e.call("s1", wire.MethodReplay, map[string]any{"contextId": "s1"})
	require.NoError(t, err)
	var r wire.ReplayResult
	require.NoError(t, json.Unmarshal(res, &r))
	assert.Equal(t, wire.ReplayResult{Epoch: e.broker.Epoch(), LastSeq: 3, Events: []json.RawMessage{}}, r)
	// One without the other is still malformed.
	_, err = e.call("s1", wire.MethodReplay, map[string]any{"contextId": "s1", "epoch": ""})
	requireCode(t, err, wire.ErrInvalidParams)
	_, err = e.call("s1", wire.MethodReplay, map[string]any{"contextId": "s1", "afterSeq": 0})
	requireCode(t, err, wire.ErrInvalidParams)
}
