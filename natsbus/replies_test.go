package natsbus_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// heldEcho answers every request with its params; a request of method
// "held" is answered only once release is closed.
type heldEcho struct {
	release chan struct{}
	held    chan struct{} // a held request has come
	done    sync.WaitGroup
}

func (h *heldEcho) ServeRPC(_ context.Context, _ transport.Caller, raw []byte) []byte {
	req, perr := wire.ParseRequest(raw, 0)
	if perr != nil {
		return wire.ErrorResponse(nil, perr)
	}
	if req.Method == "held" {
		h.done.Add(1)
		defer h.done.Done()
		h.held <- struct{}{}
		<-h.release
	}
	out, _ := wire.EncodeResult(req.ID, req.Params)
	return out
}

// The callers of one client read each other's replies and pass them on;
// the reply to a call its caller gave up is dropped by whoever reads it,
// and never taken for the reply to a later call.
func TestTheRepliesOfCallsGivenUpReachNoOtherCall(t *testing.T) {
	b := newBus(t)
	h := &heldEcho{release: make(chan struct{}), held: make(chan struct{}, 8)}
	require.NoError(t, b.Serve(h))
	c, err := b.Connect(natsbus.ClientConfig{})
	require.NoError(t, err)
	s, err := c.Session(context.Background(), "s1")
	require.NoError(t, err)

	for i := range 4 {
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := s.Call(ctx, "held", map[string]int{"abandoned": i})
			errc <- err
		}()
		<-h.held // given up once the broker has it
		cancel()
		require.ErrorIs(t, <-errc, context.Canceled)
	}
	close(h.release) // their replies come now, with nobody waiting for them
	h.done.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			res, err := s.Call(ctx, "echo", map[string]int{"i": i})
			if assert.NoError(t, err) {
				var got map[string]int
				require.NoError(t, json.Unmarshal(res, &got))
				assert.Equal(t, map[string]int{"i": i}, got, fmt.Sprint("call ", i))
			}
		})
	}
	wg.Wait()
}
