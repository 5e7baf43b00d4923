package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// repeat is a JSON array of n copies of unit.
func repeat(unit string, n int) string {
	return "[" + strings.TrimSuffix(strings.Repeat(unit+",", n), ",") + "]"
}

// sendBody is a SendMessage request whose one data part is data.
func sendBody(data string) []byte {
	return []byte(`{"jsonrpc":"2.0","id":7,"method":"SendMessage","params":{"message":{"messageId":"m1","role":"ROLE_USER","parts":[{"data":` + data + `}]}}}`)
}

func isLimit(err error) bool {
	var se *scanError
	return errors.As(err, &se) && !se.syntax
}

func TestScanBodyLetsRealRequestsThrough(t *testing.T) {
	records := make([]string, 5000)
	for i := range records {
		records[i] = `{"id":1234,"name":"abcdef","ok":true}`
	}
	members := make([]string, 5000)
	for i := range members {
		members[i] = `"k` + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + `":` + "1"
	}
	for name, data := range map[string]string{
		"text of 1 MiB":           `"` + strings.Repeat("x", 1<<20) + `"`,
		"5,000 records":           "[" + strings.Join(records, ",") + "]",
		"records to 1 MiB":        repeat(`{"id":1234,"name":"abcdef","ok":true}`, 28000),
		"5,000 members":           "{" + strings.Join(members, ",") + "}",
		"numbers to 1 MiB":        repeat("10", 349000),
		"3,500 empty objects":     repeat("{}", 3500),
		"127 levels, envelope in": strings.Repeat("[", 127-5) + strings.Repeat("]", 127-5),
	} {
		b := sendBody(data)
		s, err := scanBody(b, MaxBodyDepth)
		require.NoError(t, err, name)
		assert.Equal(t, []byte("7"), s.id, name)
		assert.LessOrEqual(t, s.weight(len(b)), int64(len(b))+DecodedSlack/DecodedPerByte, name)
	}
}

func TestScanBodyRefusesWhatDecodesLarge(t *testing.T) {
	for name, data := range map[string]string{
		"[{},{},…] of 1 MiB":     repeat("{}", 349000),
		"[[],[],…] of 1 MiB":     repeat("[]", 349000),
		"[{\"a\":0},…] of 1 MiB": repeat(`{"a":0}`, 131000),
		"[[0],[0],…] of 1 MiB":   repeat("[0]", 262000),
		"[0,0,…] of 1 MiB":       repeat("0", 524000),
		"129 levels":             strings.Repeat("[", 129) + strings.Repeat("]", 129),
		"deeper than the stack":  strings.Repeat("[", 100000),
	} {
		_, err := scanBody(sendBody(data), MaxBodyDepth)
		assert.True(t, isLimit(err), "%s: %v", name, err)
	}
	s, err := scanBody(sendBody(`{"n":9007199254740993}`), MaxBodyDepth)
	require.NoError(t, err)
	assert.True(t, s.inexact)
	s, err = scanBody(sendBody(`{"n":900719925474099,"m":-0,"k":[1,2]}`), MaxBodyDepth)
	require.NoError(t, err)
	assert.False(t, s.inexact, "integers of 15 digits travel as float64")
}

func TestScanBodyAgreesWithEncodingJSON(t *testing.T) {
	for _, in := range []string{``, ` `, `{`, `}`, `[1,]`, `{"a":1,}`, `{"a" 1}`, `{1:2}`, `01`, `1.`, `1e`, `-`, `.5`, `"\x"`, `"\u12"`, "\"\x01\"",
		`tru`, `nul`, `[1] [2]`, `{} x`, `"abc`, `[`, `[[]`, `{"a":}`, `{"a"`,
		`1`, `-0.1e-7`, `"\u00e9\n"`, ` {"a" : [ true , false , null ] } `, `[1E+2,0.5e-3]`, "\"\xff\"",
		`"\ud800"`, `"\udc00x\ud800\u0041"`, "{\"\xc3\":\"\xed\xa0\x80\"}", `{"a":1,"a":2}`, `1x`, `"a""b"`, `[1 2]`, `{"a":1 "b":2}`, `1 2`, "\t1\r\n", `[1]]`, `{]`, `-01`, `1e+`, `0x1`, `[01]`, `NaN`, `"\u00E9"`} {
		_, err := scanBody([]byte(in), MaxBodyDepth)
		assert.Equal(t, json.Valid([]byte(in)), err == nil, "%q: %v", in, err)
	}
}

