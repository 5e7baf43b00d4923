//go:build unix

package host_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/host"
	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/store/pebblestore"
)

// TestABrokerThatCannotStartIsRetriedWithBackoff: a pipe child that exits
// at its start (its data dir refuses it) is not started hundreds of times
// a second: the host backs off, and joins it once it can start.
func TestABrokerThatCannotStartIsRetriedWithBackoff(t *testing.T) {
	dir := t.TempDir()
	data, starts := filepath.Join(dir, "data"), filepath.Join(dir, "starts")
	// Each start leaves a line in starts.
	argv := []string{"sh", "-c", `echo >> "$1"; exec "$2" serve --bus=pipe --data-dir "$3" --log-level=error`, "sh", starts, testbin.A2ABus(t), data}
	h, err := host.Open(ctxT(t), host.Config{Bus: host.Pipe, BrokerCommand: argv})
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() })
	d := spawn(t, session(t, h, "chat-1"), "worker")
	first := h.BrokerPID()
	// The broker dies and leaves a store it will refuse: its folder
	// emptied.
	require.NoError(t, kill(first))
	store := filepath.Join(data, pebblestore.DirName)
	files, err := filepath.Glob(filepath.Join(store, "*"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		require.NoError(t, os.Remove(f))
	}
	count := func() int {
		b, _ := os.ReadFile(starts)
		return strings.Count(string(b), "\n")
	}
	before := count()
	time.Sleep(2 * time.Second) // how many starts in two seconds: the count is the point
	tries := count() - before
	t.Logf("%d starts in 2 s while the broker could not start", tries)
	assert.LessOrEqual(t, tries, 8, "50 ms, then doubling to 1 s between starts")
	assert.Positive(t, tries)
	// Fixed, it starts, and the delegate goes on.
	require.NoError(t, os.RemoveAll(store))
	_, err = d.Peers(ctxT(t))
	require.NoError(t, err)
	assert.NotEqual(t, first, h.BrokerPID())
}
