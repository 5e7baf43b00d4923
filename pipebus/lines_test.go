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
		want wire.Route
	}{
		{"notification", ev, wire.Route{Notification: true, Session: "bench"}},
		{"response", resp, wire.Route{ID: []byte("17")}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.line)))
			b.ReportAllocs()
			for b.Loop() {
				r, ok := wire.ReadRoute(c.line)
				if !ok || r.Notification != c.want.Notification || r.Session != c.want.Session || !bytes.Equal(r.ID, c.want.ID) {
					b.Fatalf("ReadRoute: %+v, %v", r, ok)
				}
			}
		})
	}
}
