package wire

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzValidJSONAgreesWithEncodingJSON: the faster validator accepts
// exactly what json.Valid accepts, duplicate names and invalid UTF-8
// included, so the envelope's fast path is taken for the same inputs.
func FuzzValidJSONAgreesWithEncodingJSON(f *testing.F) {
	for _, s := range []string{
		`{}`, `[]`, `1`, `"x"`, `null`, ``, ` `, `{`, `{"a":1,"a":2}`, "\"\xff\"", `{"a":[1,2,{"b":null}]}`,
		`{"jsonrpc":"2.0","id":1,"method":"m","params":{"x":"\u00e9"}}`, `1 2`, `{"a":1}x`, `01`, `1.`, `"\ud800"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if got, want := validJSON(raw), json.Valid(raw); got != want {
			t.Fatalf("validJSON(%q) = %v, json.Valid = %v", raw, got, want)
		}
	})
}

// TestValidJSONAgreesAtTheNestingLimit: both validators stop at 10,000
// levels, where a fuzzer does not reach.
func TestValidJSONAgreesAtTheNestingLimit(t *testing.T) {
	for _, n := range []int{9999, 10000, 10001} {
		raw := []byte(strings.Repeat("[", n) + strings.Repeat("]", n))
		if got, want := validJSON(raw), json.Valid(raw); got != want {
			t.Errorf("%d levels: validJSON = %v, json.Valid = %v", n, got, want)
		}
	}
}

// FuzzValueEndIsTheLibrarys: the decoder's structural reading of a value,
// by which it skips what it does not check and measures nesting, ends
// where jsontext ends the value, and finds its depth, on any valid JSON.
func FuzzValueEndIsTheLibrarys(f *testing.F) {
	for _, s := range []string{
		`{"a":[1,{"b":"}]\""}],"c":"\\"}`, `[[],[[]],{"x":{"y":[]}}]`, `"a\"b"`, `123`, `{"k":"é{[\u007b"}`,
		`{"jsonrpc":"2.0","method":"a2a.push","params":{"recipient":"a","message":{"parts":[{"kind":"text","text":"x\\\"]}"}]}}}`,
	} {
		f.Add([]byte(s), []byte(`,"x":1}`))
	}
	f.Fuzz(func(t *testing.T, value, after []byte) {
		if !validJSON(value) || len(value) == 0 || isSpace(value[0]) || isSpace(value[len(value)-1]) {
			return
		}
		if len(after) > 0 && !strings.ContainsRune(",}] \t\r\n", rune(after[0])) {
			return // a number or a literal ends only at a delimiter
		}
		d := newDecoder(append(value[:len(value):len(value)], after...))
		defer d.release()
		end := d.valueEnd()
		if d.bad || end != len(value) {
			t.Fatalf("%q: value ends at %d (bad %v), not %d", value, end, d.bad, len(value))
		}
		if want := depthOf(value); d.deepest != want {
			t.Fatalf("%q: depth %d, not %d", value, d.deepest, want)
		}
	})
}
