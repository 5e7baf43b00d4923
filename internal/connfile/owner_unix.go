//go:build unix

package connfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// The Unix side of trusting a path: uids and mode bits. owner_windows.go
// is the same API with owner SIDs and ACLs.

// oNoFollow makes an open fail on a symlink.
const oNoFollow = syscall.O_NOFOLLOW

// notOwnedReason says why fi, a file or folder as stat saw it, is not the
// current user's own; "" when it is.
func notOwnedReason(_ string, fi fs.FileInfo) string {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "its owner is unknown"
	}
	// The effective uid: the one that owns the files this process makes.
	if me := os.Geteuid(); int(st.Uid) != me {
		return fmt.Sprintf("it is owned by uid %d, not by this user (uid %d)", st.Uid, me)
	}
	return ""
}

// sharedReason says why others than its owner may change what fi, a
// folder, holds; "" when they may not. A sticky bit is no excuse: it
// keeps others from renaming our entries, not from making their own
// first.
func sharedReason(_ string, fi fs.FileInfo) string {
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Sprintf("it is writable by group or others (mode %#o)", perm)
	}
	return ""
}

// makePrivate makes the open folder d the user's alone: mode 0700.
func makePrivate(d *os.File) error { return d.Chmod(0o700) }

// processAlive reports whether pid runs (signal 0: a process of another
// user answers EPERM, and runs).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
