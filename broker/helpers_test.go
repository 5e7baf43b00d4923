package broker_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
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

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

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
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
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

// session opens (once) and subscribes a session.
func (e *env) session(id string) *session {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s, ok := e.sessions[id]; ok {
		return s
	}
	s, err := e.bus.Session(context.Background(), id)
	require.NoError(e.t, err)
	sub, err := s.Subscribe(context.Background())
	require.NoError(e.t, err)
	e.sessions[id] = &session{Session: s, sub: sub}
	return e.sessions[id]
}

// call sends a request from a session and records any error code.
func (e *env) call(sessionID, method string, params any) (json.RawMessage, error) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := e.session(sessionID).Call(ctx, method, params)
	var we *wire.Error
	if errors.As(err, &we) {
		e.mu.Lock()
		e.codes[we.Code]++
		e.mu.Unlock()
	} else if err != nil {
		require.NoError(e.t, err, "transport failure")
	}
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
	res, err := e.call(sessionID, wire.MethodRegister, wire.RegisterParams{
		ContextID: sessionID, Card: &wire.AgentCard{Name: name, Description: "test agent " + name}, InstanceID: instance,
	})
	require.NoError(e.t, err)
	var r wire.RegisterResult
	require.NoError(e.t, json.Unmarshal(res, &r))
	return &agent{e: e, session: sessionID, id: r.AgentID, token: r.Token, instance: r.InstanceID, card: r.Card}
}

func (a *agent) call(method string, params map[string]any) (json.RawMessage, error) {
	a.e.t.Helper()
	if params == nil {
		params = map[string]any{}
	}
	if _, ok := params["token"]; !ok {
		params["token"] = a.token
	}
	return a.e.call(a.session, method, params)
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
