package wire

import (
	"bytes"
	"encoding/json"
)

// PeekID returns the id of a request without decoding it: the raw value
// of its top-level "id" member, nil when it has none or the message is not
// a well-formed request object. It is a fast path for answering requests
// that will not be served (a flood's overflow); it agrees with
// ParseRequest's id whenever ParseRequest accepts the message, falling
// back to it for anything unusual (an escaped member name, a duplicate).
func PeekID(raw []byte) json.RawMessage {
	id, ok := peekID(raw)
	if !ok {
		if req, _ := ParseRequest(raw, len(raw)); req != nil {
			return req.ID
		}
		return nil
	}
	return id
}

// peekID scans the top-level members of an object; ok false means "ask
// ParseRequest".
func peekID(raw []byte) (id json.RawMessage, ok bool) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return nil, false
	}
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == '}' {
		return nil, true
	}
	for {
		if i >= len(raw) || raw[i] != '"' {
			return nil, false
		}
		end := i + 1
		for end < len(raw) && raw[end] != '"' {
			if raw[end] == '\\' || raw[end] < 0x20 {
				return nil, false // escaped or odd member names: the slow path
			}
			end++
		}
		if end >= len(raw) {
			return nil, false
		}
		name := raw[i+1 : end]
		i = skipSpace(raw, end+1)
		if i >= len(raw) || raw[i] != ':' {
			return nil, false
		}
		i = skipSpace(raw, i+1)
		start := i
		i = skipValue(raw, i)
		if i <= start {
			return nil, false // no value
		}
		if string(name) == "id" {
			if id != nil {
				return nil, false // a duplicate: as encoding/json decides
			}
			id = json.RawMessage(bytes.Clone(raw[start:i]))
		}
		i = skipSpace(raw, i)
		if i >= len(raw) {
			return nil, false
		}
		switch raw[i] {
		case ',':
			i = skipSpace(raw, i+1)
		case '}':
			if skipSpace(raw, i+1) != len(raw) {
				return nil, false
			}
			if id != nil && !validID(id) {
				return nil, false
			}
			return id, true
		default:
			return nil, false
		}
	}
}

func validID(id []byte) bool {
	if len(id) == 0 {
		return false
	}
	switch id[0] {
	case '"', 'n', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return json.Valid(id)
	}
	return false
}

// isSpace reports whether c is JSON whitespace.
func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(raw []byte, i int) int {
	for i < len(raw) && isSpace(raw[i]) {
		i++
	}
	return i
}

// skipValue returns the index after the JSON value at i, or -1. It checks
// the structure, not every literal: PeekID's answer is a hint for an
// error response, and ParseRequest has the last word on any served one.
func skipValue(raw []byte, i int) int {
	depth := 0
	for i < len(raw) {
		switch c := raw[i]; c {
		case '"':
			i++
			for i < len(raw) && raw[i] != '"' {
				if raw[i] == '\\' {
					i++
				}
				i++
			}
			if i >= len(raw) {
				return -1
			}
			i++
		case '{', '[':
			depth++
			i++
		case '}', ']':
			if depth == 0 {
				return i
			}
			depth--
			i++
		case ',', ':':
			if depth == 0 {
				return i
			}
			i++
		case ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i
			}
			i++
		default:
			i++
		}
		if depth == 0 && (i >= len(raw) || raw[i] == ',' || raw[i] == '}' || isSpace(raw[i])) {
			return i
		}
	}
	if depth == 0 {
		return i
	}
	return -1
}

// ResponseError returns the error of a response, nil for a result (or for
// something that is not a response at all). On a response in the layout
// this package encodes (ErrorResponse, EncodeResult) it reads only the
// head, so telling a result of any size from an error costs the same.
func ResponseError(resp []byte) *Error {
	const head = `{"jsonrpc":"2.0","id":`
	if bytes.HasPrefix(resp, []byte(head)) {
		if i := skipValue(resp, len(head)); i > 0 {
			switch rest := resp[i:]; {
			case bytes.HasPrefix(rest, []byte(`,"result":`)):
				return nil
			case bytes.HasPrefix(rest, []byte(`,"error":`)):
				var r struct {
					Error *Error `json:"error"`
				}
				if json.Unmarshal(resp, &r) == nil && r.Error != nil {
					return r.Error
				}
			}
		}
	}
	_, _, rpcErr, _ := DecodeResponse(resp)
	return rpcErr
}
