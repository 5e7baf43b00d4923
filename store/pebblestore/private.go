package pebblestore

import (
	"io"
	"os"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// privateFS is a file system whose new folders are 0700 and new files
// 0600, as the rest of the data dir: Pebble asks for 0755 and 0666.
type privateFS struct{ vfs.FS }

// chmod sets a mode through the operating system, which holds the files
// only where the file system is the operating system's (not a file
// system in memory).
func (fs privateFS) chmod(name string, mode os.FileMode) error {
	if vfs.Root(fs.FS) != vfs.Default {
		return nil
	}
	return os.Chmod(name, mode)
}

func (fs privateFS) MkdirAll(dir string, _ os.FileMode) error {
	if err := fs.FS.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return fs.chmod(dir, 0o700)
}

func (fs privateFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	return fs.private(fs.FS.Create(name, c))(name)
}

func (fs privateFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	return fs.private(fs.FS.OpenReadWrite(name, c, opts...))(name)
}

// private makes the file just opened 0600.
func (fs privateFS) private(f vfs.File, err error) func(name string) (vfs.File, error) {
	return func(name string) (vfs.File, error) {
		if err != nil {
			return nil, err
		}
		if err := fs.chmod(name, 0o600); err != nil {
			f.Close()
			return nil, err
		}
		return f, nil
	}
}

func (fs privateFS) Unwrap() vfs.FS { return fs.FS }

func (fs privateFS) Lock(name string) (io.Closer, error) {
	c, err := fs.FS.Lock(name)
	if err != nil {
		return nil, err
	}
	if err := fs.chmod(name, 0o600); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}
