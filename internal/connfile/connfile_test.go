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
	t.Setenv("XDG_RUNTIME_DIR", "")
	t.Setenv("XDG_STATE_HOME", "/state")
	p, warning, err := connfile.DefaultPath()
	require.NoError(t, err)
	assert.Equal(t, "/state/a2a-bus/connection.json", p)
	assert.Empty(t, warning)
	t.Setenv("XDG_STATE_HOME", "")
	t.Setenv("HOME", "/home/u")
	p, warning, err = connfile.DefaultPath()
	require.NoError(t, err)
	assert.Equal(t, "/home/u/.local/state/a2a-bus/connection.json", p)
	assert.Empty(t, warning)
}

// runtimeDir makes a folder for XDG_RUNTIME_DIR with mode perm.
func runtimeDir(t *testing.T, perm os.FileMode) string {
	t.Helper()
	d := filepath.Join(t.TempDir(), "run")
	require.NoError(t, os.Mkdir(d, 0o700))
	require.NoError(t, os.Chmod(d, perm)) // past the umask
	return d
}

// otherUser is the uid tests give files that must not be the user's own.
const otherUser = 65534 // nobody

// requireRoot skips a test that needs to give a file to another user.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("only root can give a file to another user (os.Chown); run as root to test ownership")
	}
}

func TestDefaultPathTrustsOnlyAPrivateRuntimeDir(t *testing.T) {
	tests := []struct {
		name string
		dir  func(t *testing.T) string
		used bool   // the runtime dir is used
		why  string // else the warning says this
	}{
		{"a 0700 folder is used", func(t *testing.T) string { return runtimeDir(t, 0o700) }, true, ""},
		{"a 0755 folder is used", func(t *testing.T) string { return runtimeDir(t, 0o755) }, true, ""},
		{"a missing folder is used: it is created the user's own", func(t *testing.T) string {
			return filepath.Join(t.TempDir(), "not-yet")
		}, true, ""},
		{"a world-writable folder is not", func(t *testing.T) string { return runtimeDir(t, 0o777) }, false, "writable by group or others"},
		{"a sticky world-writable folder is not", func(t *testing.T) string { return runtimeDir(t, 0o1777) }, false, "writable by group or others"},
		{"a group-writable folder is not", func(t *testing.T) string { return runtimeDir(t, 0o770) }, false, "writable by group or others"},
		{"a symlink is not", func(t *testing.T) string {
			link := filepath.Join(t.TempDir(), "link")
			require.NoError(t, os.Symlink(runtimeDir(t, 0o700), link))
			return link
		}, false, "is a symlink"},
		{"a file is not", func(t *testing.T) string {
			f := filepath.Join(t.TempDir(), "file")
			require.NoError(t, os.WriteFile(f, nil, 0o600))
			return f
		}, false, "not a folder"},
		{"another user's folder is not", func(t *testing.T) string {
			requireRoot(t)
			d := runtimeDir(t, 0o700)
			require.NoError(t, os.Chown(d, otherUser, otherUser))
			return d
		}, false, "owned by uid 65534"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.dir(t)
			state := t.TempDir()
			t.Setenv("XDG_RUNTIME_DIR", dir)
			t.Setenv("XDG_STATE_HOME", state)
			p, warning, err := connfile.DefaultPath()
			require.NoError(t, err)
			if tc.used {
				assert.Equal(t, filepath.Join(dir, "a2a-bus", "connection.json"), p)
				assert.Empty(t, warning)
				return
			}
			fallback := filepath.Join(state, "a2a-bus", "connection.json")
			assert.Equal(t, fallback, p, "the next candidate")
			assert.Contains(t, warning, dir, "the warning names the folder")
			assert.Contains(t, warning, tc.why)
			assert.Contains(t, warning, fallback, "and says what is used instead")
		})
	}
	t.Run("without XDG_STATE_HOME the fallback is the home folder", func(t *testing.T) {
		t.Setenv("XDG_RUNTIME_DIR", runtimeDir(t, 0o777))
		t.Setenv("XDG_STATE_HOME", "")
		t.Setenv("HOME", "/home/u")
		p, warning, err := connfile.DefaultPath()
		require.NoError(t, err)
		assert.Equal(t, "/home/u/.local/state/a2a-bus/connection.json", p)
		assert.NotEmpty(t, warning)
	})
	t.Run("without any fallback the warning still reaches the caller", func(t *testing.T) {
		t.Setenv("XDG_RUNTIME_DIR", runtimeDir(t, 0o777))
		t.Setenv("XDG_STATE_HOME", "")
		t.Setenv("HOME", "")
		_, warning, err := connfile.DefaultPath()
		require.Error(t, err)
		assert.NotEmpty(t, warning)
	})
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
	_, err = os.Lstat(path + ".lock")
	assert.ErrorIs(t, err, os.ErrNotExist, "no lock file is left behind")

	// The next broker takes the path as the first did.
	c, err = connfile.Lock(path)
	require.NoError(t, err)
	_, err = connfile.Lock(path)
	assert.ErrorIs(t, err, connfile.ErrRunning, "the new lock is held")
	require.NoError(t, c.Release())
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

