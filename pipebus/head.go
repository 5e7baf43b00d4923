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
