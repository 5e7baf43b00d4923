//go:build !linux

package natscluster

import "syscall"

// sysProcAttr has nothing to add off Linux: the cleanup kills the nodes.
func sysProcAttr() *syscall.SysProcAttr { return nil }
