package pebblestore

import (
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/store/boltstore"
)

// watchSyncs records every folder synced, with the names it held then,
// until the test ends.
func watchSyncs(t *testing.T) func() map[string][][]string {
	var mu sync.Mutex
	seen := map[string][][]string{}
	old := syncDir
	syncDir = func(dir string) error {
		var names []string
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		for _, e := range entries {
			names = append(names, e.Name())
		}
		mu.Lock()
		seen[dir] = append(seen[dir], names)
		mu.Unlock()
		return old(dir)
	}
	t.Cleanup(func() { syncDir = old })
	return func() map[string][][]string {
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
}

// syncedWith reports whether dir was synced while it held name and none
// of gone.
func syncedWith(seen map[string][][]string, dir, name string, gone ...string) bool {
	return slices.ContainsFunc(seen[dir], func(names []string) bool {
		return slices.Contains(names, name) && !slices.ContainsFunc(gone, func(g string) bool { return slices.Contains(names, g) })
	})
}

// TestNewEntriesAreSyncedIntoTheirFolders: every folder entry a first
// start makes (the data dir and its missing parents, the store's folder
// renamed into place) is made durable before Open returns: its parent is
// synced once it holds it. A power cut after the start then finds the
// store where the acknowledged changes were made, not an empty one. The
// folders synced are watched through syncDir, which the store calls
// for every sync of a folder it makes itself.
func TestNewEntriesAreSyncedIntoTheirFolders(t *testing.T) {
	seen := watchSyncs(t)
	root := t.TempDir()
	dir := filepath.Join(root, "a", "b")
	s, err := Open(dir, Options{})
	require.NoError(t, err)
	require.NoError(t, s.Close())
	got := seen()
	require.True(t, syncedWith(got, root, "a"), "the data dir's new parent synced into its own: %v", got)
	require.True(t, syncedWith(got, filepath.Join(root, "a"), "b"), "the new data dir synced into its parent: %v", got)
	require.True(t, syncedWith(got, dir, DirName, DirName+".new"), "the store's folder synced into the data dir after its rename: %v", got)
}

// TestTheMigrationsRenamesAreSynced: a migration's new store and the
// earlier file renamed aside are durable before Open returns.
func TestTheMigrationsRenamesAreSynced(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile(filepath.Join("..", "boltstore", "testdata", boltstore.FileName))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, boltstore.FileName), data, 0o600))
	seen := watchSyncs(t)
	s, err := Open(dir, Options{})
	require.NoError(t, err)
	require.NoError(t, s.Close())
	got := seen()
	require.True(t, syncedWith(got, dir, DirName, DirName+".new"), "the new store's folder synced into the data dir: %v", got)
	require.True(t, syncedWith(got, dir, boltstore.FileName+MigratedSuffix, boltstore.FileName), "the earlier file's rename aside synced: %v", got)
}
