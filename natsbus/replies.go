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
type replyMux struct {
	id  string
	sub *nats.Subscription

	mu      sync.Mutex
	next    uint64
	waiting map[string]chan *nats.Msg
}

func newReplyMux(nc *nats.Conn, session string) (*replyMux, error) {
	m := &replyMux{id: nats.NewInbox()[len(nats.InboxPrefix):], waiting: map[string]chan *nats.Msg{}}
	inbox := InboxPrefix + "*"
	if session != "" {
		inbox = SessionInbox(session)
	}
	sub, err := nc.Subscribe(inbox+"."+m.id+".*", m.deliver)
	if err != nil {
		return nil, err
	}
	m.sub = sub
	return m, nil
}

func (m *replyMux) deliver(msg *nats.Msg) {
	m.mu.Lock()
	ch := m.waiting[msg.Subject]
	delete(m.waiting, msg.Subject)
	m.mu.Unlock()
	if ch != nil {
		ch <- msg // buffered: never blocks
	}
}

// errRequestEnded: the request's scope or link ended before its reply.
var errRequestEnded = errors.New("natsbus: the request ended")

// request publishes data on subject with a reply subject under inbox and
// waits for the reply, as nats.Conn.RequestWithContext does, until ctx,
// scope or link ends: selecting on the three costs no context of its
// own.
func (m *replyMux) request(ctx, scope, link context.Context, nc *nats.Conn, subject, inbox string, data []byte) (*nats.Msg, error) {
	ch := make(chan *nats.Msg, 1)
	m.mu.Lock()
	m.next++
	reply := inbox + "." + m.id + "." + strconv.FormatUint(m.next, 36)
	m.waiting[reply] = ch
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.waiting, reply)
		m.mu.Unlock()
	}()
	if err := nc.PublishRequest(subject, reply, data); err != nil {
		return nil, err
	}
	select {
	case msg := <-ch:
		// The server answers for a subject nobody serves with an empty
		// status message, as nats.go's own requests see it.
		if len(msg.Data) == 0 && msg.Header.Get("Status") == "503" {
			return nil, nats.ErrNoResponders
		}
		return msg, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-scope.Done():
		return nil, errRequestEnded
	case <-link.Done():
		return nil, errRequestEnded
	}
}
