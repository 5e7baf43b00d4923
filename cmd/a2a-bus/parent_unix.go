//go:build unix

package main

import (
	"context"
	"errors"
	"os"
	"syscall"
	"time"
)

// watchParent returns a context that ends with ctx, or when the process
// that started this one has gone (the process is handed to another
// parent: init, or a subreaper), already or later. A process started by
// init has no parent to watch; one started through a double fork watches
// whoever adopted it (such launchers want --exit-with-parent=false).
// stop releases the watch; the goroutine is the caller's.
//
// pid, when not 0, names the process to watch instead (a host that starts
// serve through a launcher passes its own, --parent-pid): it is gone when
// signal 0 finds no such process.
func watchParent(ctx context.Context, pid int) (context.Context, func()) {
	ctx, cancelCause := context.WithCancelCause(ctx)
	cancel := func() { cancelCause(nil) }
	parent := startParent
	alive := func() bool { return os.Getppid() == parent }
	if pid > 0 {
		alive = func() bool { return !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) }
	} else if parent <= 1 {
		return ctx, cancel
	}
	if !alive() {
		cancelCause(errParentGone) // gone during the start
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
				if !alive() {
					cancelCause(errParentGone)
					return
				}
			}
		}
	}()
	return ctx, func() { cancel(); <-done }
}
