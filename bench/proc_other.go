//go:build !linux

package main

import (
	"syscall"
	"time"
)

// childProcAttr is the children's process attributes: none here.
func childProcAttr() *syscall.SysProcAttr { return nil }

// cpuTime is read from /proc: Linux only.
func cpuTime([]int) (self, others time.Duration, ok bool) { return 0, 0, false }
