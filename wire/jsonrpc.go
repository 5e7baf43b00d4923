package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// Version is the only JSON-RPC version spoken.
const Version = "2.0"

// DefaultMaxMessageBytes is the size limit of one message on every bus.
const DefaultMaxMessageBytes = 1 << 20

// Request is a JSON-RPC request or notification. ID is the raw id as sent
// (a string, a number or null); nil means absent, which makes the request a
// notification. A parsed Request's Params is a slice of the raw message,
// not a copy: it is valid while the raw message is.
type Request struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params,omitempty"`
	// decoded is Params decoded, when ParseRequest read them.
	decoded any
}

// DecodeParams decodes the request's params into v, as DecodeParams
// does. The params of a send or an update come decoded by ParseRequest.
func (r *Request) DecodeParams(v any) *Error {
	switch d := r.decoded.(type) {
	case *SendParams:
		if p, ok := v.(*SendParams); ok {
			*p = *d
			return nil
		}
	case *UpdateParams:
		if p, ok := v.(*UpdateParams); ok {
			*p = *d
			return nil
		}
	}
	return DecodeParams(r.Params, v)
}

// IsNotification reports whether the request has no id.
func (r *Request) IsNotification() bool { return r.ID == nil }

// Response is a JSON-RPC response: exactly one of Result and Error.
type Response struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *Error          `json:"error,omitempty"`
}

// Notification is a JSON-RPC notification from the broker.
type Notification struct {
	JSONRPC string          `json:"jsonrpc"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params"`
}

// envelope holds the members of any message without committing to their
// types, so that each can be checked in the protocol's order. The codec
// reads them as slices of the message, each checked as JSON.
type envelope struct {
	JSONRPC jsontext.Value `json:"jsonrpc"`
	ID      jsontext.Value `json:"id"`
	Method  jsontext.Value `json:"method"`
	Params  jsontext.Value `json:"params"`
	Result  jsontext.Value `json:"result"`
	Error   jsontext.Value `json:"error"`
}

var null = []byte("null")

// decodeEnvelope reads the members of a message by their exact names
// ("ID" or "Method" are unknown members, ignored); a member given twice
// takes its last value.
func decodeEnvelope(raw []byte) (envelope, error) {
	var env envelope // read by the codec, it stays on the stack
	if codecDecodeEnvelope(raw, &env) {
		return env, nil
	}
	lib := new(envelope) // not JSON, or nested past the codec's reach
	err := libraryUnmarshal(raw, lib)
	return *lib, err
}

func codecDecodeEnvelope(raw []byte, env *envelope) bool {
	d := newDecoder(raw)
	defer d.release()
	d.decEnvelope(env)
	return d.end()
}

// readRequest reads the members of a request as decodeEnvelope does, and
// how deeply the request nests. The params of a send or an update that
// come after the method, as EncodeRequest writes them, it decodes in the
// same pass (decoded); other params it reads by their structure alone,
// for the caller to check. ok is false for a request that is not JSON,
// that nests past the codec's reach, or whose params decoded in the pass
// the codec leaves to the library.
func readRequest(raw []byte, eager bool) (env envelope, depth int, decoded any, ok bool) {
	d := newDecoder(raw)
	defer d.release()
	d.exactDepth = MaxDepth
	for f := d.first(requestFields); f != endObject; f = d.next(requestFields, f) {
		var v []byte
		switch c := d.peek(); {
		case f == 3: // params
			start := d.i
			if p := paramsFor(env.Method); eager && c == '{' && p != nil && d.decodeValue(p) && !d.bad {
				decoded = p
			} else {
				decoded = nil
				d.valueEnd() // to measure the nesting; checked by the caller
			}
			env.Params = d.b[start:d.i:d.i]
			continue
		case c == '{' || c == '[':
			start := d.i
			d.valueEnd() // to measure the nesting
			if v = d.b[start:d.i:d.i]; !d.bad && !validJSON(v) {
				d.fail()
			}
		default:
			v = d.value()
		}
		switch f {
		case 0:
			env.JSONRPC = v
		case 1:
			env.ID = v
		case 2:
			env.Method = v
		}
	}
	return env, d.deepest, decoded, d.end()
}

// requestFields are the members of a request, in the order
// EncodeRequest writes them.
var requestFields = newFields("jsonrpc", "id", "method", "params")

// paramsFor returns new params for a send or an update, the requests of
// every round trip, which ParseRequest decodes with the codec; nil for
// any other method.
func paramsFor(method jsontext.Value) any {
	switch string(method) {
	case `"` + MethodSend + `"`:
		return new(SendParams)
	case `"` + MethodUpdateTask + `"`:
		return new(UpdateParams)
	}
	return nil
}

