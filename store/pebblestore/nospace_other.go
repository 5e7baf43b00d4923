//go:build !unix && !windows

package pebblestore

import (
	"errors"
	"syscall"
)

// isNoSpace tells an error of a full disk.
func isNoSpace(err error) bool { return errors.Is(err, syscall.ENOSPC) }
