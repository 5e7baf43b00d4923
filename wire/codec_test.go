package wire_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/go-json-experiment/json/jsontext"
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

// codecTargets are the types the codec reads, each with a new value.
var codecTargets = []struct {
	name string
	new  func() any
}{
	{"task", func() any { return new(wire.Task) }},
	{"task result", func() any { return new(wire.TaskResult) }},
	{"send result", func() any { return new(wire.SendResult) }},
	{"notification", wire.NewEventNote},
	{"send", func() any { return new(wire.SendParams) }},
	{"update", func() any { return new(wire.UpdateParams) }},
	{"envelope", wire.NewEnvelope},
}

// sameAsTheLibrary fails if the codec reads raw into any of its types as
// anything but what the library reads; it reports whether the codec read
// raw as the type named want.
func sameAsTheLibrary(t *testing.T, raw []byte, want string) bool {
	t.Helper()
	took := false
	for _, tg := range codecTargets {
		v := tg.new()
		if !wire.CodecDecode(raw, v) {
			continue
		}
		took = took || tg.name == want
		lib := tg.new()
		require.NoError(t, wire.LibraryUnmarshal(raw, lib), "the codec took as a %s what the library refuses: %s", tg.name, raw)
		require.Equal(t, lib, v, "%s: %s", tg.name, raw)
	}
	return took
}

// sent is something the broker or a session sends, made from fuzz
// bytes, and the codec's type it is read as.
func (s *source) sent() (raw []byte, target string, err error) {
	switch s.byte() % 5 {
	case 0:
		method, params := s.event()
		raw, err = wire.MarshalNotification(method, params)
		return raw, "notification", err
	case 1:
		id, method, params := s.request()
		raw, err = wire.EncodeRequest(id, method, params)
		return raw, "envelope", err
	case 2:
		_, method, params := s.request()
		raw, err = wire.Marshal(params)
		if method == wire.MethodSend {
			return raw, "send", err
		}
		return raw, "update", err
	case 3:
		raw, err = wire.Marshal(s.task())
		return raw, "task", err
	default:
		raw, err = wire.Marshal(wire.SendResult{Task: s.task(), Delivered: s.str()})
		return raw, "send result", err
	}
}

// FuzzCodecDecodesAsTheLibrary: whatever the codec reads, it reads as the
// library does. It is given what the broker and the sessions send (which
// it must read, unless a timestamp is out of RFC 3339's years), and those
// bytes with one change (which it reads as the library does, or leaves to
// it).
func FuzzCodecDecodesAsTheLibrary(f *testing.F) {
	f.Add([]byte{}, uint16(0), byte(0))
	f.Add(bytes.Repeat([]byte{1}, 300), uint16(40), byte('x'))
	f.Add([]byte("\x01\x05\x05hello\x03<&>\x02\"\\\x04\xe2\x80\xa8\xff\x01\x01\x01\x01\x01\x01\x07\x08\t\n\x0b\x0c\r\x1f\x7f"), uint16(7), byte('"'))
	for i := range byte(5) {
		f.Add(append([]byte{i, 1, 3}, bytes.Repeat([]byte("\x03a<b\x01\x02\x05\x06"), 40)...), uint16(i)*31, byte('\\'))
		f.Add(append([]byte{i, 0, 1}, bytes.Repeat([]byte("\x01\x00\x02"), 30)...), uint16(i)*17, byte(' '))
		f.Add([]byte{i, 2, 1, 7}, uint16(i)*5, byte('n'))
	}
	f.Fuzz(func(t *testing.T, data []byte, at uint16, to byte) {
		s := &source{b: data}
		raw, target, err := s.sent()
		if err != nil {
			return // a raw member that is not JSON: nobody sends it
		}
		if !sameAsTheLibrary(t, raw, target) {
			// Only a timestamp outside the years 0 to 9999 is left out.
			assert.Regexp(t, `"(-|[0-9]{5,})`, string(raw), "the codec left a %s as it is sent: %s", target, raw)
		}
		changed := bytes.Clone(raw)
		changed[int(at)%len(changed)] = to
		sameAsTheLibrary(t, changed, target)
		sameAsTheLibrary(t, append(bytes.Clone(raw[:int(at)%len(raw)]), raw[int(at)%len(raw)+1:]...), target)
	})
}

