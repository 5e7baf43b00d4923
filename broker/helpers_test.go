package broker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/transport/fakebus"
	"github.com/a2a-bus/a2a-bus/wire"
)

// env is a broker on a fake bus, with helpers that speak the protocol.
type env struct {
	t      testing.TB
	bus    *fakebus.Bus
	broker *broker.Broker

	mu       sync.Mutex
	sessions map[string]*session
	// codes records every error code the broker answered with, so a test
	// can show that one is never produced.
	codes map[int]int
}

type session struct {
	transport.Session
	sub transport.Subscription
}

func newEnv(t testing.TB, cfg broker.Config) *env {
	t.Helper()
	return newEnvOn(t, cfg, fakebus.Config{})
}

// newOwnerEnv is an env whose sessions call as the pipe's owner does:
// unbound to a session.
func newOwnerEnv(t testing.TB, cfg broker.Config) *env {
	t.Helper()
	return newEnvOn(t, cfg, fakebus.Config{Owner: true})
}

func newEnvOn(t testing.TB, cfg broker.Config, bcfg fakebus.Config) *env {
	t.Helper()
	return newEnvWrapped(t, cfg, bcfg, nil)
}

// newEnvWrapped is newEnvOn with the broker serving on wrap(bus): a bus
// that adds features (a payload limit, session credentials) or watches.
func newEnvWrapped(t testing.TB, cfg broker.Config, bcfg fakebus.Config, wrap func(*fakebus.Bus) transport.Bus) *env {
	t.Helper()
	bus := fakebus.New(bcfg)
	var served transport.Bus = bus
	if wrap != nil {
		served = wrap(bus)
	}
	b, err := broker.New(context.Background(), served, cfg)
	require.NoError(t, err)
	e := &env{t: t, bus: bus, broker: b, sessions: map[string]*session{}, codes: map[int]int{}}
	t.Cleanup(func() {
		bus.Close()
		b.Close()
	})
	return e
}

// The helpers come in pairs: tryX reports what goes wrong as an error,
// for goroutines other than the test's (where require must not be
// called); X is tryX for the test's goroutine, and stops the test on a
// failure that is not the broker's answer.

// trySession opens (once) and subscribes a session.
func (e *env) trySession(id string) (*session, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s, ok := e.sessions[id]; ok {
		return s, nil
	}
	s, err := e.bus.Session(context.Background(), id)
	if err != nil {
		return nil, err
	}
	sub, err := s.Subscribe(context.Background())
	if err != nil {
		return nil, err
	}
	e.sessions[id] = &session{Session: s, sub: sub}
	return e.sessions[id], nil
}

func (e *env) session(id string) *session {
	e.t.Helper()
	s, err := e.trySession(id)
	require.NoError(e.t, err)
	return s
}

// errTransport marks a failure of the bus, not an answer of the broker.
var errTransport = errors.New("transport failure")

// tryCall sends a request from a session and records any error code.
func (e *env) tryCall(sessionID, method string, params any) (json.RawMessage, error) {
	s, err := e.trySession(sessionID)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errTransport, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := s.Call(ctx, method, params)
	var we *wire.Error
	switch {
	case errors.As(err, &we):
		e.mu.Lock()
		e.codes[we.Code]++
		e.mu.Unlock()
	case err != nil:
		err = fmt.Errorf("%w: %v", errTransport, err)
	}
	return res, err
}

func (e *env) call(sessionID, method string, params any) (json.RawMessage, error) {
	e.t.Helper()
	res, err := e.tryCall(sessionID, method, params)
	require.NotErrorIs(e.t, err, errTransport)
	return res, err
}

// agent is a registered agent, as its runtime holds it.
type agent struct {
	e        *env
	session  string
	id       string
	token    string
	instance string
	card     wire.AgentCard
}

func (e *env) register(sessionID, name string) *agent {
	e.t.Helper()
	return e.registerInstance(sessionID, name, "")
}

func (e *env) registerInstance(sessionID, name, instance string) *agent {
	e.t.Helper()
	a, err := e.tryRegister(sessionID, name, instance)
	require.NoError(e.t, err)
	return a
}

func (e *env) tryRegister(sessionID, name, instance string) (*agent, error) {
	res, err := e.tryCall(sessionID, wire.MethodRegister, wire.RegisterParams{
		ContextID: sessionID, Card: &wire.AgentCard{Name: name, Description: "test agent " + name}, InstanceID: instance,
	})
	if err != nil {
		return nil, err
	}
	var r wire.RegisterResult
	if err := json.Unmarshal(res, &r); err != nil {
		return nil, err
	}
	return &agent{e: e, session: sessionID, id: r.AgentID, token: r.Token, instance: r.InstanceID, card: r.Card}, nil
}

// withToken returns params with the agent's token, unless they have one.
func (a *agent) withToken(params map[string]any) map[string]any {
	out := map[string]any{"token": a.token}
	for k, v := range params {
		out[k] = v
	}
	return out
}

func (a *agent) call(method string, params map[string]any) (json.RawMessage, error) {
	a.e.t.Helper()
	return a.e.call(a.session, method, a.withToken(params))
}

