package main_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/internal/testbin"
)

// TestServeUI: serve --ui writes the live view's address and token into
// the connection file, logs the address to open with the token in its
// fragment, serves the page without the token and the data with it, and
// status shows the address.
func TestServeUI(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.json")
	cmd := exec.Command(testbin.A2ABus(t), "serve", "--ui", "--data-dir=", "--connection-file", path)
	cmd.Env = testEnv(t)
	errPipe, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGKILL)
		<-waited
	})
	stderr := bufio.NewReader(errPipe)
	first, err := stderr.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, path, strings.TrimSpace(first))
	var logged string
	for !strings.Contains(logged, "live view") {
		line, err := stderr.ReadString('\n')
		require.NoError(t, err, "the live view's line; so far: %s", logged)
		logged += line
	}
	go io.Copy(io.Discard, stderr)

	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var conn struct {
		UIURL   string `json:"uiUrl"`
		UIToken string `json:"uiToken"`
	}
	require.NoError(t, json.Unmarshal(data, &conn))
	assert.Regexp(t, `^http://127\.0\.0\.1:\d+/$`, conn.UIURL)
	assert.Regexp(t, `^[0-9a-f]{64}$`, conn.UIToken)
	assert.Contains(t, logged, conn.UIURL+"#token="+conn.UIToken, "the address to open carries the token in its fragment")
	assert.Equal(t, 1, strings.Count(logged, conn.UIToken), "once, in the fragment: %s", logged)

	hc := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	res, err := hc.Get(conn.UIURL)
	require.NoError(t, err)
	page, err := io.ReadAll(res.Body)
	res.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, res.StatusCode)
	assert.Contains(t, string(page), "a2a-bus live view")

	res, err = hc.Get(conn.UIURL + "api/snapshot")
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, res.StatusCode, "the data wants the token")
	req, err := http.NewRequest(http.MethodGet, conn.UIURL+"api/snapshot", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+conn.UIToken)
	res, err = hc.Do(req)
	require.NoError(t, err)
	var snap struct {
		Info struct{ Bus string } `json:"info"`
	}
	require.NoError(t, json.NewDecoder(res.Body).Decode(&snap))
	res.Body.Close()
	assert.Equal(t, http.StatusOK, res.StatusCode)
	assert.Equal(t, "nats", snap.Info.Bus)

	status := exec.Command(testbin.A2ABus(t), "status", "--connection-file", path)
	status.Env = testEnv(t)
	out, err := status.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "live view "+conn.UIURL)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-waited:
		waited <- err
		require.NoError(t, err, "a clean exit")
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not exit")
	}
	_, err = hc.Get(conn.UIURL)
	assert.Error(t, err, "the live view stopped with serve")
}
