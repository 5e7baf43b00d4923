package wire_test

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/wire"
)

// source turns fuzz bytes into the fields of a value: each call takes
// what it needs from the front, and an exhausted source gives zeros.
type source struct{ b []byte }

func (s *source) byte() byte {
	if len(s.b) == 0 {
		return 0
	}
	c := s.b[0]
	s.b = s.b[1:]
	return c
}

func (s *source) bool() bool { return s.byte()&1 == 1 }

// str is a string of up to 31 arbitrary bytes: invalid UTF-8, control
// characters, quotes and HTML's specials all come up.
func (s *source) str() string {
	n := min(int(s.byte()&31), len(s.b))
	v := string(s.b[:n])
	s.b = s.b[n:]
	return v
}

func (s *source) strp() *string {
	if !s.bool() {
		return nil
	}
	v := s.str()
	return &v
}

// raws are raw members as a client may send them, and some no client
// can (they are not JSON): json.Marshal refuses those, and so must
// Marshal.
var raws = []string{"", `{}`, `{"a": 1, "b": [true, null, "x"]}`, " { \"k\" : \"<b>&amp;\u2028\" } ", `null`, `[1, 2]`, `{"a":`, `nope`, "{\"bad\":\"\xff\"}", `"s"`, `  7  `}

func (s *source) raw() json.RawMessage {
	switch i := int(s.byte()); {
	case i < len(raws)*8:
		if r := raws[i%len(raws)]; r != "" {
			return json.RawMessage(r)
		}
		return nil
	default:
		return json.RawMessage(s.str())
	}
}

func (s *source) time() wire.Time {
	ms := int64(s.byte())<<32 | int64(s.byte())<<24 | int64(s.byte())<<16 | int64(s.byte())<<8 | int64(s.byte())
	if s.bool() {
		ms = -ms
	}
	t := time.UnixMilli(ms * 997)
	if s.bool() {
		t = t.In(time.FixedZone("x", 5*3600+1800)) // written in UTC all the same
	}
	return wire.Time{Time: t}
}

func (s *source) parts() []wire.Part {
	if s.byte() == 0 {
		return nil
	}
	ps := make([]wire.Part, int(s.byte()%3))
	for i := range ps {
		p := wire.Part{Kind: wire.PartKind(s.str()), Text: s.strp(), Data: s.raw(), Metadata: s.raw()}
		if s.bool() {
			p.File = &wire.File{Name: s.str(), MimeType: s.str(), Bytes: s.strp(), URI: s.strp()}
		}
		ps[i] = p
	}
	return ps
}

func (s *source) message() *wire.Message {
	if !s.bool() {
		return nil
	}
	return &wire.Message{MessageID: s.str(), Role: wire.Role(s.str()), Parts: s.parts(), From: s.str(), TaskID: s.str(), ContextID: s.str(), Metadata: s.raw()}
}

func (s *source) task() *wire.Task {
	if s.byte() == 0 {
		return nil
	}
	t := &wire.Task{ID: s.str(), ContextID: s.str(), RequesterName: s.str(), AgentName: s.str(), AgentContextID: s.str(),
		Status:    wire.TaskStatus{State: wire.State(s.str()), Timestamp: s.time(), Message: s.message()},
		CreatedAt: s.time(), UpdatedAt: s.time(), Metadata: s.raw()}
	for range s.byte() % 3 {
		if m := s.message(); m != nil {
			t.History = append(t.History, *m)
		}
	}
	switch s.byte() % 3 {
	case 1:
		t.Artifacts = []wire.Artifact{}
	case 2:
		for range 1 + s.byte()%2 {
			t.Artifacts = append(t.Artifacts, wire.Artifact{ArtifactID: s.str(), Name: s.str(), Parts: s.parts(), Metadata: s.raw()})
		}
	}
	return t
}

func (s *source) head() wire.EventHead {
	return wire.EventHead{Recipient: s.str(), RecipientContextID: s.str(), ContextID: s.str(), Seq: uint64(s.byte())<<56 | uint64(s.byte()), Epoch: s.str()}
}

