package wire

import (
	"bytes"
	"strings"
)

// Route is what a bus reads of a message to route it: a response by its
// id, a notification by its recipient's session.
type Route struct {
	// ID is the raw top-level "id", a slice of the message; nil when
	// absent.
	ID []byte
	// Notification: the message has a top-level "method".
	Notification bool
	// Session is the session a notification goes to: the params'
	// recipientContextId, or their contextId where a producer omitted the
	// first (addressing rule 5, docs/PROTOCOL.md). Either is read when it
	// is a string (null is "").
	Session string
}

// ReadRoute reads the route of a message in one pass. It reads its
// members as a decode does (exact names, the last of a repeated one, an
// object given twice merged into the first), but checks only what it
// reads: that the message is a JSON object, the id, the method's presence
// and the params' two strings. The rest it leaves to the receiver's
// decode. ok is false for a message that is not an object, or whose
// structure is cut short.
//
// A notification as the broker writes it, its method first and its
// recipientContextId among the params' first members, is routed without
// reading further: when the rest of the message holds neither that name
// nor "params", spelled plainly, nor an escape that could spell a letter
// of one, no member can follow that changes its route.
func ReadRoute(msg []byte) (r Route, ok bool) {
	d := newDecoder(msg)
	defer d.release()
	var recipient, context string
	for f := d.first(routeFields); f != endObject; f = d.next(routeFields, f) {
		switch f {
		case 3: // id
			r.ID = d.value()
		case 1: // method
			r.Notification = true
			d.skipLoose()
		case 2: // params
			if d.peek() != '{' {
				d.skipLoose()
				continue
			}
			// The members of either notification, in the order the
			// broker writes them.
			for f := d.first(eventParamsFields); f != endObject; f = d.next(eventParamsFields, f) {
				var dst *string
				switch f {
				case 1:
					dst = &recipient
				case 2:
					dst = &context
				}
				if c := d.peek(); dst == nil || c != '"' && c != 'n' {
					d.skipLoose()
					continue
				}
				if *dst = d.str(); f == 1 && recipient != "" && r.Notification && settled(d.b[d.i:]) {
					return Route{Notification: true, Session: recipient}, !d.bad
				}
			}
		default:
			d.skipLoose()
		}
	}
	if !d.end() {
		return Route{}, false
	}
	if r.Session = recipient; recipient == "" {
		r.Session = context
	}
	return r, true
}

// routeFields are the top-level members of a message, a notification's
// in the order the broker writes them.
var routeFields = newFields("jsonrpc", "method", "params", "id")

// settled reports whether rest, what follows a notification's
// recipientContextId, can change neither its route nor its being one: it
// ends the message as an object ends, and holds neither name nor an
// escape \u0040 to \u007f, the only escapes that spell a letter.
func settled(rest []byte) bool {
	if end := bytes.TrimRight(rest, " \t\r\n"); len(end) == 0 || end[len(end)-1] != '}' {
		return false // cut short: the full read judges it
	}
	if holds(rest, "recipientContextId", 9) || holds(rest, "params", 0) {
		return false
	}
	for i := 0; ; i += 4 {
		k := bytes.Index(rest[i:], []byte(`\u00`))
		if k < 0 {
			return true
		}
		i += k
		if i+4 < len(rest) && strings.IndexByte("4567", rest[i+4]) >= 0 {
			return false
		}
	}
}

// holds reports whether b holds name, looked for by its byte at: the
// rarer the byte in JSON, the fewer comparisons (the 'C' of
// recipientContextId, where a search from the name's start would stop at
// every 'r').
func holds(b []byte, name string, at int) bool {
	for i := at; i < len(b); i++ {
		j := bytes.IndexByte(b[i:], name[at])
		if j < 0 {
			return false
		}
		i += j
		if start := i - at; start >= 0 && start+len(name) <= len(b) && string(b[start:start+len(name)]) == name {
			return true
		}
	}
	return false
}