func (a *agent) tryCall(method string, params map[string]any) (json.RawMessage, error) {
	return a.e.tryCall(a.session, method, a.withToken(params))
}

// tryTask makes a call that answers a task.
func (a *agent) tryTask(method string, params map[string]any) (*wire.Task, error) {
	res, err := a.tryCall(method, params)
	if err != nil {
		return nil, err
	}
	var r wire.TaskResult
	if err := json.Unmarshal(res, &r); err != nil || r.Task == nil {
		return nil, fmt.Errorf("not a task result: %s", res)
	}
	return r.Task, nil
}

func (a *agent) trySend(to, msg string) (*wire.Task, error) {
	p := map[string]any{"message": text(msg)}
	if to != "" {
		p["to"] = to
	}
	return a.tryTask(wire.MethodSend, p)
}

func (a *agent) tryUpdate(taskID string, state wire.State, msg string) (*wire.Task, error) {
	p := map[string]any{"taskId": taskID, "state": state}
	if msg != "" {
		p["message"] = text(msg)
	}
	return a.tryTask(wire.MethodUpdateTask, p)
}

func (a *agent) tryDeregister() error {
	_, err := a.tryCall(wire.MethodDeregister, nil)
	return err
}

func text(s string) map[string]any {
	return map[string]any{"parts": []any{map[string]any{"kind": "text", "text": s}}}
}

func decodeTask(t testing.TB, res json.RawMessage) *wire.Task {
	t.Helper()
	var r wire.TaskResult
	require.NoError(t, json.Unmarshal(res, &r))
	require.NotNil(t, r.Task)
	return r.Task
}

// send creates a task; to may be empty.
func (a *agent) send(to, msg string) (*wire.Task, error) {
	a.e.t.Helper()
	p := map[string]any{"message": text(msg)}
	if to != "" {
		p["to"] = to
	}
	res, err := a.call(wire.MethodSend, p)
	if err != nil {
		return nil, err
	}
	return decodeTask(a.e.t, res), nil
}

func (a *agent) mustSend(to, msg string) *wire.Task {
	a.e.t.Helper()
	task, err := a.send(to, msg)
	require.NoError(a.e.t, err)
	return task
}

func (a *agent) taskCall(method, taskID string, extra map[string]any) (*wire.Task, error) {
	a.e.t.Helper()
	p := map[string]any{"taskId": taskID}
	for k, v := range extra {
		p[k] = v
	}
	res, err := a.call(method, p)
	if err != nil {
		return nil, err
	}
	return decodeTask(a.e.t, res), nil
}

func (a *agent) get(taskID string) (*wire.Task, error) {
	return a.taskCall(wire.MethodGetTask, taskID, nil)
}

func (a *agent) update(taskID string, state wire.State, msg string) (*wire.Task, error) {
	extra := map[string]any{"state": state}
	if msg != "" {
		extra["message"] = text(msg)
	}
	return a.taskCall(wire.MethodUpdateTask, taskID, extra)
}

func (a *agent) cancel(taskID string) (*wire.Task, error) {
	return a.taskCall(wire.MethodCancelTask, taskID, nil)
}

func (a *agent) reply(taskID, msg string) (*wire.Task, error) {
	return a.taskCall(wire.MethodSend, taskID, map[string]any{"message": text(msg)})
}

func (a *agent) deregister() error {
	_, err := a.call(wire.MethodDeregister, nil)
	return err
}

func (a *agent) list() []wire.AgentCard {
	a.e.t.Helper()
	res, err := a.call(wire.MethodListAgents, nil)
	require.NoError(a.e.t, err)
	var r wire.ListAgentsResult
	require.NoError(a.e.t, json.Unmarshal(res, &r))
	return r.Agents
}

// event returns the next notification of a session. On the fake bus a
// notification is in the channel before the call that caused it returns.
func (e *env) event(sessionID string) *wire.Event {
	e.t.Helper()
	select {
	case raw, ok := <-e.session(sessionID).sub.C():
		require.True(e.t, ok, "subscription ended")
		ev, err := wire.DecodeEvent(raw)
		require.NoError(e.t, err)
		return ev
	default:
		e.t.Fatalf("session %s has no pending event", sessionID)
		return nil
	}
}

// noEvent asserts that a session has no pending notification.
func (e *env) noEvent(sessionID string) {
	e.t.Helper()
	select {
	case raw := <-e.session(sessionID).sub.C():
		e.t.Fatalf("session %s got an unexpected event: %s", sessionID, raw)
	default:
	}
}

// requireCode asserts err is the wire error want.
func requireCode(t testing.TB, err error, want *wire.Error) {
	t.Helper()
	require.Error(t, err)
	var we *wire.Error
	require.True(t, errors.As(err, &we), "not a wire error: %v", err)
	require.Truef(t, errors.Is(err, want), "got %v, want %s", err, want.DataCode())
}

// bus2 returns a second, independent fake bus closed with the test.
func (e *env) bus2(t testing.TB) *fakebus.Bus {
	b := fakebus.New(fakebus.Config{})
	t.Cleanup(func() { b.Close() })
	return b
}
