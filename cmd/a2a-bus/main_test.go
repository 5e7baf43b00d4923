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
	for _, args := range [][]string{{"serve", "--help"}, {"help", "serve"}} {
		code, _, stderr := runCLI(t, args...)
		assert.Equal(t, exitOK, code)
		assert.Contains(t, stderr, "Examples:")
		assert.Contains(t, stderr, "-max-tasks-per-context")
	}
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
