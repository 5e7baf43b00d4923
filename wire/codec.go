package wire

//go:generate go run ./internal/codecgen

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/bits"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// The codec reads and writes the hot types (a task and what it holds, the
// two notifications, the send and update params and results, the
// JSON-RPC envelope) at the speed of a hand-written parser, from code
// that codecgen generates from the types' definitions (codec_gen.go):
// members in any order, each type's in one place, its struct. What the
// codec decodes, it decodes as github.com/go-json-experiment/json does
// with decodeOptions (FuzzCodecDecodesAsTheLibrary); anything it is not
// sure of (a type mismatch, a number out of range, an error of any kind)
// it leaves to that library, which has the last word and the error
// message. What it encodes, it encodes as encoding/json does, byte for
// byte (FuzzMarshalIsJSONMarshal).
//
// The decoder below is the codec's lexer. It checks every byte it reads
// as JSON: punctuation, literals, numbers and strings without an escape
// itself; a string with one, an array or an object it keeps raw or skips,
// with jsontext, which checks it as it reads it. Only a route (ReadRoute)
// and an id peeked at (PeekID) skip values by their structure alone
// (skipLoose): the receiver's decode checks them.
//
// The decoder is fast where the encoder's output makes it so: the
// member the encoder writes next is looked for first (next), and the
// form of a timestamp the encoder writes is read at once (parseTime).
// Either way it reads any order and any form the library reads.

// decoder reads JSON from b at i. Any departure from what the codec
// reads with certainty sets bad and moves i to the end, after which every
// read gives a zero value and every loop ends.
type decoder struct {
	b   []byte
	i   int
	bad bool
	// The member name the decoder read last (name): b[keyStart:keyEnd],
	// or keyBuf when it was escaped. Offsets, not a slice, so that
	// reading a name writes no pointer.
	keyStart, keyEnd int
	keyEscaped       bool
	keyBuf           []byte
	// depth is how deep in arrays and objects i is; deepest, how deep
	// the input has been: exactly wherever it could be deeper than
	// exactDepth (0: nowhere), at least as deep as what it read.
	depth, deepest, exactDepth int
	// seen are short strings made before, by this decode or an earlier
	// one: an event repeats its task id, session ids and names, and the
	// next events of a session repeat most of them again. Each is a copy
	// of its own bytes, so that keeping one keeps nothing else of any
	// input. A string is looked for in the four places of its bucket,
	// chosen by a hash of its bytes; a new one replaces the bucket's
	// oldest.
	seen     [16][4]string
	seenNext [16]uint8
	// lib reads what the decoder leaves to jsontext, from libBuf.
	lib     *jsontext.Decoder
	libBuf  bytes.Buffer
	libUsed bool
}

// decoders keeps decoders, and the strings they have seen.
var decoders = sync.Pool{New: func() any { return new(decoder) }}

func newDecoder(b []byte) *decoder {
	d := decoders.Get().(*decoder)
	d.b, d.i, d.bad, d.depth, d.deepest, d.exactDepth = b, 0, false, 0, 0, 0
	return d
}

func (d *decoder) release() {
	d.b = nil
	if d.libUsed {
		// Keep nothing of the input.
		d.libBuf = bytes.Buffer{}
		d.lib.Reset(&d.libBuf)
		d.libUsed = false
	}
	decoders.Put(d)
}

// name is the member name first or next read.
func (d *decoder) name() []byte {
	if d.keyEscaped {
		return d.keyBuf
	}
	return d.b[d.keyStart:d.keyEnd]
}

// codecDecode reads raw into v, a pointer to a zero value of a type the
// codec reads, and reports whether it did; it leaves v partly written
// when it did not.
func codecDecode(raw []byte, v any) bool {
	d := newDecoder(raw)
	defer d.release()
	return d.decodeValue(v) && d.end()
}

// maxNesting bounds the nesting the codec reads, just below the
// library's 10,000 levels: deeper input is the library's to refuse.
const maxNesting = 9_990

func (d *decoder) fail() {
	d.bad = true
	d.i = len(d.b)
}

func (d *decoder) ws() {
	for d.i < len(d.b) && isSpace(d.b[d.i]) {
		d.i++
	}
}

// isSpace reports whether c is JSON whitespace.
func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// end reports whether all of b was read, and read well.
func (d *decoder) end() bool {
	d.ws()
	return !d.bad && d.i == len(d.b)
}

