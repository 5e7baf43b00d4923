package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/a2a-bus/a2a-bus/wire"
)

// The bounds on what a request's body may cost once decoded
// (docs/PROTOCOL.md §12, Limits). The SDK decodes a body into Go values:
// an empty object costs over a hundred bytes of heap for its three bytes
// of JSON, so a body of nothing but small containers grows some 40-fold.
// Before the SDK sees a body, scanBody reads its tokens (no tree) and
// refuses one whose decoded form would be much larger than its bytes.
const (
	// MaxBodyDepth bounds the nesting of arrays and objects in a request,
	// the envelope included: the broker's own bound (§11).
	MaxBodyDepth = wire.MaxDepth
	// ValueCost and ContainerCost are what the scan counts for each JSON
	// value (an object's keys included) and, besides, each array or
	// object: about what they cost decoded, and once more on their way
	// to the broker (a boxed scalar with its slot, a small map's first
	// group).
	ValueCost     = 40
	ContainerCost = 256
	// DecodedPerByte and DecodedSlack bound a body's count: at most
	// DecodedPerByte × its bytes + DecodedSlack. Text of any size, records
	// as JSON encoders write them ({"id":1234,"name":"abcdef","ok":true}
	// counts 14.1 a byte), numbers of two digits or more ("10," counts
	// 13.3 a byte) pass at any size; the slack lets any body have about
	// 26,000 values or 3,500 empty containers whatever its size. What is
	// refused (-32600) is a body mostly of tiny containers ([{},{},…]
	// counts 99 a byte) or of one-digit numbers ([0,0,…], 20 a byte).
	DecodedPerByte = 16
	DecodedSlack   = 1 << 20
	// BusyWait is how long a request waits for room in the gateway's
	// budget (Config.MaxInFlightBytes) before it is refused (-32603).
	BusyWait = 10 * time.Second
)

// JSON-RPC error codes the gateway answers itself.
const (
	codeParseError     = -32700
	codeInvalidRequest = -32600
	codeInternalError  = -32603
)

// bodyScan is what scanBody learned of a body.
type bodyScan struct {
	values, containers int
	// inexact is set when a number in the body would not survive a
	// float64 (a fraction, an exponent, or 16 digits or more).
	inexact bool
	// id is the request's top-level id as written (a string, a number or
	// null), when the scan reached it: the id of an error answer.
	id []byte
}

// cost is the body's count (ValueCost, ContainerCost).
func (s *bodyScan) cost() int64 {
	return int64(s.values)*ValueCost + int64(s.containers)*ContainerCost
}

// weight is what a body of n bytes so scanned holds of the gateway's
// budget: its size, or more for a body whose decoded form is larger than
// DecodedPerByte × its size would be (at most n + DecodedSlack/DecodedPerByte).
func (s *bodyScan) weight(n int) int64 {
	return max(int64(n), (s.cost()+DecodedPerByte-1)/DecodedPerByte)
}

// scanError is scanBody's failure: a syntax error (-32700) or a body
// over a limit (-32600).
type scanError struct {
	syntax bool
	msg    string
}

func (e *scanError) Error() string { return e.msg }

// scanOptions are the gateway's decode options (those of wire): it takes
// duplicate names, and invalid UTF-8 in strings as encoding/json does.
var scanOptions = jsonv2.JoinOptions(jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))

// scanner is a pooled decoder: in holds the body, read in place.
type scanner struct {
	dec jsontext.Decoder
	in  bytes.Buffer
}

var scanners = sync.Pool{New: func() any { return new(scanner) }}

// scanBody checks that b is one JSON value, alone but for white space,
// that nests at most maxDepth deep (at most jsontext's own bound) and
// whose count (ValueCost, ContainerCost) is at most DecodedPerByte ×
// len(b) + DecodedSlack. It reads b's tokens once, in place, with a
// pooled decoder, and stops at the first token over a bound.
func scanBody(b []byte, maxDepth int) (bodyScan, error) {
	sc := scanners.Get().(*scanner)
	sc.in = *bytes.NewBuffer(b)
	sc.dec.Reset(&sc.in, scanOptions)
	s, err := sc.scan(b, maxDepth)
	sc.in = bytes.Buffer{}
	sc.dec.Reset(&sc.in) // drops b
	scanners.Put(sc)
	return s, err
}

