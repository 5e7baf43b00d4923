//go:build unix

package pebblestore

import (
	"errors"
	"syscall"
)

// isNoSpace tells an error of a full disk, or of a user's disk quota
// used up, which is the same to the store: there is no room.
func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}
