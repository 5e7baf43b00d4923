package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/pipebus"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/wire"
)

// serveOptions are serve's settings, from flags and the config file.
type serveOptions struct {
	bus                string
	maxTasksPerContext int
	maxMessageBytes    int
	replayWindow       int
	orphanTimeout      time.Duration
	logLevel           string
	config             string
}

func serveFlags(o *serveOptions, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.bus, "bus", "nats", "the bus: nats or pipe")
	fs.IntVar(&o.maxTasksPerContext, "max-tasks-per-context", broker.DefaultMaxTasksPerContext, "open tasks a session may have requested")
	fs.IntVar(&o.maxMessageBytes, "max-message-bytes", wire.DefaultMaxMessageBytes, "the largest message, on every bus")
	fs.IntVar(&o.replayWindow, "replay-window", broker.DefaultReplayWindow, "notifications kept per session for a2a.events.replay")
	fs.DurationVar(&o.orphanTimeout, "orphan-timeout", broker.DefaultOrphanTimeout, "after a restart, how long open tasks wait for their members (0 disables)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.config, "config", "", "a JSON file of settings: keys are these flag names without dashes; flags win")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: a2a-bus serve [flags]

Runs the broker until SIGINT or SIGTERM (or, with --bus=pipe, the end of
its stdin), then exits 0. Logs go to stderr.

Examples:
  a2a-bus serve --bus=pipe          # JSON-RPC lines on stdin/stdout
  a2a-bus serve --config a2a.json   # {"bus": "pipe", "max-tasks-per-context": 64}

Flags:
`)
		fs.PrintDefaults()
	}
	return fs
}

func runServe(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var o serveOptions
	fs := serveFlags(&o, stderr)
	if err := parseFlags(fs, args, &o.config); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return report(stderr, "serve", err)
	}
	if err := o.validate(); err != nil {
		return report(stderr, "serve", err)
	}
	log, err := newLogger(stderr, o.logLevel)
	if err != nil {
		return report(stderr, "serve", err)
	}
	if err := serve(ctx, o, log); err != nil {
		return report(stderr, "serve", err)
	}
	return exitOK
}

func (o *serveOptions) validate() error {
	switch o.bus {
	case "nats", "pipe":
	default:
		return usageErrorf("--bus: %q is not nats or pipe", o.bus)
	}
	if o.maxTasksPerContext < 1 {
		return usageErrorf("--max-tasks-per-context: must be at least 1")
	}
	if o.maxMessageBytes < 1024 {
		return usageErrorf("--max-message-bytes: must be at least 1024")
	}
	if o.replayWindow < 1 {
		return usageErrorf("--replay-window: must be at least 1")
	}
	if o.orphanTimeout < 0 {
		return usageErrorf("--orphan-timeout: must not be negative")
	}
	return nil
}

func (o *serveOptions) brokerConfig(st store.Store, log *slog.Logger) broker.Config {
	orphan := o.orphanTimeout
	if orphan == 0 {
		orphan = -1 // the flag's 0 disables; the Config's 0 is the default
	}
	return broker.Config{
		Store:              st,
		MaxTasksPerContext: o.maxTasksPerContext,
		MaxMessageBytes:    o.maxMessageBytes,
		ReplayWindow:       o.replayWindow,
		OrphanTimeout:      orphan,
		Logger:             log,
	}
}

func serve(ctx context.Context, o serveOptions, log *slog.Logger) error {
	st := store.NewMemory()
	defer st.Close()
	switch o.bus {
	case "pipe":
		return servePipe(ctx, o, st, log)
	default:
		return fmt.Errorf("--bus=%s is not available in this build", o.bus)
	}
}

func servePipe(ctx context.Context, o serveOptions, st store.Store, log *slog.Logger) error {
	in, out := pipebus.Stdio(log)
	bus := pipebus.New(in, out, pipebus.Config{MaxMessageBytes: o.maxMessageBytes, Logger: log})
	b, err := broker.New(bus, o.brokerConfig(st, log))
	if err != nil {
		bus.Close()
		return err
	}
	log.Info("serving on the pipe", "maxMessageBytes", o.maxMessageBytes)
	select {
	case <-ctx.Done():
		log.Info("signal received: shutting down")
	case <-bus.Done():
	}
	bus.Close()
	b.Close()
	if err := bus.Err(); err != nil {
		return err
	}
	log.Info("stopped")
	return nil
}
