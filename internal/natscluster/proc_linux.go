package natscluster

import "syscall"

// sysProcAttr kills a node when the test process dies, so that a test
// binary killed by a timeout leaves no server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
