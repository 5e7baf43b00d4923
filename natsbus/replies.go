package natsbus

import (
	"context"
	"errors"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"
)

// replyMux receives the replies of one client's requests through a
// single subscription: reply subjects are _INBOX.<T>.<id>.<n>, <id> being
// the client's and <n> the request's. A session credential's client
// reads its own session's inbox, the host's every session's.
//
// The subscription delivers into a channel that the callers waiting for
// a reply read themselves: nats.go's reader hands a reply straight to a
// waiting caller, with no goroutine in between. A caller that reads
// another's reply passes it on to that caller's own channel; one that
// reads a reply nobody waits for any more drops it. Every waiting caller
// reads the channel, so a reply never waits there while its caller does.
type replyMux struct {
	id      string
	sub     *nats.Subscription
	replies chan *nats.Msg

	mu      sync.Mutex
	next    uint64
	waiting map[string]chan *nats.Msg
}

// replyBuffer is how many replies wait in the mux's channel before
// nats.go drops one (a slow consumer). A reply waits there only while
// its caller is not parked on the channel (it is passing on another's
// reply, or it is gone); those of calls given up wait for the next
// caller, which drops them.
const replyBuffer = 4096

func newReplyMux(nc *nats.Conn, session string) (*replyMux, error) {
	m := &replyMux{id: nats.NewInbox()[len(nats.InboxPrefix):], waiting: map[string]chan *nats.Msg{},
		replies: make(chan *nats.Msg, replyBuffer)}
	inbox := InboxPrefix + "*"
	if session != "" {
		inbox = SessionInbox(session)
	}
	sub, err := nc.ChanSubscribe(inbox+"."+m.id+".*", m.replies)
	if err != nil {
		return nil, err
	}
	m.sub = sub
	return m, nil
}

// claim returns the channel of the caller waiting for msg, and forgets
// it: nil when no caller waits for it (any more).
func (m *replyMux) claim(msg *nats.Msg) chan *nats.Msg {
	m.mu.Lock()
	defer m.mu.Unlock()
	ch := m.waiting[msg.Subject]
	delete(m.waiting, msg.Subject)
	return ch
}

// errRequestEnded: the request's scope or link ended before its reply.
var errRequestEnded = errors.New("natsbus: the request ended")

// request publishes data on subject with a reply subject under inbox and
// waits for the reply, as nats.Conn.RequestWithContext does, until ctx,
// scope or link ends: selecting on the three costs no context of its
// own.
func (m *replyMux) request(ctx, scope, link context.Context, nc *nats.Conn, subject, inbox string, header nats.Header, data []byte) (*nats.Msg, error) {
	ch := make(chan *nats.Msg, 1)
	var name [128]byte
	subj := append(append(append(append(name[:0], inbox...), '.'), m.id...), '.')
	m.mu.Lock()
	m.next++
	reply := string(strconv.AppendUint(subj, m.next, 36))
	m.waiting[reply] = ch
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.waiting, reply)
		m.mu.Unlock()
	}()
	var err error
	if header != nil {
		err = nc.PublishMsg(&nats.Msg{Subject: subject, Reply: reply, Header: header, Data: data})
	} else {
		err = nc.PublishRequest(subject, reply, data)
	}
	if err != nil {
		return nil, err
	}
	for {
		var msg *nats.Msg
		select {
		case msg = <-ch:
		case msg = <-m.replies:
			if msg.Subject != reply {
				if to := m.claim(msg); to != nil {
					to <- msg // buffered, and claimed once: never blocks
				}
				continue
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-scope.Done():
			return nil, errRequestEnded
		case <-link.Done():
			return nil, errRequestEnded
		}
		// The server answers for a subject nobody serves with an empty
		// status message, as nats.go's own requests see it.
		if len(msg.Data) == 0 && msg.Header.Get("Status") == "503" {
			return nil, nats.ErrNoResponders
		}
		return msg, nil
	}
}
