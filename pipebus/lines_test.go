package pipebus

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"

	"github.com/a2a-bus/a2a-bus/transport/bustest"
	"github.com/a2a-bus/a2a-bus/wire"
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

// BenchmarkScanHead reads the head of the benchmarks' sample event, as
// the host end does for every notification it routes.
func BenchmarkScanHead(b *testing.B) {
	line := bustest.SampleEvent("bench", 1)
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		if h, ok := scanHead(line); !ok || h.recipient != "bench" {
			b.Fatalf("scanHead: %+v, %v", h, ok)
		}
	}
}

// BenchmarkFastNote routes the same event by its leading members.
func BenchmarkFastNote(b *testing.B) {
	line := bustest.SampleEvent("bench", 1)
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		if r, ok := fastNote(line); !ok || r != "bench" {
			b.Fatalf("fastNote: %q, %v", r, ok)
		}
	}
}

// BenchmarkReadHead reads what the host end routes a line by, for the
// benchmarks' sample event and for a response carrying a task.
func BenchmarkReadHead(b *testing.B) {
	ev := bustest.SampleEvent("bench", 1)
	var note struct {
		Params wire.TaskEvent `json:"params"`
	}
	if err := json.Unmarshal(ev, &note); err != nil {
		b.Fatal(err)
	}
	resp, err := wire.EncodeResult(json.RawMessage("17"), wire.TaskResult{Task: note.Params.Task})
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		line []byte
		want head
	}{
		{"notification", ev, head{isNote: true, recipient: "bench"}},
		{"response", resp, head{id: []byte("17")}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.line)))
			b.ReportAllocs()
			for b.Loop() {
				h, err := readHead(c.line)
				if err != nil || h.isNote != c.want.isNote || h.recipient != c.want.recipient || !bytes.Equal(h.id, c.want.id) {
					b.Fatalf("readHead: %+v, %v", h, err)
				}
			}
		})
	}
}

// fastNoteSeeds are notifications as the broker writes them, and the same
// with what must send them to scanHead: a later "params" or
// "recipientContextId", spelled plainly or with letter escapes.
func fastNoteSeeds(t testing.TB) [][]byte {
	text := "a <b> & \"c\"\n"
	head := wire.EventHead{Recipient: "discussant-2", RecipientContextID: "s-2", ContextID: "s-1", Seq: 7, Epoch: "e"}
	ev, err := wire.MarshalNotification(wire.NotifyTaskEvent, &wire.TaskEvent{EventHead: head, TaskID: "t", Kind: wire.EventCreated,
		Message: &wire.Message{MessageID: "m", Role: wire.RoleUser, Parts: []wire.Part{{Kind: wire.KindText, Text: &text}}}})
	if err != nil {
		t.Fatal(err)
	}
	push, err := wire.MarshalNotification(wire.NotifyPush, &wire.Push{EventHead: head, From: "discussant",
		Message: &wire.Message{MessageID: "m", Role: wire.RoleUser, Parts: []wire.Part{{Kind: wire.KindText, Text: &text}}}})
	if err != nil {
		t.Fatal(err)
	}
	seeds := [][]byte{ev, push, bustest.SampleEvent("bench", 1)}
	for _, s := range []string{
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a","recipientContextId":"b"}}`,
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a","recipient\u0043ontextId":"b"}}`,
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a"},"params":{"recipientContextId":"b"}}`,
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a"},"params":{}}`,
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a"},"p\u0061rams":{"recipientContextId":"b"}}`,
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a"},"p\u0061rams":{"recipient\u0043ontextId":"b"}}`,
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a","x":{"recipientContextId":"b"}}}`,
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a\u0062"}}`,
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":""}}`,
		"{\"jsonrpc\":\"2.0\",\"method\":\"m\",\"params\":{\"recipientContextId\":\"\xff\"}}",
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a"`,
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a"},]`,
	} {
		seeds = append(seeds, []byte(s))
	}
	return seeds
}

// FuzzFastNote checks the fast route against a full decode, as
// FuzzScanHead checks scanHead, and against scanHead itself.
func FuzzFastNote(f *testing.F) {
	for _, s := range fastNoteSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		recipient, ok := fastNote(line)
		if !ok {
			return
		}
		if recipient == "" {
			t.Fatal("an empty recipient routed")
		}
		if h, ok := scanHead(line); ok && (!h.isNote || h.recipient != recipient) {
			t.Fatalf("fastNote %q, scanHead %+v", recipient, h)
		}
		var exact map[string]json.RawMessage
		if json.Unmarshal(line, &exact) != nil {
			return // not JSON: the session's decode refuses it
		}
		var params map[string]json.RawMessage
		var rc string
		if exact["method"] == nil || json.Unmarshal(exact["params"], &params) != nil || json.Unmarshal(params["recipientContextId"], &rc) != nil {
			t.Fatalf("fastNote routed %q to %q, a decode finds method %q, params %q", line, recipient, exact["method"], exact["params"])
		}
		if rc != recipient {
			t.Fatalf("recipientContextId: fastNote %q, decode %q", recipient, rc)
		}
	})
}

// TestFastNoteTakesTheBrokersNotifications: the broker's own
// notifications take the fast route; each departure that could change the
// route is left to scanHead.
func TestFastNoteTakesTheBrokersNotifications(t *testing.T) {
	seeds := fastNoteSeeds(t)
	for i, want := range []string{"s-2", "s-2", "bench"} {
		if got, ok := fastNote(seeds[i]); !ok || got != want {
			t.Errorf("%s: fastNote %q, %v; want %q", seeds[i], got, ok, want)
		}
	}
	for _, line := range seeds[3:] {
		if got, ok := fastNote(line); ok {
			t.Errorf("%s: fastNote took it, routed to %q", line, got)
		}
	}
}
