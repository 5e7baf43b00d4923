package pipebus

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// TestCloseEndsIdleWorkers: a worker that served a request waits for the
// next one, and Close ends it then and there, whatever its idle time.
func TestCloseEndsIdleWorkers(t *testing.T) {
	defer func(d time.Duration) { workerIdle = d }(workerIdle)
	workerIdle = time.Hour
	bus, c, err := Pair(Config{}, ClientConfig{})
	require.NoError(t, err)
	require.NoError(t, bus.Serve(transport.HandlerFunc(func(_ context.Context, _ transport.Caller, raw []byte) []byte {
		req, perr := wire.ParseRequest(raw, 0)
		if perr != nil {
			return wire.ErrorResponse(nil, perr)
		}
		out, _ := wire.EncodeResult(req.ID, "ok")
		return out
	})))
	s, err := c.Session(context.Background(), "s1")
	require.NoError(t, err)
	for range 3 { // served by a worker that then waits for the next
		_, err = s.Call(context.Background(), "m", nil)
		require.NoError(t, err)
	}
	require.NoError(t, c.Close())
	closed := make(chan struct{})
	go func() {
		bus.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close waited for an idle worker")
	}
}
