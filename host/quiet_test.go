package host_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/host"
	"github.com/a2a-bus/a2a-bus/wire"
)

// records keeps what a logger was given.
type records struct {
	mu  sync.Mutex
	got []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *records) WithGroup(string) slog.Handler            { return r }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, rec)
	return nil
}

func (r *records) atLeast(l slog.Level) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range r.got {
		if rec.Level >= l {
			out = append(out, rec.Level.String()+" "+rec.Message)
		}
	}
	return out
}

// openAndCloseWithSessions runs a host through a life: two sessions with a
// delegate each and a message between them, then an orderly Close with
// the sessions still open.
func openAndCloseWithSessions(t *testing.T, bus string, cfg host.Config) {
	ctx := ctxT(t)
	h, err := openBus(ctx, bus, cfg)
	require.NoError(t, err)
	a, err := h.Session(ctx, "s1")
	require.NoError(t, err)
	b, err := h.Session(ctx, "s2")
	require.NoError(t, err)
	da, err := a.Spawn(ctx, wire.AgentCard{Name: "a"})
	require.NoError(t, err)
	db, err := b.Spawn(ctx, wire.AgentCard{Name: "b"})
	require.NoError(t, err)
	_, err = da.Send(ctx, db.ID(), say("hello"), nil)
	require.NoError(t, err)
	wait(t, db)
	require.NoError(t, h.Close())
}

// TestALibraryLogsOnlyThroughItsCallersLogger: embedded without a Logger,
// the host writes nothing to the process's default logger.
func TestALibraryLogsOnlyThroughItsCallersLogger(t *testing.T) {
	var def records
	prev := slog.Default()
	slog.SetDefault(slog.New(&def))
	t.Cleanup(func() { slog.SetDefault(prev) })
	openAndCloseWithSessions(t, "nats", host.Config{Bus: host.NATS, Memory: true})
	assert.Empty(t, def.atLeast(slog.LevelDebug), "the default logger got records")
}

// TestAnOrderlyCloseIsNotAWarning: with the caller's logger at every
// level, an orderly life and Close log nothing at WARN or above.
func TestAnOrderlyCloseIsNotAWarning(t *testing.T) {
	for _, bus := range []string{"fake", "nats"} {
		t.Run(bus, func(t *testing.T) {
			var got records
			cfg := host.Config{Memory: true, Logger: slog.New(&got)}
			if bus == "nats" {
				cfg.Bus = host.NATS
			}
			openAndCloseWithSessions(t, bus, cfg)
			assert.Empty(t, got.atLeast(slog.LevelWarn))
			assert.NotEmpty(t, got.atLeast(slog.LevelDebug), "the caller's logger is the one used")
		})
	}
}
