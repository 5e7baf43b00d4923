//go:build windows

package connfile

import (
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/windows"
)

// The Windows side of trusting a path: owner SIDs and ACLs, where
// owner_unix.go has uids and mode bits. Small on purpose: it cannot be
// run where the project is built, only compiled.

// oNoFollow: Windows opens follow a symlink only for a user allowed to
// make one; the Lstat checks around the opens refuse symlinks.
const oNoFollow = 0

// currentUser returns the SID of the user this process runs as.
func currentUser() (*windows.SID, error) {
	t := windows.GetCurrentProcessToken()
	u, err := t.GetTokenUser()
	if err != nil {
		return nil, err
	}
	return u.User.Sid, nil
}

// notOwnedReason says why path is not the current user's own; "" when it
// is.
func notOwnedReason(path string, _ fs.FileInfo) string {
	sd, err := windows.GetNamedSecurityInfo(path, windows.SE_FILE_OBJECT, windows.OWNER_SECURITY_INFORMATION)
	if err != nil {
		return "its owner is unknown: " + err.Error()
	}
	owner, _, err := sd.Owner()
	if err != nil {
		return "its owner is unknown: " + err.Error()
	}
	me, err := currentUser()
	if err != nil {
		return "the current user is unknown: " + err.Error()
	}
	if !owner.Equals(me) {
		return fmt.Sprintf("it is owned by %s, not by this user (%s)", owner, me)
	}
	return ""
}

// sharedReason: a folder this user owns is theirs to share; what a2a-bus
// makes itself, makePrivate keeps private.
func sharedReason(string, fs.FileInfo) string { return "" }

// makePrivate gives the folder d an ACL that grants the current user
// alone (and, inherited, what is made in it), and no ACE inherited from
// above: the connection file and the data in it are the user's only.
func makePrivate(d *os.File) error {
	me, err := currentUser()
	if err != nil {
		return err
	}
	sd, err := windows.SecurityDescriptorFromString(fmt.Sprintf("D:P(A;OICI;FA;;;%s)", me))
	if err != nil {
		return err
	}
	dacl, _, err := sd.DACL()
	if err != nil {
		return err
	}
	return windows.SetNamedSecurityInfo(d.Name(), windows.SE_FILE_OBJECT,
		windows.DACL_SECURITY_INFORMATION|windows.PROTECTED_DACL_SECURITY_INFORMATION, nil, nil, dacl, nil)
}

// processAlive reports whether pid runs: its handle opens and it has no
// exit code yet.
func processAlive(pid int) bool {
	h, err := windows.OpenProcess(windows.PROCESS_QUERY_LIMITED_INFORMATION, false, uint32(pid))
	if err != nil {
		return false
	}
	defer windows.CloseHandle(h)
	var code uint32
	if err := windows.GetExitCodeProcess(h, &code); err != nil {
		return false
	}
	return code == 259 // STILL_ACTIVE
}
