// Package connfile writes and reads the broker's connection file: how a
// host in any language finds the running broker, and how a second broker
// knows one is running.
package connfile

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/gofrs/flock"
)

// Info is the file's content.
type Info struct {
	URL   string `json:"url"`
	Token string `json:"token,omitempty"`
	PID   int    `json:"pid"`
	// A2AURL and A2AToken are the A2A gateway's base URL and bearer token
	// (serve --a2a-listen); absent when it is off.
	A2AURL   string `json:"a2aUrl,omitempty"`
	A2AToken string `json:"a2aToken,omitempty"`
	// WSURL is the WebSocket listener for web pages (serve --ws-listen);
	// absent when it is off.
	WSURL string `json:"wsUrl,omitempty"`
	// UIURL and UIToken are the live view's address and bearer token
	// (serve --ui); absent when it is off.
	UIURL   string `json:"uiUrl,omitempty"`
	UIToken string `json:"uiToken,omitempty"`
	// Broker is, in a cluster (serve --state=jetstream), the broker's
	// name, which its host's clients name in every request
	// (natsbus.ClientConfig.Broker).
	Broker string `json:"broker,omitempty"`
}

// ErrRunning is returned by Claim when a live broker holds the file.
var ErrRunning = errors.New("a broker is already running")

// DefaultPath is where the connection file is by default, on this
// platform (see Places): in $XDG_RUNTIME_DIR/a2a-bus when that is set and
// trusted, else in the state folder (DefaultDataDir).
//
// An XDG_RUNTIME_DIR that another user owns or may write in (or that is a
// symlink or no folder) is passed over for the next candidate, and
// warning says so, for the caller to log: a warning, not an error,
// because the next candidate is as good. warning is "" otherwise, and
// may be set when err is too.
func DefaultPath() (path, warning string, err error) { return platform().connectionFile() }

// DefaultDataDir is the broker's data dir by default, on this platform
// (see Places).
func DefaultDataDir() (string, error) { return platform().stateDir() }

// ownFolderName names the project's own folder: Lock makes it private.
const ownFolderName = "a2a-bus"

// Claim is a connection file this broker holds.
type Claim struct {
	path string
	lock *flock.Flock
	once sync.Once
}

// lockTries bounds how often Lock takes the lock file again because the
// file it locked was removed or replaced meanwhile (a broker releasing
// it as this one took it): past it, another broker is taken to hold it.
const lockTries = 8

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
	// The project's own folder is private even if it existed before; a
	// folder the user named is theirs to set.
	if filepath.Base(dir) == ownFolderName {
		if err := ownFolder(dir); err != nil {
			return nil, err
		}
	}
	lock, err := takeLock(path + ".lock")
	if err != nil {
		return nil, err
	}
	if lock == nil {
		return nil, running(path)
	}
	if old, err := Read(path); err == nil && Live(old) {
		lock.Close()
		return nil, running(path)
	}
	return &Claim{path: path, lock: lock}, nil
}

// takeLock takes the lock file, without waiting: nil when another process
// holds it. The file is opened without following a symlink (following it
// would create or open a file of the symlink's choosing), and must be the
// user's own. gofrs/flock is flock(2) on Unix and LockFileEx on Windows.
//
// Release removes the lock file, so a file locked here may have been
// removed (or replaced by another broker's) between its opening and its
// locking: a lock on it holds nothing. The lock counts only when the path
// still names the file locked; else it is taken again.
func takeLock(path string) (*flock.Flock, error) {
	for range lockTries {
		lock, err := lockOnce(path)
		if lock == nil || err != nil {
			return nil, err
		}
		fi, ferr := lock.Stat()
		pfi, perr := os.Lstat(path)
		if ferr == nil && perr == nil && os.SameFile(fi, pfi) {
			return lock, nil
		}
		lock.Close()
	}
	return nil, nil
}

// lockOnce is takeLockOnce; a test makes a file go between its locking
// and its check.
var lockOnce = takeLockOnce

// takeLockOnce is one attempt of takeLock's, not checking that the file
// locked is still the one at path.
func takeLockOnce(path string) (*flock.Flock, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		return nil, untrusted(path, "it is a symlink")
	}
	lock := flock.New(path, flock.SetFlag(os.O_RDWR|os.O_CREATE|oNoFollow), flock.SetPermissions(0o600))
	locked, err := lock.TryLock()
	if err != nil {
		if fi, lerr := os.Lstat(path); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return nil, untrusted(path, "it is a symlink")
		}
		return nil, fmt.Errorf("connection file: %w", err)
	}
	if !locked {
		return nil, nil
	}
	fi, err := lock.Stat()
	if err == nil {
		if why := notOwnedReason(path, fi); why != "" {
			err = untrusted(path, why)
		}
	}
	if err != nil {
		lock.Close()
		return nil, err
	}
	return lock, nil
}

// Path returns the file's path.
func (c *Claim) Path() string { return c.path }

// Write writes info, mode 0600, replacing the file atomically.
func (c *Claim) Write(info Info) error { return write(c.path, info) }

// Release removes the file and the lock file, and lets the lock go;
// call it on clean shutdown. The lock file is removed while it is still
// locked where the platform allows it (Unix), else (Windows, which does
// not remove an open file) once it is closed, unless another broker has
// opened it by then: that one keeps it. A broker that locked the removed
// file meanwhile finds it no longer at the path, and takes the lock
// again (takeLock). Idempotent.
func (c *Claim) Release() error {
	var err error
	c.once.Do(func() {
		err = os.Remove(c.path)
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		lockPath := c.path + ".lock"
		removed := os.Remove(lockPath) == nil
		c.lock.Close()
		if !removed {
			os.Remove(lockPath) // best effort: a lock file left is harmless
		}
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
	if !processAlive(info.PID) {
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
