package gateway

import (
	"context"
	"errors"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// DefaultMaxCalls bounds the gateway's calls to the broker under way at
// once (Config.MaxCalls). Each may bring back a task as large as the
// server's payload limit, and the server cuts a connection that has more
// than four of those waiting for it (natsbus: maxPending): fifty clients
// reading a 6 MB task at once are served two at a time instead of
// having the gateway's connection cut, all of their reads with it (issue
// #29).
const DefaultMaxCalls = 2

// readPatience is how long a read whose answer was lost (the broker
// unavailable: the gateway's connection was cut and is being made again)
// is tried again before the client is told.
const readPatience = 10 * time.Second

// call runs f in one of the gateway's call slots.
func (g *Gateway) call(ctx context.Context, f func() error) error {
	select {
	case g.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-g.ctx.Done():
		return errShuttingDown
	}
	defer func() { <-g.slots }()
	return f()
}

var errShuttingDown = a2a.NewError(a2a.ErrInternalError, "the gateway is shutting down")

// read runs a read in a call slot, and again, for up to readPatience,
// while the broker is unavailable: a read may be repeated, and a cut of
// the gateway's connection is then no error its clients see. (A change
// is tried again by the runtime, under its idempotency key.)
func (g *Gateway) read(ctx context.Context, f func() error) error {
	// Patience counts from the first loss, not from the call: a read
	// that waited its turn behind a flood of others has lost nothing yet.
	var giveUp time.Time
	wait := 50 * time.Millisecond
	for {
		err := g.call(ctx, f)
		if !errors.Is(err, transport.ErrUnavailable) {
			return err
		}
		if giveUp.IsZero() {
			giveUp = time.Now().Add(readPatience)
		} else if time.Now().After(giveUp) {
			return err
		}
		g.log.Debug("a read through the gateway was lost; trying again", "error", err)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		case <-g.ctx.Done():
			t.Stop()
			return err
		}
		wait = min(2*wait, time.Second)
	}
}

// task reads a task of the gateway's agent (read).
func (g *Gateway) task(ctx context.Context, id string) (t *wire.Task, err error) {
	err = g.read(ctx, func() error {
		t, err = g.agent(ctx).Task(ctx, id)
		return err
	})
	return t, err
}

// peers reads the live agents' cards (read).
func (g *Gateway) peers(ctx context.Context) (cards []wire.AgentCard, err error) {
	err = g.read(ctx, func() error {
		cards, err = g.def.d.Peers(ctx)
		return err
	})
	return cards, err
}