// peek returns the next byte after whitespace, 0 at the end.
func (d *decoder) peek() byte {
	d.ws()
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

// literal reads lit if it comes next. What follows it is checked by the
// next read: a delimiter or the end.
func (d *decoder) literal(lit string) bool {
	d.ws()
	if len(d.b)-d.i >= len(lit) && string(d.b[d.i:d.i+len(lit)]) == lit {
		d.i += len(lit)
		return true
	}
	return false
}

// null reads a null if one comes next.
func (d *decoder) null() bool {
	if d.i < len(d.b) && d.b[d.i] != 'n' && !isSpace(d.b[d.i]) {
		return false // what comes next, without a call
	}
	return d.literal("null")
}

func (d *decoder) enter() {
	d.depth++
	if d.depth > d.deepest {
		d.deepest = d.depth
	}
	if d.depth > maxNesting {
		d.fail()
	}
}

// fields are the members of a struct the codec reads: their names, and
// each as the encoder writes its head ("name":).
type fields struct {
	names, heads []string
}

func newFields(names ...string) *fields {
	fs := &fields{names: names}
	for _, n := range names {
		fs.heads = append(fs.heads, `"`+n+`":`)
	}
	return fs
}

// The field indexes first and next return besides a struct's own.
const (
	unknownField = -1
	endObject    = -2
)

// first reads the start of an object and its first member's name and
// colon, and returns the member's field index in fs (unknownField for a
// member fs does not have), or endObject for an empty object.
func (d *decoder) first(fs *fields) int {
	if d.peek() != '{' {
		d.fail()
		return endObject
	}
	d.i++
	d.enter()
	if d.peek() == '}' {
		d.i++
		d.depth--
		return endObject
	}
	return d.field(fs, 0)
}

// next reads what follows the value of the member of field index prev:
// the next member's name and colon (its field index, or unknownField),
// or the end of the object (endObject).
func (d *decoder) next(fs *fields, prev int) int {
	if d.i < len(d.b) && d.b[d.i] == ',' {
		// The member the encoder writes next, without a space: one
		// comparison.
		if k := prev + 1; k < len(fs.heads) {
			if h := fs.heads[k]; len(d.b)-d.i > len(h) && string(d.b[d.i+1:d.i+1+len(h)]) == h {
				d.i += 1 + len(h)
				return k
			}
		}
	}
	switch d.peek() {
	case ',':
		d.i++
		return d.field(fs, prev+1)
	case '}':
		d.i++
		d.depth--
		return endObject
	}
	d.fail()
	return endObject
}

// field reads a member's name and colon, and returns its field index. The
// member that follows in the struct's order, as the encoder writes it, is
// tried first: there a name costs one comparison.
func (d *decoder) field(fs *fields, expect int) int {
	if expect >= 0 && expect < len(fs.heads) {
		if h := fs.heads[expect]; len(d.b)-d.i >= len(h) && string(d.b[d.i:d.i+len(h)]) == h {
			d.i += len(h)
			return expect
		}
	}
	d.ws()
	if !d.member() {
		return endObject
	}
	name := d.name()
	for k, n := range fs.names {
		if n == string(name) {
			return k
		}
	}
	return unknownField
}

func (d *decoder) member() bool {
	if d.i >= len(d.b) || d.b[d.i] != '"' {
		d.fail()
		return false
	}
	start := d.i
	plain := d.span()
	if d.bad {
		return false
	}
	d.keyStart, d.keyEnd, d.keyEscaped = start+1, d.i-1, !plain
	if !plain {
		d.keyBuf = d.unquote(d.keyBuf[:0], d.b[start:d.i])
	}
	if d.peek() != ':' {
		d.fail()
		return false
	}
	d.i++
	return !d.bad
}

// arrayStart reads the start of an array, and reports whether an element
// comes next.
func (d *decoder) arrayStart() bool {
	if d.peek() != '[' {
		d.fail()
		return false
	}
	d.i++
	d.enter()
	if d.peek() == ']' {
		d.i++
		d.depth--
		return false
	}
	return true
}

// arrayNext reads what follows an element, and reports whether another
// comes next.
func (d *decoder) arrayNext() bool {
	switch d.peek() {
	case ',':
		d.i++
		return true
	case ']':
		d.i++
		d.depth--
		return false
	}
	d.fail()
	return false
}

// plainByte marks the bytes a string holds as they are: printable ASCII
// but the quote and the backslash.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < 0x7f; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// span reads the string at i, and reports whether it is plain: no
// escape, no control character, valid UTF-8, so that its bytes between
// the quotes are its value. A string that is not plain is checked and
// unquoted by jsontext (unquote).
func (d *decoder) span() (plain bool) {
	b := d.b
	j := d.i + 1
	// Eight bytes at a time while none is a quote, a backslash, a control
	// character or past ASCII.
	for ; len(b)-j >= 8; j += 8 {
		w := binary.LittleEndian.Uint64(b[j:])
		if hasZero(w^(lsb*'"'))|hasZero(w^(lsb*'\\'))|(w-lsb*0x20)&^w&msb|w&msb != 0 {
			break
		}
	}
	for j < len(b) && plainByte[b[j]] {
		j++
	}
	if j < len(b) && b[j] == '"' {
		d.i = j + 1
		return true
	}
	plain = true
	start := d.i + 1
	for j < len(b) {
		switch c := b[j]; {
		case c == '"':
			d.i = j + 1
			return plain && utf8.Valid(b[start:j])
		case c == '\\':
			plain = false
			j += 2
		case c < 0x20:
			plain = false
			j++
		default:
			j++
		}
	}
	d.fail()
	return false
}

const (
	lsb  = 0x0101010101010101
	msb  = 0x8080808080808080
	low7 = 0x7f7f7f7f7f7f7f7f
)

// hasZero is not zero when a byte of w is zero.
func hasZero(w uint64) uint64 { return (w - lsb) &^ w & msb }

// unquote appends the value of the quoted string s, which is not plain,
// as the library reads it: its escapes decoded, invalid UTF-8 and lone
// surrogates as U+FFFD. A string the library refuses fails the decode.
func (d *decoder) unquote(dst, s []byte) []byte {
	if !jsontext.Value(s).IsValid(decodeOptions) {
		d.fail()
		return dst
	}
	out, _ := jsontext.AppendUnquote(dst, s) // only invalid UTF-8 is left to report
	return out
}

// str reads a string (null is ""), kept among the strings seen when it
// is short.
func (d *decoder) str() string { return d.string(true) }

// secret reads a string that holds a secret (a token): it is made anew,
// never kept among the strings seen nor compared with them, since the
// decoders and what they have seen are shared by every session.
func (d *decoder) secret() string { return d.string(false) }

func (d *decoder) string(keep bool) string {
	c := byte(0)
	if d.i < len(d.b) {
		c = d.b[d.i]
	}
	if c != '"' {
		c = d.peek()
	}
	switch c {
	case '"':
	case 'n':
		if d.null() {
			return ""
		}
		fallthrough
	default:
		d.fail()
		return ""
	}
	start := d.i
	plain := d.span()
	switch {
	case d.bad:
		return ""
	case plain && keep:
		return d.short(d.b[start+1 : d.i-1])
	case plain:
		return string(d.b[start+1 : d.i-1])
	}
	return string(d.unquote(nil, d.b[start:d.i]))
}

// short returns b as a string, the one made before if it repeats one.
func (d *decoder) short(b []byte) string {
	n := len(b)
	if n == 0 || n > 64 {
		return string(b)
	}
	h := (uint(n)*31 + uint(b[0])*7 + uint(b[n/2])*3 + uint(b[n-1])) % uint(len(d.seen))
	bucket := &d.seen[h]
	for _, s := range bucket {
		if len(s) == n && s == string(b) {
			return s
		}
	}
	s := string(b)
	bucket[d.seenNext[h]%4] = s
	d.seenNext[h]++
	return s
}

// boolean reads true, false or null (false).
func (d *decoder) boolean() bool {
	switch {
	case d.literal("true"):
		return true
	case d.literal("false"), d.null():
		return false
	}
	d.fail()
	return false
}

// uint reads a uint64, or null (0): digits only. A sign, a fraction, an
// exponent or too large a number is the library's to judge.
func (d *decoder) uint() uint64 {
	if d.null() {
		return 0
	}
	start := d.i
	var n uint64
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		digit := uint64(d.b[d.i] - '0')
		if n > (1<<64-1-digit)/10 {
			d.fail()
			return 0
		}
		n = n*10 + digit
		d.i++
	}
	if d.i == start || (d.b[start] == '0' && d.i > start+1) {
		d.fail()
		return 0
	}
	if d.i < len(d.b) {
		switch d.b[d.i] {
		case '.', 'e', 'E':
			d.fail()
			return 0
		}
	}
	return n
}

