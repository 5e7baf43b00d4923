//go:build windows

package main

import (
	"context"

	"golang.org/x/sys/windows"
)

// watchParent returns a context that ends with ctx, or when the process
// that started this one exits: the parent's process handle is signalled
// then. Windows does not hand an orphan to another parent, so the pid is
// not polled; the handle is waited on, a quarter of a second at a time.
// pid, when not 0, names the process to watch instead (--parent-pid).
func watchParent(ctx context.Context, pid int) (context.Context, func()) {
	ctx, cancelCause := context.WithCancelCause(ctx)
	cancel := func() { cancelCause(nil) }
	if pid <= 0 {
		pid = startParent
	}
	h, err := windows.OpenProcess(windows.SYNCHRONIZE, false, uint32(pid))
	if err != nil {
		return ctx, cancel // no parent to watch (gone already, or not ours to see)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer windows.CloseHandle(h)
		for ctx.Err() == nil {
			ev, err := windows.WaitForSingleObject(h, uint32(parentPoll.Milliseconds()))
			if err == nil && ev == windows.WAIT_OBJECT_0 {
				cancelCause(errParentGone)
				return
			}
		}
	}()
	return ctx, func() { cancel(); <-done }
}
