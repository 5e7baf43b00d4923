package wire_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
	"unsafe"

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

// sameAsTheFullParse fails if the fast path reads raw as anything but
// what the full path reads, params included; it reports whether the fast
// path took it.
func sameAsTheFullParse(t *testing.T, raw []byte) bool {
	t.Helper()
	fast, ok := wire.FastRequest(raw)
	if !ok {
		return false
	}
	full, perr := wire.FullRequest(raw)
	require.Nil(t, perr, "the fast path took what the full path refuses: %s", raw)
	require.Equal(t, full.JSONRPC, fast.JSONRPC, "%s", raw)
	require.Equal(t, full.ID, fast.ID, "%s", raw)
	require.Equal(t, full.Method, fast.Method, "%s", raw)
	require.Equal(t, string(full.Params), string(fast.Params), "%s", raw)
	require.Equal(t, len(fast.Params), cap(fast.Params), "the params can grow into the request: %s", raw)
	switch fast.Method {
	case wire.MethodSend:
		var a, b wire.SendParams
		require.Nil(t, full.DecodeParams(&a), "%s", raw)
		require.Nil(t, fast.DecodeParams(&b), "%s", raw)
		require.Equal(t, a, b, "%s", raw)
	case wire.MethodUpdateTask:
		var a, b wire.UpdateParams
		require.Nil(t, full.DecodeParams(&a), "%s", raw)
		require.Nil(t, fast.DecodeParams(&b), "%s", raw)
		require.Equal(t, a, b, "%s", raw)
	default:
		t.Fatalf("the fast path read method %q", fast.Method)
	}
	return true
}

// request is a send or an update made from fuzz bytes, as a runtime could
// send it.
func (s *source) request() (id uint64, method string, params any) {
	id = uint64(s.byte())<<40 | uint64(s.byte())
	for {
		switch v := s.value().(type) {
		case wire.SendParams, *wire.SendParams:
			return id, wire.MethodSend, v
		case wire.UpdateParams, *wire.UpdateParams:
			return id, wire.MethodUpdateTask, v
		}
		if len(s.b) == 0 {
			return id, wire.MethodSend, wire.SendParams{}
		}
	}
}

// FuzzFastRequestIsTheFullParse: whatever the fast path reads of a
// request, it reads as the full path does. It is given the requests the
// runtime encodes (which it must take when they are UTF-8), and those
// bytes with one change (which it takes or leaves, never misreads).
func FuzzFastRequestIsTheFullParse(f *testing.F) {
	f.Add([]byte{}, uint16(0), byte(0))
	f.Add([]byte{0, 7, 8, 5, 't', 'o', 'k', 'e', 'n', 1, 'b', 1, 't', 1, 1, 3, 'm', '-', '1'}, uint16(40), byte('x'))
	f.Add([]byte{1, 2, 9, 3, 'a', 'b', 'c', 2, 't', '1', 9, 'c', 'o', 'm', 'p', 'l', 'e', 't', 'e', 'd', 1, 1, 2}, uint16(33), byte('"'))
	f.Add(append([]byte{0, 1, 8}, bytes.Repeat([]byte("\x03a<b\x01\x02\x05\x06"), 40)...), uint16(77), byte('\\'))
	f.Fuzz(func(t *testing.T, data []byte, at uint16, to byte) {
		s := &source{b: data}
		id, method, params := s.request()
		raw, err := wire.EncodeRequest(id, method, params)
		if err != nil {
			return // a raw member that is not JSON: no runtime sends it
		}
		if !sameAsTheFullParse(t, raw) {
			// Only a raw member's invalid UTF-8 is left out.
			assert.False(t, utf8.Valid(raw), "the fast path left a runtime's request: %s", raw)
		}
		changed := bytes.Clone(raw)
		changed[int(at)%len(changed)] = to
		sameAsTheFullParse(t, changed)
	})
}