// FuzzCodecReadsAnyInputAsTheLibrary is FuzzCodecDecodesAsTheLibrary on
// any bytes: the codec reads them as the library does, or leaves them to
// it.
func FuzzCodecReadsAnyInputAsTheLibrary(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","method":"a2a.push","params":{"recipient":"a","recipientContextId":"s","contextId":"s","seq":1,"epoch":"e","from":"b","message":{"messageId":"m","parts":[{"kind":"text","text":"hi"}]}}}`,
		`{"jsonrpc":"2.0","id":7,"method":"a2a.message.send","params":{"token":"t","to":"w","message":{"messageId":"","parts":[{"kind":"data","data":{"a":[1,2.5e3,null,true]}}],"metadata":{}}}}`,
		`{"task":{"id":"t","status":{"state":"working","timestamp":"2026-12-01T10:00:00.000Z","message":null},"artifacts":[{"artifactId":"a","parts":[{"kind":"file","file":{"name":"n","uri":"u"}}]}],"createdAt":"2026-12-01T10:00:00Z"},"delivered":"x"}`,
		`{"token":"\u0074","taskId":"x","state":"completed","artifacts":[],"messageId":"\ud800"}`,
		`{"params":{"seq":18446744073709551615},"method":"a2a.task.event"}`, `null`, `{}`, `[]`, `{"a":}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		sameAsTheLibrary(t, raw, "")
	})
}

// filled returns a new value of t with every field set, down to depth
// levels of structs: a field the codec does not write or read shows.
func filled(t reflect.Type, depth int) reflect.Value {
	v := reflect.New(t).Elem()
	switch {
	case t == reflect.TypeFor[wire.Time]():
		v.Set(reflect.ValueOf(wire.NewTime(time.Date(2026, 12, 1, 10, 0, 0, 5e6, time.UTC))))
	case t == reflect.TypeFor[json.RawMessage](), t == reflect.TypeFor[jsontext.Value]():
		v.SetBytes([]byte(`{"a":[1,"<b>"]}`))
	case t.Kind() == reflect.String:
		v.SetString("x<&>")
	case t.Kind() == reflect.Bool:
		v.SetBool(true)
	case t.Kind() == reflect.Uint64:
		v.SetUint(1<<64 - 1)
	case t.Kind() == reflect.Pointer && depth > 0:
		v.Set(filled(t.Elem(), depth-1).Addr())
	case t.Kind() == reflect.Slice && depth > 0:
		v.Set(reflect.Append(v, filled(t.Elem(), depth-1)))
	case t.Kind() == reflect.Struct:
		for i := range t.NumField() {
			if t.Field(i).IsExported() {
				v.Field(i).Set(filled(t.Field(i).Type, depth))
			}
		}
	}
	return v
}

// TestTheCodecHasEveryField: the codec writes and reads every field of
// its types as encoding/json and the library do. A field added to a type
// but not to the codec (go generate ./wire) fails here.
func TestTheCodecHasEveryField(t *testing.T) {
	for _, v := range []any{&wire.Task{}, &wire.TaskResult{}, &wire.SendResult{}, &wire.TaskEvent{}, &wire.Push{}, &wire.Message{},
		&wire.TaskStatus{}, &wire.Artifact{}, &wire.SendParams{}, &wire.UpdateParams{}} {
		full := filled(reflect.TypeOf(v).Elem(), 4).Addr().Interface()
		want, err := json.Marshal(full)
		require.NoError(t, err)
		got, err := wire.Marshal(full)
		require.NoError(t, err)
		require.Equal(t, string(want), string(got), "%T", v)
	}
	for _, tg := range codecTargets {
		full := filled(reflect.TypeOf(tg.new()).Elem(), 4).Addr().Interface()
		raw, err := json.Marshal(full)
		require.NoError(t, err)
		v, lib := tg.new(), tg.new()
		require.True(t, wire.CodecDecode(raw, v), "%s: %s", tg.name, raw)
		require.NoError(t, wire.LibraryUnmarshal(raw, lib))
		require.Equal(t, lib, v, "%s: %s", tg.name, raw)
	}
}

// TestTheCodecTakesWhatTheLibraryReads: the messages the broker and the
// sessions write go through the codec (so the fuzz target's comparisons
// are not vacuous), as do other orders, spaces, escapes and repeats; a
// value of the wrong type, or one the library refuses, is left to the
// library.
func TestTheCodecTakesWhatTheLibraryReads(t *testing.T) {
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
		assert.True(t, sameAsTheLibrary(t, raw, "notification"), "%s", raw)
	}
	for _, r := range []struct {
		method string
		params any
	}{
		{wire.MethodSend, wire.SendParams{Token: "tok", To: "worker", Message: msg}},
		{wire.MethodSend, &wire.SendParams{Token: "tok", TaskID: "t-1", Message: msg, Oneway: true, Metadata: []byte(`{"m":[]}`)}},
		{wire.MethodUpdateTask, wire.UpdateParams{Token: "tok", TaskID: "t-1", State: wire.StateCompleted}},
		{wire.MethodUpdateTask, &wire.UpdateParams{Token: "tok", TaskID: "t-1", State: wire.StateWorking, Message: msg, MessageID: "u-1", Artifacts: task.Artifacts}},
	} {
		raw, err := wire.EncodeRequest(1<<64-1, r.method, r.params)
		require.NoError(t, err)
		assert.True(t, sameAsTheLibrary(t, raw, "envelope"), "%s", raw)
		params, err := wire.Marshal(r.params)
		require.NoError(t, err)
		assert.True(t, sameAsTheLibrary(t, params, map[string]string{wire.MethodSend: "send", wire.MethodUpdateTask: "update"}[r.method]), "%s", params)
	}
	for _, tc := range []struct {
		raw, target string
		takes       bool
	}{
		{`{"params":{"epoch":"e","seq":1,"recipient":"a"},"method":"a2a.push"}`, "notification", true},
		{` { "method" : "a2a.push" , "params" : { "seq" : 0 , "message" : null } } `, "notification", true},
		{`{"method":"a2a.push","params":{"from":"a","from":"b","message":{"messageId":"m","role":"user"},"message":{"messageId":"n"}}}`, "notification", true},
		{`{"method":"a2a.push","params":{"From":"a","m\u0065ssage":{"messageId":"\u00e9\n\ud83d\ude00\ud800"},"x":[1,{"y":null}]}}`, "notification", true},
		{"{\"method\":\"a2a.push\",\"params\":{\"from\":\"\xff\"}}", "notification", true},
		{`{"token":"t","message":{"parts":[{"kind":"text","text":null,"text":"x"}],"parts":null},"oneway":null}`, "send", true},
		{`{"task":{"status":{"state":"working","timestamp":"2026-12-01T10:00:00+02:00"},"createdAt":"2026-12-01T10:00:00.123456789Z","updatedAt":null}}`, "task result", true},
		{`{"jsonrpc":"2.0","ID":1,"id":null,"method":"m","params":[1,2]}`, "envelope", true},
		{`{"method":"a2a.push","params":{"seq":01}}`, "notification", false},
		{`{"method":"a2a.push","params":{"seq":1.0}}`, "notification", false},
		{`{"method":"a2a.push","params":{"seq":-1}}`, "notification", false},
		{`{"method":"a2a.push","params":{"seq":18446744073709551616}}`, "notification", false},
		{`{"method":"a2a.push","params":{"from":1}}`, "notification", false},
		{`{"method":"a2a.push","params":{"final":"yes"}}`, "notification", false},
		{`{"method":"a2a.push","params":{}} x`, "notification", false},
		{`{"method":"a2a.push","params":{},}`, "notification", false},
		{`{"method":"a2a.push","params":{"x":tru}}`, "notification", false},
		{`{"method":"a2a.push","params":{"from":"\x"}}`, "notification", false},
		{"{\"method\":\"a2a.push\",\"params\":{\"from\":\"\x01\"}}", "notification", false},
		{`{"task":{"createdAt":"2026-02-30T00:00:00.000Z"}}`, "task result", false},
		{`{"task":{"createdAt":"yesterday"}}`, "task result", false},
		{`{"token":"t","message":{"parts":{}}}`, "send", false},
	} {
		assert.Equal(t, tc.takes, sameAsTheLibrary(t, []byte(tc.raw), tc.target), "%s", tc.raw)
	}
	// A raw member as deep as the library reads on its own, but not
	// inside the event, is the library's to refuse.
	deep := strings.Repeat("[", 9998) + strings.Repeat("]", 9998)
	raw, err := wire.MarshalNotification(wire.NotifyPush, &wire.Push{Message: &wire.Message{MessageID: "m", Metadata: []byte(deep)}})
	require.NoError(t, err)
	assert.False(t, sameAsTheLibrary(t, raw, "notification"), "the codec took a metadata member nested 9,998 deep")
	_, err = wire.DecodeEvent(raw)
	assert.Error(t, err, "too deep for the library")
}

func BenchmarkDecodeEvent(b *testing.B) {
	raw, err := wire.MarshalNotification(wire.NotifyTaskEvent, benchEvent())
	require.NoError(b, err)
	for _, c := range []struct {
		name string
		fn   func([]byte) (*wire.Event, error)
	}{{"library", func(raw []byte) (*wire.Event, error) {
		n := wire.NewEventNote()
		return nil, wire.LibraryUnmarshal(raw, n)
	}}, {"DecodeEvent", wire.DecodeEvent}} {
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

func BenchmarkParseRequest(b *testing.B) {
	text := "Shall we share the roundtable? I take seat 1."
	raw, err := wire.EncodeRequest(17, wire.MethodSend, &wire.SendParams{Token: "5c2f7a8e9b0d4c1f8a6e3b2d1c0f9e8d5c2f7a8e9b0d4c1f", To: "discussant-2",
		Message: &wire.Message{MessageID: "m-1", Parts: []wire.Part{{Kind: wire.KindText, Text: &text}}}})
	require.NoError(b, err)
	for _, c := range []struct {
		name  string
		parse func([]byte) (*wire.Request, *wire.Error)
	}{{"ParseRequest", func(raw []byte) (*wire.Request, *wire.Error) { return wire.ParseRequest(raw, 0) }}} {
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

// TestDecodeResponseCapsWhatItReturns: the id and the result are slices
// of the response, which an append cannot write into.
func TestDecodeResponseCapsWhatItReturns(t *testing.T) {
	raw := []byte(`{"jsonrpc":"2.0","id":"x\"y","result":{"a":[1, 2]} }`)
	id, result, rpcErr, err := wire.DecodeResponse(raw)
	require.NoError(t, err)
	require.Nil(t, rpcErr)
	assert.Equal(t, `"x\"y"`, string(id))
	assert.Equal(t, `{"a":[1, 2]}`, string(result))
	assert.Equal(t, len(id), cap(id))
	assert.Equal(t, len(result), cap(result))
	_ = append(id, '!')
	_ = append(result, '!')
	assert.Equal(t, `{"jsonrpc":"2.0","id":"x\"y","result":{"a":[1, 2]} }`, string(raw))
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
	}{{"DecodeResponse", wire.DecodeResponse}} {
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

// TestTokensAreNotKeptAmongTheStringsSeen: the codec's decoders, and the
// short strings they keep to hand out again, are shared by every session;
// a token is made anew each time, never looked up among them.
func TestTokensAreNotKeptAmongTheStringsSeen(t *testing.T) {
	raw, err := wire.EncodeRequest(1, wire.MethodSend, wire.SendParams{Token: "5c2f7a8e9b0d4c1f8a6e3b2d1c0f9e8d", To: "worker", Message: &wire.Message{}})
	require.NoError(t, err)
	decode := func() wire.SendParams {
		req, perr := wire.ParseRequest(raw, 0)
		require.Nil(t, perr)
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