// depthOf returns how deeply valid JSON nests arrays and objects.
func depthOf(raw []byte) int {
	dec := jsontext.NewDecoder(bytes.NewReader(raw), decodeOptions)
	deepest := 0
	for {
		if _, err := dec.ReadToken(); err != nil {
			return deepest
		}
		deepest = max(deepest, dec.StackDepth())
	}
}

// validJSON is json.Valid, at twice its speed: jsontext's validator, told
// to accept what json.Valid accepts (duplicate names, invalid UTF-8, which
// are checked elsewhere).
func validJSON(raw []byte) bool {
	return jsontext.Value(raw).IsValid(decodeOptions)
}

// jsonString reads a JSON string value, which is valid JSON, as the
// library does: a lone surrogate is U+FFFD.
func jsonString(v jsontext.Value) (string, bool) {
	if len(v) < 2 || v[0] != '"' {
		return "", false
	}
	if bytes.IndexByte(v, '\\') < 0 {
		return string(v[1 : len(v)-1]), true
	}
	s, _ := jsontext.AppendUnquote(nil, v) // valid: only a surrogate to report
	return string(s), true
}

// ParseRequest decodes one raw request as the broker must (PROTOCOL §1).
// On failure it returns the error to answer with; the request is then to be
// answered with id null, except for ErrMethodNotFound-class errors found
// later by the caller. maxBytes <= 0 means DefaultMaxMessageBytes.
//
// The returned Request's Params is never nil: absent params are "{}".
// Whether Params is an object is not checked here (that is -32602, which
// ranks below -32601 and so needs the method table).
func ParseRequest(raw []byte, maxBytes int) (*Request, *Error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxMessageBytes
	}
	if len(raw) > maxBytes {
		return nil, ErrInvalidRequest.Withf("message of %d bytes is over the limit of %d", len(raw), maxBytes)
	}
	if !utf8.Valid(raw) {
		return nil, ErrParse.Withf("message is not valid UTF-8")
	}
	trimmed := bytes.TrimLeft(raw, " \t\r\n")
	if len(trimmed) == 0 {
		return nil, ErrParse.Withf("empty message")
	}
	switch trimmed[0] {
	case '{':
	case '[':
		if !validJSON(trimmed) {
			return nil, ErrParse.Withf("message is not valid JSON")
		}
		return nil, ErrInvalidRequest.Withf("batches are not supported")
	default:
		if !validJSON(trimmed) {
			return nil, ErrParse.Withf("message is not valid JSON")
		}
		return nil, ErrInvalidRequest.Withf("a request must be a JSON object")
	}
	env, depth, decoded, ok := readRequest(trimmed, true)
	if !ok {
		// Params the codec leaves to the library, or not JSON.
		env, depth, decoded, ok = readRequest(trimmed, false)
	}
	if ok && decoded == nil && env.Params != nil {
		if p := paramsFor(env.Method); p != nil && ParamsObject(json.RawMessage(env.Params)) && codecDecode(env.Params, p) {
			decoded = p // and so JSON
		} else if !validJSON(env.Params) {
			ok = false
		}
	}
	if !ok {
		// The library says what is wrong, or, for a request nested past
		// the codec's reach, what it holds and how deep.
		lib := new(envelope)
		if err := libraryUnmarshal(trimmed, lib); err != nil {
			return nil, ErrParse.Withf("message is not valid JSON: %s", decodeProblem(err))
		}
		env, depth, decoded = *lib, depthOf(trimmed), nil
	}
	if depth > MaxDepth {
		return nil, ErrInvalidRequest.Withf("message nests arrays and objects deeper than %d levels", MaxDepth)
	}
	if string(env.JSONRPC) != `"`+Version+`"` {
		if version, ok := jsonString(env.JSONRPC); !ok || version != Version {
			return nil, ErrInvalidRequest.Withf(`"jsonrpc" must be "2.0"`)
		}
	}
	if env.ID != nil && !validID(env.ID) {
		return nil, ErrInvalidRequest.Withf(`"id" must be a string, a number or null`)
	}
	method, ok := methodName(env.Method)
	if !ok || method == "" {
		return nil, ErrInvalidRequest.Withf(`"method" must be a non-empty string`)
	}
	params := json.RawMessage(env.Params)
	if params == nil {
		params = json.RawMessage("{}")
	}
	return &Request{JSONRPC: Version, ID: bytes.Clone(env.ID), Method: method, Params: params, decoded: decoded}, nil
}

