package pebblestore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/store/pebblestore"
	"github.com/a2a-bus/a2a-bus/store/storetest"
)

// newestLog returns the newest log file of the store in dir.
func newestLog(t *testing.T, dir string) string {
	t.Helper()
	logs, err := filepath.Glob(filepath.Join(dir, pebblestore.DirName, "*.log"))
	require.NoError(t, err)
	require.NotEmpty(t, logs)
	slices.Sort(logs)
	return logs[len(logs)-1]
}

// acknowledged makes n tasks, one after another, each acknowledged, and
// closes the store.
func acknowledged(t *testing.T, dir string, n int) {
	t.Helper()
	s := open(t, dir)
	for i := range n {
		require.NoError(t, s.Create(context.Background(), storetest.NewRecord(fmt.Sprint("t", i), "c", "a", "b", i), 0))
	}
	require.NoError(t, s.Close())
}

// refusedForLoss checks that dir's store is refused, in one line that
// names --accept-data-loss, each time it is tried; then that with
// AcceptDataLoss it opens, says why, and the next start takes it as it
// is now.
func refusedForLoss(t *testing.T, dir, why string) {
	t.Helper()
	for range 2 {
		_, err := pebblestore.Open(dir, pebblestore.Options{})
		require.ErrorIs(t, err, pebblestore.ErrDataLoss)
		assert.NotContains(t, err.Error(), "\n")
		assert.Contains(t, err.Error(), why)
		assert.Contains(t, err.Error(), "--accept-data-loss")
	}
	var told []string
	s, err := pebblestore.Open(dir, pebblestore.Options{AcceptDataLoss: true, OnDataLoss: func(p string) { told = append(told, p) }})
	require.NoError(t, err)
	require.Len(t, told, 1, "the loss is told once")
	assert.Contains(t, told[0], why)
	require.NoError(t, s.Create(context.Background(), storetest.NewRecord("after", "c", "a", "b", 0), 0))
	require.NoError(t, s.Close())
	s = open(t, dir) // accepted once: the marker now agrees
	got, err := s.Get(context.Background(), "after")
	require.NoError(t, err)
	assert.Equal(t, "after", got.Task.ID)
	require.NoError(t, s.Close())
}

// TestAcknowledgedChangesLostFromTheLogTailAreRefused: the cases of a
// damaged newest log that Pebble itself takes for a torn tail, dropping
// what follows: the marker of the last acknowledged commit shows the
// loss.
func TestAcknowledgedChangesLostFromTheLogTailAreRefused(t *testing.T) {
	// mustRefuse: the cases, which lost acknowledged tasks
	// silently before; the others must lose none silently either: the
	// store is refused, or opens with every acknowledged task.
	mustRefuse := map[string]bool{"truncated to half": true, "a byte flipped 100 bytes from the end": true,
		"a byte flipped 3000 bytes from the end": true, "emptied": true}
	damage := map[string]func(t *testing.T, path string){
		"truncated to half": func(t *testing.T, path string) {
			st, err := os.Stat(path)
			require.NoError(t, err)
			require.NoError(t, os.Truncate(path, st.Size()/2))
		},
		"a byte flipped 100 bytes from the end":  func(t *testing.T, path string) { flip(t, path, 100) },
		"a byte flipped 3000 bytes from the end": func(t *testing.T, path string) { flip(t, path, 3000) },
		"the last record cut by 10 bytes":        func(t *testing.T, path string) { cut(t, path, 10) },
		"emptied":                                func(t *testing.T, path string) { require.NoError(t, os.Truncate(path, 0)) },
	}
	for name, fn := range damage {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			acknowledged(t, dir, 300)
			fn(t, newestLog(t, dir))
			s, err := pebblestore.Open(dir, pebblestore.Options{})
			if err == nil {
				// Only records that held no acknowledged task were cut
				// (the last ones may be log syncs' marks).
				assert.False(t, mustRefuse[name], "opened after the damage")
				for i := range 300 {
					_, gerr := s.Get(context.Background(), fmt.Sprint("t", i))
					require.NoError(t, gerr, "acknowledged task t%d", i)
				}
				require.NoError(t, s.Close())
				return
			}
			if errorsIsCorrupt(err) {
				// Damage Pebble sees as such: refused as corrupt (as
				// documented), not a loss to accept.
				assert.NotContains(t, err.Error(), "\n")
				return
			}
			refusedForLoss(t, dir, "acknowledged commits are lost")
		})
	}
}

