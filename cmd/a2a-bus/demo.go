package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/a2a-bus/a2a-bus/host"
	"github.com/a2a-bus/a2a-bus/internal/secret"
	"github.com/a2a-bus/a2a-bus/liveview"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/wire"
)

func runDemo(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	busName := fs.String("bus", "nats", "the bus: nats (an embedded server) or pipe (the broker as a child process)")
	connFile := fs.String("connection-file", "", "join the running broker of this connection file instead of starting one")
	hold := fs.Bool("hold", false, "after the round trip, keep the delegates until interrupted, answering every task they are given (to look at them with status, or talk to them through the A2A gateway)")
	ui := fs.Bool("ui", false, "serve a live view of the demo for a web browser: the round trip starts once a page is open, and goes on every few seconds until interrupted")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: a2a-bus demo [--bus nats|pipe] [--ui]

Runs ADR 0162's cross-session round trip and prints it: two chat sessions
each spawn a delegate named discussant (the second becomes discussant-2),
they find each other across sessions, one hands the other a task, and the
answer wakes it. The broker keeps its tasks in a temporary folder, removed
at the end, and writes no connection file.

Examples:
  a2a-bus demo              # on an embedded NATS server
  a2a-bus demo --bus pipe   # the broker as a child process on a pipe
  a2a-bus demo --ui         # and watch it in a browser: open the address it prints
  a2a-bus demo --connection-file "$XDG_RUNTIME_DIR/a2a-bus/connection.json" --hold

Flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, nil); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return report(stderr, "demo", err)
	}
	kind, err := host.ParseBus(*busName)
	if err != nil {
		return report(stderr, "demo", usageErrorf("--bus: %q is not nats or pipe", *busName))
	}
	if *ui && (kind != host.NATS || *connFile != "" || *hold) {
		return report(stderr, "demo", usageErrorf("--ui: with the embedded NATS server, without --connection-file and --hold (a running broker has its own: serve --ui)"))
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// The broker keeps its tasks in a temporary data dir, removed after.
	dataDir, err := os.MkdirTemp("", "a2a-bus-demo-")
	if err != nil {
		return report(stderr, "demo", err)
	}
	defer os.RemoveAll(dataDir)
	cfg := host.Config{Bus: kind, DataDir: dataDir, Logger: log}
	if *connFile != "" {
		if kind != host.NATS {
			return report(stderr, "demo", usageErrorf("--connection-file joins a broker on NATS"))
		}
		cfg.ConnectionFile = *connFile
	}
	if kind == host.Pipe {
		self, err := os.Executable()
		if err != nil {
			return report(stderr, "demo", err)
		}
		cfg.BrokerCommand = []string{self, "serve", "--bus=pipe", "--data-dir=" + dataDir, "--log-level=warn"}
	}
	if err := demo(ctx, cfg, stdout, *hold, *ui); err != nil {
		return report(stderr, "demo", err)
	}
	return exitOK
}

// transcript prints numbered, timed lines.
type transcript struct {
	w     io.Writer
	start time.Time
}

func (t *transcript) say(who, format string, args ...any) {
	ms := float64(time.Since(t.start).Microseconds()) / 1000
	fmt.Fprintf(t.w, "  %8.2f ms  %-7s %s\n", ms, who, fmt.Sprintf(format, args...))
}

func text(m *wire.Message) string {
	if m == nil {
		return ""
	}
	var parts []string
	for _, p := range m.Parts {
		if p.Text != nil {
			parts = append(parts, *p.Text)
		}
	}
	return strings.Join(parts, " ")
}