func (sc *scanner) scan(b []byte, maxDepth int) (bodyScan, error) {
	var s bodyScan
	limit := int64(DecodedPerByte)*int64(len(b)) + DecodedSlack
	dec := &sc.dec
	keyIsID := false // the value that comes is the top level's "id"
	for {
		depth := dec.StackDepth()
		switch k := dec.PeekKind(); k {
		case '{', '[':
			s.values++
			s.containers++
			if depth >= maxDepth {
				return s, &scanError{msg: fmt.Sprintf("the request nests arrays and objects deeper than %d levels", maxDepth)}
			}
			if s.cost() > limit {
				return s, overCount(&s, len(b))
			}
			keyIsID = false // a container is no id, nor is what is in it
			if _, err := dec.ReadToken(); err != nil {
				return s, syntaxErr(err)
			}
		case '}', ']':
			if _, err := dec.ReadToken(); err != nil {
				return s, syntaxErr(err)
			}
		case 0: // an error, or the end before a value is whole
			_, err := dec.ReadToken()
			if errors.Is(err, io.EOF) { // nothing but white space
				err = io.ErrUnexpectedEOF
			}
			return s, syntaxErr(err)
		default: // a name or a scalar
			// Only a name in the top-level object matters: "id" or not.
			isName := false
			if depth == 1 && k == '"' {
				kind, n := dec.StackIndex(1)
				isName = kind == '{' && n%2 == 0
			}
			v, err := dec.ReadValue()
			if err != nil {
				return s, syntaxErr(err)
			}
			s.values++
			switch {
			case isName:
				keyIsID = string(v) == `"id"`
			default:
				if k == '0' && inexact(v) {
					s.inexact = true
				}
				if keyIsID && (k == '"' || k == '0' || k == 'n') {
					end := int(dec.InputOffset())
					s.id = b[end-len(v) : end]
				}
				keyIsID = false
			}
			if s.cost() > limit {
				return s, overCount(&s, len(b))
			}
		}
		if dec.StackDepth() == 0 && s.values > 0 {
			// The top-level value is whole: nothing but white space may follow.
			if k := dec.PeekKind(); k != 0 {
				return s, &scanError{syntax: true, msg: fmt.Sprintf("invalid character %q after the top-level value after offset %d", byte(k), dec.InputOffset())}
			}
			if _, err := dec.ReadToken(); !errors.Is(err, io.EOF) {
				return s, syntaxErr(err)
			}
			return s, nil
		}
	}
}

// inexact reports whether the number n would not survive a float64 as
// written: a fraction, an exponent, or 16 digits or more (a minus sign
// counted).
func inexact(n []byte) bool {
	if len(n) > 15 {
		return true
	}
	for _, c := range n {
		if c == '.' || c == 'e' || c == 'E' {
			return true
		}
	}
	return false
}

// syntaxErr is a syntax error in jsontext's words and at its offset, but
// without its JSON Pointer: that is built from the body's own member
// names, which an answer (and a log line) should not repeat.
func syntaxErr(err error) error {
	var se *jsontext.SyntacticError
	if errors.As(err, &se) && se.Err != nil {
		return &scanError{syntax: true, msg: fmt.Sprintf("%v at offset %d", se.Err, se.ByteOffset)}
	}
	return &scanError{syntax: true, msg: strings.TrimPrefix(err.Error(), "jsontext: ")}
}

func overCount(s *bodyScan, n int) error {
	return &scanError{msg: fmt.Sprintf("the request's %d-byte body holds too many values and containers for its size: its decoded form would be over %d times as large (at most %d × its bytes + %d, counting %d a value and %d more a container)",
		n, DecodedPerByte, DecodedPerByte, DecodedSlack, ValueCost, ContainerCost)}
}

// budget is a weighted semaphore over the bodies in service
// (Config.MaxInFlightBytes): waiters are served in order.
type budget struct {
	mu      sync.Mutex
	size    int64
	used    int64
	waiters []*waiter
}

type waiter struct {
	n     int64
	ready chan struct{}
}

func newBudget(size int64) *budget { return &budget{size: size} }

// acquire takes n (at most the budget's size) within ctx, waiting at most
// BusyWait.
func (b *budget) acquire(ctx context.Context, n int64) error {
	n = min(n, b.size)
	b.mu.Lock()
	if len(b.waiters) == 0 && b.used+n <= b.size {
		b.used += n
		b.mu.Unlock()
		return nil
	}
	w := &waiter{n: n, ready: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	b.mu.Unlock()
	t := time.NewTimer(BusyWait)
	defer t.Stop()
	var err error
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-t.C:
		err = errBusy
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-w.ready: // served meanwhile: give it back
		b.used -= n
		b.wake()
	default:
		for i, x := range b.waiters {
			if x == w {
				b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
				break
			}
		}
		b.wake() // the first waiter may fit now that w no longer blocks it
	}
	return err
}

var errBusy = errors.New("busy")

// release gives back n.
func (b *budget) release(n int64) {
	b.mu.Lock()
	b.used -= min(n, b.size)
	b.wake()
	b.mu.Unlock()
}

