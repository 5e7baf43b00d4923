package pebblestore

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
)

// mkdirAllSynced makes dir and its missing parents, mode 0700, each
// made durable (its parent synced), so that a power cut after a first
// start does not take the data dir, with the changes acknowledged in it,
// away: the next start would make an empty store there.
func mkdirAllSynced(dir string) error {
	if fi, err := os.Stat(dir); err == nil {
		if !fi.IsDir() {
			return &os.PathError{Op: "mkdir", Path: dir, Err: syscall.ENOTDIR}
		}
		return nil
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := mkdirAllSynced(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil // made meanwhile, by a broker that syncs it too
		}
		return err
	}
	return syncDir(parent)
}
