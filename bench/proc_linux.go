package main

import "time"

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