// methods are the methods a request names, so that reading one makes no
// string.
var methods = map[string]string{}

func init() {
	for _, m := range []string{MethodRegister, MethodDeregister, MethodListAgents, MethodSend, MethodGetTask, MethodListTasks,
		MethodUpdateTask, MethodCancelTask, MethodReplay, MethodSessionOpen, MethodSessionClose, MethodAdminInfo,
		MethodAdminAgents, MethodAdminTasks, MethodAdminSessions, MethodGatewayClientIssue, MethodGatewayClientRevoke} {
		methods[`"`+m+`"`] = m
	}
}

// methodName reads a request's method, a string.
func methodName(v jsontext.Value) (string, bool) {
	if m, ok := methods[string(v)]; ok {
		return m, true
	}
	return jsonString(v)
}

// validID reports whether a valid JSON value is a string, a number or
// null.
func validID(id []byte) bool {
	if len(id) == 0 {
		return false
	}
	switch id[0] {
	case '"', 'n', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return true
	}
	return false
}

// MaxDepth bounds how deeply a request nests arrays and objects
// (PROTOCOL §11). What the broker stores and sends of a request nests a
// few levels deeper than the request did (a message inside a task inside
// a result): far below the 10,000 levels past which no JSON decoder here
// reads, so whatever the broker accepts it can read back and deliver.
const MaxDepth = 128

// PeekID returns the id of a request without checking the rest of it: the
// raw value of its top-level "id" member, nil when it has none or the
// message is not a JSON object. It is a fast path for answering requests
// that will not be served (a flood's overflow); it agrees with
// ParseRequest's id whenever ParseRequest accepts the message.
func PeekID(raw []byte) json.RawMessage {
	d := newDecoder(raw)
	defer d.release()
	var id []byte
	for f := d.first(requestFields); f != endObject; f = d.next(requestFields, f) {
		if f == 1 { // id
			id = d.value()
		} else {
			d.skipLoose()
		}
	}
	if !d.end() || !validID(id) {
		return nil
	}
	return bytes.Clone(id)
}

// ParamsObject reports whether raw params are a JSON object (after
// ParseRequest, absent params are already "{}").
func ParamsObject(params json.RawMessage) bool {
	p := bytes.TrimLeft(params, " \t\r\n")
	return len(p) > 0 && p[0] == '{'
}

// EncodeRequest encodes a request with a numeric id. Params given as raw
// JSON are sent as they are.
func EncodeRequest(id uint64, method string, params any) ([]byte, error) {
	e := encoders.Get().(*encoder)
	defer e.release()
	if err := e.request(id, method, params); err != nil {
		return nil, err
	}
	return bytes.Clone(e.b), nil
}

// AppendRequest appends what EncodeRequest returns to dst: a caller that
// sends the request and is done with it may encode it into a buffer it
// uses again.
func AppendRequest(dst []byte, id uint64, method string, params any) ([]byte, error) {
	e := encoder{b: dst}
	if err := e.request(id, method, params); err != nil {
		return dst, err
	}
	return e.b, nil
}

func (e *encoder) request(id uint64, method string, params any) error {
	e.name(`{"jsonrpc":"2.0","id":`)
	e.b = strconv.AppendUint(e.b, id, 10)
	e.name(`,"method":`)
	e.str(method)
	e.name(`,"params":`)
	switch p := params.(type) {
	case nil:
		e.name("{}")
	case json.RawMessage:
		e.b = append(e.b, p...)
	case []byte:
		e.b = append(e.b, p...)
	default:
		if err := e.any(params); err != nil {
			return fmt.Errorf("wire: encode params: %w", err)
		}
	}
	e.b = append(e.b, '}')
	return nil
}

// EncodeResult encodes a successful response. id is the request's raw id
// (nil: null); a raw result is sent as it is.
func EncodeResult(id json.RawMessage, result any) ([]byte, error) {
	if id == nil {
		id = null
	}
	e := encoders.Get().(*encoder)
	defer e.release()
	e.name(`{"jsonrpc":"2.0","id":`)
	e.b = append(e.b, id...)
	e.name(`,"result":`)
	if r, ok := result.(json.RawMessage); ok {
		e.b = append(e.b, r...)
	} else if err := e.any(result); err != nil {
		return nil, err
	}
	e.b = append(e.b, '}')
	return bytes.Clone(e.b), nil
}

// ErrNotResponse is returned by DecodeResponse for a message that is not a
// JSON-RPC response.
var ErrNotResponse = errors.New("wire: not a JSON-RPC response")