// time reads a Time as its UnmarshalJSONFrom does: any RFC 3339 time, in
// UTC, and null as no change.
func (d *decoder) time(t *Time) {
	// The form the encoder writes, read at once.
	if n := len(`"2006-01-02T15:04:05.000Z"`); len(d.b)-d.i >= n && d.b[d.i] == '"' && d.b[d.i+n-1] == '"' {
		if v, ok := parseTime(d.b[d.i+1 : d.i+n-1]); ok {
			t.Time = v
			d.i += n
			return
		}
	}
	switch d.peek() {
	case 'n':
		if d.null() {
			return
		}
	case '"':
		start := d.i
		plain := d.span()
		if d.bad {
			return
		}
		s := d.b[start+1 : d.i-1]
		if v, ok := parseTime(s); ok {
			t.Time = v
			return
		}
		if !plain {
			s = d.unquote(nil, d.b[start:d.i])
		}
		v, err := time.Parse(time.RFC3339Nano, string(s))
		if err == nil {
			t.Time = v.UTC()
			return
		}
	}
	d.fail()
}

// parseTime reads a time as appendTime writes it, "2006-01-02T15:04:05.000Z"
// for the years 0 to 9999, as time.Parse reads it; ok is false for
// anything else.
func parseTime(b []byte) (t time.Time, ok bool) {
	if len(b) != len("2006-01-02T15:04:05.000Z") || b[4] != '-' || b[7] != '-' || b[10] != 'T' || b[13] != ':' || b[16] != ':' || b[19] != '.' || b[23] != 'Z' {
		return time.Time{}, false
	}
	ok = true
	num := func(from, to int) int {
		v := 0
		for _, c := range b[from:to] {
			if c < '0' || c > '9' {
				ok = false
			}
			v = v*10 + int(c-'0')
		}
		return v
	}
	year, month, day := num(0, 4), num(5, 7), num(8, 10)
	hour, minute, sec, ms := num(11, 13), num(14, 16), num(17, 19), num(20, 23)
	if !ok || month < 1 || month > 12 || day < 1 || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	t = time.Date(year, time.Month(month), day, hour, minute, sec, ms*1e6, time.UTC)
	if t.Day() != day { // the 31st of a month of 30 days, say
		return time.Time{}, false
	}
	return t, true
}

