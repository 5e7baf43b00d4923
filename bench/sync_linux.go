package main

import (
	"os"

	"golang.org/x/sys/unix"
)

// syncData is fdatasync, as the stores' logs use on Linux.
func syncData(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }
