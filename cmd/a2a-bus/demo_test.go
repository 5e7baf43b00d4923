package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/internal/connfile"
	"github.com/a2a-bus/a2a-bus/liveview"
	"github.com/a2a-bus/a2a-bus/natsbus"
)

// lockedBuffer is a buffer written and read from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestDemoUI: demo --ui prints the live view's address, starts the
// round trip once a page follows it, and the page sees the task's moves.
// Ctrl-C ends it cleanly (its delegates settled, exit 0) at any point:
// after the first round trip, or in the middle of it.
func TestDemoUI(t *testing.T) {
	t.Run("after the round trip", func(t *testing.T) { demoUI(t, 3) })
	t.Run("during the round trip", func(t *testing.T) { demoUI(t, 1) })
}

// demoUI runs demo --ui, follows its live view, and interrupts the demo
// once the view has seen stopAfter of the first round trip's moves.
func demoUI(t *testing.T, stopAfter int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, w := io.Pipe()
	var stderr lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"demo", "--ui"}, strings.NewReader(""), w, &stderr)
		w.Close()
	}()
	out := bufio.NewReader(r)
	var address string
	for address == "" {
		line, err := out.ReadString('\n')
		require.NoError(t, err, "the address; stderr: %s", stderr.String())
		if rest, ok := strings.CutPrefix(line, "live view: open "); ok {
			address = strings.TrimSpace(rest)
		}
	}
	var rest lockedBuffer
	drained := make(chan struct{})
	go func() {
		io.Copy(&rest, out)
		close(drained)
	}()
	base, token, ok := strings.Cut(address, "#token=")
	require.True(t, ok, "the token in the fragment: %s", address)

	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	get := func(path string) *http.Response {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		res, err := hc.Do(req)
		require.NoError(t, err)
		return res
	}
	// Nothing happens before a page follows the view.
	res := get("api/snapshot")
	var snap liveview.Snapshot
	require.NoError(t, json.NewDecoder(res.Body).Decode(&snap))
	res.Body.Close()
	assert.Empty(t, snap.Agents, "the demo waits for a page")

	res = get("api/events")
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	lines := bufio.NewScanner(res.Body)
	var moves []string
	for len(moves) < stopAfter && lines.Scan() {
		var l struct {
			Type  string
			Entry *liveview.Entry
		}
		require.NoError(t, json.Unmarshal(lines.Bytes(), &l))
		if l.Type == "entry" {
			moves = append(moves, l.Entry.Kind+" "+string(l.Entry.State)+" to "+l.Entry.To.AgentID+": "+l.Entry.Text)
		}
	}
	assert.Equal(t, []string{
		"created submitted to discussant-2: Shall we share the roundtable? I take seat 1.",
		"status working to discussant: ",
		"status completed to discussant: Agreed: seat 2 is mine.",
	}[:stopAfter], moves, "the first round trip, which waits for the page")

	cancel()
	select {
	case code := <-done:
		assert.Equal(t, exitOK, code, "stderr: %s", stderr.String())
	case <-time.After(20 * time.Second):
		t.Fatal("the demo did not end")
	}
	<-drained
	assert.Contains(t, rest.String(), "delegates settled")
}

// TestServeUIOnAnotherNATSServer: with --nats-url the live view dials
// the server as the broker does, and reads the broker through it.
func TestServeUIOnAnotherNATSServer(t *testing.T) {
	other, err := natsbus.New(natsbus.Config{}) // a NATS server, and no broker on it
	require.NoError(t, err)
	t.Cleanup(func() { other.Close() }) // after serve's end
	url := strings.Replace(other.URL(), "nats://", "nats://"+other.Server().Token()+"@", 1)
	path := filepath.Join(t.TempDir(), "c.json")
	stderr := serveInProcess(t, "--nats-url", url, "--ui", "--connection-file", path, "--data-dir=")
	for {
		line, err := stderr.ReadString('\n')
		require.NoError(t, err)
		if strings.Contains(line, "live view") {
			break
		}
	}
	// (serveInProcess reads the rest at the end; serve logs nothing more
	// meanwhile.)
	info, err := connfile.Read(path)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodGet, info.UIURL+"api/snapshot", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+info.UIToken)
	hc := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	res, err := hc.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	var snap liveview.Snapshot
	require.NoError(t, json.NewDecoder(res.Body).Decode(&snap))
	assert.Equal(t, "nats", snap.Info.Bus)
	assert.NotEmpty(t, snap.Info.Epoch)
}