// TestTheFastPathTakesTheRuntimesRequests: the sends and updates the
// runtime encodes go the fast way (so the fuzz target's comparisons are
// not vacuous); every other request, and any departure from the form,
// goes the full way.
func TestTheFastPathTakesTheRuntimesRequests(t *testing.T) {
	text, data := "take seat 2? <b>&</b> \u2028 é \x00", "aGk="
	msg := &wire.Message{MessageID: "m-1", Role: wire.RoleUser, Metadata: []byte(` {"k": "<v>"} `),
		Parts: []wire.Part{{Kind: wire.KindText, Text: &text}, {Kind: wire.KindData, Data: []byte(`[1, {"a": 2}]`)}, {Kind: wire.KindFile, File: &wire.File{Name: "f", Bytes: &data}}}}
	for _, r := range []struct {
		method string
		params any
	}{
		{wire.MethodSend, wire.SendParams{Token: "tok", To: "worker", Message: msg}},
		{wire.MethodSend, &wire.SendParams{Token: "tok", TaskID: "t-1", Message: msg, Oneway: true, Metadata: []byte(`{"m":[]}`)}},
		{wire.MethodSend, wire.SendParams{}},
		{wire.MethodUpdateTask, wire.UpdateParams{Token: "tok", TaskID: "t-1", State: wire.StateCompleted}},
		{wire.MethodUpdateTask, &wire.UpdateParams{Token: "tok", TaskID: "t-1", State: wire.StateWorking, Message: msg, MessageID: "u-1",
			Artifacts: []wire.Artifact{{ArtifactID: "a", Name: "n", Parts: msg.Parts, Metadata: []byte(`{}`)}}}},
	} {
		raw, err := wire.EncodeRequest(1<<64-1, r.method, r.params)
		require.NoError(t, err)
		assert.True(t, sameAsTheFullParse(t, raw), "%s", raw)
	}
	// A raw member as deep as a request may nest on its own, but not
	// where it sits, is the full path's to refuse.
	deep := strings.Repeat("[", wire.MaxDepth-1) + strings.Repeat("]", wire.MaxDepth-1)
	raw, err := wire.EncodeRequest(1, wire.MethodSend, wire.SendParams{Token: "t", Message: &wire.Message{Parts: []wire.Part{{Kind: wire.KindData, Data: []byte(deep)}}}})
	require.NoError(t, err)
	_, ok := wire.FastRequest(raw)
	assert.False(t, ok, "the fast path took a part's data nested %d deep", wire.MaxDepth-1)
	_, perr := wire.ParseRequest(raw, 0)
	require.NotNil(t, perr, "too deep for a request")
	assert.Equal(t, wire.ErrInvalidRequest.Code, perr.Code)
	for _, raw := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"a2a.tasks.get","params":{"token":"t","taskId":"x"}}`,
		`{"jsonrpc":"2.0","id":"1","method":"a2a.tasks.update","params":{"token":"t","taskId":"x","state":"completed"}}`,
		`{"jsonrpc":"2.0","id":01,"method":"a2a.tasks.update","params":{"token":"t","taskId":"x","state":"completed"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"a2a.tasks.update","params":{"token":"t","taskId":"x","state":"completed"}} `,
		`{"jsonrpc":"2.0","id":1,"method":"a2a.tasks.update","params":{"taskId":"x","token":"t","state":"completed"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"a2a.tasks.update","params":{"token":"t","taskId":"x","state":"completed","token":"u"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"a2a.tasks.update","params":{"token":"\ud800","taskId":"x","state":"completed"}}`,
		"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a2a.message.send\",\"params\":{\"token\":\"t\",\"message\":{\"messageId\":\"\",\"parts\":[],\"metadata\":\"\xff\"}}}",
		`{"jsonrpc":"2.0","id":1,"method":"a2a.message.send","params":{"token":"t","message":{"messageId":"","parts":[{"kind":"data","data":[1,}]}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"a2a.message.send","params":{"token":"t","message":null},"id":2}`,
	} {
		_, ok := wire.FastRequest([]byte(raw))
		assert.False(t, ok, "the fast path took %s", raw)
	}
}

func BenchmarkParseRequest(b *testing.B) {
	text := "Shall we share the roundtable? I take seat 1."
	raw, err := wire.EncodeRequest(17, wire.MethodSend, &wire.SendParams{Token: "5c2f7a8e9b0d4c1f8a6e3b2d1c0f9e8d5c2f7a8e9b0d4c1f", To: "discussant-2",
		Message: &wire.Message{MessageID: "m-1", Parts: []wire.Part{{Kind: wire.KindText, Text: &text}}}})
	require.NoError(b, err)
	for _, c := range []struct {
		name  string
		parse func([]byte) (*wire.Request, *wire.Error)
	}{{"full", wire.FullRequest}, {"ParseRequest", func(raw []byte) (*wire.Request, *wire.Error) { return wire.ParseRequest(raw, 0) }}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				req, perr := c.parse(raw)
				if perr != nil {
					b.Fatal(perr)
				}
				var p wire.SendParams
				if perr := req.DecodeParams(&p); perr != nil {
					b.Fatal(perr)
				}
			}
		})
	}
}

// FuzzFastResultIsTheFullDecode: DecodeResponse reads every response as
// its full path does, and takes every result EncodeResult writes the fast
// way; the same bytes with one change it reads the same either way too.
func FuzzFastResultIsTheFullDecode(f *testing.F) {
	f.Add([]byte(`7`), []byte(`{"task":{"id":"t"}}`), uint16(0), byte('x'))
	f.Add([]byte(`"x\"y"`), []byte(`[1, 2] `), uint16(30), byte('}'))
	f.Add([]byte(`null`), []byte(`{"a":",\"error\":"}`), uint16(25), byte(' '))
	f.Fuzz(func(t *testing.T, id, result []byte, at uint16, to byte) {
		same := func(raw []byte) bool {
			t.Helper()
			fid, fres, ferr, fe := wire.DecodeResponse(raw)
			wid, wres, werr, we := wire.FullResponse(raw)
			require.Equal(t, wid, fid, "id of %q", raw)
			require.Equal(t, wres, fres, "result of %q", raw)
			require.Equal(t, werr, ferr, "error of %q", raw)
			require.Equal(t, we == nil, fe == nil, "%q: %v, %v", raw, we, fe)
			id, result, ok := wire.FastResult(raw)
			if ok {
				require.Equal(t, len(id), cap(id), "the id can grow into the response: %q", raw)
				require.Equal(t, len(result), cap(result), "the result can grow into the response: %q", raw)
			}
			return ok
		}
		raw, err := wire.EncodeResult(json.RawMessage(id), json.RawMessage(result))
		if err != nil {
			return
		}
		trimmed := func(b []byte) bool { return len(b) > 0 && bytes.Equal(bytes.TrimSpace(b), b) && json.Valid(b) }
		if !same(raw) && trimmed(id) && trimmed(result) {
			t.Errorf("the fast path left %q", raw)
		}
		changed := bytes.Clone(raw)
		changed[int(at)%len(changed)] = to
		same(changed)
	})
}

func BenchmarkDecodeResponse(b *testing.B) {
	ev := benchEvent()
	task := *ev.Task
	task.History = []wire.Message{*ev.Message}
	raw, err := wire.EncodeResult(json.RawMessage("17"), wire.TaskResult{Task: &task})
	require.NoError(b, err)
	for _, c := range []struct {
		name   string
		decode func([]byte) (json.RawMessage, json.RawMessage, *wire.Error, error)
	}{{"full", wire.FullResponse}, {"DecodeResponse", wire.DecodeResponse}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, _, err := c.decode(raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestTokensAreNotKeptAmongTheStringsSeen: the fast path's decoders, and
// the short strings they keep to hand out again, are shared by every
// session; a token is made anew each time, never looked up among them.
func TestTokensAreNotKeptAmongTheStringsSeen(t *testing.T) {
	raw, err := wire.EncodeRequest(1, wire.MethodSend, wire.SendParams{Token: "5c2f7a8e9b0d4c1f8a6e3b2d1c0f9e8d", To: "worker", Message: &wire.Message{}})
	require.NoError(t, err)
	decode := func() wire.SendParams {
		req, ok := wire.FastRequest(raw)
		require.True(t, ok)
		var p wire.SendParams
		require.Nil(t, req.DecodeParams(&p))
		return p
	}
	// The strings are compared as addresses (assert.Equal would compare
	// what they point to). The decoders come from a sync.Pool, which may
	// drop one (it does often under -race): only a pair decoded by the
	// same decoder, which hands the recipient's name out twice, says
	// anything of the token.
	reused := false
	for range 100 {
		a, b := decode(), decode()
		require.Equal(t, a.Token, b.Token)
		if unsafe.StringData(a.To) != unsafe.StringData(b.To) {
			continue // two decoders
		}
		reused = true
		require.True(t, unsafe.StringData(a.Token) != unsafe.StringData(b.Token), "the token was kept among the strings seen")
	}
	require.True(t, reused, "no decoder decoded twice in 100 pairs")
}