func demo(parent context.Context, cfg host.Config, out io.Writer, hold, ui bool) error {
	ctx, cancel := context.WithTimeout(parent, 30*time.Second)
	defer cancel()
	h, err := host.Open(ctx, cfg)
	if err != nil {
		return err
	}
	defer h.Close()
	fmt.Fprintf(out, "a2a-bus demo: ADR 0162 cross-session round trip on %s\n\n", h.Describe())
	if ui {
		watched, stop, err := startDemoUI(h, out)
		if err != nil {
			return err
		}
		defer stop()
		select {
		case <-watched:
		case <-parent.Done():
			return nil
		}
		// The round trip's 30 s start now.
		cancel()
		ctx, cancel = context.WithTimeout(parent, 30*time.Second)
		defer cancel()
	}
	tr := &transcript{w: out, start: time.Now()}

	// With --ui, Ctrl-C is how the demo ends, at whatever point it is:
	// an error that the interruption caused ends it cleanly.
	interrupted := func() bool { return ui && parent.Err() != nil }
	d1, d2, closeSessions, err := spawnDiscussants(ctx, h, tr)
	defer closeSessions()
	if err != nil {
		if interrupted() {
			return nil
		}
		return err
	}
	var roundTrip time.Duration
	err = discover(ctx, tr, d1)
	if err == nil {
		roundTrip, err = takeSeats(ctx, tr, d1, d2)
	}
	if err != nil && !interrupted() {
		return err
	}
	tookSeats := err == nil
	if hold {
		// Held, the delegates answer whatever task they are given, as an
		// A2A client through the gateway sees (README: "Talk to a delegate
		// from any A2A client").
		var answering sync.WaitGroup
		for _, d := range []*runtime.Delegate{d1, d2} {
			answering.Go(func() { answer(parent, tr, d, 0) })
		}
		tr.say("both", "holding the delegates until interrupted; each answers the tasks it is given")
		<-parent.Done()
		answering.Wait()
	}
	if ui && tookSeats {
		tr.say("both", "asking again every few seconds until interrupted")
		if err := keepAsking(parent, tr, d1, d2); err != nil {
			return err
		}
	}
	if hold || ui {
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
	}
	for _, d := range []*runtime.Delegate{d1, d2} {
		if err := d.Settle(ctx); err != nil {
			return err
		}
	}
	tr.say("both", "delegates settled (deregistered)")
	if tookSeats {
		fmt.Fprintf(out, "\nround trip, send to the requester's wake-up: %.2f ms\n", float64(roundTrip.Microseconds())/1000)
	}
	return nil
}

// answer works every task d is given until ctx ends: working, with an
// artifact that echoes the request, then, after pause, completed with a
// message.
func answer(ctx context.Context, tr *transcript, d *runtime.Delegate, pause time.Duration) {
	for {
		ev, err := d.Wait(ctx)
		if err != nil {
			return
		}
		if ev.Task == nil || ev.Task.Kind != wire.EventCreated {
			continue
		}
		id, asked := ev.Task.TaskID, text(ev.Task.Message)
		tr.say(d.SessionID(), "%s wakes: task %s from %s: %q", d.ID(), short(id), ev.Task.Task.RequesterName, asked)
		if _, err := d.Update(ctx, id, wire.StateWorking, nil, wire.Artifact{Name: "echo", Parts: []wire.Part{wire.TextPart(asked)}}); err != nil {
			continue
		}
		if pause > 0 {
			select {
			case <-time.After(pause):
			case <-ctx.Done():
				return
			}
		}
		reply := &wire.Message{Parts: []wire.Part{wire.TextPart(fmt.Sprintf("%s heard: %s", d.ID(), asked))}}
		if _, err := d.Update(ctx, id, wire.StateCompleted, reply); err == nil {
			tr.say(d.SessionID(), "%s: completed task %s", d.ID(), short(id))
		}
	}
}

// spawnDiscussants opens chat-1 and chat-2 and spawns a "discussant" in
// each: the second is named discussant-2. closeSessions closes what was
// opened, also when err is set.
func spawnDiscussants(ctx context.Context, h *host.Host, tr *transcript) (d1, d2 *runtime.Delegate, closeSessions func(), err error) {
	card := wire.AgentCard{Name: "discussant", Description: "takes a seat at the roundtable"}
	var opened []*runtime.Runtime
	closeSessions = func() {
		for _, rt := range slices.Backward(opened) {
			rt.Close()
		}
	}
	var ds [2]*runtime.Delegate
	for i, chat := range []string{"chat-1", "chat-2"} {
		rt, err := h.Session(ctx, chat)
		if err != nil {
			return nil, nil, closeSessions, err
		}
		opened = append(opened, rt)
		if ds[i], err = rt.Spawn(ctx, card); err != nil {
			return nil, nil, closeSessions, err
		}
		tr.say(chat, "spawned %q: %s", card.Name, ds[i].Prompt())
	}
	return ds[0], ds[1], closeSessions, nil
}

// discover lists what d sees: the other session's discussant.
func discover(ctx context.Context, tr *transcript, d *runtime.Delegate) error {
	peers, err := d.Peers(ctx)
	if err != nil {
		return err
	}
	for _, p := range peers {
		tr.say(d.SessionID(), "%s discovers %s in session %s", d.ID(), p.AgentID, p.ContextID)
	}
	return nil
}

