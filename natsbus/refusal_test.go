package natsbus_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/transport"
)

// TestASubscriptionPastTheServersCapIsAnError: a server that allows fewer
// subscriptions per connection than a host holds sessions (an operator's
// setting) refuses the one past its cap; the host's Subscribe says so,
// with the server's reason, instead of the server's log alone. The
// subscriptions it took still bring their events, the next past the cap
// is refused without asking, and one freed makes room for another.
func TestASubscriptionPastTheServersCapIsAnError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := natsbus.New(natsbus.Config{CloseGrace: testGrace, Server: natsbus.ServerConfig{MaxSubscriptions: 4}})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	c, err := b.Connect(natsbus.ClientConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })

	var subs []transport.Subscription
	var refusal error
	for i := range 8 {
		s, err := c.Session(ctx, fmt.Sprint("chat-", i))
		require.NoError(t, err)
		sub, err := s.Subscribe(ctx)
		if err != nil {
			refusal = err
			break
		}
		subs = append(subs, sub)
	}
	require.Error(t, refusal, "8 subscriptions on a connection allowed 4")
	assert.ErrorIs(t, refusal, transport.ErrRefused)
	assert.Contains(t, refusal.Error(), "maximum subscriptions exceeded")
	require.NotEmpty(t, subs)
	require.LessOrEqual(t, len(subs), 4)

	for i := range subs {
		require.NoError(t, b.Publish(fmt.Sprint("chat-", i), []byte(fmt.Sprintf(`{"n":%d}`, i))))
	}
	for i, sub := range subs {
		select {
		case got := <-sub.C():
			assert.Equal(t, fmt.Sprintf(`{"n":%d}`, i), string(got), "session %d", i)
		case <-time.After(10 * time.Second):
			t.Fatalf("session %d, subscribed before the cap, never got its event", i)
		}
	}

	next, err := c.Session(ctx, "chat-next")
	require.NoError(t, err)
	_, err = next.Subscribe(ctx)
	require.ErrorIs(t, err, transport.ErrRefused, "past the cap learned")

	require.NoError(t, subs[0].Close())
	sub, err := next.Subscribe(ctx)
	require.NoError(t, err, "a subscription freed makes room")
	require.NoError(t, b.Publish("chat-next", []byte(`{"next":true}`)))
	select {
	case got := <-sub.C():
		assert.Equal(t, `{"next":true}`, string(got))
	case <-time.After(10 * time.Second):
		t.Fatal("the subscription made in the freed room never got its event")
	}
}

// TestASubscriptionThePermissionsRefuseIsAnError: a client given one
// session's credentials for another session (a host's mistake) is refused
// that session's events by the server, and Subscribe says so.
func TestASubscriptionThePermissionsRefuseIsAnError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := newBus(t)
	br, err := broker.New(context.Background(), b, broker.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { br.Close() })
	creds := openSession(t, b, "s1")
	c, err := natsbus.Dial(natsbus.ClientConfig{URL: creds.URL, User: creds.User, Password: creds.Password, Session: "s2", NoReconnect: true})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	s, err := c.Session(ctx, "s2")
	require.NoError(t, err)
	_, err = s.Subscribe(ctx)
	require.ErrorIs(t, err, transport.ErrRefused)
	assert.Contains(t, err.Error(), natsbus.EventsSubject("s2"))
	assert.Contains(t, err.Error(), "Permissions Violation")

	right, err := natsbus.Dial(natsbus.ClientConfig{URL: creds.URL, User: creds.User, Password: creds.Password, Session: "s1", NoReconnect: true})
	require.NoError(t, err)
	t.Cleanup(func() { right.Close() })
	s1, err := right.Session(ctx, "s1")
	require.NoError(t, err)
	sub, err := s1.Subscribe(ctx)
	require.NoError(t, err, "the session's own events are not refused")
	require.NoError(t, sub.Close())
}
