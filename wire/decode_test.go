package wire_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/wire"
)

// decodeTargets are the types the broker and its clients decode on every
// call, each with a seed.
var decodeTargets = []struct {
	name string
	new  func() any
	seed string
}{
	{"send", func() any { return new(wire.SendParams) }, `{"token":"t","to":"scribe","message":{"messageId":"m","parts":[{"kind":"text","text":"hi","metadata":{"a":[1]}},{"kind":"file","file":{"name":"a","bytes":"aGk="}}]},"metadata":{"k":1}}`},
	{"update", func() any { return new(wire.UpdateParams) }, `{"token":"t","taskId":"x","state":"completed","artifacts":[{"name":"n","parts":[{"kind":"data","data":{"x":null}}]}],"messageId":"u"}`},
	{"register", func() any { return new(wire.RegisterParams) }, `{"contextId":"c","card":{"name":"a","skills":[{"id":"s","tags":["x"]}]},"instanceId":"i"}`},
	{"task result", func() any { return new(wire.TaskResult) }, `{"task":{"id":"x","contextId":"c","status":{"state":"working","timestamp":"2026-12-01T09:00:00.000Z"},"history":[],"artifacts":[],"createdAt":"2026-12-01T09:00:00Z","updatedAt":"2026-12-01T09:00:00.5+01:00"}}`},
	{"list", func() any { return new(wire.ListTasksResult) }, `{"tasks":[{"id":"x"},{"id":"y","metadata":null}],"nextPageToken":"y"}`},
}

// fieldNames are the JSON names of every struct field reachable from t.
func fieldNames(t reflect.Type, into map[string]bool) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || into[t.String()] {
		return
	}
	into[t.String()] = true
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" {
			name = f.Name
		}
		if f.Anonymous && f.Tag.Get("json") == "" {
			fieldNames(f.Type, into)
			continue
		}
		into["."+name] = true
		fieldNames(f.Type, into)
	}
}

// caseVariant reports whether a member name matches a field only when
// case is ignored: there encoding/json and the protocol differ on purpose.
func caseVariant(names []string, fields map[string]bool) bool {
	for _, n := range names {
		for f := range fields {
			if f[0] == '.' && strings.EqualFold(f[1:], n) && f[1:] != n {
				return true
			}
		}
	}
	return false
}

// FuzzDecodeAgreesWithEncodingJSON: the decoder reads what encoding/json
// reads, wherever the two are meant to agree: not on member names that
// differ from a field's only in case (the protocol ignores them), nor on a
// member given twice (both keep the last value, but encoding/json merges
// an object into the one before). Both accept or both refuse.
func FuzzDecodeAgreesWithEncodingJSON(f *testing.F) {
	fields := map[string]bool{}
	for i, tg := range decodeTargets {
		fieldNames(reflect.TypeOf(tg.new()), fields)
		f.Add(uint8(i), []byte(tg.seed))
	}
	f.Add(uint8(0), []byte(`{"token":"a","token":"b","message":{"parts":[]},"message":null}`))
	f.Add(uint8(1), []byte(`{"state":1,"token":"\ud800x"}`))
	f.Fuzz(func(t *testing.T, which uint8, raw []byte) {
		tg := decodeTargets[int(which)%len(decodeTargets)]
		if names, dup, _ := memberNames(raw); dup || caseVariant(names, fields) {
			return
		}
		v1, v2 := tg.new(), tg.new()
		err1 := json.Unmarshal(raw, v1)
		err2 := wire.Unmarshal(raw, v2)
		if (err1 == nil) != (err2 == nil) {
			t.Fatalf("%s %q: encoding/json says %v, the decoder %v", tg.name, raw, err1, err2)
		}
		if err1 == nil && !reflect.DeepEqual(v1, v2) {
			t.Fatalf("%s %q:\nencoding/json %+v\nthe decoder   %+v", tg.name, raw, v1, v2)
		}
	})
}

