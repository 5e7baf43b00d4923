package wire

import (
	"bytes"
	"encoding/json"
	"sync"
	"time"
	"unicode/utf8"
)

// fastEvent decodes raw if it is a task event or a push exactly as
// MarshalNotification writes one: members in their order, no space,
// timestamps as TimeFormat writes them for the years 0 to 9999. Every
// event the broker sends is; a session reads two of them per round trip.
// ok is false for anything else (another order, a member the broker does
// not write, an escape or a byte it never writes), and DecodeEvent then
// decodes raw in full: the fast path only ever gives what the full decode
// would. FuzzFastEventIsTheFullDecode holds the two to that.
func fastEvent(raw []byte) (ev *Event, ok bool) {
	d := fastDecoders.Get().(*fastDecoder)
	defer fastDecoders.Put(d)
	d.b, d.i, d.bad, d.maxRaw = raw, 0, false, maxRawDepth
	defer func() { d.b = nil }()
	d.lit(`{"jsonrpc":"2.0","method":`)
	switch {
	case d.opt(`"a2a.task.event","params":`):
		h := d.head()
		t := &TaskEvent{EventHead: h}
		t.TaskID = d.field(`,"taskId":`)
		t.Kind = EventKind(d.field(`,"kind":`))
		d.lit(`,"task":`)
		if !d.opt("null") {
			t.Task = d.task()
		}
		if d.opt(`,"message":`) {
			t.Message = d.message()
		}
		d.lit(`,"final":`)
		switch {
		case d.opt("true"):
			t.Final = true
		case d.opt("false"):
		default:
			d.bad = true
		}
		ev = &Event{Method: NotifyTaskEvent, TaskEvent: t}
	case d.opt(`"a2a.push","params":`):
		p := &Push{EventHead: d.head()}
		p.From = d.field(`,"from":`)
		d.lit(`,"message":`)
		if !d.opt("null") {
			p.Message = d.message()
		}
		ev = &Event{Method: NotifyPush, Push: p}
	default:
		return nil, false
	}
	d.lit("}}")
	if d.bad || d.i != len(raw) {
		return nil, false
	}
	return ev, true
}

// maxRawDepth is the deepest raw member the fast path reads of an event:
// far below the full decode's bound, far above what a request may carry
// (MaxDepth).
const maxRawDepth = 1000

// fastRequest reads raw if it is an a2a.message.send or a2a.tasks.update
// request exactly as EncodeRequest writes one, with a numeric id: the two
// requests of every round trip. It reads the envelope and the params in
// one pass, and that pass is all the checking the full path does: every
// string, number and punctuation is read as it must be, each raw member
// is checked as valid JSON, UTF-8 and not nested deeper than the
// request's own bound allows it there. The params come decoded with the
// request (Request.DecodeParams). ok is false for anything else, and
// ParseRequest then reads raw the full way: the fast path only ever gives
// what the full one would. FuzzFastRequestIsTheFullParse holds it to
// that.
func fastRequest(raw []byte) (req *Request, ok bool) {
	if !utf8.Valid(raw) {
		return nil, false
	}
	d := fastDecoders.Get().(*fastDecoder)
	defer fastDecoders.Put(d)
	// A raw member sits at most 6 levels down (a part's data, inside an
	// update's artifact); 8 leave room.
	d.b, d.i, d.bad, d.maxRaw = raw, 0, false, MaxDepth-8
	defer func() { d.b = nil }()
	d.lit(`{"jsonrpc":"2.0","id":`)
	idStart := d.i
	d.uint()
	id := raw[idStart:d.i]
	d.lit(`,"method":`)
	req = &Request{JSONRPC: Version}
	switch {
	case d.opt(`"a2a.message.send","params":`):
		req.Method = MethodSend
		start := d.i
		req.decoded, req.Params = d.sendParams(), raw[start:d.i:d.i]
	case d.opt(`"a2a.tasks.update","params":`):
		req.Method = MethodUpdateTask
		start := d.i
		req.decoded, req.Params = d.updateParams(), raw[start:d.i:d.i]
	default:
		return nil, false
	}
	d.lit("}")
	if d.bad || d.i != len(raw) {
		return nil, false
	}
	req.ID = bytes.Clone(id)
	return req, true
}

