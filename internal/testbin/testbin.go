// Package testbin builds the project's commands for tests that run them as
// real child processes, once per test binary.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

var (
	mu    sync.Mutex
	built = map[string]string{}
	dir   string
)

// Build returns the path of the named package's binary (an import path such
// as "github.com/a2a-bus/a2a-bus/cmd/a2a-bus"), built on first use with the
// go command that runs the tests. The binaries are removed by Cleanup.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if p, ok := built[pkg]; ok {
		return p
	}
	if dir == "" {
		d, err := os.MkdirTemp("", "a2a-bus-testbin-")
		if err != nil {
			t.Fatalf("testbin: %v", err)
		}
		dir = d
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	cmd := exec.Command(goBin, "build", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("testbin: go build %s: %v\n%s", pkg, err, msg)
	}
	built[pkg] = out
	return out
}

// A2ABus is Build for the a2a-bus command.
func A2ABus(t testing.TB) string {
	return Build(t, "github.com/a2a-bus/a2a-bus/cmd/a2a-bus")
}

// Cleanup removes the built binaries; call it from TestMain after m.Run.
func Cleanup() {
	mu.Lock()
	defer mu.Unlock()
	if dir != "" {
		if err := os.RemoveAll(dir); err != nil {
			fmt.Fprintln(os.Stderr, "testbin:", err)
		}
	}
	dir = ""
	built = map[string]string{}
}
