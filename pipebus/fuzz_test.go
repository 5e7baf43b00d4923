package pipebus_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/pipebus"
)

const fuzzLimit = 4096

// isNotification is an oracle independent of the broker's decoder: a
// UTF-8 JSON object with "jsonrpc":"2.0", a non-empty string method and
// no "id" member.
func isNotification(line []byte) bool {
	if !utf8.Valid(line) {
		return false
	}
	t := bytes.TrimLeft(line, " \t\r")
	if len(t) == 0 || t[0] != '{' {
		return false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(line, &m) != nil {
		return false
	}
	if _, ok := m["id"]; ok {
		return false
	}
	var version, method string
	if json.Unmarshal(m["jsonrpc"], &version) != nil || version != "2.0" {
		return false
	}
	return json.Unmarshal(m["method"], &method) == nil && method != ""
}

// FuzzServeLine sends one arbitrary line, then a sentinel request, through
// the pipe to a real broker: the broker must answer the line with exactly
// one well-formed response (none for a notification or a blank line), then
// answer the sentinel: it never stops serving.
func FuzzServeLine(f *testing.F) {
	for _, seed := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"a2a.agents.register","params":{"contextId":"s1","card":{"name":"a"}}}`,
		`{"jsonrpc":"2.0","id":"x","method":"a2a.message.send","params":{"token":"00","message":{"parts":[{"kind":"file","file":{"bytes":"aGk="}}]}}}`,
		`{"jsonrpc":"2.0","method":"a2a.agents.list"}`,
		`{"jsonrpc":"2.0","ID":1,"method":"a2a.agents.list"}`,
		`[1,2]`, `null`, `{"jsonrpc":"2.0","id":[],"method":"m"}`, "{\"a\":\"\xff\"}", `   `,
		`{"jsonrpc":"2.0","id":1,"method":"a2a.events.replay","params":{"contextId":"s","epoch":"","afterSeq":18446744073709551615}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		line = bytes.ReplaceAll(line, []byte("\n"), nil)
		reqR, reqW, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		respR, respW, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		bus, err := pipebus.New(reqR, respW, pipebus.Config{MaxMessageBytes: fuzzLimit})
		if err != nil {
			t.Fatal(err)
		}
		b, err := broker.New(context.Background(), bus, broker.Config{})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		// Read everything the broker writes, until the bus closes its end.
		lines := make(chan [][]byte, 1)
		go func() {
			defer respR.Close()
			sc := bufio.NewScanner(respR)
			sc.Buffer(nil, 1<<20)
			var got [][]byte
			for sc.Scan() {
				got = append(got, bytes.Clone(sc.Bytes()))
			}
			lines <- got
		}()
		reqW.Write(append(line, '\n'))
		reqW.Write([]byte(`{"jsonrpc":"2.0","id":"sentinel-7f3a","method":"a2a.nope"}` + "\n"))
		reqW.Close()
		// At the end of its input the bus answers what it read, then stops.
		select {
		case <-bus.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the bus did not stop at the end of its input")
		}
		bus.Close()
		var answers []map[string]json.RawMessage
		sentinel := false
		for _, l := range <-lines {
			var m map[string]json.RawMessage
			if err := json.Unmarshal(l, &m); err != nil {
				t.Fatalf("broker wrote a line that is not JSON: %q", l)
			}
			if string(m["id"]) == `"sentinel-7f3a"` {
				sentinel = true
				continue
			}
			answers = append(answers, m)
		}
		if !sentinel {
			t.Fatalf("the broker stopped serving after %q", line)
		}
		trimmed := bytes.TrimSpace(line)
		want := 1
		if len(line) <= fuzzLimit && (len(trimmed) == 0 || isNotification(line)) {
			want = 0
		}
		if len(answers) != want {
			t.Fatalf("line %q got %d answers, want %d: %v", line, len(answers), want, answers)
		}
		for _, m := range answers {
			_, hasResult := m["result"]
			_, hasError := m["error"]
			if hasResult == hasError || string(m["jsonrpc"]) != `"2.0"` {
				t.Fatalf("malformed response %v", m)
			}
			if _, ok := m["id"]; !ok {
				t.Fatalf("response without id %v", m)
			}
		}
	})
}
