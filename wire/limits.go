package wire

import "fmt"

// The size bounds of the protocol derive from one setting, the message
// limit (--max-message-bytes), so that they cannot disagree: a task the
// broker accepts can always be read back and delivered, because every
// response and notification that carries it fits on the bus.
const (
	// MinPayload and MaxPayload bound a bus's payload limit: at least
	// room for a list page of useful size, at most what a NATS server
	// takes.
	MinPayload = 8 << 20
	MaxPayload = 64 << 20
	// MaxMessageLimit is the largest message limit the broker accepts, so
	// that a task of at least that size still fits in MaxPayload beside a
	// request of that size.
	MaxMessageLimit = 16 << 20
	// Overhead is the room kept in every response and notification for
	// what surrounds a task or a page: the envelope, an event's head, the
	// bytes by which a closing changes a task's status.
	Overhead = 64 << 10
)

// Limits are the size bounds in effect.
type Limits struct {
	// Message is the largest request a client may send; larger ones are
	// answered -32600.
	Message int
	// Payload is the largest message the bus carries. Every response and
	// notification the broker produces is at most this long.
	Payload int
	// Task is the largest task, counted as its JSON encoding: a change
	// that would make a task larger is refused with -32602 before it is
	// stored.
	Task int
}

// NewLimits derives the limits from the message limit (<= 0 means
// DefaultMaxMessageBytes): the payload is eight times the message limit
// (within MinPayload and MaxPayload), and a task fills what a response
// leaves once a request's worth of id and the Overhead are set aside.
func NewLimits(message int) Limits {
	if message <= 0 {
		message = DefaultMaxMessageBytes
	}
	return limits(message, min(max(8*message, MinPayload), MaxPayload))
}

func limits(message, payload int) Limits {
	return Limits{Message: message, Payload: payload, Task: payload - message - Overhead}
}

// Within returns the limits for a bus whose payload limit is payload (an
// external NATS server's max_payload), when that is smaller than l.Payload:
// the message limit drops to a quarter of it at most, and the task limit
// follows. A payload too small for any task is an error naming it.
func (l Limits) Within(payload int) (Limits, error) {
	if payload <= 0 || payload >= l.Payload {
		return l, nil
	}
	message := min(l.Message, payload/4)
	out := limits(message, payload)
	if out.Task < message {
		return l, fmt.Errorf("a payload limit of %d bytes leaves no room for tasks (want at least %d)", payload, 4*Overhead)
	}
	return out, nil
}

// PageBytes is the most a page of a list holds (tasks, agents, replayed
// events), besides its first item, which it holds whatever its size:
// small enough that many lists at once hold little memory, large enough
// that a page of small items is a full page.
const PageBytes = 1 << 20

// Page is the byte budget of one page of a list: PageBytes, or less where
// the payload is small, so that a page still fits the payload, envelope
// and id included.
func (l Limits) Page() int { return min(PageBytes, l.Payload-l.Message-Overhead/2) }

// Item is the largest single item of a list page (a task, an event): a
// page of just it still fits the payload.
func (l Limits) Item() int { return l.Payload - l.Message - Overhead/2 }

// Valid reports whether the limits hold together: a message limit within
// [1024, MaxMessageLimit], and room for a task at least as large as a
// message.
func (l Limits) Valid() error {
	switch {
	case l.Message < 1024:
		return fmt.Errorf("the message limit must be at least 1024 bytes (got %d)", l.Message)
	case l.Message > MaxMessageLimit:
		return fmt.Errorf("the message limit must be at most %d bytes (got %d)", MaxMessageLimit, l.Message)
	case l.Task < l.Message:
		return fmt.Errorf("a payload limit of %d bytes leaves no room for a task of %d bytes", l.Payload, l.Message)
	}
	return nil
}
