// Package connfile writes and reads the broker's connection file: how a
// host in any language finds the running broker, and how a second broker
// knows one is running.
package connfile

import (
	"encoding/json"
	"errors"
	"fmt"
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
func DefaultPath() (string, error) {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "a2a-bus", "connection.json"), nil
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "a2a-bus", "connection.json"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("connection file: no XDG_RUNTIME_DIR, XDG_STATE_HOME or home directory: %w", err)
	}
	return filepath.Join(home, ".local", "state", "a2a-bus", "connection.json"), nil
}

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
func Lock(path string) (*Claim, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("connection file: %w", err)
	}
	// The project's own folder is 0700 even if it existed before; a
	// folder the user named is theirs to set.
	if filepath.Base(dir) == "a2a-bus" {
		if err := os.Chmod(dir, 0o700); err != nil {
			return nil, fmt.Errorf("connection file: %w", err)
		}
	}
	lock, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("connection file: %w", err)
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

// write replaces path atomically with a file of mode 0600.
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

// Read reads a connection file.
func Read(path string) (Info, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Info{}, err
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