// value is one of the values Marshal writes by hand.
func (s *source) value() any {
	switch s.byte() % 11 {
	case 10:
		var t *wire.Task
		if s.bool() {
			t = s.task()
		}
		r := wire.SendResult{Task: t, Delivered: s.str()}
		if s.bool() {
			return &r
		}
		return r
	case 8:
		p := wire.SendParams{Token: s.str(), To: s.str(), TaskID: s.str(), Message: s.message(), Oneway: s.bool(), Metadata: s.raw()}
		if s.bool() {
			return &p
		}
		return p
	case 9:
		p := wire.UpdateParams{Token: s.str(), TaskID: s.str(), State: wire.State(s.str()), Message: s.message(), MessageID: s.str()}
		switch s.byte() % 3 {
		case 1:
			p.Artifacts = []wire.Artifact{}
		case 2:
			p.Artifacts = []wire.Artifact{{ArtifactID: s.str(), Parts: s.parts(), Metadata: s.raw()}}
		}
		if s.bool() {
			return &p
		}
		return p
	case 5:
		return s.message()
	case 6:
		if !s.bool() {
			return (*wire.TaskStatus)(nil)
		}
		return &wire.TaskStatus{State: wire.State(s.str()), Timestamp: s.time(), Message: s.message()}
	case 7:
		if !s.bool() {
			return (*wire.Artifact)(nil)
		}
		return &wire.Artifact{ArtifactID: s.str(), Name: s.str(), Parts: s.parts(), Metadata: s.raw()}
	case 0:
		return s.task()
	case 1:
		if s.byte() == 0 {
			return (*wire.TaskResult)(nil)
		}
		return &wire.TaskResult{Task: s.task()}
	case 2:
		return wire.TaskResult{Task: s.task()}
	case 3:
		if s.byte() == 0 {
			return (*wire.TaskEvent)(nil)
		}
		return &wire.TaskEvent{EventHead: s.head(), TaskID: s.str(), Kind: wire.EventKind(s.str()), Task: s.task(), Message: s.message(), Final: s.bool()}
	default:
		if s.byte() == 0 {
			return (*wire.Push)(nil)
		}
		return &wire.Push{EventHead: s.head(), From: s.str(), Message: s.message()}
	}
}

// sameAsJSONMarshal fails unless Marshal gives v exactly the bytes, or
// the refusal, that json.Marshal gives it.
func sameAsJSONMarshal(t *testing.T, v any) {
	t.Helper()
	want, wantErr := json.Marshal(v)
	got, err := wire.Marshal(v)
	if wantErr != nil {
		require.Error(t, err, "json.Marshal refuses %#v", v)
		assert.Zero(t, wire.EncodedLen(v))
		_, err = wire.EncodeResult(nil, v)
		require.Error(t, err)
		_, err = wire.MarshalNotification(wire.NotifyTaskEvent, v)
		require.Error(t, err)
		_, err = wire.EncodeRequest(7, "m", v)
		require.Error(t, err)
		out, err := wire.AppendRequest([]byte("before"), 7, "m", v)
		require.Error(t, err)
		assert.Equal(t, "before", string(out))
		return
	}
	require.NoError(t, err)
	if !bytes.Equal(got, want) {
		t.Fatalf("Marshal differs from json.Marshal:\n got %s\nwant %s", got, want)
	}
	assert.Equal(t, len(want), wire.EncodedLen(v))
	q, err := wire.EncodeRequest(7, "a2a.<method>", v)
	require.NoError(t, err)
	params := string(want)
	if v == nil {
		params = "{}" // a request without params has empty ones
	}
	assert.Equal(t, `{"jsonrpc":"2.0","id":7,"method":"a2a.\u003cmethod\u003e","params":`+params+`}`, string(q))
	a, err := wire.AppendRequest([]byte("before"), 7, "a2a.<method>", v)
	require.NoError(t, err)
	assert.Equal(t, "before"+string(q), string(a), "AppendRequest appends what EncodeRequest returns")
	r, err := wire.EncodeResult(json.RawMessage(`7`), v)
	require.NoError(t, err)
	assert.Equal(t, `{"jsonrpc":"2.0","id":7,"result":`+string(want)+`}`, string(r))
	n, err := wire.MarshalNotification(wire.NotifyTaskEvent, v)
	require.NoError(t, err)
	want, err = json.Marshal(struct {
		JSONRPC string `json:"jsonrpc"`
		Method  string `json:"method"`
		Params  any    `json:"params"`
	}{wire.Version, wire.NotifyTaskEvent, v})
	require.NoError(t, err)
	assert.Equal(t, string(want), string(n))
}

