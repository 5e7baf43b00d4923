package wire_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/wire"
)

// event is a task event or a push made from fuzz bytes, as the broker
// could send it.
func (s *source) event() (method string, params any) {
	if s.bool() {
		return wire.NotifyPush, &wire.Push{EventHead: s.head(), From: s.str(), Message: s.message()}
	}
	return wire.NotifyTaskEvent, &wire.TaskEvent{EventHead: s.head(), TaskID: s.str(), Kind: wire.EventKind(s.str()), Task: s.task(), Message: s.message(), Final: s.bool()}
}

// sameAsTheFullDecode fails if the fast path decodes raw to anything but
// what the full decode gives; it reports whether the fast path took it.
func sameAsTheFullDecode(t *testing.T, raw []byte) bool {
	t.Helper()
	fast, ok := wire.FastEvent(raw)
	if !ok {
		return false
	}
	full, err := wire.FullEvent(raw)
	require.NoError(t, err, "the fast path took what the full decode refuses: %s", raw)
	require.Equal(t, full, fast, "%s", raw)
	return true
}

// FuzzFastEventIsTheFullDecode: whatever the fast path decodes, it decodes
// as the full decode does. It is given the broker's own notifications
// (which it must take, unless a timestamp is out of its years), and those
// bytes with one change (which it takes or leaves, never misreads).
func FuzzFastEventIsTheFullDecode(f *testing.F) {
	f.Add([]byte{}, uint16(0), byte(0))
	f.Add(bytes.Repeat([]byte{1}, 300), uint16(40), byte('x'))
	f.Add([]byte("\x01\x05\x05hello\x03<&>\x02\"\\\x04\xe2\x80\xa8\xff\x01\x01\x01\x01\x01\x01\x07\x08\t\n\x0b\x0c\r\x1f\x7f"), uint16(7), byte('"'))
	for i := range byte(4) {
		f.Add(append([]byte{i, 1, 3}, bytes.Repeat([]byte("\x03a<b\x01\x02\x05\x06"), 40)...), uint16(i)*31, byte('\\'))
	}
	f.Fuzz(func(t *testing.T, data []byte, at uint16, to byte) {
		s := &source{b: data}
		method, params := s.event()
		raw, err := wire.MarshalNotification(method, params)
		if err != nil {
			return // a raw member that is not JSON: the broker never sends it
		}
		if !sameAsTheFullDecode(t, raw) {
			// Only a timestamp outside the years 0 to 9999 is left out.
			assert.Regexp(t, `"(-|[0-9]{5,})`, string(raw), "the fast path left the broker's own notification: %s", raw)
		}
		changed := bytes.Clone(raw)
		changed[int(at)%len(changed)] = to
		sameAsTheFullDecode(t, changed)
	})
}

