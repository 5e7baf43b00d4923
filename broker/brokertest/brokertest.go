// Package brokertest runs the broker over a bus and checks what a session
// sees end to end: registration and listing, routing by
// recipientContextId, seq order, concurrent sessions, and the caller
// binding the bus reports. It is the second half of a bus's conformance;
// the first, transport/bustest, checks the transport contract alone and
// does not import the broker.
//
//	func TestConformance(t *testing.T) {
//		newHarness := func(t *testing.T) bustest.Harness { ... }
//		bustest.Run(t, features, newHarness)
//		brokertest.Run(t, features, newHarness)
//	}
//
// When Harness.Bus is nil the broker already serves in another process
// (a child a2a-bus serve) and the tests talk to it.
package brokertest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/transport/bustest"
	"github.com/a2a-bus/a2a-bus/wire"
)

// Run runs the suite, each test on a fresh harness with a fresh broker.
func Run(t *testing.T, f bustest.Features, newHarness func(t *testing.T) bustest.Harness) {
	if f.Buffer <= 0 {
		f.Buffer = transport.DefaultSubscriptionBuffer
	}
	s := &suite{f: f}
	tests := []struct {
		name string
		fn   func(*testing.T, bustest.Harness)
	}{
		{"Broker/RegisterAndList", s.testRegisterList},
		{"Broker/EventsReachOnlyTheRecipientSession", s.testRouting},
		{"Broker/EventsArriveInSeqOrder", s.testOrder},
		{"Broker/ConcurrentSessions", s.testConcurrent},
		{"Broker/CallerSessionIsEnforced", s.testBound},
		{"Broker/ClosingASessionLeavesTheOthersWorking", s.testSessionsIndependent},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			require.NotNil(t, h.Client)
			t.Cleanup(func() { assert.NoError(t, h.Client.Close()) })
			if h.Bus != nil {
				b, err := broker.New(context.Background(), h.Bus, broker.Config{})
				require.NoError(t, err)
				// The documented order: the bus first, so that no handler
				// is running when the broker goes.
				t.Cleanup(func() {
					assert.NoError(t, h.Bus.Close())
					assert.NoError(t, b.Close())
				})
			}
			tc.fn(t, h)
		})
	}
}

type suite struct{ f bustest.Features }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), bustest.Timeout)
	t.Cleanup(cancel)
	return ctx
}

type peer struct {
	sess  transport.Session
	sub   transport.Subscription
	id    string
	token string
}

func register(t *testing.T, h bustest.Harness, sessionID, name string) *peer {
	t.Helper()
	p, err := tryRegister(ctxT(t), h, sessionID, name)
	require.NoError(t, err)
	return p
}

