package connfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// ErrUntrusted is returned when a file or folder the broker or a host
// would trust could have been put there by another user: it is a symlink,
// another user's, or not what it should be.
var ErrUntrusted = errors.New("connection file: untrusted path")

func untrusted(path, reason string) error {
	return fmt.Errorf("%w: %s: %s", ErrUntrusted, path, reason)
}

// runtimeDirReason says why dir, $XDG_RUNTIME_DIR, may not hold the
// connection file; "" when it may. As ssh with its key files: another
// user who can write in it, or owns it, could move our folder away and
// plant a connection file that hosts trust. A folder that does not exist
// yet may: Lock creates it, ours and 0700.
func runtimeDirReason(dir string) string {
	fi, err := os.Lstat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return ""
	case err != nil:
		return err.Error()
	case fi.Mode()&fs.ModeSymlink != 0:
		return "it is a symlink"
	case !fi.IsDir():
		return "it is not a folder"
	}
	if why := notOwnedReason(dir, fi); why != "" {
		return why
	}
	return sharedReason(dir, fi)
}

// openNoFollow opens path without following a symlink at it (parent
// folders are followed) and checks that what it opened is the user's
// own: a symlink or another user's file is ErrUntrusted, naming path.
// The checks are on the open file, so path cannot be swapped between
// them and the use.
func openNoFollow(path string, flag int, perm fs.FileMode) (*os.File, fs.FileInfo, error) {
	f, err := os.OpenFile(path, flag|oNoFollow, perm)
	if err != nil {
		// O_NOFOLLOW fails with ELOOP on Linux, but not with the same
		// errno everywhere: ask the path itself.
		if fi, lerr := os.Lstat(path); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return nil, nil, untrusted(path, "it is a symlink")
		}
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if why := notOwnedReason(path, fi); why != "" {
		f.Close()
		return nil, nil, untrusted(path, why)
	}
	return f, fi, nil
}

// ownFolder makes dir, the project's own folder, private (0700) after
// checking it is the user's own and no symlink: a folder someone else
// made there is refused, not taken over.
func ownFolder(dir string) error {
	d, fi, err := openNoFollow(dir, os.O_RDONLY, 0)
	if err != nil {
		if errors.Is(err, ErrUntrusted) {
			return err
		}
		return fmt.Errorf("connection file: %w", err)
	}
	defer d.Close()
	if !fi.IsDir() {
		return untrusted(dir, "it is not a folder")
	}
	if err := makePrivate(d); err != nil {
		return fmt.Errorf("connection file: %w", err)
	}
	return nil
}