// takeSeats is the round trip: d1 asks without naming a peer, d2 wakes,
// works and completes with an artifact, d1 wakes to the result. It
// returns the time from the send to d1's wake-up.
func takeSeats(ctx context.Context, tr *transcript, d1, d2 *runtime.Delegate) (time.Duration, error) {
	sent := time.Now()
	task, err := d1.Send(ctx, "", wire.Message{Parts: []wire.Part{wire.TextPart("Shall we share the roundtable? I take seat 1.")}}, nil)
	if err != nil {
		return 0, err
	}
	tr.say("chat-1", "%s sends, without naming a peer, task %s to %s: %q", d1.ID(), short(task.ID), task.AgentName, text(&task.History[0]))

	ev, err := d2.Wait(ctx)
	if err != nil {
		return 0, err
	}
	if ev.Task == nil {
		return 0, fmt.Errorf("discussant-2 woke without its task: %+v", ev)
	}
	tr.say("chat-2", "%s wakes: task %s %s by %s of %s", d2.ID(), short(ev.Task.TaskID), ev.Task.Kind, ev.Task.Message.From, ev.Task.ContextID)
	if _, err := d2.Update(ctx, ev.Task.TaskID, wire.StateWorking, nil); err != nil {
		return 0, err
	}
	tr.say("chat-2", "%s: working", d2.ID())
	seats, err := wire.DataPart(map[string]int{"discussant": 1, "discussant-2": 2})
	if err != nil {
		return 0, err
	}
	answer := &wire.Message{Parts: []wire.Part{wire.TextPart("Agreed: seat 2 is mine.")}}
	if _, err := d2.Update(ctx, ev.Task.TaskID, wire.StateCompleted, answer, wire.Artifact{Name: "seats", Parts: []wire.Part{seats}}); err != nil {
		return 0, err
	}
	tr.say("chat-2", "%s: completed, with an artifact of the seats", d2.ID())

	ev, err = waitTask(ctx, d1, task.ID)
	if err != nil {
		return 0, err
	}
	roundTrip := time.Since(sent)
	tr.say("chat-1", "%s wakes: task %s %s: %q", d1.ID(), short(ev.Task.TaskID), ev.Task.Task.Status.State, text(ev.Task.Message))
	return roundTrip, nil
}

// waitTask waits for the final event of a task.
func waitTask(ctx context.Context, d *runtime.Delegate, id string) (runtime.Event, error) {
	for {
		ev, err := d.Wait(ctx)
		if err != nil {
			return ev, err
		}
		if ev.Task != nil && ev.Task.TaskID == id && ev.Task.Final {
			return ev, nil
		}
	}
}

// short shows the end of a task id: its start is a timestamp, the same
// for tasks made close together.
func short(id string) string {
	if len(id) > 8 {
		return "…" + id[len(id)-8:]
	}
	return id
}

// startDemoUI serves the live view of the demo's broker on loopback and
// prints the address to open. watched is closed once a page follows it.
func startDemoUI(h *host.Host, out io.Writer) (watched <-chan struct{}, stop func(), err error) {
	c, ok := h.Client().(*natsbus.Client)
	if !ok {
		return nil, nil, errors.New("--ui: the live view needs the embedded NATS server")
	}
	token := secret.Hex(32)
	view, err := liveview.New(c, liveview.Config{Token: token})
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		view.Close()
		return nil, nil, err
	}
	srv := &http.Server{Handler: view.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 30 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(ln)
	}()
	fmt.Fprintf(out, "live view: open http://%s/#token=%s\nThe round trip starts once the page is open; Ctrl-C ends the demo.\n\n", ln.Addr(), token)
	return view.Watched(), func() {
		view.Close()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			srv.Close()
		}
		<-served
	}, nil
}

// keepAsking has d1 hand d2 a task every few seconds until ctx ends; d2
// works on each for a second, so that a live view shows it working.
func keepAsking(ctx context.Context, tr *transcript, d1, d2 *runtime.Delegate) error {
	var answering sync.WaitGroup
	answering.Go(func() { answer(ctx, tr, d2, time.Second) })
	defer answering.Wait()
	for round := 2; ; round++ {
		select {
		case <-time.After(3 * time.Second):
		case <-ctx.Done():
			return nil
		}
		task, err := d1.Send(ctx, d2.ID(), wire.Message{Parts: []wire.Part{wire.TextPart(fmt.Sprintf("Round %d: shall we swap seats?", round))}}, nil)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		tr.say(d1.SessionID(), "%s asks %s: task %s", d1.ID(), task.AgentName, short(task.ID))
		ev, err := waitTask(ctx, d1, task.ID)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		tr.say(d1.SessionID(), "%s wakes: task %s %s: %q", d1.ID(), short(task.ID), ev.Task.Task.Status.State, text(ev.Task.Message))
	}
}
