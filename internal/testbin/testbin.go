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
	return build(t, "", pkg)
}

// build builds pkg in module (a directory; "" is the test's own module).
func build(t testing.TB, module, pkg string) string {
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
	args := []string{"build", "-o", out, pkg}
	if module != "" {
		args = append([]string{"-C", module}, args...)
	}
	cmd := exec.Command(goCommand, args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("testbin: go build %s: %v\n%s", pkg, err, msg)
	}
	built[pkg] = out
	return out
}

// Tool is Build for a command of the tools module (tools/go.mod), such
// as "github.com/nats-io/natscli/nats".
func Tool(t testing.TB, pkg string) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("testbin: cannot locate the tools module")
	}
	return build(t, filepath.Join(filepath.Dir(file), "..", "..", "tools"), pkg)
}

// goCommand is the go command that runs the tests: go test puts its
// GOROOT/bin first on the tests' PATH.
const goCommand = "go"

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

// Exit is Cleanup, then os.Exit(code): a TestMain's cleanup for
// goleak.VerifyTestMain, whose Cleanup option replaces its own os.Exit
// (a cleanup that does not exit would drop the leak check's failure).
func Exit(code int) {
	Cleanup()
	os.Exit(code)
}
