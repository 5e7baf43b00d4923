//go:build windows

package main

import (
	"context"
	"os"

	"golang.org/x/sys/windows"
)

// watchParent returns a context that ends with ctx, or when the process
// that started this one exits: the parent's process handle is signalled
// then. Windows does not hand an orphan to another parent, so the pid is
// not polled; the handle is waited on, a quarter of a second at a time.
func watchParent(ctx context.Context) (context.Context, func()) {
	ctx, cancelCause := context.WithCancelCause(ctx)
	cancel := func() { cancelCause(nil) }
	h, err := windows.OpenProcess(windows.SYNCHRONIZE, false, uint32(os.Getppid()))
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
