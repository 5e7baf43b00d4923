// Command a2a-bus runs the host-wide A2A broker and its tools.
//
//	a2a-bus serve [flags]   run the broker (NATS by default, or --bus=pipe)
//	a2a-bus demo [--bus]    run the cross-session round trip and show it
//	a2a-bus status          show a running broker's agents, tasks and sessions
//	a2a-bus watch           print a running broker's notifications as they come
//	a2a-bus version         print the version
//	a2a-bus help [command]  show help
//
// Logs go to stderr; with --bus=pipe, stdout carries only the protocol.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
)

func main() {
	ignoreBrokenPipes()
	ctx, stop := signal.NotifyContext(context.Background(), shutdownSignals...)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int
}

func commands() []command {
	return []command{
		{"serve", "run the broker", runServe},
		{"demo", "run the cross-session round trip and show it", runDemo},
		{"status", "show a running broker's agents, tasks and sessions", runStatus},
		{"watch", "print a running broker's notifications as they come", runWatch},
		{"version", "print the version", runVersion},
	}
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			// Asked for: the help goes to stdout.
			return run(ctx, []string{args[1], "--help"}, stdin, stdout, stdout)
		}
		usage(stdout)
		return exitOK
	}
	for _, c := range commands() {
		if c.name == name {
			return c.run(ctx, args[1:], stdin, stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "a2a-bus: unknown command %q (see a2a-bus help)\n", name)
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "a2a-bus: the host-wide agent-to-agent broker.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: a2a-bus <command> [flags]")
	fmt.Fprintln(w)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run a2a-bus help <command> for its flags.")
}
