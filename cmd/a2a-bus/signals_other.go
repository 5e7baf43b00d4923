//go:build !unix

package main

import (
	"os"
	"syscall"
)

// shutdownSignals end a command cleanly. On Windows, Go delivers Ctrl-C
// and Ctrl-Break as os.Interrupt, and a console's close, a logoff or a
// shutdown as SIGTERM; SIGHUP and SIGPIPE do not exist there.
var shutdownSignals = []os.Signal{os.Interrupt, syscall.SIGTERM}

// ignoreBrokenPipes has nothing to do where there is no SIGPIPE.
func ignoreBrokenPipes() {}
