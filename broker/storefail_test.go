package broker_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/wire"
)

// fullStore's changes fail as a durable store's do on a full disk, once
// armed: with an error that says why in words a client may see.
type fullStore struct {
	*store.Memory
	armed atomic.Bool
}

// errFull is such an error: its text names a file, its reason does not.
type errFull struct{}

func (errFull) Error() string {
	return "write /home/someone/.local/state/a2a-bus/tasks/000123.log: no space left on device"
}
func (errFull) Reason() string { return "the disk is full" }

func (f *fullStore) Create(ctx context.Context, rec *store.Record, maxOpen int) error {
	if f.armed.Load() {
		return errFull{}
	}
	return f.Memory.Create(ctx, rec, maxOpen)
}

// syncBuffer is a log's output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestAStoreFailureNamesItsCause: a change the store refuses for a
// reason it gives (a full disk) is answered -32603 naming it, never the
// store's paths; reads go on; and the failure is logged once, with a
// count, not once a request.
func TestAStoreFailureNamesItsCause(t *testing.T) {
	st := &fullStore{Memory: store.NewMemory()}
	out := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(out, nil))
	e := newEnv(t, broker.Config{Store: st, Logger: log})
	a := e.register("s1", "a")
	e.register("s2", "b")
	before := a.mustSend("b", "before")
	st.armed.Store(true)
	const sends = 200
	for range sends {
		_, err := a.send("b", "refused")
		requireCode(t, err, wire.ErrInternal)
		var we *wire.Error
		require.True(t, errors.As(err, &we))
		assert.Equal(t, "create task failed in the task store: the disk is full", we.Message)
		_, err = a.get(before.ID)
		require.NoError(t, err, "reads go on")
	}
	lines := strings.Count(out.String(), "\n")
	assert.LessOrEqual(t, lines, 4, "a line or two for the first failure, not one a request:\n%s", out)
	require.NoError(t, e.broker.Close())
	assert.Contains(t, out.String(), "repeats=199 ", "the count is logged at close:\n%s", out)
}