func FuzzMarshalIsJSONMarshal(f *testing.F) {
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte{1}, 200))
	f.Add([]byte("\x00\x05\x05hello\x03<&>\x02\"\\\x04\xe2\x80\xa8\xff\x01\x01\x01\x01\x01\x01\x07\x08\t\n\x0b\x0c\r\x1f\x7f"))
	for i := range byte(5) {
		f.Add(append([]byte{i, 1}, bytes.Repeat([]byte("\x03a<b\x01\x02"), 40)...))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s := &source{b: data}
		sameAsJSONMarshal(t, s.value())
	})
}

// TestMarshalIsJSONMarshal covers each hand-written member once, with the
// strings and raw members encoding/json escapes or refuses.
func TestMarshalIsJSONMarshal(t *testing.T) {
	text, data, uri := "a \"quoted\" <b>&</b>\n\t\x00\x1f\x7f é \u2028\u2029 \xff\xfe end", "aGk=", "https://example.com/?a=1&b=<2>"
	now := wire.NewTime(time.Date(2026, 12, 1, 10, 0, 0, 123e6, time.UTC))
	msg := wire.Message{MessageID: "m-1", Role: wire.RoleUser, From: "asker", TaskID: "t-1", ContextID: "s1", Metadata: json.RawMessage(` {"k": "<v>"} `),
		Parts: []wire.Part{
			{Kind: wire.KindText, Text: &text, Metadata: json.RawMessage(`{}`)},
			{Kind: wire.KindData, Data: json.RawMessage("[1, {\"a\": \"\u2028\"}]")},
			{Kind: wire.KindFile, File: &wire.File{Name: "f.txt", MimeType: "text/plain", Bytes: &data}},
			{Kind: wire.KindFile, File: &wire.File{URI: &uri}},
			{Kind: wire.KindFile, File: &wire.File{}},
		}}
	task := &wire.Task{ID: "t-1", ContextID: "s1", RequesterName: "asker", AgentName: "worker", AgentContextID: "s2",
		Status:    wire.TaskStatus{State: wire.StateInputRequired, Timestamp: now, Message: &msg},
		History:   []wire.Message{msg, {MessageID: "m-2", Parts: []wire.Part{}}, {MessageID: "m-3"}},
		Artifacts: []wire.Artifact{{ArtifactID: "a-1", Name: "notes", Parts: msg.Parts, Metadata: json.RawMessage(`{"x":1}`)}, {ArtifactID: "a-2"}},
		CreatedAt: now, UpdatedAt: wire.Time{Time: now.Add(time.Hour).In(time.FixedZone("y", -3600))}, Metadata: json.RawMessage(`{"z":null}`)}
	head := wire.EventHead{Recipient: "worker", RecipientContextID: "s2", ContextID: "s1", Seq: 1<<64 - 1, Epoch: "e<1>"}
	for _, v := range []any{
		task, &wire.Task{}, (*wire.Task)(nil),
		&wire.Task{Artifacts: []wire.Artifact{}},
		&wire.TaskResult{Task: task}, wire.TaskResult{}, &wire.TaskResult{}, (*wire.TaskResult)(nil),
		&wire.TaskEvent{EventHead: head, TaskID: "t-1", Kind: wire.EventCreated, Task: task, Message: &msg, Final: true},
		&wire.TaskEvent{}, (*wire.TaskEvent)(nil),
		&wire.Push{EventHead: head, From: "asker", Message: &msg}, &wire.Push{}, (*wire.Push)(nil),
		&msg, &wire.Message{}, (*wire.Message)(nil),
		&task.Status, &wire.TaskStatus{}, (*wire.TaskStatus)(nil),
		&task.Artifacts[0], &wire.Artifact{}, (*wire.Artifact)(nil),
		wire.SendParams{Token: "t", To: "w<1>", TaskID: "x", Message: &msg, Oneway: true, Metadata: json.RawMessage(` {"a": 1} `)},
		&wire.SendParams{}, (*wire.SendParams)(nil), wire.SendParams{Message: &wire.Message{}},
		wire.UpdateParams{Token: "t", TaskID: "x", State: wire.StateCompleted, Message: &msg, Artifacts: task.Artifacts, MessageID: "u-1"},
		&wire.UpdateParams{Artifacts: []wire.Artifact{}}, (*wire.UpdateParams)(nil),
		wire.SendResult{Task: task, Delivered: "w<1>"}, wire.SendResult{Delivered: "w-2"}, &wire.SendResult{Task: task}, wire.SendResult{}, (*wire.SendResult)(nil),
		// Not written by hand: json.Marshal's own.
		msg, task.Status, map[string]int{"b": 2, "a": 1}, nil,
	} {
		sameAsJSONMarshal(t, v)
	}
	// A raw member that is not JSON is json.Marshal's error.
	bad := &wire.Task{Metadata: json.RawMessage(`{"a":`)}
	_, want := json.Marshal(bad)
	_, err := wire.Marshal(bad)
	require.Error(t, want)
	assert.Equal(t, want.Error(), err.Error())
}

