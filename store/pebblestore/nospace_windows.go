//go:build windows

package pebblestore

import (
	"errors"
	"syscall"
)

// Windows' errors of a full disk (winerror.h).
const (
	errorHandleDiskFull syscall.Errno = 39
	errorDiskFull       syscall.Errno = 112
)

// isNoSpace tells an error of a full disk.
func isNoSpace(err error) bool {
	return errors.Is(err, errorDiskFull) || errors.Is(err, errorHandleDiskFull) || errors.Is(err, syscall.ENOSPC)
}
