package main

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"
	"go.uber.org/goleak"

	"github.com/a2a-bus/a2a-bus/internal/testbin"
)

// TestMain lets the test binary be the a2a-bus command in the scripts of
// testdata/script, as the Go command's own tests do, and checks for
// leaked goroutines after the tests.
func TestMain(m *testing.M) {
	testscript.Main(leakChecked{m}, map[string]func(){"a2a-bus": main})
}

type leakChecked struct{ m *testing.M }

func (l leakChecked) Run() int {
	// The tests set the A2A_BUS_* variables they mean. Those of whoever
	// runs them (a developer's settings) would be settings, or warnings,
	// of every serve started here. (Here, not in TestMain: testscript
	// runs a script's commands through TestMain too, with the script's
	// variables.)
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, envPrefix) {
			os.Unsetenv(k)
		}
	}
	code := l.m.Run()
	testbin.Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}

// TestScripts drives the command as a user would: testdata/script/*.txtar.
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir: "testdata/script",
		Setup: func(env *testscript.Env) error {
			// Keep every file the command writes in the script's folder.
			env.Setenv("XDG_RUNTIME_DIR", env.WorkDir+"/run")
			env.Setenv("XDG_STATE_HOME", env.WorkDir+"/state")
			env.Setenv("HOME", env.WorkDir+"/home")
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			// poll PATTERN CMD ARGS...: run the command until its stdout
			// matches PATTERN (up to 20 s); its last stdout stays for
			// the stdout checks that follow.
			"poll": func(ts *testscript.TestScript, neg bool, args []string) {
				if len(args) < 2 {
					ts.Fatalf("usage: poll PATTERN CMD ARGS...")
				}
				re := regexp.MustCompile(args[0])
				for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
					err := ts.Exec(args[1], args[2:]...)
					if err == nil && re.MatchString(ts.ReadFile("stdout")) {
						return
					}
				}
				ts.Fatalf("no output of %s matched %q; last:\n%s", strings.Join(args[1:], " "), args[0], ts.ReadFile("stdout"))
			},
		},
	})
}
