package natsbus

import (
	"encoding/base64"
	"errors"
	"unicode/utf8"
)

// The subjects of the NATS binding. <T> is a session's subject token.
const (
	// RPCPrefix + <T> is where a session sends its requests.
	RPCPrefix = "a2a.rpc."
	// HostRPC is where the host sends host-only requests.
	HostRPC = "a2a.host.rpc"
	// EventsPrefix + <T> + EventsSuffix is where a session's notifications
	// are published.
	EventsPrefix = "a2a.session."
	EventsSuffix = ".events"
	// InboxPrefix + <T> is the inbox prefix a session credential must use.
	InboxPrefix = "_INBOX."
	// BrokerHeader, on a request in a cluster, names the broker of the
	// caller's own host (docs/PROTOCOL.md §13): the agents it registers
	// belong to that broker, and are let go when that broker's lease
	// lapses, as the host with it is taken for dead.
	BrokerHeader = "A2A-Broker"
)

// ValidBrokerName reports whether name can name a broker of a cluster:
// 1 to 64 letters, digits, - or _.
func ValidBrokerName(name string) bool {
	if len(name) == 0 || len(name) > 64 {
		return false
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}

// plainToken reports whether s matches ^[A-Za-z0-9_-]{1,128}$ (a loop:
// this runs on every request and event, and a regexp was 3% of a push).
func plainToken(s string) bool {
	return len(s) >= 1 && len(s) <= 128 && tokenChars(s)
}

// b64Token reports whether s matches ^~[A-Za-z0-9_-]+$, the alphabet of
// the encoded form. Checked before decoding: the decoder skips \r and \n,
// which would give an id a second name.
func b64Token(s string) bool {
	return len(s) >= 2 && s[0] == '~' && tokenChars(s[1:])
}

func tokenChars(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

var b64 = base64.RawURLEncoding.Strict()

// ErrBadToken is returned by SessionID for a subject token that is not the
// canonical token of any session id.
var ErrBadToken = errors.New("natsbus: not a canonical session subject token")

// SubjectToken returns the subject token <T> of a session id: the id
// itself when it matches ^[A-Za-z0-9_-]{1,128}$, otherwise "~" and the
// unpadded base64url encoding of its UTF-8 bytes. "~" never occurs in the
// first form, so the mapping is one-to-one.
func SubjectToken(id string) string {
	if plainToken(id) {
		return id
	}
	return "~" + b64.EncodeToString([]byte(id))
}

// SessionID inverts SubjectToken. A token in neither canonical form
// (padding, a "~" form of an id that has a plain form, bytes that are not
// UTF-8, ...) is ErrBadToken, so no session has two names.
func SessionID(token string) (string, error) {
	if plainToken(token) {
		return token, nil
	}
	if !b64Token(token) {
		return "", ErrBadToken
	}
	raw, err := b64.DecodeString(token[1:])
	if err != nil || len(raw) == 0 || !utf8.Valid(raw) {
		return "", ErrBadToken
	}
	id := string(raw)
	if plainToken(id) {
		return "", ErrBadToken
	}
	return id, nil
}

// RPCSubject returns the subject of a session's requests.
func RPCSubject(session string) string { return RPCPrefix + SubjectToken(session) }

// EventsSubject returns the subject of a session's notifications.
func EventsSubject(session string) string {
	return EventsPrefix + SubjectToken(session) + EventsSuffix
}

// SessionInbox returns the inbox prefix of a session credential.
func SessionInbox(session string) string { return InboxPrefix + SubjectToken(session) }
