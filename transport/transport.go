package transport

import (
	"context"
	"encoding/json"
	"errors"
)

// Named errors. Implementations wrap them with %w, so callers test with
// errors.Is.
var (
	// ErrClosed is returned by every method of a Bus, Client, Session or
	// Subscription after its Close, and by calls still pending when it
	// closed.
	ErrClosed = errors.New("transport: closed")

	// ErrUnavailable is returned by Call when the broker cannot be
	// reached: the pipe's child exited, no broker serves the NATS subject,
	// the connection was lost, or (the fake) the session was disconnected.
	// The cause is wrapped with it.
	ErrUnavailable = errors.New("transport: broker unavailable")

	// ErrTooLarge is returned by Call, before sending, when the request
	// encodes to more than the bus's message limit.
	ErrTooLarge = errors.New("transport: message too large")

	// ErrRefused is returned by Subscribe when the server behind the bus
	// refused the subscription (NATS: a permission it does not grant, or
	// its cap on subscriptions per connection): trying again does not
	// help. The server's reason is wrapped with it.
	ErrRefused = errors.New("transport: subscription refused")

	// ErrServing is returned by a second call to Bus.Serve.
	ErrServing = errors.New("transport: already serving")
)

// Scope says which methods a caller may call, as the bus vouches for it.
// The zero Scope is invalid.
type Scope uint8

const (
	// ScopeSession: the agent methods, for Caller.Session only. A NATS
	// request on a2a.rpc.<T> has this scope.
	ScopeSession Scope = iota + 1
	// ScopeHost: only the host-only methods (a2a.sessions.*, admin
	// extensions). A NATS request on a2a.host.rpc has this scope.
	ScopeHost
	// ScopeOwner: every method, for any session. The pipe's owner (the
	// host at the other end) has this scope.
	ScopeOwner
)

// String returns the scope's name.
func (s Scope) String() string {
	switch s {
	case ScopeSession:
		return "session"
	case ScopeHost:
		return "host"
	case ScopeOwner:
		return "owner"
	}
	return "invalid"
}

// Caller is who sent a request, as far as the bus can tell.
type Caller struct {
	// Scope says which methods the caller may call.
	Scope Scope
	// Session is the calling session's id when Scope is ScopeSession, and
	// empty otherwise. The bus vouches for it (NATS takes it from the
	// subject, whose publish permission the server enforces), so the
	// broker refuses a token or contextId of another session.
	Session string
	// HomeBroker is, in a cluster, the broker of the caller's own host as
	// the caller's client names it (NATS: the A2A-Broker header,
	// docs/PROTOCOL.md §13), or "" when it names none. The bus does not
	// vouch for it: it says which broker the caller's agents belong to,
	// which is the caller's own business.
	HomeBroker string
}

