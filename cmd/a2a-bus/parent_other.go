//go:build !unix && !windows

package main

import "context"

// watchParent does not watch yet where there is no parent pid to poll:
// the context ends with ctx only.
func watchParent(ctx context.Context, _ int) (context.Context, func()) {
	return context.WithCancel(ctx)
}