// raw reads any value, as the library checks it, and returns a copy of
// its bytes.
func (d *decoder) raw() json.RawMessage {
	v := d.value()
	if v == nil {
		return nil
	}
	return bytes.Clone(v)
}

// value reads any value, as the library checks it, and returns its bytes:
// a slice of the input, capped so that an append cannot write into it.
// A plain string, a literal and a number are checked here; anything else
// is read by jsontext.
func (d *decoder) value() jsontext.Value {
	d.ws()
	start := d.i
	ok := false
	switch c := d.peek(); {
	case c == '"':
		ok = d.span() || d.library(start)
	case c == 't', c == 'f', c == 'n':
		ok = d.literal("true") || d.literal("false") || d.null()
	case c == '-' || c >= '0' && c <= '9':
		ok = d.number()
	default:
		ok = d.library(start)
	}
	if !ok || d.bad {
		d.fail()
		return nil
	}
	return d.b[start:d.i:d.i]
}

// library reads the value at start with jsontext, which checks it in the
// same pass, and reports whether it is valid JSON.
func (d *decoder) library(start int) bool {
	if d.lib == nil {
		d.lib = jsontext.NewDecoder(&d.libBuf)
	}
	d.libBuf = *bytes.NewBuffer(d.b[start:])
	d.lib.Reset(&d.libBuf, decodeOptions)
	v, err := d.lib.ReadValue()
	if err != nil {
		return false
	}
	d.i = start + len(v)
	d.libUsed = true
	// The nesting counts from the input's start, where the library
	// counts from the value's: measure it where the two could differ, or
	// where it could pass exactDepth.
	if n := d.depth + len(v)/2; n > maxNesting || d.exactDepth > 0 && n > d.exactDepth {
		d.i = start
		d.valueEnd()
		d.i = start + len(v)
	}
	return !d.bad
}

