package main_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/gateway"
	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/pipebus"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// realBroker is an a2a-bus serve process on one bus, on a data dir, and
// the host's connection to it.
type realBroker struct {
	client transport.Client
	host   interface {
		CallHost(ctx context.Context, method string, params any) (json.RawMessage, error)
	}
	stop func(t *testing.T, sig syscall.Signal)
}

// startOn starts a2a-bus serve on bus ("pipe" or "nats") on dataDir,
// with extra flags, and connects to it as its host.
func startOn(t *testing.T, bus, dataDir string, extra ...string) *realBroker {
	t.Helper()
	switch bus {
	case "pipe":
		cmd := exec.Command(testbin.A2ABus(t), append([]string{"serve", "--bus=pipe", "--data-dir", dataDir, "--log-level=warn"}, extra...)...)
		cmd.Env = testEnv(t)
		ch, err := pipebus.Start(cmd, pipebus.ClientConfig{})
		require.NoError(t, err)
		t.Cleanup(func() { ch.Close() })
		_, err = ch.CallHost(context.Background(), wire.MethodAdminInfo, nil)
		require.NoError(t, err, "the child answers")
		return &realBroker{client: ch, host: ch, stop: func(t *testing.T, sig syscall.Signal) {
			require.NoError(t, cmd.Process.Signal(sig))
			select {
			case <-ch.Done():
			case <-time.After(20 * time.Second):
				t.Fatal("the broker did not exit")
			}
			ch.Close()
		}}
	case "nats":
		path := filepath.Join(t.TempDir(), "connection.json")
		b := startServe(t, append([]string{"--connection-file", path, "--data-dir", dataDir, "--log-level=warn"}, extra...)...)
		c, err := natsbus.Dial(natsbus.ClientConfig{URL: b.conn.URL, Token: b.conn.Token, NoReconnect: true})
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return &realBroker{client: c, host: c, stop: func(t *testing.T, sig syscall.Signal) {
			b.stop(t, sig)
			c.Close()
		}}
	}
	t.Fatalf("no bus %q", bus)
	return nil
}

// registerAs registers m on c and returns its session, or the broker's
// refusal.
func (m *member) try(c transport.Client) (transport.Session, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.Session(ctx, m.session)
	if err != nil {
		return nil, err
	}
	res, err := s.Call(ctx, wire.MethodRegister, wire.RegisterParams{ContextID: m.session, Card: &wire.AgentCard{Name: m.name}, InstanceID: m.instance})
	if err != nil {
		return s, err
	}
	var r wire.RegisterResult
	if err := json.Unmarshal(res, &r); err != nil {
		return s, err
	}
	m.token, m.id = r.Token, r.AgentID
	return s, nil
}

func taskCall(t *testing.T, s transport.Session, method string, params any) *wire.Task {
	t.Helper()
	res, err := s.Call(context.Background(), method, params)
	require.NoError(t, err)
	var r wire.TaskResult
	require.NoError(t, json.Unmarshal(res, &r))
	require.NotNil(t, r.Task)
	return r.Task
}

func sendCall(t *testing.T, s transport.Session, params wire.SendParams) *wire.Task {
	t.Helper()
	res, err := s.Call(context.Background(), wire.MethodSend, params)
	require.NoError(t, err)
	var r wire.SendResult
	require.NoError(t, json.Unmarshal(res, &r))
	require.NotNil(t, r.Task)
	return r.Task
}

func codeOf(err error) int {
	var we *wire.Error
	if errors.As(err, &we) {
		return we.Code
	}
	return 0
}

// TestNamesSurviveTheBrokerProcess: on each bus, two sessions register
// planner; the broker is killed (SIGKILL) or stopped (SIGTERM) and
// started again on its data dir; a newcomer from a third session
// registers first, then the two come back in the reverse order: each
// gets its old name, the newcomer planner-3, and the stored task's names
// are unchanged. Another session cannot take a held instance id.
func TestNamesSurviveTheBrokerProcess(t *testing.T) {
	for _, bus := range []string{"pipe", "nats"} {
		for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
			t.Run(bus+"/"+sig.String(), func(t *testing.T) {
				dir := t.TempDir()
				b := startOn(t, bus, dir)
				one := &member{session: "chat-1", name: "planner", instance: "inst-1"}
				two := &member{session: "chat-2", name: "planner", instance: "inst-2"}
				s1 := one.register(t, b.client)
				two.register(t, b.client)
				require.Equal(t, "planner", one.id)
				require.Equal(t, "planner-2", two.id)
				text := "plan the release"
				task := sendCall(t, s1, wire.SendParams{Token: one.token, To: "planner-2",
					Message: &wire.Message{Role: wire.RoleUser, Parts: []wire.Part{{Kind: wire.KindText, Text: &text}}}})

				b.stop(t, sig)
				b = startOn(t, bus, dir)
				thief := &member{session: "thief", name: "planner", instance: "inst-1"}
				_, err := thief.try(b.client)
				require.Error(t, err, "a held instance id stays with its session")
				assert.Equal(t, wire.ErrInvalidParams.Code, codeOf(err))
				newcomer := &member{session: "chat-3", name: "planner", instance: "inst-3"}
				s3 := newcomer.register(t, b.client)
				s2 := two.register(t, b.client)
				s1 = one.register(t, b.client)
				assert.Equal(t, "planner-3", newcomer.id)
				assert.Equal(t, "planner-2", two.id)
				assert.Equal(t, "planner", one.id)

				got := taskCall(t, s1, wire.MethodGetTask, wire.TaskParams{Token: one.token, TaskID: task.ID})
				assert.Equal(t, "planner", got.RequesterName)
				assert.Equal(t, "planner-2", got.AgentName)
				got = taskCall(t, s2, wire.MethodGetTask, wire.TaskParams{Token: two.token, TaskID: task.ID})
				assert.Equal(t, "chat-2", got.AgentContextID)
				// The old address still reaches chat-2's agent.
				sent := sendCall(t, s3, wire.SendParams{Token: newcomer.token, To: "planner-2",
					Message: &wire.Message{Role: wire.RoleUser, Parts: []wire.Part{{Kind: wire.KindText, Text: &text}}}})
				assert.Equal(t, "chat-2", sent.AgentContextID)
			})
		}
	}
}

// TestAHeldInstanceIsLetGoAfterTheOrphanTimeout: a held instance id is
// refused to another session until --orphan-timeout passes with nobody
// back; then it is free.
func TestAHeldInstanceIsLetGoAfterTheOrphanTimeout(t *testing.T) {
	dir := t.TempDir()
	b := startOn(t, "pipe", dir, "--orphan-timeout=500ms")
	keeper := &member{session: "owner", name: "keeper", instance: "inst-keeper"}
	keeper.register(t, b.client)
	b.stop(t, syscall.SIGKILL)

	b = startOn(t, "pipe", dir, "--orphan-timeout=500ms")
	thief := &member{session: "thief", name: "keeper", instance: "inst-keeper"}
	_, err := thief.try(b.client)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "held for another session")
	require.Eventually(t, func() bool {
		_, err := thief.try(b.client)
		return err == nil
	}, 15*time.Second, 50*time.Millisecond, "released after the orphan timeout")
	assert.Equal(t, "keeper", thief.id)
}

// TestTheGatewaysIdentityCannotBeTaken: the gateway's agent has an
// instance id kept in the data dir. Restarted without --a2a-listen, no
// session can register that id (nor the well-known one of earlier
// versions), open the gateway's session, or read the gateway's tasks.
func TestTheGatewaysIdentityCannotBeTaken(t *testing.T) {
	dir := t.TempDir()
	b := startOn(t, "nats", dir, "--a2a-listen=127.0.0.1:0")
	// A delegate the gateway's clients talk to.
	worker := &member{session: "chat-1", name: "worker", instance: "inst-worker"}
	worker.register(t, b.client)
	data, err := os.ReadFile(filepath.Join(dir, gateway.InstanceFile))
	require.NoError(t, err)
	instance := strings.TrimSpace(string(data))
	require.True(t, strings.HasPrefix(instance, "a2a-gateway-"), instance)
	b.stop(t, syscall.SIGTERM)

	b = startOn(t, "nats", dir, "--orphan-timeout=200ms")
	for _, id := range []string{instance, gateway.Instance} {
		evil := &member{session: "evil", name: "a2a-gateway", instance: id}
		_, err := evil.try(b.client)
		require.Error(t, err, id)
		assert.Equal(t, wire.ErrInvalidParams.Code, codeOf(err), "%s: %v", id, err)
	}
	_, err = b.host.CallHost(context.Background(), wire.MethodSessionOpen, wire.SessionParams{ContextID: gateway.DefaultSession})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the broker's own session")
	// Past the orphan timeout too: the identity is the broker's, not held.
	// The worker's instance, held since the same start, is let go when the
	// timeout passes: once another session can take it, it has passed.
	other := &member{session: "chat-9", name: "worker", instance: "inst-worker"}
	require.Eventually(t, func() bool {
		_, err := other.try(b.client)
		return err == nil
	}, 15*time.Second, 20*time.Millisecond, "the worker's held instance is let go after the orphan timeout")
	evil := &member{session: "evil", name: "a2a-gateway", instance: instance}
	_, err = evil.try(b.client)
	assert.Equal(t, wire.ErrInvalidParams.Code, codeOf(err), "%v", err)

	// The same serve, started again with the gateway, is the same agent.
	b.stop(t, syscall.SIGTERM)
	startOn(t, "nats", dir, "--a2a-listen=127.0.0.1:0")
	again, err := os.ReadFile(filepath.Join(dir, gateway.InstanceFile))
	require.NoError(t, err)
	assert.Equal(t, string(data), string(again))
}