// tryRegister is register for goroutines other than the test's: it
// returns the failure instead of stopping the test.
func tryRegister(ctx context.Context, h bustest.Harness, sessionID, name string) (*peer, error) {
	sess, err := h.Client.Session(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	sub, err := sess.Subscribe(ctx)
	if err != nil {
		return nil, err
	}
	res, err := sess.Call(ctx, wire.MethodRegister, wire.RegisterParams{ContextID: sessionID, Card: &wire.AgentCard{Name: name}})
	if err != nil {
		return nil, err
	}
	var r wire.RegisterResult
	if err := json.Unmarshal(res, &r); err != nil {
		return nil, err
	}
	return &peer{sess: sess, sub: sub, id: r.AgentID, token: r.Token}, nil
}

func (p *peer) push(t *testing.T, to, text string) {
	t.Helper()
	_, err := p.sess.Call(ctxT(t), wire.MethodSend, wire.SendParams{Token: p.token, To: to, Oneway: true,
		Message: &wire.Message{Parts: []wire.Part{wire.TextPart(text)}}})
	require.NoError(t, err)
}

func nextEvent(t *testing.T, p *peer) *wire.Event {
	t.Helper()
	select {
	case m, ok := <-p.sub.C():
		require.True(t, ok, "subscription ended")
		ev, err := wire.DecodeEvent(m)
		require.NoError(t, err)
		return ev
	case <-time.After(bustest.Timeout):
		t.Fatal("no notification arrived")
		return nil
	}
}

func pushText(t *testing.T, ev *wire.Event) string {
	t.Helper()
	require.NotNil(t, ev.Push, "want a push")
	require.NotEmpty(t, ev.Push.Message.Parts)
	require.NotNil(t, ev.Push.Message.Parts[0].Text)
	return *ev.Push.Message.Parts[0].Text
}

// settle waits until p's subscription is live: a helper pushes to p until
// the push arrives.
func settle(t *testing.T, p *peer, helper *peer) {
	t.Helper()
	helper.push(t, p.id, "settle")
	require.Equal(t, "settle", pushText(t, nextEvent(t, p)))
}

func (s *suite) testRegisterList(t *testing.T, h bustest.Harness) {
	a := register(t, h, "s1", "discussant")
	b := register(t, h, "s2", "discussant")
	assert.Equal(t, "discussant", a.id)
	assert.Equal(t, "discussant-2", b.id)
	res, err := a.sess.Call(ctxT(t), wire.MethodListAgents, wire.TokenParams{Token: a.token})
	require.NoError(t, err)
	var l wire.ListAgentsResult
	require.NoError(t, json.Unmarshal(res, &l))
	require.Len(t, l.Agents, 1)
	assert.Equal(t, "discussant-2", l.Agents[0].AgentID)
	assert.Equal(t, "s2", l.Agents[0].ContextID)
}

func (s *suite) testRouting(t *testing.T, h bustest.Harness) {
	a := register(t, h, "s1", "a")
	b := register(t, h, "s.2", "b")
	settle(t, a, b)
	settle(t, b, a)
	b.push(t, "a", "for a")
	a.push(t, "b", "for b")
	evA, evB := nextEvent(t, a), nextEvent(t, b)
	assert.Equal(t, "for a", pushText(t, evA))
	assert.Equal(t, "s1", evA.Push.RecipientContextID)
	assert.Equal(t, "for b", pushText(t, evB), "b's next event is its own, not a's")
	assert.Equal(t, "s.2", evB.Push.RecipientContextID)
}

func (s *suite) testOrder(t *testing.T, h bustest.Harness) {
	a := register(t, h, "s1", "a")
	b := register(t, h, "s2", "b")
	settle(t, a, b)
	n := min(200, s.f.Buffer-1) // the receiver reads only after the last push
	for i := range n {
		b.push(t, "a", fmt.Sprint(i))
	}
	var last uint64
	for i := range n {
		ev := nextEvent(t, a)
		assert.Equal(t, fmt.Sprint(i), pushText(t, ev))
		if last != 0 {
			assert.Equal(t, last+1, ev.Push.Seq)
		}
		last = ev.Push.Seq
	}
}

func (s *suite) testConcurrent(t *testing.T, h bustest.Harness) {
	const sessions = 16
	peers := make([]*peer, sessions)
	errs := make([]error, sessions)
	var wg sync.WaitGroup
	for i := range peers {
		wg.Go(func() { peers[i], errs[i] = tryRegister(ctxT(t), h, fmt.Sprint("s", i), "worker") })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	ids := map[string]bool{}
	for _, p := range peers {
		assert.False(t, ids[p.id], "duplicate name %s", p.id)
		ids[p.id] = true
	}
	assignees := make([]string, sessions)
	for i, p := range peers {
		wg.Go(func() {
			next := peers[(i+1)%sessions]
			res, err := p.sess.Call(ctxT(t), wire.MethodSend, wire.SendParams{Token: p.token, To: next.id,
				Message: &wire.Message{Parts: []wire.Part{wire.TextPart("job")}}})
			var r wire.TaskResult
			if errs[i] = err; err == nil {
				if errs[i] = json.Unmarshal(res, &r); errs[i] == nil {
					assignees[i] = r.Task.AgentName
				}
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err)
		assert.Equal(t, peers[(i+1)%sessions].id, assignees[i])
	}
	for _, p := range peers {
		ev := nextEvent(t, p)
		require.NotNil(t, ev.TaskEvent)
		assert.Equal(t, p.id, ev.TaskEvent.Recipient)
		assert.Equal(t, wire.EventCreated, ev.TaskEvent.Kind)
	}
}

func (s *suite) testBound(t *testing.T, h bustest.Harness) {
	a := register(t, h, "s1", "a")
	other, err := h.Client.Session(ctxT(t), "s2")
	require.NoError(t, err)
	_, err = other.Call(ctxT(t), wire.MethodListAgents, wire.TokenParams{Token: a.token})
	if s.f.BoundSessions {
		assert.ErrorIs(t, err, wire.ErrUnauthorized, "a token used from another session")
	} else {
		assert.NoError(t, err, "the pipe's owner may act for any session")
	}
}

func (s *suite) testSessionsIndependent(t *testing.T, h bustest.Harness) {
	a := register(t, h, "s1", "a")
	b := register(t, h, "s2", "b")
	settle(t, b, a)
	require.NoError(t, a.sess.Close())
	c := register(t, h, "s3", "c")
	c.push(t, "b", "still here")
	assert.Equal(t, "still here", pushText(t, nextEvent(t, b)))
	// The same id may be opened again, and its calls are served.
	again := register(t, h, "s1", "a-again")
	assert.NotEmpty(t, again.token)
}
