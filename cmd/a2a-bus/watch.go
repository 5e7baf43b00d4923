package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/wire"
)

func runWatch(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("watch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var h hostFlags
	h.register(fs)
	session := fs.String("session", "", "watch one session only")
	replay := fs.Bool("replay", false, "first print the events the broker still keeps")
	count := fs.Int("count", 0, "stop after this many events (0: until interrupted)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: a2a-bus watch [flags]

Prints the notifications of every session (or one), one line each, as
the broker publishes them, until Ctrl-C.

Examples:
  a2a-bus watch
  a2a-bus watch --session chat-2
  a2a-bus watch --replay --count 10

Flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, nil); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return report(stderr, "watch", err)
	}
	if *count < 0 {
		return report(stderr, "watch", usageErrorf("--count must not be negative"))
	}
	if *session != "" {
		if err := wire.ValidateID("--session", *session); err != nil {
			return report(stderr, "watch", usageErrorf("%v", err))
		}
	}
	c, ref, err := h.dial()
	if err != nil {
		return report(stderr, "watch", err)
	}
	defer c.Close()
	subject, msgs, stop, err := subscribeEvents(c, *session)
	if err != nil {
		return report(stderr, "watch", err)
	}
	defer stop()
	fmt.Fprintf(stderr, "watching %s on %s; Ctrl-C to stop\n", subject, ref.url)

	p := &eventPrinter{w: stdout, limit: *count, printed: map[[2]string]uint64{}}
	if *replay {
		if done, err := replayKept(ctx, c, *session, p.show); err != nil {
			return report(stderr, "watch", err)
		} else if done {
			return exitOK
		}
	}
	for {
		select {
		case m := <-msgs:
			if p.show(m.Data) {
				return exitOK
			}
		case <-c.Gone():
			return report(stderr, "watch", errors.New("the connection to the broker was lost"))
		case <-ctx.Done():
			return exitOK
		}
	}
}

// subscribeEvents subscribes the host connection to the events of every
// session, or of one, and returns once the server has the subscription.
func subscribeEvents(c *natsbus.Client, session string) (subject string, msgs chan *nats.Msg, stop func(), err error) {
	subject = "a2a.session.*.events"
	if session != "" {
		subject = natsbus.EventsSubject(session)
	}
	msgs = make(chan *nats.Msg, 1<<14)
	sub, err := c.Conn().ChanSubscribe(subject, msgs)
	if err != nil {
		return "", nil, nil, err
	}
	if err := c.Conn().Flush(); err != nil {
		sub.Unsubscribe()
		return "", nil, nil, err
	}
	return subject, msgs, func() { sub.Unsubscribe() }, nil
}

// eventPrinter prints events one line each, once: it remembers the last
// seq printed per (epoch, session), so a replayed event is not printed
// twice and a broker that restarts starts counting anew.
type eventPrinter struct {
	w       io.Writer
	limit   int // stop after this many (0: never)
	n       int
	printed map[[2]string]uint64
}

// show prints raw if it is an event not printed yet, and reports whether
// the limit is reached.
func (p *eventPrinter) show(raw []byte) bool {
	ev, err := wire.DecodeEvent(raw)
	if err != nil {
		return false
	}
	h := ev.Head()
	key := [2]string{h.Epoch, h.RecipientContextID}
	if h.Seq <= p.printed[key] {
		return false // replayed already
	}
	p.printed[key] = h.Seq
	fmt.Fprintln(p.w, describe(ev))
	p.n++
	return p.limit > 0 && p.n >= p.limit
}

// replayKept prints the events the broker keeps, session by session.
func replayKept(ctx context.Context, c *natsbus.Client, only string, show func([]byte) bool) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var sessions []wire.AdminSession
	var epoch string
	err := hostList(cctx, c, wire.MethodAdminSessions, func(raw json.RawMessage) (string, error) {
		var page wire.AdminSessions
		err := json.Unmarshal(raw, &page)
		sessions, epoch = append(sessions, page.Sessions...), page.Epoch
		return page.NextPageToken, err
	})
	if err != nil {
		return false, err
	}
	for _, s := range sessions {
		if only != "" && s.ContextID != only || s.Kept == 0 {
			continue
		}
		sess, err := c.Session(cctx, s.ContextID)
		if err != nil {
			return false, err
		}
		// A replay answers a page at a time, up to the last seq it had.
		for after := s.LastSeq - uint64(s.Kept); after < s.LastSeq; {
			raw, err := sess.Call(cctx, wire.MethodReplay, wire.ReplayParams{ContextID: s.ContextID, Epoch: &epoch, AfterSeq: &after})
			if err != nil {
				break // moved on meanwhile: the live tail shows the rest
			}
			var res wire.ReplayResult
			if json.Unmarshal(raw, &res) != nil || len(res.Events) == 0 {
				break
			}
			for _, e := range res.Events {
				if show(e) {
					return true, nil
				}
			}
			after += uint64(len(res.Events))
		}
	}
	return false, nil
}

// describe makes one readable line of a notification.
func describe(ev *wire.Event) string {
	h := ev.Head()
	at := time.Now().Format("15:04:05.000")
	who := fmt.Sprintf("%s %-12s #%-4d %s", at, h.RecipientContextID, h.Seq, h.Recipient)
	if p := ev.Push; p != nil {
		return fmt.Sprintf("%s  push from %s (%s): %s", who, p.From, p.ContextID, quoteText(p.Message))
	}
	te := ev.TaskEvent
	line := fmt.Sprintf("%s  task %s %s", who, short(te.TaskID), te.Kind)
	if te.Task != nil {
		line += " " + string(te.Task.Status.State)
	}
	if te.Message != nil {
		line += fmt.Sprintf(" from %s: %s", te.Message.From, quoteText(te.Message))
	}
	if te.Final {
		line += " (final)"
	}
	return line
}

func quoteText(m *wire.Message) string {
	s := text(m)
	if len(s) > 60 {
		s = s[:60] + "…"
	}
	return fmt.Sprintf("%q", strings.TrimSpace(s))
}
