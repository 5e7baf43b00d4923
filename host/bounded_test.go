package host_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/host"
	"github.com/a2a-bus/a2a-bus/transport"
)

// TestACallToAKilledJoinedBrokerEndsAtItsDeadline: the host joined a
// sidecar, which is killed and not started again. A send made with a
// context that never ends waits for a broker that does not come: it fails
// as unavailable at the runtime's CallTimeout, retries included, instead
// of waiting for ever (or a timeout per retry).
func TestACallToAKilledJoinedBrokerEndsAtItsDeadline(t *testing.T) {
	dir := t.TempDir()
	path, data := filepath.Join(dir, "run", "connection.json"), filepath.Join(dir, "data")
	exited, _ := sidecar(t, path, data)
	cfg := host.Config{Bus: host.NATS, ConnectionFile: path}
	cfg.Runtime.CallTimeout = time.Second
	h, err := host.Open(ctxT(t), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() })
	chat := session(t, h, "chat-1")
	// The broker is gone for good: at the end the runtime leaves, rather
	// than close, which would wait CallTimeout for each delegate's
	// deregistration (not what this test is about).
	t.Cleanup(func() { chat.Leave() })
	asker, _ := spawn(t, chat, "asker"), spawn(t, chat, "worker")

	require.NoError(t, kill(h.BrokerPID()))
	<-exited
	_, err = asker.Send(context.Background(), "worker", say("is anyone there?"), nil)
	require.ErrorIs(t, err, transport.ErrUnavailable)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "ended by the call's deadline")
	_, err = asker.Task(context.Background(), "no-such-task")
	require.ErrorIs(t, err, transport.ErrUnavailable, "a read is bounded too")
}
