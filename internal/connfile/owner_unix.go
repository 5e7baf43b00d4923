//go:build unix

package connfile

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// The ownership checks are the only part of trusting a path that is
// particular to Unix: a Windows port replaces this file (owner SIDs and
// ACLs instead of uids and mode bits).

// notOwnedReason says why fi, a file or folder as stat saw it, is not the
// current user's own; "" when it is.
func notOwnedReason(fi fs.FileInfo) string {
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
func sharedReason(fi fs.FileInfo) string {
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Sprintf("it is writable by group or others (mode %#o)", perm)
	}
	return ""
}
