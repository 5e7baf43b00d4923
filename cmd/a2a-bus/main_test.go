package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "a2a.json")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

func TestUsage(t *testing.T) {
	code, _, stderr := runCLI(t)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "serve")
	code, stdout, _ := runCLI(t, "help")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, stdout, "Usage: a2a-bus <command>")
	code, _, stderr = runCLI(t, "frobnicate")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, `unknown command "frobnicate"`)
}

func TestServeHelp(t *testing.T) {
	// --help prints where flag errors go; "help serve" asks for it on stdout.
	code, _, stderr := runCLI(t, "serve", "--help")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, stderr, "Examples:")
	assert.Contains(t, stderr, "-max-tasks-per-context")
	code, stdout, _ := runCLI(t, "help", "serve")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, stdout, "Examples:")
	assert.Contains(t, stdout, "-max-tasks-per-context")
}

func TestServeRefusesBadSettings(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"--frob"}, "frob"},
		{"unknown bus", []string{"--bus=carrier-pigeon"}, `--bus: "carrier-pigeon"`},
		{"zero cap", []string{"--max-tasks-per-context=0"}, "--max-tasks-per-context"},
		{"NATS flag on the pipe", []string{"--bus=pipe", "--listen=127.0.0.1:0"}, "--listen is for the NATS bus"},
		{"live view on the pipe", []string{"--bus=pipe", "--ui"}, "--ui is for the NATS bus"},
		{"live view off loopback", []string{"--ui", "--ui-listen=0.0.0.0:0"}, `--ui-listen: natsbus: listen address is not loopback (allow it explicitly): "0.0.0.0:0"`},
		{"live view address without the view", []string{"--ui-listen=127.0.0.1:8080"}, "--ui-listen: needs --ui"},
		{"bad level", []string{"--bus=pipe", "--log-level=loud"}, "--log-level"},
		{"config: unknown key", []string{"--config", writeConfig(t, `{"bus":"pipe","max-taks-per-context":3}`)}, `unknown key "max-taks-per-context"`},
		{"config: bad value", []string{"--config", writeConfig(t, `{"max-tasks-per-context":"many"}`)}, `key "max-tasks-per-context": bad value "many"`},
		{"config: wrong type", []string{"--config", writeConfig(t, `{"bus":["pipe"]}`)}, `key "bus"`},
		{"config: not an object", []string{"--config", writeConfig(t, `[1]`)}, "not a JSON object"},
		{"config: trailing data", []string{"--config", writeConfig(t, `{} {}`)}, "trailing data"},
		{"config: missing file", []string{"--config", filepath.Join(t.TempDir(), "nope.json")}, "nope.json"},
		{"config: config key", []string{"--config", writeConfig(t, `{"config":"x"}`)}, `unknown key "config"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runCLI(t, append([]string{"serve"}, tc.args...)...)
			assert.Equal(t, exitUsage, code)
			assert.Contains(t, stderr, tc.want)
			assert.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
		})
	}
}

func TestConfigFileAndFlagsWin(t *testing.T) {
	var o serveOptions
	fs := serveFlags(&o, &bytes.Buffer{})
	cfg := writeConfig(t, `{"bus":"pipe","max-tasks-per-context":64,"replay-window":5,"orphan-timeout":"1m"}`)
	require.NoError(t, parseFlags(fs, []string{"--config", cfg, "--replay-window=7"}, &o.config))
	assert.Equal(t, "pipe", o.bus)
	assert.Equal(t, 64, o.maxTasksPerContext)
	assert.Equal(t, 7, o.replayWindow, "the flag wins over the file")
	assert.Equal(t, "1m0s", o.orphanTimeout.String())
}

func TestExitCodes(t *testing.T) {
	noBroker := filepath.Join(t.TempDir(), "none.json")
	tests := []struct {
		args []string
		code int
	}{
		{[]string{"status", "--frob"}, exitUsage},
		{[]string{"watch", "--count", "-1"}, exitUsage},
		{[]string{"status", "--token", "abc"}, exitUsage},
		{[]string{"status", "--connection-file", noBroker}, exitFailure},
		{[]string{"watch", "--connection-file", noBroker}, exitFailure},
		{[]string{"version", "extra"}, exitUsage},
		{[]string{"demo", "--ui", "--bus", "pipe"}, exitUsage},
		{[]string{"demo", "--ui", "--hold"}, exitUsage},
		{[]string{"version"}, exitOK},
		{[]string{"help", "status"}, exitOK},
		{[]string{"serve", "--listen", "10.0.0.1:4222", "--print-config"}, exitUsage},
		{[]string{"serve", "--ui", "--ui-listen", "0.0.0.0:0", "--allow-remote", "--print-config"}, exitOK},
		{[]string{"serve", "--ui", "--allow-remote", "--nats-url", "nats://127.0.0.1:4222", "--print-config"}, exitOK},
		{[]string{"serve", "--log-level", "loud", "--print-config"}, exitUsage},
		{[]string{"serve", "--config", writeConfig(t, `{"print-config": true}`)}, exitUsage},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, _, stderr := runCLI(t, tc.args...)
			assert.Equal(t, tc.code, code, stderr)
			if tc.code != exitOK {
				assert.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
			}
		})
	}
	t.Run("help goes to stdout when asked for", func(t *testing.T) {
		_, stdout, stderr := runCLI(t, "help", "serve")
		assert.Contains(t, stdout, "Usage: a2a-bus serve")
		assert.Empty(t, stderr)
	})
}

func TestEnvironmentForNATSDoesNotStopThePipe(t *testing.T) {
	t.Setenv("A2A_BUS_CONNECTION_FILE", filepath.Join(t.TempDir(), "c.json"))
	t.Setenv("A2A_BUS_LISTEN", "127.0.0.1:0")
	code, stdout, stderr := runCLI(t, "serve", "--bus=pipe", "--print-config")
	assert.Equal(t, exitOK, code, stderr)
	assert.Contains(t, stdout, `"connection-file": ""`, "ignored on the pipe")
	code, _, stderr = runCLI(t, "serve", "--bus=pipe", "--listen=127.0.0.1:0", "--print-config")
	assert.Equal(t, exitUsage, code, "a flag given on the pipe is still refused")
	assert.Contains(t, stderr, "--listen is for the NATS bus")
}

func TestNoHomeMeansNoSilentMemoryStore(t *testing.T) {
	t.Setenv("XDG_STATE_HOME", "")
	t.Setenv("HOME", "")
	code, _, stderr := runCLI(t, "serve", "--bus=pipe")
	assert.Equal(t, exitFailure, code)
	assert.Contains(t, stderr, "no default data dir")
}

// unsafeRuntimeDir points XDG_RUNTIME_DIR at a world-writable folder and
// XDG_STATE_HOME at a private one; it returns the connection file's path
// in the latter, which is used instead.
func unsafeRuntimeDir(t *testing.T) string {
	t.Helper()
	rt := filepath.Join(t.TempDir(), "run")
	require.NoError(t, os.Mkdir(rt, 0o700))
	require.NoError(t, os.Chmod(rt, 0o777)) // past the umask
	state := t.TempDir()
	t.Setenv("XDG_RUNTIME_DIR", rt)
	t.Setenv("XDG_STATE_HOME", state)
	return filepath.Join(state, "a2a-bus", "connection.json")
}

func TestHostCommandsWarnOfAnUnsafeRuntimeDir(t *testing.T) {
	for _, cmd := range []string{"status", "watch"} {
		t.Run(cmd, func(t *testing.T) {
			fallback := unsafeRuntimeDir(t)
			code, _, stderr := runCLI(t, cmd)
			assert.Equal(t, exitFailure, code, "no broker runs")
			warning, failure, _ := strings.Cut(stderr, "\n")
			assert.Contains(t, warning, "a2a-bus "+cmd+": warning: XDG_RUNTIME_DIR ")
			assert.Contains(t, warning, "writable by group or others")
			assert.Contains(t, failure, fallback, "the fallback is looked for")
		})
	}
}

func TestServeWarnsOfAnUnsafeRuntimeDir(t *testing.T) {
	fallback := unsafeRuntimeDir(t)
	stderr := serveInProcess(t, "--data-dir=")
	first, err := stderr.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, fallback+"\n", first, "the first line is the fallback path")
	// The held log lines come next, up to the one saying it serves.
	var logged []string
	for !strings.Contains(strings.Join(logged, ""), "serving on NATS") {
		line, err := stderr.ReadString('\n')
		require.NoError(t, err)
		logged = append(logged, line)
	}
	assert.Contains(t, strings.Join(logged, ""), "level=WARN", "the warning is logged: %q", logged)
	assert.Contains(t, strings.Join(logged, ""), "writable by group or others")
}
