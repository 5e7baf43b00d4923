package host_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/host"
)

// TestJoiningABrokerThatNeverAnswersFails: the connection file names a
// port that takes connections and never answers, as a sidecar stopped
// with SIGSTOP does (the kernel accepts for it). Joining it fails within
// the dial's bound (the NATS client's connect timeout, which covers the
// handshake) instead of hanging: a host rejoining such a broker dials
// again and again until it answers or another takes its place.
func TestJoiningABrokerThatNeverAnswersFails(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0") // never accepts: the backlog does
	require.NoError(t, err)
	defer ln.Close()
	path := filepath.Join(t.TempDir(), "connection.json")
	b, err := json.Marshal(map[string]any{"url": "nats://" + ln.Addr().String(), "token": "t", "pid": os.Getpid()})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b, 0o600))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	h, err := host.Open(ctx, host.Config{Bus: host.NATS, ConnectionFile: path})
	if err == nil {
		h.Close()
	}
	require.Error(t, err)
	assert.NoError(t, ctx.Err(), "it failed before its context ended")
	t.Logf("the dial failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
}
