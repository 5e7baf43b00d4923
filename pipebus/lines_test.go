package pipebus

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"
)

// FuzzLineReader checks the framing against a plain split on "\n": every
// line comes back whole or is reported too long, nothing else.
func FuzzLineReader(f *testing.F) {
	f.Add([]byte("a\nbb\r\nccc"), uint8(2))
	f.Add([]byte("\n\n\r\n"), uint8(0))
	f.Add(bytes.Repeat([]byte("x"), 70000), uint8(200))
	f.Add([]byte("{\"jsonrpc\":\"2.0\"}\n"+string(bytes.Repeat([]byte("y"), 100))+"\nz"), uint8(16))
	f.Fuzz(func(t *testing.T, data []byte, max uint8) {
		limit := int(max) + 1
		var want [][]byte // nil entries: too long
		segs := bytes.Split(data, []byte("\n"))
		if len(segs[len(segs)-1]) == 0 {
			segs = segs[:len(segs)-1] // data ended with "\n", or was empty
		}
		for _, seg := range segs {
			seg = bytes.TrimSuffix(seg, []byte("\r"))
			if len(seg) > limit {
				want = append(want, nil)
			} else {
				want = append(want, seg)
			}
		}
		lr := newLineReader(bytes.NewReader(data), limit)
		for i := 0; ; i++ {
			line, tooLong, err := lr.next()
			if errors.Is(err, io.EOF) {
				if i != len(want) {
					t.Fatalf("got %d lines, want %d", i, len(want))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if i >= len(want) {
				t.Fatalf("line %d is one too many: %q", i, line)
			}
			if tooLong != (want[i] == nil) {
				t.Fatalf("line %d: tooLong %v, want %v (len %d, limit %d)", i, tooLong, want[i] == nil, len(want[i]), limit)
			}
			if !tooLong && !bytes.Equal(line, want[i]) {
				t.Fatalf("line %d: got %q, want %q", i, line, want[i])
			}
		}
	})
}

// FuzzScanHead checks the fast head scanner against encoding/json: when
// it answers, it answers what a full decode finds.
func FuzzScanHead(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","method":"a2a.push","params":{"recipient":"a","recipientContextId":"s1","contextId":"s0","seq":1}}`,
		`{"jsonrpc":"2.0","id":17,"result":{"task":{"contextId":"x"}}}`,
		`{"params":{"contextId":"c\u00e9","data":[{"recipientContextId":"evil"}]},"method":"m"}`,
		`{"id":null,"error":{"code":-32700}}`,
		`{"method":"m","params":[1,2]}`, `{}`, `[]`, `{"a":"\"}"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		h, ok := scanHead(line)
		if !ok {
			return
		}
		var full struct {
			ID     json.RawMessage `json:"id"`
			Method json.RawMessage `json:"method"`
			Params json.RawMessage `json:"params"`
		}
		// Compare only on what encoding/json accepts as an object with
		// exactly named members (the scanner needs no more).
		var exact map[string]json.RawMessage
		if json.Unmarshal(line, &exact) != nil || json.Unmarshal(line, &full) != nil {
			return
		}
		if (exact["method"] != nil) != h.isNote {
			t.Fatalf("method presence: scan %v, decode %q", h.isNote, exact["method"])
		}
		if !bytes.Equal(bytes.TrimSpace(exact["id"]), h.id) {
			t.Fatalf("id: scan %q, decode %q", h.id, exact["id"])
		}
		var params map[string]json.RawMessage
		if json.Unmarshal(exact["params"], &params) == nil {
			var rc, cc string
			if json.Unmarshal(params["recipientContextId"], &rc) == nil && rc != h.recipient {
				t.Fatalf("recipientContextId: scan %q, decode %q", h.recipient, rc)
			}
			if json.Unmarshal(params["contextId"], &cc) == nil && cc != h.context {
				t.Fatalf("contextId: scan %q, decode %q", h.context, cc)
			}
		}
	})
}
