package natsbus_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// TestASessionCredentialsCalls: a client on a session's own credential
// gets its answers in its own inbox, and a call still waiting for one
// ends when its context ends, when its session or its client closes, and
// when the session is revoked (the server cuts its connection): each
// promptly, with its own error, and the client's other calls go on.
func TestASessionCredentialsCalls(t *testing.T) {
	b := newBus(t)
	open := b.HostMethods()[wire.MethodSessionOpen]
	held := make(chan struct{}, 8)
	require.NoError(t, b.Serve(transport.HandlerFunc(func(ctx context.Context, from transport.Caller, raw []byte) []byte {
		req, _ := wire.ParseRequest(raw, 0)
		if from.Scope == transport.ScopeHost { // a2a.sessions.open
			res, err := open(ctx, req.Params)
			if err != nil {
				return wire.ErrorResponse(req.ID, wire.ErrInternal.Withf("%v", err))
			}
			resp, _ := wire.EncodeResult(req.ID, res)
			return resp
		}
		if req.Method == "hold" {
			held <- struct{}{}
			<-ctx.Done() // until the bus closes: the caller must not wait for it
			return nil
		}
		resp, _ := wire.EncodeResult(req.ID, map[string]string{"session": from.Session})
		return resp
	})))
	dial := func(t *testing.T) (*natsbus.Client, transport.Session) {
		t.Helper()
		creds := openSession(t, b, "s1")
		c, err := natsbus.Dial(natsbus.ClientConfig{URL: creds.URL, User: creds.User, Password: creds.Password, Session: "s1", NoReconnect: true})
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		s, err := c.Session(context.Background(), "s1")
		require.NoError(t, err)
		return c, s
	}
	answered := func(t *testing.T, s transport.Session) {
		t.Helper()
		res, err := s.Call(context.Background(), "echo", struct{}{})
		require.NoError(t, err)
		var got struct{ Session string }
		require.NoError(t, json.Unmarshal(res, &got))
		assert.Equal(t, "s1", got.Session)
	}
	// pending starts a held call on s and returns where its error comes.
	pending := func(t *testing.T, ctx context.Context, s transport.Session) <-chan error {
		t.Helper()
		errc := make(chan error, 1)
		go func() {
			_, err := s.Call(ctx, "hold", struct{}{})
			errc <- err
		}()
		select {
		case <-held:
		case err := <-errc:
			t.Fatalf("the held call ended at once: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("the held call never reached the broker")
		}
		return errc
	}
	ended := func(t *testing.T, errc <-chan error, what string) error {
		t.Helper()
		select {
		case err := <-errc:
			require.Error(t, err)
			return err
		case <-time.After(5 * time.Second):
			t.Fatalf("a waiting call outlived %s", what)
			return nil
		}
	}

	t.Run("its context ends", func(t *testing.T) {
		_, s := dial(t)
		answered(t, s)
		ctx, cancel := context.WithCancel(context.Background())
		errc := pending(t, ctx, s)
		cancel()
		assert.ErrorIs(t, ended(t, errc, "its context"), context.Canceled)
		answered(t, s)
	})
	t.Run("its session closes", func(t *testing.T) {
		_, s := dial(t)
		errc := pending(t, context.Background(), s)
		require.NoError(t, s.Close())
		assert.ErrorIs(t, ended(t, errc, "its session"), transport.ErrClosed)
	})
	t.Run("its client closes", func(t *testing.T) {
		c, s := dial(t)
		errc := pending(t, context.Background(), s)
		require.NoError(t, c.Close())
		assert.ErrorIs(t, ended(t, errc, "its client"), transport.ErrClosed)
	})
	t.Run("the session is revoked", func(t *testing.T) {
		_, s := dial(t)
		errc := pending(t, context.Background(), s)
		require.NoError(t, b.RevokeSession(context.Background(), "s1"))
		assert.ErrorIs(t, ended(t, errc, "its connection"), transport.ErrUnavailable)
	})
}
