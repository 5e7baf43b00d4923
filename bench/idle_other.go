//go:build !linux

package main

import (
	"fmt"
	"os"
)

// idle reads serve's CPU time and memory from /proc: Linux only.
func (r *runner) idle() error {
	fmt.Fprintln(os.Stderr, "bench: idle: skipped, it reads /proc (Linux only)")
	return nil
}
