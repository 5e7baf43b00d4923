//go:build !unix

package main

import "os"

// shutdownSignals end a command cleanly: Ctrl-C (and Ctrl-Break, a
// console's close, which Go delivers as os.Interrupt).
var shutdownSignals = []os.Signal{os.Interrupt}

// ignoreBrokenPipes has nothing to do where there is no SIGPIPE.
func ignoreBrokenPipes() {}
