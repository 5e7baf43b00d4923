package pipebus

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// head is what the host end needs of a line to route it: the response's
// id, or, for a notification, its recipient session.
type head struct {
	id        []byte // raw top-level "id" value; nil when absent
	isNote    bool   // has a top-level "method"
	recipient string // params.recipientContextId
	context   string // params.contextId
}

// scanHead reads a line's head in one pass, without decoding the rest:
// the broker's notifications are routed at the speed of a byte scan.
// It reports false on anything it does not expect (escapes in names,
// malformed JSON), and the caller then decodes the line in full.
func scanHead(b []byte) (h head, ok bool) {
	s := scanner{b: b}
	if !s.object(func(key []byte) bool {
		switch string(key) {
		case "id":
			start := s.i
			if !s.value() {
				return false
			}
			h.id = s.b[start:s.i]
		case "method":
			h.isNote = true
			return s.value()
		case "params":
			s.ws()
			if s.i >= len(s.b) || s.b[s.i] != '{' {
				return s.value()
			}
			return s.object(func(key []byte) bool {
				var dst *string
				switch string(key) {
				case "recipientContextId":
					dst = &h.recipient
				case "contextId":
					dst = &h.context
				default:
					return s.value()
				}
				s.ws()
				if s.i >= len(s.b) || s.b[s.i] != '"' {
					return s.value()
				}
				raw, escaped, ok := s.str()
				if !ok {
					return false
				}
				if escaped || !utf8.Valid(raw) {
					// As encoding/json reads it (escapes, U+FFFD).
					return json.Unmarshal(raw, dst) == nil
				}
				*dst = string(raw[1 : len(raw)-1])
				return true
			})
		default:
			return s.value()
		}
		return true
	}) {
		return head{}, false
	}
	return h, true
}

// The form in which the broker writes every notification: these members
// first, in this order, without spaces.
var (
	notePrefix   = []byte(`{"jsonrpc":"2.0","method":"`)
	noteEnd      = []byte(`}}`) // params, then the notification
	paramsOpen   = []byte(`,"params":{`)
	paramsName   = []byte(`"params"`)
	recipientKey = []byte(`"recipientContextId"`)
)

// Where holds looks for each name first: at a letter that is rare in the
// broker's notifications ('p' of "params", 'C' of "recipientContextId").
const (
	paramsAnchor    = 1
	recipientAnchor = 10
)

// holds reports whether b contains name. It finds each name[at] at memory
// speed and compares around it: bytes.Contains starts from the name's
// quote, of which JSON holds one every few bytes.
func holds(b, name []byte, at int) bool {
	for i := at; i < len(b); {
		j := bytes.IndexByte(b[i:], name[at])
		if j < 0 {
			return false
		}
		i += j
		if start := i - at; start+len(name) <= len(b) && bytes.Equal(b[start:start+len(name)], name) {
			return true
		}
		i++
	}
	return false
}

// fastNote routes a notification in the form the broker writes it
// without walking the rest of the line: "jsonrpc", "method", then
// "params" whose first members up to "recipientContextId" are plain
// strings, and the line ends as the broker's do ("}}": a line cut short
// goes to scanHead, which drops it). It gives the recipient only when no other member named
// "params" or "recipientContextId" can follow: the rest of the line holds
// neither name, nor an escape that could spell one (\u0040 to \u007f;
// every other escape stands for a character outside those names). Then
// the names seen are the last of their kind, as a full decode finds them.
// Anything else reports false, and scanHead reads the line.
func fastNote(b []byte) (recipient string, ok bool) {
	rest, ok := bytes.CutPrefix(b, notePrefix)
	if !ok || !bytes.HasSuffix(rest, noteEnd) {
		return "", false // not the form, or cut short: scanHead judges it
	}
	q := bytes.IndexByte(rest, '"') // the method's end
	if q < 0 || bytes.IndexByte(rest[:q], '\\') >= 0 {
		return "", false
	}
	if rest, ok = bytes.CutPrefix(rest[q+1:], paramsOpen); !ok {
		return "", false
	}
	// Up to a few plain "name":"value" members before the recipient.
	for range 4 {
		name, value, after, ok := plainMember(rest)
		if !ok {
			return "", false
		}
		if string(name) != "recipientContextId" {
			if len(after) == 0 || after[0] != ',' {
				return "", false
			}
			rest = after[1:]
			continue
		}
		if len(value) == 0 || !utf8.Valid(value) ||
			holds(after, recipientKey, recipientAnchor) || holds(after, paramsName, paramsAnchor) || letterEscape(after) {
			return "", false
		}
		return string(value), true
	}
	return "", false
}