// benchEvent is the task event the benchmarks encode and decode: the
// created event of a task with one short text message.
func benchEvent() *wire.TaskEvent {
	text := "take seat 2?"
	now := wire.NewTime(time.Now())
	msg := &wire.Message{MessageID: "m-1", Role: wire.RoleUser, Parts: []wire.Part{{Kind: wire.KindText, Text: &text}}, From: "requester", TaskID: "01929c6e-7f7c-7a10-9c7b-3f2f0a4d5e6f", ContextID: "s1"}
	task := &wire.Task{ID: "01929c6e-7f7c-7a10-9c7b-3f2f0a4d5e6f", ContextID: "s1", RequesterName: "requester", AgentName: "assignee", AgentContextID: "s2", Status: wire.TaskStatus{State: wire.StateSubmitted, Timestamp: now}, Artifacts: []wire.Artifact{}, CreatedAt: now, UpdatedAt: now}
	return &wire.TaskEvent{EventHead: wire.EventHead{Recipient: "assignee", RecipientContextID: "s2", ContextID: "s1", Seq: 7, Epoch: "e"}, TaskID: task.ID, Kind: wire.EventCreated, Task: task, Message: msg}
}

func BenchmarkMarshalEvent(b *testing.B) {
	ev := benchEvent()
	for _, c := range []struct {
		name string
		fn   func(any) ([]byte, error)
	}{{"encoding/json", json.Marshal}, {"wire", wire.Marshal}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.fn(ev); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func FuzzAppendTimeIsAppendFormat(f *testing.F) {
	for _, s := range []int64{0, -1, 1, 253402300799999, 253402300800000, -62135596800000, -62135596800001, 1764583200123} {
		f.Add(s, int32(0))
	}
	f.Fuzz(func(t *testing.T, ms int64, ns int32) {
		v := time.UnixMilli(ms).Add(time.Duration(ns % 1e6))
		want := v.UTC().AppendFormat(nil, wire.TimeFormat)
		if got := wire.AppendTime(nil, v); !bytes.Equal(got, want) {
			t.Fatalf("%d ms %d ns: got %s, want %s", ms, ns, got, want)
		}
	})
}