// DecodeResponse decodes a response. It returns the raw id, and either the
// raw result or the error object the broker answered with. A message that
// is not a response is ErrNotResponse. The id and the result are slices of
// raw, capped: an append to either cannot write into raw.
func DecodeResponse(raw []byte) (id json.RawMessage, result json.RawMessage, rpcErr *Error, err error) {
	env, err := decodeEnvelope(raw)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %v", ErrNotResponse, err)
	}
	if env.Method != nil {
		return nil, nil, nil, fmt.Errorf("%w: it has a method", ErrNotResponse)
	}
	id = json.RawMessage(env.ID)
	if env.Error != nil && !bytes.Equal(env.Error, null) {
		var e Error
		if err := Unmarshal(env.Error, &e); err != nil {
			return id, nil, nil, fmt.Errorf("%w: bad error object: %v", ErrNotResponse, err)
		}
		return id, nil, &e, nil
	}
	if env.Result == nil {
		return id, nil, nil, fmt.Errorf("%w: neither result nor error", ErrNotResponse)
	}
	return id, json.RawMessage(env.Result), nil, nil
}

// ResponseError returns the error of a response, nil for a result (or for
// something that is not a response at all). It reads the members up to
// the first "result" or "error" only, so that telling a result of any
// size from an error costs the same.
func ResponseError(resp []byte) *Error {
	d := newDecoder(resp)
	defer d.release()
	for f := d.first(responseFields); f != endObject; f = d.next(responseFields, f) {
		switch f {
		case 2: // result
			return nil
		case 3: // error
			v := d.value()
			if v == nil || bytes.Equal(v, null) {
				continue // no error: the result says
			}
			var e Error
			if Unmarshal(v, &e) != nil {
				return nil
			}
			return &e
		default:
			d.skip()
		}
	}
	return nil
}

// responseFields are the members of a response, in the order
// EncodeResult and ErrorResponse write them.
var responseFields = newFields("jsonrpc", "id", "result", "error")

// NotificationHead is what a bus needs to route a notification without
// decoding it whole.
type NotificationHead struct {
	Method string
	// RecipientContextID is the recipient's session; "" when a producer
	// omitted it.
	RecipientContextID string
	// ContextID is the session the event comes from: the delivery fallback
	// when RecipientContextID is absent (addressing rule 5, docs/PROTOCOL.md).
	ContextID string
	// Seq is the notification's number in its recipient session.
	Seq uint64
	// Epoch names the broker run that numbered it.
	Epoch string
}

// DecodeNotificationHead reads the routing fields of a notification.
func DecodeNotificationHead(raw []byte) (NotificationHead, error) {
	var n struct {
		Method string `json:"method"`
		Params struct {
			RecipientContextID string `json:"recipientContextId"`
			ContextID          string `json:"contextId"`
			Seq                uint64 `json:"seq"`
			Epoch              string `json:"epoch"`
		} `json:"params"`
	}
	if err := Unmarshal(raw, &n); err != nil {
		return NotificationHead{}, err
	}
	return NotificationHead{
		Method:             n.Method,
		RecipientContextID: n.Params.RecipientContextID,
		ContextID:          n.Params.ContextID,
		Seq:                n.Params.Seq,
		Epoch:              n.Params.Epoch,
	}, nil
}

// DecodeParams decodes request params into v, turning decoding failures
// into ErrInvalidParams with a message that names the field.
func DecodeParams(params json.RawMessage, v any) *Error {
	if !ParamsObject(params) {
		return ErrInvalidParams.Withf("params must be an object")
	}
	if err := Unmarshal(params, v); err != nil {
		return ErrInvalidParams.Withf("%s", decodeProblem(err))
	}
	return nil
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "string"
	case "bool":
		return "boolean"
	case "slice", "array":
		return "array"
	case "map", "struct", "ptr":
		return "object"
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64", "float32", "float64":
		return "number"
	}
	return goKind
}

// FieldError is a validation failure of one field of a decoded object.
type FieldError struct {
	Field   string
	Problem string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Problem }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Problem: fmt.Sprintf(format, args...)}
}

// DecodeResult decodes a response as a caller wants it: the raw result, or the
// *Error the broker answered with as the error.
func DecodeResult(raw []byte) (json.RawMessage, error) {
	_, result, rpcErr, err := DecodeResponse(raw)
	if err != nil {
		return nil, err
	}
	if rpcErr != nil {
		return nil, rpcErr
	}
	return result, nil
}
