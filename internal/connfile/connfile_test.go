package connfile_test

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/internal/connfile"
)

func TestDefaultPath(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/1000")
	p, err := connfile.DefaultPath()
	require.NoError(t, err)
	assert.Equal(t, "/run/user/1000/a2a-bus/connection.json", p)
	t.Setenv("XDG_RUNTIME_DIR", "")
	t.Setenv("XDG_STATE_HOME", "/state")
	p, _ = connfile.DefaultPath()
	assert.Equal(t, "/state/a2a-bus/connection.json", p)
	t.Setenv("XDG_STATE_HOME", "")
	t.Setenv("HOME", "/home/u")
	p, _ = connfile.DefaultPath()
	assert.Equal(t, "/home/u/.local/state/a2a-bus/connection.json", p)
}

func TestLockWriteRelease(t *testing.T) {
	path := filepath.Join(t.TempDir(), "new", "connection.json")
	c, err := connfile.Lock(path)
	require.NoError(t, err)
	require.NoError(t, c.Write(connfile.Info{URL: "nats://127.0.0.1:1", Token: "ab", PID: os.Getpid()}))
	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	dir, err := os.Stat(filepath.Dir(path))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), dir.Mode().Perm())
	got, err := connfile.Read(path)
	require.NoError(t, err)
	assert.Equal(t, "ab", got.Token)

	_, err = connfile.Lock(path)
	assert.ErrorIs(t, err, connfile.ErrRunning, "the lock is held")

	require.NoError(t, c.Release())
	require.NoError(t, c.Release())
	_, err = os.Stat(path)
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func TestStaleFileIsReplacedLiveOneRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "connection.json")
	// A file naming a process that runs and a URL that accepts connections,
	// written by a broker that takes no lock.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	live := connfile.Info{URL: "nats://" + ln.Addr().String(), PID: os.Getpid()}
	require.NoError(t, os.WriteFile(path, []byte(`{"url":"`+live.URL+`","pid":`+itoa(live.PID)+`}`), 0o600))
	assert.True(t, connfile.Live(live))
	_, err = connfile.Lock(path)
	assert.ErrorIs(t, err, connfile.ErrRunning)
	assert.Contains(t, err.Error(), path)

	// The same file once its URL is gone: stale.
	ln.Close()
	assert.False(t, connfile.Live(live))
	c, err := connfile.Lock(path)
	require.NoError(t, err)
	require.NoError(t, c.Write(connfile.Info{URL: "nats://127.0.0.1:2", PID: os.Getpid()}))
	require.NoError(t, c.Release())

	assert.False(t, connfile.Live(connfile.Info{URL: live.URL, PID: 0}))
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestOwnFolderIsMade0700(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a2a-bus")
	require.NoError(t, os.Mkdir(dir, 0o777))
	require.NoError(t, os.Chmod(dir, 0o777))
	c, err := connfile.Lock(filepath.Join(dir, "connection.json"))
	require.NoError(t, err)
	defer c.Release()
	st, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), st.Mode().Perm())
}