// memberNames returns every member name in raw, and whether an object
// names a member twice; ok is false when raw is not valid JSON.
func memberNames(raw []byte) (names []string, dup, ok bool) {
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	type frame struct {
		object bool
		seen   map[string]bool
		name   bool // the next token is a member name
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return names, dup, err.Error() == "EOF" && len(stack) == 0
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if n, isName := tok.(string); isName && top != nil && top.object && top.name {
			names = append(names, n)
			dup = dup || top.seen[n]
			top.seen[n], top.name = true, false
			continue
		}
		if d, isDelim := tok.(json.Delim); isDelim {
			switch d {
			case '{':
				stack = append(stack, &frame{object: true, seen: map[string]bool{}, name: true})
				continue
			case '[':
				stack = append(stack, &frame{})
				continue
			default:
				stack = stack[:len(stack)-1]
				if len(stack) == 0 {
					continue
				}
				top = stack[len(stack)-1]
			}
		}
		if top != nil && top.object {
			top.name = true // a value ended: a name follows, or the object ends
		}
	}
}

func TestDecodeProblemsNameTheMember(t *testing.T) {
	for _, tc := range []struct{ raw, want string }{
		{`{"token":1}`, "token: want string, got number"},
		{`{"message":{"parts":"x"}}`, "message.parts: want array, got string"},
		{`{"message":{"parts":[{"kind":"text","text":true}]}}`, "message.parts[0].text: want string, got boolean"},
		{`{"oneway":"yes"}`, "oneway: want boolean, got string"},
		{`{"metadata":{"a":1},"to":[]}`, "to: want string, got array"},
	} {
		var p wire.SendParams
		werr := wire.DecodeParams(json.RawMessage(tc.raw), &p)
		require.NotNil(t, werr, tc.raw)
		assert.Equal(t, wire.ErrInvalidParams.Code, werr.Code)
		assert.Equal(t, tc.want, werr.Message, tc.raw)
	}
	var r wire.TaskResult
	err := wire.Unmarshal([]byte(`{"task":{"createdAt":"yesterday"}}`), &r)
	require.Error(t, err)
	var u wire.UpdateParams
	werr := wire.DecodeParams(json.RawMessage(`{"taskId":"x","state":"working","TaskId":7,"STATE":[]}`), &u)
	assert.Nil(t, werr, "members that differ from a field only in case are unknown, and ignored")
	assert.Equal(t, "x", u.TaskID)
}

func TestMemberNames(t *testing.T) {
	names, dup, ok := memberNames([]byte(`{"a":{"b":[1,{"c":2}],"d":null},"e":[],"f":"x"}`))
	assert.True(t, ok)
	assert.False(t, dup)
	assert.Equal(t, []string{"a", "b", "c", "d", "e", "f"}, names)
	_, dup, _ = memberNames([]byte(`{"a":1,"b":{"a":1},"a":2}`))
	assert.True(t, dup)
	_, dup, _ = memberNames([]byte(`[{"a":1},{"a":1}]`))
	assert.False(t, dup, "the same name in two objects is no duplicate")
}

func TestNumbersForIntegerFieldsSayWhatIsWrong(t *testing.T) {
	for raw, want := range map[string]string{
		`{"pageSize":1.5}`:                  "pageSize: want a whole number, got 1.5",
		`{"pageSize":1e300}`:                "pageSize: want a whole number, got 1e300",
		`{"pageSize":99999999999999999999}`: "pageSize: 99999999999999999999 is out of range",
	} {
		var p wire.ListTasksParams
		werr := wire.DecodeParams(json.RawMessage(raw), &p)
		require.NotNil(t, werr, raw)
		assert.Equal(t, want, werr.Message, raw)
	}
	for raw, want := range map[string]string{
		`{"contextId":"c","afterSeq":-1}`:  "afterSeq: want a whole number, not negative, got -1",
		`{"contextId":"c","afterSeq":1.0}`: "afterSeq: want a whole number, not negative, got 1.0",
	} {
		var p wire.ReplayParams
		werr := wire.DecodeParams(json.RawMessage(raw), &p)
		require.NotNil(t, werr, raw)
		assert.Equal(t, want, werr.Message, raw)
	}
}