func (d *fastDecoder) sendParams() *SendParams {
	p := &SendParams{}
	p.Token = d.secret(`{"token":`)
	p.To = d.omitEmpty(`,"to":`)
	p.TaskID = d.omitEmpty(`,"taskId":`)
	d.lit(`,"message":`)
	if !d.opt("null") {
		p.Message = d.message()
	}
	p.Oneway = d.opt(`,"oneway":true`)
	p.Metadata = d.omitEmptyRaw(`,"metadata":`)
	d.lit("}")
	return p
}

func (d *fastDecoder) updateParams() *UpdateParams {
	p := &UpdateParams{}
	p.Token = d.secret(`{"token":`)
	p.TaskID = d.field(`,"taskId":`)
	p.State = State(d.field(`,"state":`))
	if d.opt(`,"message":`) {
		p.Message = d.message()
	}
	if d.opt(`,"artifacts":`) {
		p.Artifacts = fastList(d, d.artifact)
	}
	p.MessageID = d.omitEmpty(`,"messageId":`)
	d.lit("}")
	return p
}

// fastDecoder reads the canonical form from b at i; any departure from it
// sets bad, after which every read gives zero values.
type fastDecoder struct {
	b   []byte
	i   int
	bad bool
	// seen are short strings made before, by this event or an earlier
	// one: an event repeats its task id, session ids and names, and the
	// next events of a session repeat most of them again. Each is a copy
	// of its own bytes, so that keeping one keeps nothing else of any
	// event. The oldest is replaced first.
	seen [32]string
	next int
	// maxRaw bounds the nesting of a raw member (nestedDeeper).
	maxRaw int
	// plain: the next strings are made anew, not looked up in seen.
	plain bool
}

// fastDecoders keeps decoders, and the strings they have seen.
var fastDecoders = sync.Pool{New: func() any { return new(fastDecoder) }}

// lit reads s, which must come next.
func (d *fastDecoder) lit(s string) {
	if !d.opt(s) {
		d.bad = true
	}
}

// opt reads s if it comes next, and reports whether it did.
func (d *fastDecoder) opt(s string) bool {
	if d.bad || !bytes.HasPrefix(d.b[d.i:], []byte(s)) {
		return false
	}
	d.i += len(s)
	return true
}

// field reads the member name (with its punctuation) and a string.
func (d *fastDecoder) field(name string) string {
	d.lit(name)
	return d.str()
}

// secret is field for a member that holds a secret (a token): its string
// is made anew, never kept among the strings seen nor compared with them,
// since the decoders and what they have seen are shared by every session.
func (d *fastDecoder) secret(name string) string {
	d.plain = true
	defer func() { d.plain = false }()
	return d.field(name)
}

// omitEmpty reads an optional string member.
func (d *fastDecoder) omitEmpty(name string) string {
	if d.opt(name) {
		return d.str()
	}
	return ""
}

// omitEmptyRaw reads an optional raw member.
func (d *fastDecoder) omitEmptyRaw(name string) json.RawMessage {
	if d.opt(name) {
		return d.raw()
	}
	return nil
}