// number reads a number as JSON writes it, and reports whether it did;
// anything else it leaves to be checked by jsontext.
func (d *decoder) number() bool {
	b, i := d.b, d.i
	digits := func() bool {
		start := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i > start
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case !digits():
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if !digits() {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if !digits() {
			return false
		}
	}
	d.i = i
	return true
}

// skip reads a value, as the library checks it, to ignore it.
func (d *decoder) skip() { d.value() }

// skipLoose reads past a value without checking what it holds: for a
// route, which the receiver's decode checks.
func (d *decoder) skipLoose() {
	d.ws()
	d.valueEnd()
}

// valueEnd moves past the value at i, by its structure alone (strings,
// brackets, the bytes of a scalar), and returns where it ends; the value
// is yet to be checked. It records the value's nesting.
func (d *decoder) valueEnd() int {
	b := d.b
	if d.i >= len(b) {
		d.fail()
		return d.i
	}
	switch b[d.i] {
	case '"':
		d.stringEnd()
	case '{', '[':
		d.containerEnd()
	default:
		start := d.i
		for d.i < len(b) {
			switch b[d.i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				if d.i == start {
					d.fail()
				}
				return d.i
			}
			d.i++
		}
		if d.i == start {
			d.fail()
		}
	}
	return d.i
}

// containerEnd moves past the array or object at i, to its closing
// bracket: the brackets outside its strings counted, the strings'
// escapes skipped. It reads eight bytes at a time: which of them are
// quotes, which are inside a string, and so which brackets count.
func (d *decoder) containerEnd() {
	b := d.b
	depth := d.depth
	inString := uint8(0) // whether the byte before j is inside a string: 0 or 1
	for j := d.i; j < len(b); {
		if len(b)-j >= 8 {
			w := binary.LittleEndian.Uint64(b[j:])
			if zeros(w^(lsb*'\\')) == 0 { // no escape: the eight at once
				q := zeros(w ^ (lsb * '"'))
				// { [ } ] and, which are not outside a string in
				// JSON, Y y _ and DEL: the bytes c such that
				// (c | 0x20) &^ 0x06 is 0x79.
				br := zeros((w|lsb*0x20)&^(lsb*0x06) ^ (lsb * 0x79))
				if br == 0 {
					inString ^= uint8(bits.OnesCount64(q) & 1)
					j += 8
					continue
				}
				quotes, brackets := movemask(q), movemask(br)
				// A byte is inside a string when an odd number of
				// quotes come before it or at it: a prefix xor.
				in := quotes
				in ^= in << 1
				in ^= in << 2
				in ^= in << 4
				if inString != 0 {
					in = ^in
				}
				for m := brackets &^ in; m != 0; m &= m - 1 {
					k := bits.TrailingZeros8(m)
					switch b[j+k] {
					case '{', '[':
						d.enter()
						continue
					case '}', ']':
					default:
						continue // a byte the test takes for a bracket
					}
					d.depth--
					if d.depth == depth {
						d.i = j + k + 1
						return
					}
				}
				inString = in >> 7
				j += 8
				continue
			}
		}
		switch c := b[j]; {
		case inString != 0 && c == '\\':
			j++ // the byte it escapes
		case c == '"':
			inString ^= 1
		case inString != 0:
		case c == '{' || c == '[':
			d.enter()
		case c == '}' || c == ']':
			d.depth--
			if d.depth == depth {
				d.i = j + 1
				return
			}
		}
		j++
	}
	d.fail()
}

// zeros marks each zero byte of w with its high bit, and no other.
func zeros(w uint64) uint64 { return ^((w&low7 + low7) | w | low7) }

// movemask gathers the high bits of w's bytes, as zeros marks them, into
// a byte: bit k for byte k.
func movemask(w uint64) uint8 { return uint8((w >> 7) * 0x0102040810204080 >> 56) }

// stringEnd moves past the string at i: to the first quote not escaped.
func (d *decoder) stringEnd() {
	b := d.b
	j := d.i + 1
	for {
		// Eight bytes at a time to the next quote or backslash: the
		// lowest byte hasZero marks is the first.
		for ; len(b)-j >= 8; j += 8 {
			w := binary.LittleEndian.Uint64(b[j:])
			if m := hasZero(w^(lsb*'"')) | hasZero(w^(lsb*'\\')); m != 0 {
				j += bits.TrailingZeros64(m) / 8
				break
			}
		}
		for j < len(b) && b[j] != '"' && b[j] != '\\' {
			j++
		}
		switch {
		case j >= len(b):
			d.fail()
			return
		case b[j] == '"':
			d.i = j + 1
			return
		}
		j += 2 // an escape
	}
}
