//go:build unix

package host_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/host"
	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/store/pebblestore"
)

// starterRole writes the time of its start (Unix nanoseconds, a line) to
// the file its first argument names, then becomes the command the rest
// name.
const starterRole = "starter"

func init() { unixRoles[starterRole] = starterChild }

func starterChild() int {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "starter child: no file, no command")
		return 2
	}
	f, err := os.OpenFile(os.Args[1], os.O_WRONLY|os.O_APPEND, 0)
	if err == nil {
		_, err = fmt.Fprintf(f, "%d\n", time.Now().UnixNano())
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "starter child:", err)
		return 1
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, childRole+"=") {
			env = append(env, kv)
		}
	}
	err = syscall.Exec(os.Args[2], os.Args[2:], env)
	fmt.Fprintln(os.Stderr, "starter child:", err)
	return 1
}

// TestABrokerThatCannotStartIsRetriedWithBackoff: a pipe child that exits
// at its start (its data dir refuses it) is not started hundreds of times
// a second: the host starts it again at once, then waits 50 ms, doubling
// up to 1 s between starts, and joins it once it can start. Each start
// stamps its own time, so the waits are measured between the starts
// themselves: a busy machine can only make them longer.
func TestABrokerThatCannotStartIsRetriedWithBackoff(t *testing.T) {
	dir := t.TempDir()
	data, startsPath := filepath.Join(dir, "data"), filepath.Join(dir, "starts")
	starts := fifo(t, startsPath)
	require.NoError(t, starts.SetReadDeadline(time.Now().Add(60*time.Second)))
	lines := bufio.NewReader(starts)
	nextStart := func() time.Time {
		t.Helper()
		line, err := lines.ReadString('\n')
		require.NoError(t, err, "the host starts its broker again")
		ns, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
		require.NoError(t, err)
		return time.Unix(0, ns)
	}
	argv := []string{"env", childRole + "=" + starterRole, os.Args[0], startsPath,
		testbin.A2ABus(t), "serve", "--bus=pipe", "--data-dir", data, "--log-level=error"}
	h, err := host.Open(ctxT(t), host.Config{Bus: host.Pipe, BrokerCommand: argv})
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() })
	d := spawn(t, session(t, h, "chat-1"), "worker")
	nextStart()
	first := h.BrokerPID()
	// The broker leaves a store it will refuse: its folder emptied (under
	// it, so that no start comes before), and it dies.
	store := filepath.Join(data, pebblestore.DirName)
	files, err := filepath.Glob(filepath.Join(store, "*"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		require.NoError(t, os.Remove(f))
	}
	require.NoError(t, kill(first))
	prev := nextStart() // at once
	var waits []time.Duration
	for i := range 4 {
		at := nextStart()
		want := min(50*time.Millisecond<<i, time.Second)
		assert.GreaterOrEqual(t, at.Sub(prev), want, "the wait before start %d after the first", i+1)
		waits = append(waits, at.Sub(prev).Round(time.Millisecond))
		prev = at
	}
	t.Logf("the waits between starts while the broker could not start: %v", waits)
	// Fixed (the damaged store moved aside, with its marker, which says
	// a store was there), it starts, and the delegate goes on.
	require.NoError(t, os.RemoveAll(store))
	require.NoError(t, os.Remove(filepath.Join(data, pebblestore.MarkerName)))
	_, err = d.Peers(ctxT(t))
	require.NoError(t, err)
	assert.NotEqual(t, first, h.BrokerPID())
}
