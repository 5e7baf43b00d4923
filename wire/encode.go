package wire

import (
	"bytes"
	"encoding/json"
	"sync"
	"time"
	"unicode/utf8"
)

// Marshal encodes v exactly as json.Marshal does, byte for byte. The
// hot types (a task and what it holds, the two notifications' params, the
// send and update params and results), which the broker encodes on every
// send, update and event, are written by the codec: a third of
// json.Marshal's time, with one allocation (the result), and two more for
// each raw member (metadata, a data part), which json.Compact and
// json.HTMLEscape check and escape as json.Marshal does. Anything else,
// and any value json.Marshal would refuse, goes to json.Marshal itself.
// FuzzMarshalIsJSONMarshal holds the two to the same bytes.
func Marshal(v any) ([]byte, error) {
	e := encoders.Get().(*encoder)
	defer e.release()
	if err := e.any(v); err != nil {
		return nil, err
	}
	return bytes.Clone(e.b), nil
}

// AppendMarshal appends what Marshal returns for v to dst.
func AppendMarshal(dst []byte, v any) ([]byte, error) {
	e := encoders.Get().(*encoder)
	defer e.release()
	if err := e.any(v); err != nil {
		return dst, err
	}
	return append(dst, e.b...), nil
}

// AppendString appends s as json.Marshal writes a string: quoted, with
// HTML's specials, U+2028 and U+2029 escaped and invalid UTF-8 replaced.
func AppendString(dst []byte, s string) []byte { return appendString(dst, s) }

// MarshalNotification encodes a JSON-RPC notification of method with
// params, as json.Marshal encodes {"jsonrpc":"2.0","method":…,"params":…}.
func MarshalNotification(method string, params any) ([]byte, error) {
	e := encoders.Get().(*encoder)
	defer e.release()
	e.name(`{"jsonrpc":"2.0","method":`)
	e.str(method)
	e.name(`,"params":`)
	if err := e.any(params); err != nil {
		return nil, err
	}
	e.b = append(e.b, '}')
	return bytes.Clone(e.b), nil
}

// any appends v as json.Marshal writes it: by the codec if it is of a
// type the codec writes, else (or if a raw member of it is not JSON) by
// json.Marshal, whose error it returns.
func (e *encoder) any(v any) error {
	start := len(e.b)
	if e.encodeValue(v) && !e.failed {
		return nil
	}
	e.b, e.failed = e.b[:start], false
	b, err := json.Marshal(v)
	e.b = append(e.b, b...)
	return err
}

// EncodedLen is len(Marshal(v)), without keeping the bytes: 0 for a
// value Marshal refuses.
func EncodedLen(v any) int {
	e := encoders.Get().(*encoder)
	defer e.release()
	if e.any(v) != nil {
		return 0
	}
	return len(e.b)
}

// encoders keeps encoders whose buffers have grown to what a task
// takes, so that an encode allocates only its result.
var encoders = sync.Pool{New: func() any { return &encoder{b: make([]byte, 0, 1024)} }}

// release empties e and keeps it for the next encode, unless its buffer
// grew past what most tasks take.
func (e *encoder) release() {
	if cap(e.b) > 64<<10 {
		return
	}
	e.b, e.failed = e.b[:0], false
	encoders.Put(e)
}

// encoder appends JSON as encoding/json writes it: members in field
// order, omitempty as it means it, strings escaped for HTML, raw members
// compacted. Its methods for the hot types are generated (codec_gen.go).
type encoder struct {
	b      []byte
	failed bool // a raw member was not valid JSON
}

func (e *encoder) name(n string) { e.b = append(e.b, n...) }

func (e *encoder) str(s string) { e.b = appendString(e.b, s) }

func (e *encoder) time(t Time) {
	e.b = append(e.b, '"')
	e.b = appendTime(e.b, t.Time)
	e.b = append(e.b, '"')
}

// appendTime appends t.UTC().AppendFormat(b, TimeFormat): by hand for
// the years 0 to 9999, where the layout's parse is most of the cost.
func appendTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(b, TimeFormat)
	}
	hour, min, sec := t.Clock()
	ms := t.Nanosecond() / 1e6 // the layout's .000 truncates
	b = append(b, byte('0'+year/1000), byte('0'+year/100%10), byte('0'+year/10%10), byte('0'+year%10), '-',
		byte('0'+month/10), byte('0'+month%10), '-', byte('0'+day/10), byte('0'+day%10), 'T',
		byte('0'+hour/10), byte('0'+hour%10), ':', byte('0'+min/10), byte('0'+min%10), ':',
		byte('0'+sec/10), byte('0'+sec%10), '.', byte('0'+ms/100), byte('0'+ms/10%10), byte('0'+ms%10), 'Z')
	return b
}

// raw appends a json.RawMessage as json.Marshal does: compacted, with <,
// >, &, U+2028 and U+2029 escaped; empty is null.
func (e *encoder) raw(m json.RawMessage) {
	if len(m) == 0 {
		e.b = append(e.b, "null"...)
		return
	}
	var c bytes.Buffer
	if err := json.Compact(&c, m); err != nil {
		e.failed = true
		return
	}
	var h bytes.Buffer
	json.HTMLEscape(&h, c.Bytes())
	e.b = append(e.b, h.Bytes()...)
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string as encoding/json does with
// HTML escaping (its default): ", \ and the control characters escaped
// (\b \f \n \r \t by name), <, > and & as \u003c \u003e \u0026, U+2028
// and U+2029 as \u2028 \u2029, and each byte of invalid UTF-8 as \ufffd.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