func TestLockRefusesASymlinkAtTheLockPath(t *testing.T) {
	tests := []struct {
		name   string
		target func(t *testing.T) string // the symlink's target
	}{
		{"to a missing file", func(t *testing.T) string { return filepath.Join(t.TempDir(), "victim") }},
		{"to an existing file", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "victim")
			require.NoError(t, os.WriteFile(p, []byte("precious"), 0o644))
			return p
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "a2a-bus", "connection.json")
			require.NoError(t, os.Mkdir(filepath.Dir(path), 0o700))
			target := tc.target(t)
			before, statErr := os.Stat(target)
			require.NoError(t, os.Symlink(target, path+".lock"))

			c, err := connfile.Lock(path)
			if err == nil {
				c.Release()
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, connfile.ErrUntrusted)
			assert.Contains(t, err.Error(), path+".lock")

			after, err := os.Stat(target)
			if statErr != nil {
				assert.ErrorIs(t, err, os.ErrNotExist, "the target is not created")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, before.Mode(), after.Mode(), "the target is not modified")
			data, err := os.ReadFile(target)
			require.NoError(t, err)
			assert.Equal(t, "precious", string(data))
		})
	}
}

func TestLockRefusesAnOwnFolderThatIsNotOurs(t *testing.T) {
	tests := []struct {
		name string
		make func(t *testing.T, dir string) // makes dir, an a2a-bus folder
		why  string
	}{
		{"another user's folder", func(t *testing.T, dir string) {
			requireRoot(t)
			require.NoError(t, os.Mkdir(dir, 0o755))
			require.NoError(t, os.Chown(dir, otherUser, otherUser))
		}, "owned by uid 65534"},
		{"a symlink to a folder", func(t *testing.T, dir string) {
			require.NoError(t, os.Symlink(t.TempDir(), dir))
		}, "is a symlink"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "a2a-bus")
			tc.make(t, dir)
			before, err := os.Stat(dir)
			require.NoError(t, err)

			c, err := connfile.Lock(filepath.Join(dir, "connection.json"))
			if err == nil {
				c.Release()
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, connfile.ErrUntrusted)
			assert.Contains(t, err.Error(), dir, "the error names the folder")
			assert.Contains(t, err.Error(), tc.why)
			after, err := os.Stat(dir)
			require.NoError(t, err)
			assert.Equal(t, before.Mode(), after.Mode(), "its mode is left alone")
			_, err = os.Lstat(filepath.Join(dir, "connection.json.lock"))
			assert.ErrorIs(t, err, os.ErrNotExist, "nothing is created in it")
		})
	}
}

func TestReadRefusesAFileNotTheUsersOwn(t *testing.T) {
	info := []byte(`{"url":"nats://127.0.0.1:1","token":"ab","pid":1}` + "\n")
	tests := []struct {
		name string
		make func(t *testing.T, path string)
		why  string
	}{
		{"another user's file", func(t *testing.T, path string) {
			requireRoot(t)
			require.NoError(t, os.WriteFile(path, info, 0o600))
			require.NoError(t, os.Chown(path, otherUser, otherUser))
		}, "owned by uid 65534"},
		{"a symlink, even to the user's own file", func(t *testing.T, path string) {
			real := filepath.Join(t.TempDir(), "real.json")
			require.NoError(t, os.WriteFile(real, info, 0o600))
			require.NoError(t, os.Symlink(real, path))
		}, "is a symlink"},
		{"a folder", func(t *testing.T, path string) {
			require.NoError(t, os.Mkdir(path, 0o700))
		}, "not a regular file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "connection.json")
			tc.make(t, path)
			_, err := connfile.Read(path)
			require.Error(t, err)
			assert.ErrorIs(t, err, connfile.ErrUntrusted)
			assert.Contains(t, err.Error(), path, "the error names the file")
			assert.Contains(t, err.Error(), tc.why)
		})
	}
	t.Run("a missing file is os.ErrNotExist", func(t *testing.T) {
		_, err := connfile.Read(filepath.Join(t.TempDir(), "none.json"))
		assert.ErrorIs(t, err, os.ErrNotExist)
	})
}

func TestWriteReplacesASymlinkRatherThanFollowingIt(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a2a-bus")
	path := filepath.Join(dir, "connection.json")
	require.NoError(t, os.Mkdir(dir, 0o700))
	victim := filepath.Join(t.TempDir(), "victim")
	require.NoError(t, os.WriteFile(victim, []byte("precious"), 0o644))
	require.NoError(t, os.Symlink(victim, path))

	c, err := connfile.Lock(path)
	require.NoError(t, err, "a symlink at the file is not a live broker")
	defer c.Release()
	require.NoError(t, c.Write(connfile.Info{URL: "nats://127.0.0.1:1", PID: os.Getpid()}))
	st, err := os.Lstat(path)
	require.NoError(t, err)
	assert.True(t, st.Mode().IsRegular(), "the link is replaced by the file")
	data, err := os.ReadFile(victim)
	require.NoError(t, err)
	assert.Equal(t, "precious", string(data))
}
