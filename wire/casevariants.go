package wire

import (
	"encoding/json"
	"reflect"
	"strings"
	"sync"
)

// encoding/json matches object members to struct fields without regard to
// case: {"TOKEN": ...} would fill Token. The protocol says unknown members
// are ignored, and "TOKEN" is not "token". dropCaseVariants removes, before
// decoding into a struct, every member whose name equals a field's only
// when case is ignored. Members of raw JSON (data, metadata) are left
// alone: they are the client's, not the protocol's.

// fieldSet is the JSON names of a struct type's fields.
type fieldSet struct {
	exact  map[string]reflect.Type // name -> field type
	folded map[string]bool         // lower-cased name
}

var fieldSets sync.Map // reflect.Type -> *fieldSet

var rawMessageType = reflect.TypeFor[json.RawMessage]()

func fieldsOf(t reflect.Type) *fieldSet {
	if fs, ok := fieldSets.Load(t); ok {
		return fs.(*fieldSet)
	}
	fs := &fieldSet{exact: map[string]reflect.Type{}, folded: map[string]bool{}}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Anonymous && f.Type.Kind() == reflect.Struct {
				walk(f.Type)
				continue
			}
			if !f.IsExported() {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			fs.exact[name] = f.Type
			fs.folded[strings.ToLower(name)] = true
		}
	}
	walk(t)
	fieldSets.Store(t, fs)
	return fs
}

// dropCaseVariants returns raw without the members that would fill a field of
// t only by a case-insensitive match, and whether it changed anything.
func dropCaseVariants(raw json.RawMessage, t reflect.Type) (json.RawMessage, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == rawMessageType {
		return raw, false
	}
	switch t.Kind() {
	case reflect.Struct:
		if _, ok := reflect.New(t).Interface().(json.Unmarshaler); ok {
			return raw, false
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal(raw, &obj) != nil {
			return raw, false // not an object: the typed decode says why
		}
		fs := fieldsOf(t)
		changed := false
		for name, v := range obj {
			if ft, ok := fs.exact[name]; ok {
				if nv, ch := dropCaseVariants(v, ft); ch {
					obj[name] = nv
					changed = true
				}
				continue
			}
			if fs.folded[strings.ToLower(name)] || !isASCII(name) {
				// A case variant of a field, or a name that Unicode
				// folding might turn into one: not the field, so ignored.
				delete(obj, name)
				changed = true
			}
		}
		if !changed {
			return raw, false
		}
		out, err := json.Marshal(obj)
		if err != nil {
			return raw, false
		}
		return out, true
	case reflect.Slice, reflect.Array:
		var elems []json.RawMessage
		if json.Unmarshal(raw, &elems) != nil {
			return raw, false
		}
		changed := false
		for i, v := range elems {
			if nv, ch := dropCaseVariants(v, t.Elem()); ch {
				elems[i] = nv
				changed = true
			}
		}
		if !changed {
			return raw, false
		}
		out, err := json.Marshal(elems)
		if err != nil {
			return raw, false
		}
		return out, true
	}
	return raw, false
}

func isASCII(s string) bool {
	for i := range len(s) {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// knownExact and knownLower are every field name of the protocol's
// objects, as is and lower-cased: a member name outside knownLower cannot
// fill any field, whatever its case.
var knownExact, knownLower = func() (map[string]bool, map[string]bool) {
	exact, lower := map[string]bool{}, map[string]bool{}
	for _, v := range []any{envelope{}, RegisterParams{}, TokenParams{}, SendParams{}, TaskParams{}, CancelParams{}, ListTasksParams{},
		UpdateParams{}, ReplayParams{}, SessionParams{}, SessionCloseParams{}, ListAgentsParams{}, PageParams{}, AgentCard{}, Skill{}, Message{}, Part{}, File{}, Artifact{}} {
		for name := range fieldsOf(reflect.TypeOf(v)).exact {
			exact[name] = true
			lower[strings.ToLower(name)] = true
		}
	}
	return exact, lower
}()

// mayHaveCaseVariants is the fast path: a single pass over the member
// names of raw, true when one of them is not ASCII, carries an escape, or
// is a case variant (not an exact match) of a protocol field name.
func mayHaveCaseVariants(raw []byte) bool {
	var buf [64]byte
	for i := 0; i < len(raw); i++ {
		if raw[i] != '"' {
			continue
		}
		// A string: find its end.
		j := i + 1
		escaped, ascii := false, true
		for ; j < len(raw) && raw[j] != '"'; j++ {
			switch {
			case raw[j] == '\\':
				escaped = true
				j++
			case raw[j] >= 0x80:
				ascii = false
			}
		}
		name := raw[i+1 : min(j, len(raw))]
		i = j
		// A member name is followed by ':'.
		k := j + 1
		for k < len(raw) && (raw[k] == ' ' || raw[k] == '\t' || raw[k] == '\n' || raw[k] == '\r') {
			k++
		}
		if k >= len(raw) || raw[k] != ':' {
			continue
		}
		if escaped || !ascii {
			return true
		}
		if len(name) > len(buf) {
			continue
		}
		if knownExact[string(name)] {
			continue
		}
		lower := buf[:len(name)]
		for n, c := range name {
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			lower[n] = c
		}
		if knownLower[string(lower)] {
			return true
		}
	}
	return false
}
