// Package connfile writes and reads the broker's connection file: how a
// host in any language finds the running broker, and how a second broker
// knows one is running.
package connfile

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Info is the file's content.
type Info struct {
	URL   string `json:"url"`
	Token string `json:"token,omitempty"`
	PID   int    `json:"pid"`
}

// ErrRunning is returned by Claim when a live broker holds the file.
var ErrRunning = errors.New("a broker is already running")

// DefaultPath is $XDG_RUNTIME_DIR/a2a-bus/connection.json, else
// $XDG_STATE_HOME/a2a-bus/connection.json, else
// ~/.local/state/a2a-bus/connection.json.
//
// An XDG_RUNTIME_DIR that another user owns or may write in (or that is a
// symlink or no folder) is passed over for the next candidate, and
// warning says so, for the caller to log: a warning, not an error,
// because the next candidate is as good. warning is "" otherwise, and
// may be set when err is too.
func DefaultPath() (path, warning string, err error) {
	d := os.Getenv("XDG_RUNTIME_DIR")
	if d == "" {
		path, err = statePath()
		return path, "", err
	}
	why := runtimeDirReason(d)
	if why == "" {
		return inFolder(d), "", nil
	}
	path, err = statePath()
	instead := "using " + path + " instead"
	if err != nil {
		instead = "and there is no other folder"
	}
	return path, fmt.Sprintf("XDG_RUNTIME_DIR %s is not used for the connection file: %s; %s", d, why, instead), err
}

// statePath is DefaultPath without a runtime folder.
func statePath() (string, error) {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return inFolder(d), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("connection file: no usable XDG_RUNTIME_DIR, no XDG_STATE_HOME and no home directory: %w", err)
	}
	return inFolder(filepath.Join(home, ".local", "state")), nil
}

// inFolder is the connection file's path in the project's own folder
// under base.
func inFolder(base string) string { return filepath.Join(base, ownFolderName, "connection.json") }

// ownFolderName names the project's own folder: Lock makes it private.
const ownFolderName = "a2a-bus"

// Claim is a connection file this broker holds.
type Claim struct {
	path string
	lock *os.File
	once sync.Once
}

// Lock takes path for this broker before it starts: it refuses when a
// live broker holds it (its lock is taken, or the broker it names runs
// and accepts connections) and will replace a stale one. The folder is
// created with mode 0700.
//
// Nothing another user could have planted is used: the project's own
// folder must be the user's (it is then made 0700), and the lock file
// must be the user's and no symlink. Either is ErrUntrusted.
func Lock(path string) (*Claim, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("connection file: %w", err)
	}
	// The project's own folder is 0700 even if it existed before; a
	// folder the user named is theirs to set.
	if filepath.Base(dir) == ownFolderName {
		if err := ownFolder(dir); err != nil {
			return nil, err
		}
	}
	lock, err := openLock(path + ".lock")
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, running(path)
	}
	if old, err := Read(path); err == nil && Live(old) {
		lock.Close()
		return nil, running(path)
	}
	return &Claim{path: path, lock: lock}, nil
}

// openLock opens (or creates) the lock file. A symlink there is refused,
// not followed: following it would create or open a file of the
// symlink's choosing.
func openLock(path string) (*os.File, error) {
	lock, _, err := openNoFollow(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil && !errors.Is(err, ErrUntrusted) {
		return nil, fmt.Errorf("connection file: %w", err)
	}
	return lock, err
}

// Path returns the file's path.
func (c *Claim) Path() string { return c.path }

// Write writes info, mode 0600, replacing the file atomically.
func (c *Claim) Write(info Info) error { return write(c.path, info) }

// Release removes the file and lets the lock go; call it on clean
// shutdown. The lock file stays: removing it while locked would let a
// second broker lock a new file beside a first one still running.
// Idempotent.
func (c *Claim) Release() error {
	var err error
	c.once.Do(func() {
		err = os.Remove(c.path)
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		c.lock.Close()
	})
	return err
}

func running(path string) error {
	if old, err := Read(path); err == nil {
		return fmt.Errorf("%w (pid %d, %s); its connection file is %s", ErrRunning, old.PID, old.URL, path)
	}
	return fmt.Errorf("%w; its connection file is %s", ErrRunning, path)
}

// write replaces path atomically with a file of mode 0600. A symlink at
// path is replaced, not followed: the file is made under a fresh name
// (O_EXCL) and renamed over path.
func write(path string, info Info) error {
	data, err := json.Marshal(info)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".connection-*.json")
	if err != nil {
		return fmt.Errorf("connection file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("connection file: %w", err)
	}
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("connection file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("connection file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("connection file: %w", err)
	}
	return nil
}

// Read reads a connection file. Its token is trusted with everything, so
// a file another user could have planted is ErrUntrusted, naming it: a
// symlink (even to the user's own file), another user's file, or no
// regular file. A missing file is fs.ErrNotExist.
func Read(path string) (Info, error) {
	f, fi, err := openNoFollow(path, os.O_RDONLY, 0)
	if err != nil {
		return Info{}, err
	}
	defer f.Close()
	if !fi.Mode().IsRegular() {
		return Info{}, untrusted(path, "it is not a regular file")
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return Info{}, fmt.Errorf("connection file %s: %w", path, err)
	}
	var info Info
	if err := json.Unmarshal(data, &info); err != nil {
		return Info{}, fmt.Errorf("connection file %s: %w", path, err)
	}
	return info, nil
}

// Live reports whether the broker info names runs (its pid exists) and
// its URL accepts connections.
func Live(info Info) bool {
	if info.PID <= 0 {
		return false
	}
	if err := syscall.Kill(info.PID, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	first, _, _ := strings.Cut(info.URL, ",")
	u, err := url.Parse(first)
	if err != nil || u.Host == "" {
		return false
	}
	conn, err := net.DialTimeout("tcp", u.Host, time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}
