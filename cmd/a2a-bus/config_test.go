package main

import (
	"bufio"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/gateway"
)

// binWarning is serve's warning for A2A_BUS_BIN, a variable a desktop host
// sets for itself.
const binWarning = "a2a-bus serve: warning: environment variable A2A_BUS_BIN names no setting; ignored\n"

func TestUnknownEnvironmentVariableIsAWarning(t *testing.T) {
	t.Setenv("A2A_BUS_BIN", "/usr/bin/a2a-bus")
	code, stdout, stderr := runCLI(t, "serve", "--bus=pipe", "--print-config")
	assert.Equal(t, exitOK, code, stderr)
	assert.Contains(t, stdout, `"bus": "pipe"`, "the settings are printed")
	assert.Equal(t, binWarning, stderr, "one warning line")
}

func TestUnknownEnvironmentVariableDoesNotHideErrors(t *testing.T) {
	tests := []struct {
		name   string
		env    map[string]string
		args   []string
		want   string
		warned bool // the environment was read before the error
	}{
		{"config: unknown key", nil, []string{"--config", writeConfig(t, `{"bus":"pipe","max-taks-per-context":3}`)}, `unknown key "max-taks-per-context"`, true},
		{"environment: bad value", map[string]string{"A2A_BUS_REPLAY_WINDOW": "lots"}, []string{"--print-config"}, `A2A_BUS_REPLAY_WINDOW: bad value "lots"`, true},
		{"unknown flag", nil, []string{"--frob"}, "frob", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("A2A_BUS_BIN", "/usr/bin/a2a-bus")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			code, _, stderr := runCLI(t, append([]string{"serve"}, tc.args...)...)
			assert.Equal(t, exitUsage, code, stderr)
			first, rest, _ := strings.Cut(stderr, "\n")
			// The error is the first line, where a host reading serve's
			// first line looks for the path or the failure.
			assert.Contains(t, first, tc.want)
			if tc.warned {
				assert.Equal(t, binWarning, rest)
			} else {
				assert.Empty(t, rest)
			}
		})
	}
}

// TestUnknownEnvironmentVariableWarnsAfterThePathLine serves on NATS in
// process: the first line on stderr is the connection file's path even
// when a warning is due, and the warning follows it.
func TestUnknownEnvironmentVariableWarnsAfterThePathLine(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", t.TempDir())
	t.Setenv("XDG_STATE_HOME", t.TempDir())
	t.Setenv("A2A_BUS_BIN", "/usr/bin/a2a-bus")
	stderr := serveInProcess(t, "--data-dir=")
	first, err := stderr.ReadString('\n')
	require.NoError(t, err)
	assert.True(t, filepath.IsAbs(strings.TrimSpace(first)), "the first line is the path alone: %q", first)
	second, err := stderr.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, binWarning, second)
}

// serveInProcess runs `a2a-bus serve args...` in this process until the
// test ends, and returns its stderr. The test then stops it, drains its
// stderr, and checks it exits 0.
func serveInProcess(t *testing.T, args ...string) *bufio.Reader {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r, w := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"serve"}, args...), strings.NewReader(""), io.Discard, w)
		w.Close()
	}()
	stderr := bufio.NewReader(r)
	t.Cleanup(func() {
		drained := make(chan struct{})
		go func() { io.Copy(io.Discard, stderr); close(drained) }()
		cancel()
		assert.Equal(t, exitOK, <-done, "the broker started and stopped cleanly")
		<-drained
	})
	return stderr
}

// TestAbandonAfterFlag: --a2a-abandon-after 0 means never, which the
// gateway's config says with NeverAbandon, not with a sign.
func TestAbandonAfterFlag(t *testing.T) {
	for flag, want := range map[time.Duration]gateway.Config{
		0:               {Token: "t", NeverAbandon: true},
		5 * time.Minute: {Token: "t", AbandonAfter: 5 * time.Minute},
	} {
		cfg := gateway.Config{Token: "t"}
		abandonAfter(&cfg, flag)
		assert.Equal(t, want, cfg, "flag %v", flag)
		assert.NoError(t, cfg.Validate())
	}
}