// plainMember cuts a member "name":"value" whose name and value hold no
// escape from the front of b.
func plainMember(b []byte) (name, value, rest []byte, ok bool) {
	if len(b) == 0 || b[0] != '"' {
		return nil, nil, nil, false
	}
	n := bytes.IndexByte(b[1:], '"') + 1
	if n <= 0 || n+2 >= len(b) || b[n+1] != ':' || b[n+2] != '"' {
		return nil, nil, nil, false
	}
	name = b[1:n]
	v := b[n+3:]
	e := bytes.IndexByte(v, '"')
	if e < 0 {
		return nil, nil, nil, false
	}
	value = v[:e]
	if bytes.IndexByte(name, '\\') >= 0 || bytes.IndexByte(value, '\\') >= 0 {
		return nil, nil, nil, false
	}
	return name, value, v[e+1:], true
}

// letterEscape reports whether b holds an escape \u0040 to \u007f, the
// only escapes that can stand for a letter of a member's name.
func letterEscape(b []byte) bool {
	for {
		i := bytes.Index(b, []byte(`\u00`))
		if i < 0 {
			return false
		}
		if i+4 < len(b) && b[i+4] >= '4' && b[i+4] <= '7' {
			return true
		}
		b = b[i+4:]
	}
}

type scanner struct {
	b []byte
	i int
}

func (s *scanner) ws() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
		s.i++
	}
}

// object walks an object, calling member for each key with the scanner
// just after the ':'; member consumes the value.
func (s *scanner) object(member func(key []byte) bool) bool {
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '{' {
		return false
	}
	s.i++
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return true
	}
	for {
		s.ws()
		raw, escaped, ok := s.str()
		if !ok || escaped {
			return false // an escaped name: let the full decoder judge it
		}
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return false
		}
		s.i++
		if !member(raw[1 : len(raw)-1]) {
			return false
		}
		s.ws()
		if s.i >= len(s.b) {
			return false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case '}':
			s.i++
			return true
		default:
			return false
		}
	}
}

// str consumes a string and returns it with its quotes.
func (s *scanner) str() (raw []byte, escaped, ok bool) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, false, false
	}
	start := s.i
	s.i++
	for {
		// The next quote, found at memory speed; a backslash before it
		// escapes something, perhaps that quote.
		q := bytes.IndexByte(s.b[s.i:], '"')
		if q < 0 {
			return nil, false, false
		}
		bs := bytes.IndexByte(s.b[s.i:s.i+q], '\\')
		if bs < 0 {
			s.i += q + 1
			return s.b[start:s.i], escaped, true
		}
		escaped = true
		s.i += bs + 2 // the backslash and what it escapes
		if s.i > len(s.b) {
			return nil, false, false
		}
	}
}

// value consumes any value.
func (s *scanner) value() bool {
	s.ws()
	if s.i >= len(s.b) {
		return false
	}
	switch s.b[s.i] {
	case '"':
		_, _, ok := s.str()
		return ok
	case '{', '[':
		depth := 0
		for ; s.i < len(s.b); s.i++ {
			switch s.b[s.i] {
			case '"':
				if _, _, ok := s.str(); !ok {
					return false
				}
				s.i--
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					s.i++
					return true
				}
			}
		}
		return false
	default:
		start := s.i
		for s.i < len(s.b) && s.b[s.i] != ',' && s.b[s.i] != '}' && s.b[s.i] != ']' && s.b[s.i] != ' ' && s.b[s.i] != '\t' && s.b[s.i] != '\n' && s.b[s.i] != '\r' {
			s.i++
		}
		return s.i > start
	}
}
