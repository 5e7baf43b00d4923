package main

import (
	"os"
	"time"
)

// parentPoll is how often a sidecar looks whether its parent is alive.
const parentPoll = 250 * time.Millisecond

// startParent is the parent's pid as the process started, read before
// anything else: a parent that dies during the start is then seen gone,
// not taken for one that never was.
var startParent = os.Getppid()
