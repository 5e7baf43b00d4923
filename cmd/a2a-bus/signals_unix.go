//go:build unix

package main

import (
	"os"
	"os/signal"
	"syscall"
)

// shutdownSignals end a command cleanly: Ctrl-C, a service manager's
// SIGTERM, and SIGHUP (the terminal or the session that started it went
// away; a2a-bus has nothing to reload).
var shutdownSignals = []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP}

// ignoreBrokenPipes makes a write to a closed pipe an error (EPIPE)
// instead of a death by SIGPIPE: a sidecar whose host crashed, taking the
// reader of its stderr with it, shuts down cleanly when told, instead of
// dying at its next log line and leaving its connection file behind.
func ignoreBrokenPipes() { signal.Ignore(syscall.SIGPIPE) }
