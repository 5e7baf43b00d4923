package wire

import (
	"bytes"
	"encoding/json"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// Marshal encodes v exactly as json.Marshal does, byte for byte. A task,
// a task result, the two notifications' params, and a message, status or
// artifact (whose sizes the broker counts), which the broker encodes on
// every send, update and event, and the send and update params a session
// sends, are written by hand: a third
// of json.Marshal's time, with one allocation (the result) instead of one
// per timestamp and one for the result, and two more for each raw member
// (metadata, a data part), which json.Compact and json.HTMLEscape check
// and escape as json.Marshal does. Anything else, and any
// value json.Marshal would refuse, goes to json.Marshal itself.
// FuzzMarshalIsJSONMarshal holds the two to the same bytes.
func Marshal(v any) ([]byte, error) {
	e := encoders.Get().(*encoder)
	defer e.release()
	if err := e.any(v); err != nil {
		return nil, err
	}
	return bytes.Clone(e.b), nil
}

// AppendMarshal appends what Marshal returns for v to dst.
func AppendMarshal(dst []byte, v any) ([]byte, error) {
	e := encoders.Get().(*encoder)
	defer e.release()
	if err := e.any(v); err != nil {
		return dst, err
	}
	return append(dst, e.b...), nil
}

// AppendString appends s as json.Marshal writes a string: quoted, with
// HTML's specials, U+2028 and U+2029 escaped and invalid UTF-8 replaced.
func AppendString(dst []byte, s string) []byte { return appendString(dst, s) }

// MarshalNotification encodes a JSON-RPC notification of method with
// params, as json.Marshal encodes {"jsonrpc":"2.0","method":…,"params":…}.
func MarshalNotification(method string, params any) ([]byte, error) {
	e := encoders.Get().(*encoder)
	defer e.release()
	e.field(`{"jsonrpc":"2.0","method":`, method)
	e.name(`,"params":`)
	if err := e.any(params); err != nil {
		return nil, err
	}
	e.b = append(e.b, '}')
	return bytes.Clone(e.b), nil
}

// any appends v as json.Marshal writes it: by hand if it is of a type
// written by hand, else (or if a raw member of it is not JSON) by
// json.Marshal, whose error it returns.
func (e *encoder) any(v any) error {
	start := len(e.b)
	if e.value(v) && !e.failed {
		return nil
	}
	e.b, e.failed = e.b[:start], false
	b, err := json.Marshal(v)
	e.b = append(e.b, b...)
	return err
}

// value appends v if it is of a type written by hand, and reports
// whether it was.
func (e *encoder) value(v any) bool {
	switch v := v.(type) {
	case *Task:
		e.task(v)
	case *TaskResult:
		e.taskResult(v)
	case TaskResult:
		e.taskResult(&v)
	case *TaskEvent:
		e.taskEvent(v)
	case *Push:
		e.push(v)
	case *Message:
		e.message(v)
	case *TaskStatus:
		e.status(v)
	case *Artifact:
		e.artifact(v)
	case SendParams:
		e.sendParams(&v)
	case *SendParams:
		e.sendParams(v)
	case UpdateParams:
		e.updateParams(&v)
	case *UpdateParams:
		e.updateParams(v)
	case SendResult:
		e.sendResult(&v)
	case *SendResult:
		e.sendResult(v)
	default:
		return false
	}
	return true
}

// EncodedLen is len(Marshal(v)), without keeping the bytes: 0 for a
// value Marshal refuses.
func EncodedLen(v any) int {
	e := encoders.Get().(*encoder)
	defer e.release()
	if e.any(v) != nil {
		return 0
	}
	return len(e.b)
}

// encoders keeps encoders whose buffers have grown to what a task
// takes, so that an encode allocates only its result.
var encoders = sync.Pool{New: func() any { return &encoder{b: make([]byte, 0, 1024)} }}

// release empties e and keeps it for the next encode, unless its buffer
// grew past what most tasks take.
func (e *encoder) release() {
	if cap(e.b) > 64<<10 {
		return
	}
	e.b, e.failed = e.b[:0], false
	encoders.Put(e)
}

// encoder appends JSON as encoding/json writes it: members in field
// order, omitempty as it means it, strings escaped for HTML, raw members
// compacted.
type encoder struct {
	b      []byte
	failed bool // a raw member was not valid JSON
}

func (e *encoder) name(n string) { e.b = append(e.b, n...) }

func (e *encoder) str(s string) { e.b = appendString(e.b, s) }

// field appends a member name (with its comma and colon) and a string.
func (e *encoder) field(name, s string) {
	e.name(name)
	e.str(s)
}

// omitEmpty is field for a string member tagged omitempty.
func (e *encoder) omitEmpty(name, s string) {
	if s != "" {
		e.field(name, s)
	}
}

// omitEmptyRaw appends a raw member tagged omitempty.
func (e *encoder) omitEmptyRaw(name string, m json.RawMessage) {
	if len(m) > 0 {
		e.name(name)
		e.raw(m)
	}
}

func (e *encoder) time(t Time) {
	e.b = append(e.b, '"')
	e.b = appendTime(e.b, t.Time)
	e.b = append(e.b, '"')
}

// appendTime appends t.UTC().AppendFormat(b, TimeFormat): by hand for
// the years 0 to 9999, where the layout's parse is most of the cost.
func appendTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(b, TimeFormat)
	}
	hour, min, sec := t.Clock()
	ms := t.Nanosecond() / 1e6 // the layout's .000 truncates
	b = append(b, byte('0'+year/1000), byte('0'+year/100%10), byte('0'+year/10%10), byte('0'+year%10), '-',
		byte('0'+month/10), byte('0'+month%10), '-', byte('0'+day/10), byte('0'+day%10), 'T',
		byte('0'+hour/10), byte('0'+hour%10), ':', byte('0'+min/10), byte('0'+min%10), ':',
		byte('0'+sec/10), byte('0'+sec%10), '.', byte('0'+ms/100), byte('0'+ms/10%10), byte('0'+ms%10), 'Z')
	return b
}

