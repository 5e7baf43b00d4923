package wire

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// Unmarshal decodes JSON into v as the protocol reads it, and is what
// every path decodes with: the broker's params, the clients' results and
// events, the store's records. It is github.com/go-json-experiment/json
// (the encoding/json/v2 that the standard library is moving to), which
// decodes our messages in about half the time of encoding/json, with a
// third of its allocations; into a zero value of a hot type, the codec
// (codec.go) reads what that library would, in a third of its time, and
// leaves anything it is not sure of to it. Its defaults are the
// protocol's where encoding/json's are not: member names match exactly,
// so {"TOKEN": …} is an unknown member, ignored. Two options keep a
// message readable that encoding/json read: a member given twice is
// allowed, and invalid UTF-8 inside a string becomes U+FFFD (a request's
// bytes are checked for UTF-8 before this in any case). A member given
// twice takes its last value, null included; an object given twice is
// merged into what the first left, as encoding/json does too. Every check
// that reads a member reads it through here, so all see the same value.
//
// Encoding stays encoding/json's, byte for byte: its output is what the
// protocol's size limits are measured on (Marshal).
func Unmarshal(data []byte, v any) error {
	if isZeroValue(v) {
		if codecDecode(data, v) {
			return nil
		}
		reflect.ValueOf(v).Elem().SetZero() // as it was: the library starts over
	}
	return libraryUnmarshal(data, v)
}

// libraryUnmarshal is Unmarshal without the codec.
func libraryUnmarshal(data []byte, v any) error {
	return jsonv2.Unmarshal(data, v, decodeOptions)
}

var decodeOptions = jsonv2.JoinOptions(jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))

// UnmarshalJSONFrom implements the decoder's fast path for Time, with
// UnmarshalJSON's meaning: any RFC 3339 time, and null as no change.
func (t *Time) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	tok, err := dec.ReadToken()
	if err != nil {
		return err
	}
	switch tok.Kind() {
	case 'n':
		return nil
	case '"':
		v, err := time.Parse(time.RFC3339Nano, tok.String())
		if err != nil {
			return err
		}
		t.Time = v.UTC()
		return nil
	}
	return &jsonv2.SemanticError{JSONKind: tok.Kind(), GoType: reflect.TypeFor[Time]()}
}

// decodeProblem says what is wrong with JSON that Unmarshal refused, in
// the protocol's terms: the member's path as the client wrote it, and
// JSON kinds, never a Go type.
func decodeProblem(err error) string {
	var se *jsonv2.SemanticError
	if errors.As(err, &se) {
		path := pointerPath(se.JSONPointer)
		if msg, ok := integerProblem(se); ok {
			return prefixed(path, msg)
		}
		if se.GoType != nil && se.JSONKind != jsontext.KindInvalid {
			want := jsonKind(se.GoType.Kind().String())
			if se.GoType == reflect.TypeFor[Time]() {
				want = "string"
			}
			if got := kindName(se.JSONKind); got != want || se.Err == nil {
				return prefixed(path, fmt.Sprintf("want %s, got %s", want, got))
			}
		}
		if se.Err != nil {
			return prefixed(path, plainCause(se.Err))
		}
		return prefixed(path, "invalid value")
	}
	var syn *jsontext.SyntacticError
	if errors.As(err, &syn) {
		return fmt.Sprintf("%s (at byte %d)", plainCause(syn.Err), syn.ByteOffset)
	}
	return err.Error()
}

// integerProblem says what is wrong with a JSON number for an integer
// field: not a whole number (or negative where it cannot be), or out of
// range.
func integerProblem(se *jsonv2.SemanticError) (string, bool) {
	if se.JSONKind != '0' || se.GoType == nil {
		return "", false
	}
	unsigned := false
	switch se.GoType.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		unsigned = true
	default:
		return "", false
	}
	want := "want a whole number"
	if unsigned {
		want = "want a whole number, not negative"
	}
	v := string(se.JSONValue)
	switch {
	case v == "":
		return want, true
	case strings.ContainsAny(v, ".eE") || (unsigned && strings.HasPrefix(v, "-")):
		return fmt.Sprintf("%s, got %s", want, Cut(v, 40)), true
	}
	return fmt.Sprintf("%s is out of range", Cut(v, 40)), true
}

// plainCause is an underlying error's message without the package's
// prefix.
func plainCause(err error) string {
	if err == nil {
		return "invalid value"
	}
	var pe *time.ParseError
	if errors.As(err, &pe) {
		return "not an RFC 3339 time"
	}
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "jsontext: ")
	return strings.TrimPrefix(msg, "json: ")
}

func prefixed(path, problem string) string {
	if path == "" {
		return problem
	}
	return path + ": " + problem
}

// pointerPath writes a JSON Pointer as a path: /message/parts/0/text is
// message.parts[0].text.
func pointerPath(p jsontext.Pointer) string {
	var b strings.Builder
	for tok := range p.Tokens() {
		if _, err := strconv.Atoi(tok); err == nil && b.Len() > 0 {
			b.WriteString("[" + tok + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(tok)
	}
	return b.String()
}

func kindName(k jsontext.Kind) string {
	switch k {
	case '"':
		return "string"
	case '0':
		return "number"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	case '{':
		return "object"
	case '[':
		return "array"
	}
	return k.String()
}
