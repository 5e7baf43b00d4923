package bustest

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// These tests drive a real broker through the bus, so they also run when
// the broker is in another process.

type peer struct {
	sess  transport.Session
	sub   transport.Subscription
	id    string
	token string
}

func register(t *testing.T, h Harness, sessionID, name string) *peer {
	t.Helper()
	sess := session(t, h, sessionID)
	sub := subscribe(t, sess)
	res, err := sess.Call(ctxT(t), wire.MethodRegister, wire.RegisterParams{ContextID: sessionID, Card: &wire.AgentCard{Name: name}})
	require.NoError(t, err)
	var r wire.RegisterResult
	require.NoError(t, json.Unmarshal(res, &r))
	return &peer{sess: sess, sub: sub, id: r.AgentID, token: r.Token}
}

// tryRegister is register for other goroutines than the test's: it
// reports a failure instead of stopping the test, and returns nil.
func tryRegister(t *testing.T, h Harness, sessionID, name string) *peer {
	ctx := ctxT(t)
	sess, err := h.Client.Session(ctx, sessionID)
	if !assert.NoError(t, err) {
		return nil
	}
	sub, err := sess.Subscribe(ctx)
	if !assert.NoError(t, err) {
		return nil
	}
	res, err := sess.Call(ctx, wire.MethodRegister, wire.RegisterParams{ContextID: sessionID, Card: &wire.AgentCard{Name: name}})
	var r wire.RegisterResult
	if !assert.NoError(t, err) || !assert.NoError(t, json.Unmarshal(res, &r)) {
		return nil
	}
	return &peer{sess: sess, sub: sub, id: r.AgentID, token: r.Token}
}

func (p *peer) push(t *testing.T, to, text string) {
	t.Helper()
	_, err := p.sess.Call(ctxT(t), wire.MethodSend, map[string]any{
		"token": p.token, "to": to, "oneway": true,
		"message": map[string]any{"parts": []any{map[string]any{"kind": "text", "text": text}}},
	})
	require.NoError(t, err)
}

func nextEvent(t *testing.T, p *peer) *wire.Event {
	t.Helper()
	ev, err := wire.DecodeEvent(receive(t, p.sub))
	require.NoError(t, err)
	return ev
}

// settle waits until p's subscription is live: it pushes to itself through
// a helper until the push arrives.
func settle(t *testing.T, h Harness, p *peer, helper *peer) {
	t.Helper()
	helper.push(t, p.id, "settle")
	ev := nextEvent(t, p)
	require.Equal(t, "settle", *ev.Push.Message.Parts[0].Text)
}

func (s *suite) testBrokerRegisterList(t *testing.T, h Harness) {
	a := register(t, h, "s1", "discussant")
	b := register(t, h, "s2", "discussant")
	assert.Equal(t, "discussant", a.id)
	assert.Equal(t, "discussant-2", b.id)
	res, err := a.sess.Call(ctxT(t), wire.MethodListAgents, map[string]any{"token": a.token})
	require.NoError(t, err)
	var l wire.ListAgentsResult
	require.NoError(t, json.Unmarshal(res, &l))
	require.Len(t, l.Agents, 1)
	assert.Equal(t, "discussant-2", l.Agents[0].AgentID)
	assert.Equal(t, "s2", l.Agents[0].ContextID)
}

func (s *suite) testBrokerRouting(t *testing.T, h Harness) {
	a := register(t, h, "s1", "a")
	b := register(t, h, "s.2", "b")
	settle(t, h, a, b)
	settle(t, h, b, a)
	b.push(t, "a", "for a")
	a.push(t, "b", "for b")
	evA, evB := nextEvent(t, a), nextEvent(t, b)
	assert.Equal(t, "for a", *evA.Push.Message.Parts[0].Text)
	assert.Equal(t, "s1", evA.Push.RecipientContextID)
	assert.Equal(t, "for b", *evB.Push.Message.Parts[0].Text, "b's next event is its own, not a's")
	assert.Equal(t, "s.2", evB.Push.RecipientContextID)
}

func (s *suite) testBrokerOrder(t *testing.T, h Harness) {
	a := register(t, h, "s1", "a")
	b := register(t, h, "s2", "b")
	settle(t, h, a, b)
	n := min(200, s.f.Buffer-1) // the receiver reads only after the last push
	for i := range n {
		b.push(t, "a", fmt.Sprint(i))
	}
	var last uint64
	for i := range n {
		ev := nextEvent(t, a)
		assert.Equal(t, fmt.Sprint(i), *ev.Push.Message.Parts[0].Text)
		if last != 0 {
			assert.Equal(t, last+1, ev.Push.Seq)
		}
		last = ev.Push.Seq
	}
}

func (s *suite) testBrokerConcurrent(t *testing.T, h Harness) {
	const sessions = 16
	peers := make([]*peer, sessions)
	var wg sync.WaitGroup
	for i := range peers {
		wg.Go(func() { peers[i] = tryRegister(t, h, fmt.Sprint("s", i), "worker") })
	}
	wg.Wait()
	for _, p := range peers {
		require.NotNil(t, p, "a registration failed")
	}
	ids := map[string]bool{}
	for _, p := range peers {
		assert.False(t, ids[p.id], "duplicate name %s", p.id)
		ids[p.id] = true
	}
	for i, p := range peers {
		wg.Go(func() {
			next := peers[(i+1)%sessions]
			res, err := p.sess.Call(ctxT(t), wire.MethodSend, map[string]any{
				"token": p.token, "to": next.id,
				"message": map[string]any{"parts": []any{map[string]any{"kind": "text", "text": "job"}}},
			})
			var r wire.TaskResult
			if assert.NoError(t, err) && assert.NoError(t, json.Unmarshal(res, &r)) {
				assert.Equal(t, next.id, r.Task.AgentName)
			}
		})
	}
	wg.Wait()
	for _, p := range peers {
		ev := nextEvent(t, p)
		require.NotNil(t, ev.TaskEvent)
		assert.Equal(t, p.id, ev.TaskEvent.Recipient)
		assert.Equal(t, wire.EventCreated, ev.TaskEvent.Kind)
	}
}

func (s *suite) testBrokerBound(t *testing.T, h Harness) {
	a := register(t, h, "s1", "a")
	other := session(t, h, "s2")
	_, err := other.Call(ctxT(t), wire.MethodListAgents, map[string]any{"token": a.token})
	if s.f.BoundSessions {
		assert.ErrorIs(t, err, wire.ErrUnauthorized, "a token used from another session")
	} else {
		assert.NoError(t, err, "the pipe's owner may act for any session")
	}
}