// TestTheFastPathTakesTheBrokersEvents: the notifications the broker
// writes go the fast way (so the fuzz target's comparisons are not
// vacuous), and what it does not write goes the full way.
func TestTheFastPathTakesTheBrokersEvents(t *testing.T) {
	text, data := "take seat 2? <b>&</b> \u2028 é \x00 \xff", "aGk="
	now := wire.NewTime(time.Date(2026, 12, 1, 10, 0, 0, 123e6, time.UTC))
	msg := &wire.Message{MessageID: "m-1", Role: wire.RoleUser, From: "asker", TaskID: "t-1", ContextID: "s1", Metadata: []byte(` {"k": "<v>"} `),
		Parts: []wire.Part{{Kind: wire.KindText, Text: &text}, {Kind: wire.KindData, Data: []byte(`[1, {"a": 2}]`)}, {Kind: wire.KindFile, File: &wire.File{Name: "f", Bytes: &data}}, {Kind: wire.KindFile, File: &wire.File{}}}}
	task := &wire.Task{ID: "t-1", ContextID: "s1", RequesterName: "asker", AgentName: "worker", AgentContextID: "s2",
		Status:  wire.TaskStatus{State: wire.StateWorking, Timestamp: now, Message: msg},
		History: []wire.Message{*msg, {MessageID: "m-2", Parts: []wire.Part{}}}, Artifacts: []wire.Artifact{{ArtifactID: "a", Name: "n", Parts: msg.Parts, Metadata: []byte(`{}`)}},
		CreatedAt: now, UpdatedAt: now, Metadata: []byte(`{"z":null}`)}
	head := wire.EventHead{Recipient: "worker", RecipientContextID: "s2", ContextID: "s1", Seq: 1<<64 - 1, Epoch: "e"}
	for _, n := range []struct {
		method string
		params any
	}{
		{wire.NotifyTaskEvent, &wire.TaskEvent{EventHead: head, TaskID: "t-1", Kind: wire.EventCreated, Task: task, Message: msg, Final: true}},
		{wire.NotifyTaskEvent, &wire.TaskEvent{EventHead: head, Task: &wire.Task{}}},
		{wire.NotifyTaskEvent, &wire.TaskEvent{}},
		{wire.NotifyPush, &wire.Push{EventHead: head, From: "asker", Message: msg}},
		{wire.NotifyPush, &wire.Push{}},
	} {
		raw, err := wire.MarshalNotification(n.method, n.params)
		require.NoError(t, err)
		assert.True(t, sameAsTheFullDecode(t, raw), "%s", raw)
		ev, err := wire.DecodeEvent(raw)
		require.NoError(t, err)
		full, _ := wire.FullEvent(raw)
		assert.Equal(t, full, ev)
	}
	// A raw member as deep as the full decode allows on its own, but not
	// inside the event, is the full decode's to refuse.
	deep := strings.Repeat("[", 9998) + strings.Repeat("]", 9998)
	raw, err := wire.MarshalNotification(wire.NotifyPush, &wire.Push{Message: &wire.Message{MessageID: "m", Metadata: []byte(deep)}})
	require.NoError(t, err)
	_, ok := wire.FastEvent(raw)
	assert.False(t, ok, "the fast path took a metadata member nested 9,998 deep")
	_, err = wire.DecodeEvent(raw)
	assert.Error(t, err, "too deep for the full decode")
	for _, raw := range []string{
		`{"method":"a2a.push","params":{}}`,
		`{"jsonrpc":"2.0","method":"a2a.push","params":{"recipient":"a","recipientContextId":"s","contextId":"s","seq":1,"epoch":"e","from":"b","message":null}} `,
		`{"jsonrpc":"2.0","method":"a2a.push","params":{"recipient":"a","recipientContextId":"s","contextId":"s","seq":01,"epoch":"e","from":"b","message":null}}`,
		`{"jsonrpc":"2.0","method":"a2a.push","params":{"recipient":"\ud800","recipientContextId":"s","contextId":"s","seq":1,"epoch":"e","from":"b","message":null}}`,
		`{"jsonrpc":"2.0","method":"a2a.task.event","params":{"recipient":"a","recipientContextId":"s","contextId":"s","seq":1,"epoch":"e","taskId":"t","kind":"created","task":{"id":"t","contextId":"s","requesterName":"a","agentName":"b","agentContextId":"s","status":{"state":"submitted","timestamp":"2026-02-30T00:00:00.000Z"},"artifacts":[],"createdAt":"2026-02-03T00:00:00.000Z","updatedAt":"2026-02-03T00:00:00.000Z"},"final":false}}`,
	} {
		_, ok := wire.FastEvent([]byte(raw))
		assert.False(t, ok, "the fast path took %s", raw)
	}
}

func BenchmarkDecodeEvent(b *testing.B) {
	raw, err := wire.MarshalNotification(wire.NotifyTaskEvent, benchEvent())
	require.NoError(b, err)
	for _, c := range []struct {
		name string
		fn   func([]byte) (*wire.Event, error)
	}{{"full", wire.FullEvent}, {"DecodeEvent", wire.DecodeEvent}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.fn(raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
