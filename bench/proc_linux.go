package main

import (
	"syscall"
	"time"
)

// childProcAttr kills a child process when this one dies, so that a
// bench stopped midway leaves no server behind.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// cpuTime is the CPU time, user and system, of this process and of the
// processes pids: ok is false where it cannot be read.
func cpuTime(pids []int) (self, others time.Duration, ok bool) {
	self, err := selfCPU()
	if err != nil {
		return 0, 0, false
	}
	for _, pid := range pids {
		d, err := processCPU(pid)
		if err != nil {
			return 0, 0, false
		}
		others += d
	}
	return self, others, true
}