// str reads a string: its escapes are the ones the encoder writes
// (\" \\ \b \f \n \r \t and \u of a code point outside the surrogates),
// its other bytes valid UTF-8 and no control character.
func (d *fastDecoder) str() string {
	if d.bad || d.i >= len(d.b) || d.b[d.i] != '"' {
		d.bad = true
		return ""
	}
	start := d.i + 1
	j := start
	for j < len(d.b) && d.b[j] != '"' && d.b[j] != '\\' && d.b[j] >= 0x20 && d.b[j] < utf8.RuneSelf {
		j++
	}
	if j < len(d.b) && d.b[j] == '"' {
		d.i = j + 1
		return d.short(d.b[start:j])
	}
	out := append([]byte(nil), d.b[start:j]...)
	for j < len(d.b) {
		switch c := d.b[j]; {
		case c == '"':
			d.i = j + 1
			return string(out)
		case c < 0x20:
			d.bad = true
			return ""
		case c == '\\' && j+1 < len(d.b):
			switch e := d.b[j+1]; e {
			case '"', '\\':
				out = append(out, e)
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				r, ok := hex4(d.b[j+2:])
				if !ok || utf8.RuneLen(r) < 0 { // a surrogate
					d.bad = true
					return ""
				}
				out = utf8.AppendRune(out, r)
				j += 4
			default:
				d.bad = true
				return ""
			}
			j += 2
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(d.b[j:])
			if r == utf8.RuneError && size == 1 {
				d.bad = true
				return ""
			}
			out = append(out, d.b[j:j+size]...)
			j += size
		case c == '\\':
			d.bad = true
			return ""
		default:
			out = append(out, c)
			j++
		}
	}
	d.bad = true
	return ""
}

// short returns b as a string, the one made before if it repeats one.
func (d *fastDecoder) short(b []byte) string {
	if len(b) > 64 || d.plain {
		return string(b)
	}
	for _, s := range d.seen {
		if len(s) == len(b) && s == string(b) {
			return s
		}
	}
	s := string(b)
	d.seen[d.next%len(d.seen)] = s
	d.next++
	return s
}

// hex4 reads the four hex digits of a \u escape.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// uint reads an unsigned integer without leading zeros.
func (d *fastDecoder) uint() uint64 {
	start := d.i
	var n uint64
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		digit := uint64(d.b[d.i] - '0')
		if n > (1<<64-1-digit)/10 {
			d.bad = true
			return 0
		}
		n = n*10 + digit
		d.i++
	}
	if d.i == start || (d.b[start] == '0' && d.i > start+1) {
		d.bad = true
	}
	return n
}

// time reads a timestamp as TimeFormat writes it in UTC: a date that
// exists, and a time of day with milliseconds.
func (d *fastDecoder) time() Time {
	const n = len(`"2006-01-02T15:04:05.000Z"`)
	if d.bad || len(d.b)-d.i < n {
		d.bad = true
		return Time{}
	}
	b := d.b[d.i : d.i+n]
	num := func(from, to int) int {
		v := 0
		for _, c := range b[from:to] {
			if c < '0' || c > '9' {
				d.bad = true
				return 0
			}
			v = v*10 + int(c-'0')
		}
		return v
	}
	year, month, day := num(1, 5), num(6, 8), num(9, 11)
	hour, minute, sec, ms := num(12, 14), num(15, 17), num(18, 20), num(21, 24)
	if b[0] != '"' || b[5] != '-' || b[8] != '-' || b[11] != 'T' || b[14] != ':' || b[17] != ':' || b[20] != '.' || b[24] != 'Z' || b[25] != '"' ||
		month < 1 || month > 12 || day < 1 || hour > 23 || minute > 59 || sec > 59 {
		d.bad = true
		return Time{}
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, ms*1e6, time.UTC)
	if t.Day() != day { // the 31st of a month of 30 days, say
		d.bad = true
		return Time{}
	}
	d.i += n
	return Time{t}
}

// raw reads a raw member: a JSON value up to the next member or the end
// of its object, valid as the full decode requires it. The full decode
// also bounds the nesting of the whole event (10,000 levels, the member's
// own below a few of the event's); the fast path leaves any member nested
// deeper than maxRaw to it.
func (d *fastDecoder) raw() json.RawMessage {
	if d.bad {
		return nil
	}
	end := skipValue(d.b, d.i)
	if end <= d.i || !validJSON(d.b[d.i:end]) || nestedDeeper(d.b[d.i:end], d.maxRaw) {
		d.bad = true
		return nil
	}
	v := bytes.Clone(d.b[d.i:end])
	d.i = end
	return v
}