func FuzzBodyScan(f *testing.F) {
	for _, s := range []string{`{}`, `[1,2,{"a":[null,true,false,"x\u00e9"]}]`, `{"jsonrpc":"2.0","id":"x","method":"SendMessage"}`, `-0.1e-7`, `9007199254740993`, `[{},{}]`, `"\"`, `[[[[`, `{"a":1,}`, `1 2`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := scanBody(b, 16)
		valid := json.Valid(b)
		switch {
		case err == nil:
			if !valid {
				t.Fatalf("accepted what encoding/json refuses: %q", b)
			}
			if s.weight(len(b)) > int64(len(b))+DecodedSlack/DecodedPerByte+1 {
				t.Fatalf("accepted a weight over its bound: %d for %d bytes", s.weight(len(b)), len(b))
			}
			if s.id != nil && !json.Valid(s.id) {
				t.Fatalf("an id that is no JSON: %q", s.id)
			}
		case isLimit(err):
			// Refused for its shape: it may or may not be valid, but
			// valid, it is deeper than the bound (a fuzzed body is far
			// under the count's).
			if valid && nesting(b) <= 16 {
				t.Fatalf("refused for its shape a body within the bounds: %q: %v", b, err)
			}
		default:
			if valid {
				t.Fatalf("refused as invalid what encoding/json accepts: %q: %v", b, err)
			}
		}
	})
}

// nesting is how deep valid JSON nests, as encoding/json reads it.
func nesting(b []byte) int {
	dec := json.NewDecoder(bytes.NewReader(b))
	depth, deepest := 0, 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return deepest
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
			deepest = max(deepest, depth)
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
}

// TestScanBodyTakesOnlyAScalarIDAtTheTop: the error's id is the top
// level's "id" when it is a string or a number, never what is inside an
// array or object under that key, nor a member of the same name deeper.
func TestScanBodyTakesOnlyAScalarIDAtTheTop(t *testing.T) {
	for in, want := range map[string]string{
		`{"id":7,"x":1}`:                       `7`,
		`{"id":"a","x":1}`:                     `"a"`,
		`{"id":["injected"],"x":1}`:            ``,
		`{"id":{"id":"injected"},"x":1}`:       ``,
		`{"params":{"id":"injected"},"x":1}`:   ``,
		`{"params":[{"id":"injected"}],"x":1}`: ``,
		`{"id":null,"x":1}`:                    `null`,
		`{"id":-1.5e3}`:                        `-1.5e3`,
		`{"id":true}`:                          ``,
		`{"x":{"a":1},"id":"b"}`:               `"b"`,
		`{"id":"a","id":8}`:                    `8`,
		`{"i\u0064":7}`:                        ``,
	} {
		s, err := scanBody([]byte(in), MaxBodyDepth)
		require.NoError(t, err, in)
		assert.Equal(t, want, string(s.id), in)
	}
}

// realisticBody is a SendMessage request of about n bytes: a text part
// and a metadata list of records, half and half.
func realisticBody(n int) []byte {
	const rec = `{"id":1234,"name":"abcdef","ok":true,"score":12.5,"tags":["a","b"],"note":null}`
	recs := make([]string, 0, n/2/len(rec)+1)
	for len(recs)*len(rec) < n/2 {
		recs = append(recs, rec)
	}
	text := strings.Repeat("lorem ipsum dolor sit amet, \\\"quoted\\\" \\u00e9 ", n/2/48+1)
	return []byte(`{"jsonrpc":"2.0","id":"req-1","method":"SendMessage","params":{"message":{"messageId":"m1","role":"ROLE_USER","parts":[{"text":"` + text + `"}],"metadata":{"records":[` + strings.Join(recs, ",") + `]}}}}`)
}

func BenchmarkScanBody(b *testing.B) {
	for _, c := range []struct {
		name string
		n    int
	}{{"10KiB", 10 << 10}, {"1MiB", 1 << 20}} {
		body := realisticBody(c.n)
		if !json.Valid(body) {
			b.Fatal("the benchmark's body is no JSON")
		}
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := scanBody(body, MaxBodyDepth); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestScanBodyKeepsTheIDOfARefusedBody: a body refused after its id is
// answered with that id.
func TestScanBodyKeepsTheIDOfARefusedBody(t *testing.T) {
	s, err := scanBody([]byte(`{"jsonrpc":"2.0","id":"r1","params":`+strings.Repeat("[", 200)), MaxBodyDepth)
	assert.True(t, isLimit(err), "%v", err)
	assert.Equal(t, `"r1"`, string(s.id))
	s, err = scanBody([]byte(`{"id":7,"params":{"a":}}`), MaxBodyDepth)
	require.Error(t, err)
	assert.False(t, isLimit(err), "%v", err)
	assert.Equal(t, `7`, string(s.id))
}

func TestScanBodySyntaxErrorsDoNotRepeatTheBody(t *testing.T) {
	_, err := scanBody([]byte(`{"params":{"secret-member-name":[1,}}}`), MaxBodyDepth)
	var se *scanError
	require.ErrorAs(t, err, &se)
	assert.True(t, se.syntax)
	assert.NotContains(t, se.msg, "secret-member-name", "the answer names an offset, not the body's own names")
	assert.Contains(t, se.msg, "at offset 34")
}
