//go:build !linux

package main

import "os"

// syncData is the platform's file sync.
func syncData(f *os.File) error { return f.Sync() }
