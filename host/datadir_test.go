package host_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/host"
	"github.com/a2a-bus/a2a-bus/store/pebblestore"
	"github.com/a2a-bus/a2a-bus/wire"
)

// TestAHostsBrokerIsDurableByDefault: a host that starts its broker
// keeps its tasks and names in the platform's state folder unless told
// Memory; a delegate's name comes back after the host (and its broker)
// restarts; a second host on the same data dir is refused with what to
// do instead; Memory and DataDir together are refused.
func TestAHostsBrokerIsDurableByDefault(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the state folder is set through XDG_STATE_HOME here")
	}
	state := t.TempDir()
	t.Setenv("XDG_STATE_HOME", state)
	want := filepath.Join(state, "a2a-bus")
	got, err := host.DefaultDataDir()
	require.NoError(t, err)
	assert.Equal(t, want, got)

	open := func() *host.Host {
		h, err := host.Open(context.Background(), host.Config{Bus: host.NATS})
		require.NoError(t, err)
		return h
	}
	h := open()
	_, err = os.Stat(filepath.Join(want, pebblestore.DirName))
	require.NoError(t, err, "the store is in the state folder")

	_, err = host.OpenFake(context.Background(), host.Config{})
	require.ErrorIs(t, err, pebblestore.ErrLocked, "a second broker on the same data dir")
	assert.Contains(t, err.Error(), "join it with Config.ConnectionFile")

	ctx := context.Background()
	first := spawnIn(t, h, "chat-1", "planner", "inst-1")
	second := spawnIn(t, h, "chat-2", "planner", "inst-2")
	require.Equal(t, "planner", first)
	require.Equal(t, "planner-2", second)
	// The runtime deregisters its delegates when it closes: a crashed
	// host does not. Close the broker under them, as a crash would.
	require.NoError(t, h.Close())

	h = open()
	defer h.Close()
	assert.Equal(t, "planner-3", spawnIn(t, h, "chat-3", "planner", "inst-3"))
	assert.Equal(t, "planner-2", spawnIn(t, h, "chat-2", "planner", "inst-2"))
	assert.Equal(t, "planner", spawnIn(t, h, "chat-1", "planner", "inst-1"))

	_, err = host.Open(ctx, host.Config{Bus: host.NATS, Memory: true, DataDir: t.TempDir()})
	assert.ErrorContains(t, err, "Memory and DataDir")
}

// spawnIn registers a delegate through the host's client, without a
// runtime (which would deregister it when it closes), and returns its
// agentId.
func spawnIn(t *testing.T, h *host.Host, session, name, instance string) string {
	t.Helper()
	s, err := h.Client().Session(context.Background(), session)
	require.NoError(t, err)
	res, err := s.Call(context.Background(), wire.MethodRegister, wire.RegisterParams{ContextID: session, Card: &wire.AgentCard{Name: name}, InstanceID: instance})
	require.NoError(t, err)
	var r struct {
		AgentID string `json:"agentId"`
	}
	require.NoError(t, json.Unmarshal(res, &r))
	return r.AgentID
}

// TestAHostsBrokerOwnsTheGatewaysIdentities: the data dir a host's
// broker uses may be serve's, with tasks the gateway's clients left: no
// session of the host can take the gateway's agent there either.
func TestAHostsBrokerOwnsTheGatewaysIdentities(t *testing.T) {
	h, err := host.Open(context.Background(), host.Config{Bus: host.NATS, DataDir: t.TempDir()})
	require.NoError(t, err)
	defer h.Close()
	s, err := h.Client().Session(context.Background(), "evil")
	require.NoError(t, err)
	_, err = s.Call(context.Background(), wire.MethodRegister, wire.RegisterParams{ContextID: "evil", Card: &wire.AgentCard{Name: "a2a-gateway"}, InstanceID: "a2a-gateway"})
	var we *wire.Error
	require.ErrorAs(t, err, &we)
	assert.Equal(t, wire.ErrInvalidParams.Code, we.Code)
	assert.Contains(t, we.Message, "the broker's own agent")
}
