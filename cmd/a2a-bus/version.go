package main

import (
	"context"
	"fmt"
	"io"

	"github.com/a2a-bus/a2a-bus/internal/version"
)

func runVersion(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
			fmt.Fprintln(stdout, "Usage: a2a-bus version\n\nPrints the version of a2a-bus and of Go it was built with.\n\nExample:\n  a2a-bus version")
			return exitOK
		}
		fmt.Fprintf(stderr, "a2a-bus version: unexpected argument %q\n", args[0])
		return exitUsage
	}
	fmt.Fprintf(stdout, "a2a-bus %s (%s)\n", version.String(), version.Go())
	return exitOK
}