func (b *budget) wake() {
	for len(b.waiters) > 0 && b.used+b.waiters[0].n <= b.size {
		w := b.waiters[0]
		b.waiters = b.waiters[1:]
		b.used += w.n
		close(w.ready)
	}
}

// serveRPC reads a JSON-RPC request's body whole, within BodyTimeout and
// MaxBodyBytes, in the gateway's budget; scans it (scanBody); keeps its
// numbers as written (exactNumbers); and hands it to the SDK.
func (g *Gateway) serveRPC(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	tooLarge := func(err error) {
		w.Header().Set("Connection", "close")
		_ = rc.SetReadDeadline(time.Now())
		http.Error(w, "the request body: "+err.Error(), http.StatusRequestEntityTooLarge)
	}
	maxBody := g.cfg.MaxBodyBytes
	if r.ContentLength > maxBody {
		tooLarge(&http.MaxBytesError{Limit: maxBody})
		return
	}
	// A request holds its weight of its client's share of the budget and
	// of the whole: no client can hold the whole (one that stalls its
	// bodies, or keeps streams open, waits on its own share).
	share := g.clientOf(r.Context()).bodies
	limit := min(share.size, g.bodies.size)
	take := func(n int64) error {
		if err := share.acquire(r.Context(), n); err != nil {
			return err
		}
		if err := g.bodies.acquire(r.Context(), n); err != nil {
			share.release(n)
			return err
		}
		return nil
	}
	give := func(n int64) {
		g.bodies.release(n)
		share.release(n)
	}
	held := maxBody // a body of unknown length may be as large as that
	if r.ContentLength >= 0 {
		held = r.ContentLength
	}
	held = min(held, limit)
	if err := take(held); err != nil {
		w.Header().Set("Connection", "close")
		_ = rc.SetReadDeadline(time.Now())
		g.busy(w, nil, err)
		return
	}
	defer func() { give(held) }()
	// The body is read whole, within BodyTimeout, then the read deadline
	// goes: a stream may last as long as its task.
	_ = rc.SetReadDeadline(time.Now().Add(BodyTimeout))
	body, err := readBody(http.MaxBytesReader(w, r.Body, maxBody), r.ContentLength)
	if err != nil {
		tooLarge(err)
		return
	}
	_ = rc.SetReadDeadline(time.Time{})
	if n := int64(len(body)); n < held {
		give(held - n)
		held = n
	}
	// A message's data is never decoded (lift.go): the scan and the SDK
	// see the rest.
	body, lifted := liftData(body)
	scan, err := scanBody(body, MaxBodyDepth)
	if err != nil {
		code := codeInvalidRequest
		var se *scanError
		if errors.As(err, &se) && se.syntax {
			code = codeParseError
		}
		writeRPCError(w, scan.id, code, "the request body: "+err.Error())
		return
	}
	if wt := min(scan.weight(len(body)), limit); wt > held {
		if err := take(wt - held); err != nil {
			g.busy(w, scan.id, err)
			return
		}
		held = wt
	}
	ctx := context.WithValue(r.Context(), agentKey{}, r.PathValue("agent"))
	if scan.inexact {
		ctx = withExact(ctx, body)
	}
	if lifted != nil {
		ctx = withLifted(ctx, lifted)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	g.rpc.ServeHTTP(w, r.WithContext(ctx))
}

// readBody reads r whole: into a buffer of its length when it is known.
func readBody(r io.Reader, length int64) ([]byte, error) {
	if length < 0 {
		return io.ReadAll(r)
	}
	b := make([]byte, length)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	// The length is the body's: more is an error of the reader (none).
	return b, nil
}

func (g *Gateway) busy(w http.ResponseWriter, id []byte, err error) {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return // the client is gone
	}
	w.Header().Set("Retry-After", "1")
	writeRPCError(w, id, codeInternalError, fmt.Sprintf("the gateway is busy: the requests in service hold its %d bytes of bodies (waited %s); try again", g.bodies.size, BusyWait))
}

// writeRPCError answers a JSON-RPC error as the SDK does: HTTP 200.
func writeRPCError(w http.ResponseWriter, id []byte, code int, msg string) {
	if len(id) == 0 {
		id = []byte("null")
	}
	type rpcError struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	type response struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   rpcError        `json:"error"`
	}
	out, err := json.Marshal(response{JSONRPC: "2.0", ID: id, Error: rpcError{code, msg}})
	if err != nil {
		out, _ = json.Marshal(response{JSONRPC: "2.0", ID: json.RawMessage("null"), Error: rpcError{code, msg}})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(out)+1))
	w.Write(append(out, '\n'))
}
