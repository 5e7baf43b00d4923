package main

import "time"

// parentPoll is how often a sidecar looks whether its parent is alive.
const parentPoll = 250 * time.Millisecond
