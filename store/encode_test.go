package store_test

import (
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/wire"
)

// fuzzRecord makes a record from fuzz bytes: each field takes a few, so
// that invalid UTF-8, quotes, HTML's specials and control characters
// reach every string, and raw members that are not JSON come up too.
func fuzzRecord(data []byte) *store.Record {
	next := func() string {
		if len(data) == 0 {
			return ""
		}
		n := min(int(data[0]&15), len(data)-1)
		s := string(data[1 : 1+n])
		data = data[1+n:]
		return s
	}
	flag := func() bool { return len(next())%2 == 1 }
	text := next()
	msg := wire.Message{MessageID: next(), Role: wire.Role(next()), Parts: []wire.Part{{Kind: wire.KindText, Text: &text}}, Metadata: json.RawMessage(next())}
	if len(msg.Metadata) == 0 {
		msg.Metadata = nil
	}
	at := wire.NewTime(time.UnixMilli(int64(len(data)) * 7919))
	rec := &store.Record{
		Task: wire.Task{ID: next(), ContextID: next(), RequesterName: next(), AgentName: next(), AgentContextID: next(),
			Status: wire.TaskStatus{State: wire.State(next()), Timestamp: at}, Artifacts: []wire.Artifact{}, CreatedAt: at, UpdatedAt: at},
		RequesterInstance: next(), AssigneeInstance: next(), SendKey: next(), SendDigest: next(),
	}
	if flag() {
		rec.Task.History = []wire.Message{msg}
	}
	if flag() {
		rec.Size = len(data) - 40
	}
	for flag() {
		rec.Applied = append(rec.Applied, store.Applied{By: next(), Key: next(), Digest: next()})
	}
	return rec
}

// FuzzEncodeIsJSONMarshal: Record.Encode writes exactly what json.Marshal
// writes of a record, or fails where it fails: the stored format does not
// change with the encoder.
func FuzzEncodeIsJSONMarshal(f *testing.F) {
	f.Add([]byte("\x05hello\x03m-1\x04user\x02{}\x02t1\x02s1\x01a\x01b\x02s2\x07working\x02ia\x02ib\x03key\x03dig\x01x\x01y\x01z"))
	f.Add([]byte("\x04<&>\"\x02\xff\xfe\x03\u2028\x05{\"a\":\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		rec := fuzzRecord(data)
		want, werr := json.Marshal(rec)
		got, gerr := rec.Encode()
		if werr != nil {
			require.Error(t, gerr, "json.Marshal refuses %+v", rec)
			return
		}
		require.NoError(t, gerr)
		assert.Equal(t, string(want), string(got))
	})
}

func BenchmarkEncode(b *testing.B) {
	text := "Shall we share the roundtable? I take seat 1."
	at := wire.NewTime(time.Date(2026, 9, 5, 12, 0, 0, 0, time.UTC))
	rec := &store.Record{Task: wire.Task{ID: "01929c6e-7f7c-7a10-9c7b-3f2f0a4d5e6f", ContextID: "chat-1", RequesterName: "discussant",
		AgentName: "discussant-2", AgentContextID: "chat-2", Status: wire.TaskStatus{State: wire.StateSubmitted, Timestamp: at},
		History:   []wire.Message{{MessageID: "m-1", Role: wire.RoleUser, Parts: []wire.Part{{Kind: wire.KindText, Text: &text}}, From: "discussant"}},
		Artifacts: []wire.Artifact{}, CreatedAt: at, UpdatedAt: at}, RequesterInstance: "i-1", AssigneeInstance: "i-2", Size: 600}
	for _, c := range []struct {
		name   string
		encode func() ([]byte, error)
	}{{"json.Marshal", func() ([]byte, error) { return json.Marshal(rec) }}, {"Encode", rec.Encode}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.encode(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestEncodeTakesAnySize: a record's size is a hint for the room Encode
// makes ahead, and a size read back from a damaged store may be anything.
func TestEncodeTakesAnySize(t *testing.T) {
	for _, size := range []int{math.MaxInt, math.MaxInt - 255, math.MinInt, -1, 1 << 30} {
		rec := fuzzRecord([]byte("\x02ab\x03cde"))
		rec.Size = size
		want, err := json.Marshal(rec)
		require.NoError(t, err)
		got, err := rec.Encode()
		require.NoError(t, err)
		assert.Equal(t, string(want), string(got), "size %d", size)
	}
}
