//go:build unix

package main

import (
	"context"
	"os"
	"time"
)

// watchParent returns a context that ends with ctx, or when the process
// that started this one has gone (the process is handed to another
// parent: init, or a subreaper). A process started by init has no parent
// to watch. stop releases the watch; the goroutine is the caller's.
func watchParent(ctx context.Context) (context.Context, func()) {
	ctx, cancelCause := context.WithCancelCause(ctx)
	cancel := func() { cancelCause(nil) }
	parent := os.Getppid()
	if parent <= 1 {
		return ctx, cancel
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(parentPoll)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if os.Getppid() != parent {
					cancelCause(errParentGone)
					return
				}
			}
		}
	}()
	return ctx, func() { cancel(); <-done }
}
