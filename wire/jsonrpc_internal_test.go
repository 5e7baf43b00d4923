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