// Handler serves requests. The broker is the Handler.
type Handler interface {
	// ServeRPC answers one request. req is the message exactly as it
	// arrived, unvalidated (the handler answers bad input with its
	// JSON-RPC error); it is not used after ServeRPC returns. The returned
	// bytes are the whole response, sent back as they are; nil means that
	// no response is due (a JSON-RPC notification).
	//
	// ServeRPC is called concurrently, one call per request, in no
	// particular order. ctx is canceled when the bus closes.
	ServeRPC(ctx context.Context, from Caller, req []byte) []byte
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func(ctx context.Context, from Caller, req []byte) []byte

// ServeRPC calls f.
func (f HandlerFunc) ServeRPC(ctx context.Context, from Caller, req []byte) []byte {
	return f(ctx, from, req)
}

// Bus is the broker's side of a transport.
//
// All methods are safe for concurrent use.
type Bus interface {
	// Serve starts delivering requests to h and returns once the bus
	// accepts them. Requests that arrive before Serve wait for it or fail
	// with ErrUnavailable, as the bus can. A second Serve returns
	// ErrServing; Serve after Close returns ErrClosed.
	Serve(h Handler) error

	// Publish delivers a notification to every current subscriber of
	// session, and to no other session's subscribers. msg is one encoded
	// JSON-RPC notification whose params carry recipientContextId equal to
	// session (a bus that broadcasts routes by it); the bus and the
	// subscribers treat msg as read-only, and the caller must not change
	// it afterwards.
	//
	// Notifications published to one session, one Publish returning
	// before the next is made (from one goroutine or handed from one to
	// the next, as the broker does), reach each subscriber in the order of
	// the Publish calls. Publish does not wait
	// for subscribers: a subscriber that falls behind loses notifications
	// (counted by its Dropped) instead of slowing the broker. A session
	// with no subscriber loses the notification silently; that is not an
	// error. After Close, Publish returns ErrClosed.
	Publish(session string, msg []byte) error

	// Close stops the bus: it stops taking requests, cancels the context
	// of running handler calls (a bus may first let them finish for a
	// grace period of its choosing, so that a clean shutdown answers them)
	// and waits for them to return, fails calls still pending on
	// in-process sessions with ErrClosed, and ends every subscription of
	// in-process sessions (their channels close). Calls pending at other
	// clients fail too: with ErrUnavailable when their link to the bus
	// goes, or with a wire.ErrInternal response saying that the broker is
	// shutting down when the link stays (a shared NATS server). Close is
	// idempotent; later calls return nil.
	Close() error
}

// Client opens sessions on a bus from the session side. A bus whose
// clients live in-process (the fake, embedded NATS) is its own Client.
type Client interface {
	// Session returns the session side for the session id. Sessions of
	// one Client are independent: closing one leaves the others working.
	Session(ctx context.Context, id string) (Session, error)

	// Close closes every session opened from this Client (their pending
	// calls fail with ErrClosed, their subscriptions end) and releases
	// the Client's connection. Idempotent.
	Close() error
}

// Session is one chat session's side of a bus.
//
// All methods are safe for concurrent use.
type Session interface {
	// ID returns the session id.
	ID() string

	// Call sends one request on behalf of this session and waits for its
	// response. params is encoded as JSON (json.RawMessage is sent as is;
	// nil is {}). A JSON-RPC error response is returned as a *wire.Error;
	// a request over the bus's size limit is ErrTooLarge; a broker that
	// cannot be reached is ErrUnavailable; a closed session, client or bus
	// is ErrClosed, also for calls pending when it closed; ctx ending
	// returns ctx.Err(). Concurrent calls are allowed and each gets its
	// own response.
	Call(ctx context.Context, method string, params any) (json.RawMessage, error)

	// Subscribe starts receiving this session's notifications and no
	// other session's. Each subscription receives every notification
	// published to the session after Subscribe returned, in publish
	// order, until it falls behind by more than its buffer. A session may
	// hold several subscriptions; each receives everything.
	Subscribe(ctx context.Context) (Subscription, error)

	// Close ends the session's subscriptions and fails its pending calls
	// with ErrClosed. It does not deregister agents: the broker's state
	// is not the bus's business. Idempotent.
	Close() error
}

// Subscription is a stream of one session's notifications.
type Subscription interface {
	// C returns the channel of notifications, each one whole encoded
	// JSON-RPC notification, read-only to the receiver. The channel is
	// closed when the subscription ends: by Close, by the closing of its
	// session, client or bus, or by the loss of the connection under it.
	C() <-chan []byte

	// Dropped counts notifications lost because the receiver fell behind
	// (the buffer of C was full).
	Dropped() uint64

	// Close ends the subscription and closes C. Idempotent.
	Close() error
}

// HostCaller is implemented by a Client that can send host-only requests
// (a2a.sessions.*, admin extensions): embedded NATS with the host
// credential, the pipe (whose owner is the host), the fake.
type HostCaller interface {
	// CallHost sends one host request; errors as Session.Call.
	CallHost(ctx context.Context, method string, params any) (json.RawMessage, error)
}

// HostMethod serves one host-only method that a bus provides itself
// (NATS: a2a.sessions.open). params is the request's params object; the
// result is encoded as the response's result. A returned *wire.Error is
// sent as it is; any other error is an internal error.
type HostMethod func(ctx context.Context, params json.RawMessage) (any, error)

// HostMethodProvider is implemented by a Bus that serves host-only
// methods of its own. The broker finds it by type assertion and
// dispatches those methods, with the usual request checks, to ScopeHost
// and ScopeOwner callers.
type HostMethodProvider interface {
	HostMethods() map[string]HostMethod
}

// DefaultSubscriptionBuffer is how many notifications a subscription
// holds for a receiver that is not reading, unless the bus is configured
// otherwise.
const DefaultSubscriptionBuffer = 4096

// SubscriberCounter is implemented by a Bus that can tell how many
// subscriptions receive a session's notifications (the embedded NATS
// server can; the pipe, whose subscribers are at the other end, cannot).
// The broker's admin methods report it.
type SubscriberCounter interface {
	// Subscribers returns the number of subscriptions receiving session's
	// notifications, and false when the bus cannot tell.
	Subscribers(session string) (int, bool)
}

// PayloadLimiter is implemented by a Bus that cannot carry messages past
// some size (NATS: the server's max_payload). The broker keeps every
// response and notification within it (wire.Limits.Within).
type PayloadLimiter interface {
	// MaxPayload returns the largest message the bus carries, in bytes.
	MaxPayload() int
}

// SessionRevoker is implemented by a Bus that issues per-session
// credentials (embedded NATS). The broker serves a2a.sessions.close when
// its bus is one: it revokes the session's credentials here, then
// deregisters the session's agents.
type SessionRevoker interface {
	// RevokeSession revokes every credential issued for session and
	// closes the connections made with them. Revoking a session that has
	// none is not an error.
	RevokeSession(ctx context.Context, session string) error
}
