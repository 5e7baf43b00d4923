package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestServeStopsWithinItsBound: once told to stop, serve waits for its
// shutdown at most the bound, whatever holds it up.
func TestServeStopsWithinItsBound(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	errServe := errors.New("serve's own error")
	for _, tc := range []struct {
		name    string
		stopped bool          // ctx is done
		takes   time.Duration // the shutdown's time, after ctx
		want    error
	}{
		{"a shutdown within the bound returns its error", true, 0, errServe},
		{"a shutdown past the bound is abandoned", true, time.Hour, errShutdownAbandoned},
		{"serve that ends by itself returns its error", false, 0, errServe},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			release := make(chan struct{})
			defer close(release)
			run := func() error {
				if tc.stopped {
					<-ctx.Done()
				}
				select {
				case <-time.After(tc.takes):
				case <-release:
				}
				return errServe
			}
			if tc.stopped {
				cancel()
			}
			start := time.Now()
			err := within(ctx, 100*time.Millisecond, log, run)
			require.ErrorIs(t, err, tc.want)
			assert.Less(t, time.Since(start), 10*time.Second)
		})
	}
}
