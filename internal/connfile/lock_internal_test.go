package connfile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gofrs/flock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestALockOnAFileRemovedMeanwhileIsTakenAgain: Release removes the lock
// file, so a broker may lock a file that a releasing broker removed (or
// another replaced) after this one opened it. Such a lock holds nothing:
// Lock takes the lock again, on the file at the path, so that two brokers
// never both hold the path.
func TestALockOnAFileRemovedMeanwhileIsTakenAgain(t *testing.T) {
	path := filepath.Join(t.TempDir(), "connection.json")
	lockPath := path + ".lock"
	var orphans []*flock.Flock
	tries := 0
	lockOnce = func(p string) (*flock.Flock, error) {
		tries++
		lock, err := takeLockOnce(p)
		if tries <= 2 && lock != nil {
			// The file goes from the path once locked: removed, then
			// removed and made again by another broker.
			require.NoError(t, os.Remove(p))
			if tries == 2 {
				require.NoError(t, os.WriteFile(p, nil, 0o600))
			}
			orphans = append(orphans, lock)
		}
		return lock, err
	}
	t.Cleanup(func() { lockOnce = takeLockOnce })

	c, err := Lock(path)
	require.NoError(t, err)
	defer c.Release()
	assert.Equal(t, 3, tries, "the lock was taken again until it held the file at the path")
	for _, o := range orphans {
		assert.False(t, o.Locked(), "a lock on a file no longer at the path is let go")
	}
	held, err := c.lock.Stat()
	require.NoError(t, err)
	at, err := os.Lstat(lockPath)
	require.NoError(t, err)
	assert.True(t, os.SameFile(held, at), "the claim holds the file at the path")
	_, err = Lock(path)
	assert.ErrorIs(t, err, ErrRunning)
}
