package pebblestore

import (
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestARefusedStoreWhoseCloseWaitsForRoomIsLetGoLater: a start that
// refuses the store it opened (a loss, damage) closes its database; a
// compaction Pebble began meanwhile may be waiting for room, and the
// close with it. The start is refused all the same, at once, with its
// own error, and the close ends in the background once there is room.
func TestARefusedStoreWhoseCloseWaitsForRoomIsLetGoLater(t *testing.T) {
	var full atomic.Bool
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if full.Load() && strings.HasSuffix(op.Path, ".sst") && (op.Kind == errorfs.OpFileWrite || op.Kind == errorfs.OpFileWriteAt) {
			return &os.PathError{Op: "write", Path: op.Path, Err: syscall.ENOSPC}
		}
		return nil
	}))
	d := newDisk(func(bool, string, error) {}, func(string, error) {})
	quiet := slog.New(slog.DiscardHandler)
	opts := Options{Logger: quiet, fs: fs, disk: d}
	path := t.TempDir()
	db, err := open(path, opts, false) // a fresh database, to write to
	require.NoError(t, err)
	for i := range 100 {
		require.NoError(t, db.Set([]byte{byte(i)}, []byte("v"), pebble.NoSync))
	}
	d.setOpening(true) // as while an existing store opens
	full.Store(true)
	flushed := make(chan error, 1)
	go func() { flushed <- db.Flush() }()
	require.Eventually(t, func() bool { return d.waiters() > 0 }, 10*time.Second, time.Millisecond, "the flush waits for room")

	refusal := errors.New("refused")
	err = closeOpened(db, d, refusal)
	require.ErrorIs(t, err, refusal)
	assert.Equal(t, "refused", err.Error())
	var held *heldOpen
	require.True(t, errors.As(err, &held), "the close is left to the background")

	full.Store(false)
	select {
	case <-held.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the close never ended once there was room")
	}
	require.NoError(t, <-flushed)

	// A close that does not wait is done at once.
	db, err = open(path, Options{Logger: quiet, fs: fs, disk: newDisk(func(bool, string, error) {}, func(string, error) {})}, true)
	require.NoError(t, err)
	err = closeOpened(db, d, refusal)
	assert.Same(t, refusal, err)
}
