package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/pipebus"
	"github.com/a2a-bus/a2a-bus/wire"
)

// syncBuffer collects logs from many goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSecretsStayOutOfLogsAndErrors runs the broker and the NATS bus at
// debug level through a session's life, with failures of every kind, and
// looks for the host token, session passwords and agent tokens in the
// logs and in every error message.
func TestSecretsStayOutOfLogsAndErrors(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	bus, err := natsbus.New(natsbus.Config{Logger: log})
	require.NoError(t, err)
	b, err := broker.New(context.Background(), bus, broker.Config{Logger: log})
	require.NoError(t, err)
	defer func() { bus.Close(); b.Close() }()
	host, err := bus.Connect(natsbus.ClientConfig{Logger: log})
	require.NoError(t, err)
	defer host.Close()
	ctx := context.Background()
	secrets := []string{bus.Server().Token()}
	var errs []string

	raw, err := host.CallHost(ctx, wire.MethodSessionOpen, wire.SessionParams{ContextID: "s1"})
	require.NoError(t, err)
	var creds wire.SessionCredentials
	require.NoError(t, json.Unmarshal(raw, &creds))
	secrets = append(secrets, creds.Password)
	sc, err := natsbus.Dial(natsbus.ClientConfig{URL: creds.URL, User: creds.User, Password: creds.Password, Session: "s1", Logger: log})
	require.NoError(t, err)
	defer sc.Close()
	s1, err := sc.Session(ctx, "s1")
	require.NoError(t, err)
	s2, err := host.Session(ctx, "s2")
	require.NoError(t, err)
	reg := func(s interface {
		Call(context.Context, string, any) (json.RawMessage, error)
	}, session, name string) wire.RegisterResult {
		res, err := s.Call(ctx, wire.MethodRegister, wire.RegisterParams{ContextID: session, Card: &wire.AgentCard{Name: name}})
		require.NoError(t, err)
		var r wire.RegisterResult
		require.NoError(t, json.Unmarshal(res, &r))
		secrets = append(secrets, r.Token)
		return r
	}
	a, bb := reg(s1, "s1", "a"), reg(s2, "s2", "b")
	fail := func(_ json.RawMessage, err error) {
		require.Error(t, err)
		errs = append(errs, err.Error())
	}
	fail(s2.Call(ctx, wire.MethodListAgents, wire.TokenParams{Token: a.Token}))                         // another session's token
	fail(s1.Call(ctx, wire.MethodListAgents, wire.TokenParams{Token: a.Token + "0"}))                   // a wrong token
	fail(s1.Call(ctx, wire.MethodGetTask, map[string]any{"token": a.Token, "taskId": 5}))               // a bad shape
	fail(s1.Call(ctx, wire.MethodSend, map[string]any{"token": a.Token, "to": bb.Token, "message": 1})) // a token where a name goes
	fail(s1.Call(ctx, wire.MethodSend, map[string]any{"token": a.Token, "to": "nobody", "message": map[string]any{"parts": []any{map[string]any{"kind": "text", "text": "x"}}}}))
	_, err = s1.Call(ctx, wire.MethodDeregister, wire.TokenParams{Token: a.Token})
	require.NoError(t, err)
	fail(s1.Call(ctx, wire.MethodListAgents, wire.TokenParams{Token: a.Token})) // a revoked token
	_, err = natsbus.Dial(natsbus.ClientConfig{URL: creds.URL, User: creds.User, Password: creds.Password + "x", Session: "s1", NoReconnect: true, Logger: log})
	require.Error(t, err)
	errs = append(errs, err.Error())
	_, err = host.CallHost(ctx, wire.MethodSessionClose, wire.SessionParams{ContextID: "s1"})
	require.NoError(t, err)

	all := logs.String() + strings.Join(errs, "\n")
	require.NotEmpty(t, logs.String(), "the debug logs were captured")
	for _, s := range secrets {
		require.NotEmpty(t, s)
		assert.NotContains(t, all, s, "a secret reached a log line or an error message")
	}
}

// TestPipeBrokerLogsNoTokens runs a2a-bus serve --bus=pipe at debug level
// and checks its stderr for the tokens it issued.
func TestPipeBrokerLogsNoTokens(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(testbin.A2ABus(t), "serve", "--bus=pipe", "--data-dir", filepath.Join(t.TempDir(), "data"), "--log-level=debug")
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	ch, err := pipebus.Start(cmd, pipebus.ClientConfig{})
	require.NoError(t, err)
	ctx := context.Background()
	s, err := ch.Session(ctx, "s1")
	require.NoError(t, err)
	var tokens []string
	for _, name := range []string{"a", "b"} {
		res, err := s.Call(ctx, wire.MethodRegister, wire.RegisterParams{ContextID: "s1", Card: &wire.AgentCard{Name: name}})
		require.NoError(t, err)
		var r wire.RegisterResult
		require.NoError(t, json.Unmarshal(res, &r))
		tokens = append(tokens, r.Token)
	}
	_, err = s.Call(ctx, wire.MethodSend, map[string]any{"token": tokens[0], "message": map[string]any{"parts": []any{map[string]any{"kind": "text", "text": "x"}}}})
	require.NoError(t, err)
	_, err = s.Call(ctx, wire.MethodDeregister, wire.TokenParams{Token: tokens[1]})
	require.NoError(t, err)
	_, err = s.Call(ctx, wire.MethodListAgents, wire.TokenParams{Token: tokens[1]})
	require.True(t, errors.Is(err, wire.ErrUnauthorized))
	require.NoError(t, ch.Close())
	require.Contains(t, stderr.String(), "level=DEBUG", "debug logging was on")
	for _, tok := range tokens {
		assert.NotContains(t, stderr.String(), tok)
	}
}