// raw appends a json.RawMessage as json.Marshal does: compacted, with <,
// >, &, U+2028 and U+2029 escaped; empty is null.
func (e *encoder) raw(m json.RawMessage) {
	if len(m) == 0 {
		e.b = append(e.b, "null"...)
		return
	}
	var c bytes.Buffer
	if err := json.Compact(&c, m); err != nil {
		e.failed = true
		return
	}
	var h bytes.Buffer
	json.HTMLEscape(&h, c.Bytes())
	e.b = append(e.b, h.Bytes()...)
}

func (e *encoder) task(t *Task) {
	if t == nil {
		e.b = append(e.b, "null"...)
		return
	}
	e.field(`{"id":`, t.ID)
	e.field(`,"contextId":`, t.ContextID)
	e.field(`,"requesterName":`, t.RequesterName)
	e.field(`,"agentName":`, t.AgentName)
	e.field(`,"agentContextId":`, t.AgentContextID)
	e.name(`,"status":`)
	e.status(&t.Status)
	if len(t.History) > 0 {
		e.name(`,"history":`)
		appendList(e, t.History, e.message)
	}
	e.name(`,"artifacts":`)
	appendList(e, t.Artifacts, e.artifact)
	e.name(`,"createdAt":`)
	e.time(t.CreatedAt)
	e.name(`,"updatedAt":`)
	e.time(t.UpdatedAt)
	e.omitEmptyRaw(`,"metadata":`, t.Metadata)
	e.b = append(e.b, '}')
}

func (e *encoder) status(s *TaskStatus) {
	if s == nil {
		e.b = append(e.b, "null"...)
		return
	}
	e.field(`{"state":`, string(s.State))
	e.name(`,"timestamp":`)
	e.time(s.Timestamp)
	if s.Message != nil {
		e.name(`,"message":`)
		e.message(s.Message)
	}
	e.b = append(e.b, '}')
}

func (e *encoder) taskResult(r *TaskResult) {
	if r == nil {
		e.b = append(e.b, "null"...)
		return
	}
	e.name(`{"task":`)
	e.task(r.Task)
	e.b = append(e.b, '}')
}

// sendResult writes a send's result: a push's is {"delivered":…}.
func (e *encoder) sendResult(r *SendResult) {
	if r == nil {
		e.b = append(e.b, "null"...)
		return
	}
	e.b = append(e.b, '{')
	if r.Task != nil {
		e.name(`"task":`)
		e.task(r.Task)
	}
	if r.Delivered != "" {
		if r.Task != nil {
			e.b = append(e.b, ',')
		}
		e.field(`"delivered":`, r.Delivered)
	}
	e.b = append(e.b, '}')
}

func (e *encoder) message(m *Message) {
	if m == nil {
		e.b = append(e.b, "null"...)
		return
	}
	e.field(`{"messageId":`, m.MessageID)
	e.omitEmpty(`,"role":`, string(m.Role))
	e.name(`,"parts":`)
	e.parts(m.Parts)
	e.omitEmpty(`,"from":`, m.From)
	e.omitEmpty(`,"taskId":`, m.TaskID)
	e.omitEmpty(`,"contextId":`, m.ContextID)
	e.omitEmptyRaw(`,"metadata":`, m.Metadata)
	e.b = append(e.b, '}')
}