func (d *fastDecoder) head() EventHead {
	var h EventHead
	h.Recipient = d.field(`{"recipient":`)
	h.RecipientContextID = d.field(`,"recipientContextId":`)
	h.ContextID = d.field(`,"contextId":`)
	d.lit(`,"seq":`)
	h.Seq = d.uint()
	h.Epoch = d.field(`,"epoch":`)
	return h
}

func (d *fastDecoder) task() *Task {
	t := &Task{}
	t.ID = d.field(`{"id":`)
	t.ContextID = d.field(`,"contextId":`)
	t.RequesterName = d.field(`,"requesterName":`)
	t.AgentName = d.field(`,"agentName":`)
	t.AgentContextID = d.field(`,"agentContextId":`)
	d.lit(`,"status":`)
	t.Status = d.status()
	if d.opt(`,"history":`) {
		t.History = fastList(d, func() Message { return *d.message() })
	}
	d.lit(`,"artifacts":`)
	if !d.opt("null") {
		t.Artifacts = fastList(d, d.artifact)
	}
	d.lit(`,"createdAt":`)
	t.CreatedAt = d.time()
	d.lit(`,"updatedAt":`)
	t.UpdatedAt = d.time()
	t.Metadata = d.omitEmptyRaw(`,"metadata":`)
	d.lit("}")
	return t
}

func (d *fastDecoder) status() TaskStatus {
	var s TaskStatus
	s.State = State(d.field(`{"state":`))
	d.lit(`,"timestamp":`)
	s.Timestamp = d.time()
	if d.opt(`,"message":`) {
		s.Message = d.message()
	}
	d.lit("}")
	return s
}

func (d *fastDecoder) message() *Message {
	m := &Message{}
	m.MessageID = d.field(`{"messageId":`)
	m.Role = Role(d.omitEmpty(`,"role":`))
	d.lit(`,"parts":`)
	m.Parts = d.parts()
	m.From = d.omitEmpty(`,"from":`)
	m.TaskID = d.omitEmpty(`,"taskId":`)
	m.ContextID = d.omitEmpty(`,"contextId":`)
	m.Metadata = d.omitEmptyRaw(`,"metadata":`)
	d.lit("}")
	return m
}

func (d *fastDecoder) artifact() Artifact {
	var a Artifact
	a.ArtifactID = d.field(`{"artifactId":`)
	a.Name = d.omitEmpty(`,"name":`)
	d.lit(`,"parts":`)
	a.Parts = d.parts()
	a.Metadata = d.omitEmptyRaw(`,"metadata":`)
	d.lit("}")
	return a
}

func (d *fastDecoder) parts() []Part {
	if d.opt("null") {
		return nil
	}
	return fastList(d, d.part)
}

func (d *fastDecoder) part() Part {
	var p Part
	p.Kind = PartKind(d.field(`{"kind":`))
	if d.opt(`,"text":`) {
		s := d.str()
		p.Text = &s
	}
	p.Data = d.omitEmptyRaw(`,"data":`)
	if d.opt(`,"file":{`) {
		f := &File{}
		comma := ""
		member := func(name string) bool {
			if d.opt(comma + name) {
				comma = ","
				return true
			}
			return false
		}
		if member(`"name":`) {
			f.Name = d.str()
		}
		if member(`"mimeType":`) {
			f.MimeType = d.str()
		}
		if member(`"bytes":`) {
			s := d.str()
			f.Bytes = &s
		}
		if member(`"uri":`) {
			s := d.str()
			f.URI = &s
		}
		d.lit("}")
		p.File = f
	}
	p.Metadata = d.omitEmptyRaw(`,"metadata":`)
	d.lit("}")
	return p
}

// fastList reads an array of what one reads; [] is an empty list, not
// none, as the full decode has it.
func fastList[T any](d *fastDecoder, one func() T) []T {
	d.lit("[")
	list := []T{}
	if d.opt("]") {
		return list
	}
	for !d.bad {
		list = append(list, one())
		if d.opt("]") {
			return list
		}
		d.lit(",")
	}
	return nil
}
