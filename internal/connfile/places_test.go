package connfile

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPlacesByPlatform checks every platform's defaults, here: the rules
// are plain code over the platform's name and folders.
func TestPlacesByPlatform(t *testing.T) {
	folders := func(goos string, env map[string]string) places {
		return places{
			goos:      goos,
			getenv:    func(k string) string { return env[k] },
			home:      func() (string, error) { return "/home/u", nil },
			configDir: func() (string, error) { return "/Users/u/Library/Application Support", nil },
			cacheDir:  func() (string, error) { return `C:\Users\u\AppData\Local`, nil },
		}
	}
	run := t.TempDir() // a private runtime folder: 0700, the user's
	tests := []struct {
		name, goos      string
		env             map[string]string
		state, connFile string
	}{
		{"linux", "linux", nil, "/home/u/.local/state/a2a-bus", "/home/u/.local/state/a2a-bus/connection.json"},
		{"linux with XDG", "linux", map[string]string{"XDG_STATE_HOME": "/st", "XDG_RUNTIME_DIR": run}, "/st/a2a-bus", filepath.Join(run, "a2a-bus", "connection.json")},
		{"freebsd", "freebsd", nil, "/home/u/.local/state/a2a-bus", "/home/u/.local/state/a2a-bus/connection.json"},
		{"macos", "darwin", nil, "/Users/u/Library/Application Support/a2a-bus", "/Users/u/Library/Application Support/a2a-bus/connection.json"},
		{"macos with XDG_STATE_HOME", "darwin", map[string]string{"XDG_STATE_HOME": "/st"}, "/st/a2a-bus", "/st/a2a-bus/connection.json"},
		{"windows", "windows", nil, filepath.Join(`C:\Users\u\AppData\Local`, "a2a-bus"), filepath.Join(`C:\Users\u\AppData\Local`, "a2a-bus", "connection.json")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := folders(tc.goos, tc.env)
			state, err := p.stateDir()
			require.NoError(t, err)
			assert.Equal(t, tc.state, state)
			conn, warning, err := p.connectionFile()
			require.NoError(t, err)
			assert.Empty(t, warning)
			assert.Equal(t, tc.connFile, conn)
		})
	}
	t.Run("no folder at all", func(t *testing.T) {
		p := folders("linux", nil)
		p.home = func() (string, error) { return "", errors.New("no home") }
		_, err := p.stateDir()
		assert.ErrorIs(t, err, ErrNoPlace)
		_, _, err = p.connectionFile()
		assert.ErrorIs(t, err, ErrNoPlace)
	})
}
