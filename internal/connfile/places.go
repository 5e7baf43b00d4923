package connfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
)

// Places are where a2a-bus keeps its files, by platform. The XDG
// variables win where they are set, on every platform:
//
//	                 state folder (data dir)               connection file
//	Linux, Unix      $XDG_STATE_HOME/a2a-bus,              $XDG_RUNTIME_DIR/a2a-bus/connection.json,
//	                 else ~/.local/state/a2a-bus           else <state folder>/connection.json
//	macOS            ~/Library/Application Support/a2a-bus <state folder>/connection.json
//	Windows          %LocalAppData%\a2a-bus                <state folder>\connection.json
//
// The state folder is the user's alone: 0700 on Unix and macOS, an ACL
// granting only the user on Windows (Lock makes it so).
type places struct {
	goos      string
	getenv    func(string) string
	home      func() (string, error) // os.UserHomeDir
	configDir func() (string, error) // os.UserConfigDir
	cacheDir  func() (string, error) // os.UserCacheDir
}

// platform returns this process's places.
func platform() places {
	return places{goos: runtime.GOOS, getenv: os.Getenv, home: os.UserHomeDir, configDir: os.UserConfigDir, cacheDir: os.UserCacheDir}
}

// ErrNoPlace is returned when the platform offers no folder for the
// state (no home, no XDG variable).
var ErrNoPlace = errors.New("no folder for a2a-bus's files: set XDG_STATE_HOME, or give the path")

// stateDir is the state folder: the data dir by default, and where the
// connection file goes when there is no runtime folder.
func (p places) stateDir() (string, error) {
	if d := p.getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, ownFolderName), nil
	}
	var base string
	var err error
	switch p.goos {
	case "darwin", "ios":
		base, err = p.configDir() // ~/Library/Application Support
	case "windows":
		base, err = p.cacheDir() // %LocalAppData%
	default:
		base, err = p.home()
		if err == nil && base != "" {
			base = filepath.Join(base, ".local", "state")
		}
	}
	if err != nil || base == "" {
		return "", fmt.Errorf("%w (%v)", ErrNoPlace, err)
	}
	return filepath.Join(base, ownFolderName), nil
}

// connectionFile is DefaultPath on these places.
func (p places) connectionFile() (path, warning string, err error) {
	if d := p.getenv("XDG_RUNTIME_DIR"); d != "" {
		why := runtimeDirReason(d)
		if why == "" {
			return filepath.Join(d, ownFolderName, "connection.json"), "", nil
		}
		state, err := p.stateDir()
		instead := "using " + filepath.Join(state, "connection.json") + " instead"
		if err != nil {
			return "", fmt.Sprintf("XDG_RUNTIME_DIR %s is not used for the connection file: %s; and there is no other folder", d, why), err
		}
		return filepath.Join(state, "connection.json"), fmt.Sprintf("XDG_RUNTIME_DIR %s is not used for the connection file: %s; %s", d, why, instead), nil
	}
	state, err := p.stateDir()
	if err != nil {
		return "", "", err
	}
	return filepath.Join(state, "connection.json"), "", nil
}