func errorsIsCorrupt(err error) bool {
	return err != nil && strings.Contains(err.Error(), pebblestore.ErrCorrupt.Error())
}

func flip(t *testing.T, path string, fromEnd int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	st, err := f.Stat()
	require.NoError(t, err)
	require.Greater(t, st.Size(), fromEnd)
	b := make([]byte, 1)
	_, err = f.ReadAt(b, st.Size()-fromEnd)
	require.NoError(t, err)
	b[0] ^= 0xff
	_, err = f.WriteAt(b, st.Size()-fromEnd)
	require.NoError(t, err)
}

func cut(t *testing.T, path string, n int64) {
	t.Helper()
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.NoError(t, os.Truncate(path, st.Size()-n))
}

// TestAStoreThatWasThereAndIsGoneIsRefused: a data dir whose tasks
// folder was removed is not taken for a new one.
func TestAStoreThatWasThereAndIsGoneIsRefused(t *testing.T) {
	dir := t.TempDir()
	acknowledged(t, dir, 100)
	require.NoError(t, os.RemoveAll(filepath.Join(dir, pebblestore.DirName)))
	refusedForLoss(t, dir, "is gone")
}

// TestADamagedMarkerIsRefused: a marker with no whole slot cannot vouch
// for the store.
func TestADamagedMarkerIsRefused(t *testing.T) {
	dir := t.TempDir()
	acknowledged(t, dir, 10)
	require.NoError(t, os.WriteFile(filepath.Join(dir, pebblestore.MarkerName), []byte(strings.Repeat("x", 32)), 0o600))
	refusedForLoss(t, dir, "is damaged")
}

// TestAnUndamagedStoreOpens: no false refusal, after a clean close or a
// store that never had a marker (an earlier version's).
func TestAnUndamagedStoreOpens(t *testing.T) {
	dir := t.TempDir()
	acknowledged(t, dir, 50)
	s := open(t, dir)
	require.NoError(t, s.Close())
	require.NoError(t, os.Remove(filepath.Join(dir, pebblestore.MarkerName)))
	s = open(t, dir) // as an earlier version's: no marker yet
	n, err := s.OpenCount(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 50, n)
	require.NoError(t, s.Close())
	_, err = os.Stat(filepath.Join(dir, pebblestore.MarkerName))
	require.NoError(t, err, "the marker is written at the start")
}

// TestAReopenThatLostAcknowledgedChangesIsRefused: a store that failed
// is reopened from its log, as a restart would; a log that lost its
// tail meanwhile (here cut to half) is refused as a start would be,
// not taken as the truth: the store stays failed, and the next start
// refuses it too.
func TestAReopenThatLostAcknowledgedChangesIsRefused(t *testing.T) {
	t.Cleanup(pebblestore.SetReopenEvery(0))
	// A loss accepted at the start is that start's: a later one is not.
	for _, accept := range []bool{false, true} {
		t.Run(fmt.Sprint("started accepting a loss: ", accept), func(t *testing.T) {
			fs := newGatedFS(".log")
			dir := t.TempDir()
			s, err := pebblestore.Open(dir, pebblestore.WithFS(pebblestore.Options{AcceptDataLoss: accept}, fs))
			require.NoError(t, err)
			defer s.Close()
			ctx := context.Background()
			for i := range 300 {
				require.NoError(t, s.Create(ctx, storetest.NewRecord(fmt.Sprint("t", i), "c", "a", "b", i), 0))
			}
			held := newestLog(t, dir)
			fs.fail.Store(true)
			require.ErrorIs(t, s.Create(ctx, storetest.NewRecord("x", "c", "a", "b", 0), 0), pebblestore.ErrFailed)
			st, err := os.Stat(held)
			require.NoError(t, err)
			require.NoError(t, os.Truncate(held, st.Size()/2))
			fs.fail.Store(false)
			for range 2 {
				err = s.Create(ctx, storetest.NewRecord("y", "c", "a", "b", 0), 0)
				require.ErrorIs(t, err, pebblestore.ErrDataLoss)
				assert.Contains(t, err.Error(), "acknowledged commits are lost")
			}
			require.NoError(t, s.Close())
			refusedForLoss(t, dir, "acknowledged commits are lost")
		})
	}
}