func (e *encoder) artifact(a *Artifact) {
	if a == nil {
		e.b = append(e.b, "null"...)
		return
	}
	e.field(`{"artifactId":`, a.ArtifactID)
	e.omitEmpty(`,"name":`, a.Name)
	e.name(`,"parts":`)
	e.parts(a.Parts)
	e.omitEmptyRaw(`,"metadata":`, a.Metadata)
	e.b = append(e.b, '}')
}

func (e *encoder) parts(ps []Part) { appendList(e, ps, e.part) }

func (e *encoder) part(p *Part) {
	e.field(`{"kind":`, string(p.Kind))
	if p.Text != nil {
		e.field(`,"text":`, *p.Text)
	}
	e.omitEmptyRaw(`,"data":`, p.Data)
	if f := p.File; f != nil {
		e.name(`,"file":{`)
		comma := false
		member := func(n string) {
			if comma {
				e.b = append(e.b, ',')
			}
			comma = true
			e.name(n)
		}
		if f.Name != "" {
			member(`"name":`)
			e.str(f.Name)
		}
		if f.MimeType != "" {
			member(`"mimeType":`)
			e.str(f.MimeType)
		}
		if f.Bytes != nil {
			member(`"bytes":`)
			e.str(*f.Bytes)
		}
		if f.URI != nil {
			member(`"uri":`)
			e.str(*f.URI)
		}
		e.b = append(e.b, '}')
	}
	e.omitEmptyRaw(`,"metadata":`, p.Metadata)
	e.b = append(e.b, '}')
}

// appendList appends xs as encoding/json writes a slice: null when nil,
// else each element as one writes it, in brackets.
func appendList[T any](e *encoder, xs []T, one func(*T)) {
	if xs == nil {
		e.b = append(e.b, "null"...)
		return
	}
	e.b = append(e.b, '[')
	for i := range xs {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		one(&xs[i])
	}
	e.b = append(e.b, ']')
}

// sendParams and updateParams write the params a session sends most.
func (e *encoder) sendParams(p *SendParams) {
	if p == nil {
		e.b = append(e.b, "null"...)
		return
	}
	e.field(`{"token":`, p.Token)
	e.omitEmpty(`,"to":`, p.To)
	e.omitEmpty(`,"taskId":`, p.TaskID)
	e.name(`,"message":`)
	e.message(p.Message)
	if p.Oneway {
		e.name(`,"oneway":true`)
	}
	e.omitEmptyRaw(`,"metadata":`, p.Metadata)
	e.b = append(e.b, '}')
}

func (e *encoder) updateParams(p *UpdateParams) {
	if p == nil {
		e.b = append(e.b, "null"...)
		return
	}
	e.field(`{"token":`, p.Token)
	e.field(`,"taskId":`, p.TaskID)
	e.field(`,"state":`, string(p.State))
	if p.Message != nil {
		e.name(`,"message":`)
		e.message(p.Message)
	}
	if len(p.Artifacts) > 0 {
		e.name(`,"artifacts":`)
		appendList(e, p.Artifacts, e.artifact)
	}
	e.omitEmpty(`,"messageId":`, p.MessageID)
	e.b = append(e.b, '}')
}

func (e *encoder) head(h *EventHead) {
	e.field(`{"recipient":`, h.Recipient)
	e.field(`,"recipientContextId":`, h.RecipientContextID)
	e.field(`,"contextId":`, h.ContextID)
	e.name(`,"seq":`)
	e.b = strconv.AppendUint(e.b, h.Seq, 10)
	e.field(`,"epoch":`, h.Epoch)
}

func (e *encoder) taskEvent(v *TaskEvent) {
	if v == nil {
		e.b = append(e.b, "null"...)
		return
	}
	e.head(&v.EventHead)
	e.field(`,"taskId":`, v.TaskID)
	e.field(`,"kind":`, string(v.Kind))
	e.name(`,"task":`)
	e.task(v.Task)
	if v.Message != nil {
		e.name(`,"message":`)
		e.message(v.Message)
	}
	e.name(`,"final":`)
	e.b = strconv.AppendBool(e.b, v.Final)
	e.b = append(e.b, '}')
}

func (e *encoder) push(v *Push) {
	if v == nil {
		e.b = append(e.b, "null"...)
		return
	}
	e.head(&v.EventHead)
	e.field(`,"from":`, v.From)
	e.name(`,"message":`)
	e.message(v.Message)
	e.b = append(e.b, '}')
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string as encoding/json does with
// HTML escaping (its default): ", \ and the control characters escaped
// (\b \f \n \r \t by name), <, > and & as \u003c \u003e \u0026, U+2028
// and U+2029 as \u2028 \u2029, and each byte of invalid UTF-8 as \ufffd.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
