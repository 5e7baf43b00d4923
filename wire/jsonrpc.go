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
	// decoded is Params decoded, when the fast path read the request.
	decoded any
}

// DecodeParams decodes the request's params into v, as DecodeParams
// does. Params the fast path read come already decoded.
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

// envelope decodes the members of any message without committing to their
// types, so each can be checked in the protocol's order.
type envelope struct {
	JSONRPC json.RawMessage `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  json.RawMessage `json:"method"`
	Params  json.RawMessage `json:"params"`
	Result  json.RawMessage `json:"result"`
	Error   json.RawMessage `json:"error"`
}

var null = []byte("null")

// decodeEnvelope decodes the members of a message by their exact names:
// encoding/json would match "ID" or "Method" to the fields too, but those
// are unknown members, to be ignored. The scan of the top level is the fast
// path; a message with an escaped member name takes a map decode, and one
// that is not valid JSON takes encoding/json for its error message.
func decodeEnvelope(raw []byte) (envelope, error) {
	if validJSON(raw) {
		if env, ok := scanEnvelope(raw); ok {
			return env, nil
		}
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return envelope{}, err
	}
	return envelope{JSONRPC: m["jsonrpc"], ID: m["id"], Method: m["method"], Params: m["params"], Result: m["result"], Error: m["error"]}, nil
}

// validJSON is json.Valid, at twice its speed: jsontext's validator, told
// to accept what json.Valid accepts (duplicate names, invalid UTF-8, which
// are checked elsewhere).
func validJSON(raw []byte) bool {
	return jsontext.Value(raw).IsValid(jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
}

// scanEnvelope reads the top-level members of raw, which must be a valid
// JSON object, without decoding or copying their values: each member is a
// slice of raw. A duplicate member takes the last value, as encoding/json
// does. ok is false for a member name with an escape, which only a decode
// can compare.
func scanEnvelope(raw []byte) (env envelope, ok bool) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return envelope{}, false
	}
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == '}' {
		return env, true
	}
	for i < len(raw) && raw[i] == '"' {
		end := i + 1
		for end < len(raw) && raw[end] != '"' {
			if raw[end] == '\\' {
				return envelope{}, false
			}
			end++
		}
		name := raw[i+1 : min(end, len(raw))]
		i = skipSpace(raw, end+1)
		if i >= len(raw) || raw[i] != ':' {
			return envelope{}, false
		}
		i = skipSpace(raw, i+1)
		start := i
		i = skipValue(raw, i)
		if i <= start {
			return envelope{}, false
		}
		v := json.RawMessage(raw[start:i:i])
		switch string(name) {
		case "jsonrpc":
			env.JSONRPC = v
		case "id":
			env.ID = v
		case "method":
			env.Method = v
		case "params":
			env.Params = v
		case "result":
			env.Result = v
		case "error":
			env.Error = v
		}
		i = skipSpace(raw, i)
		if i < len(raw) && raw[i] == ',' {
			i = skipSpace(raw, i+1)
			continue
		}
		return env, i < len(raw) && raw[i] == '}'
	}
	return envelope{}, false
}

// jsonString reads a JSON string value; escapes take a decode.
func jsonString(v json.RawMessage) (string, bool) {
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' && bytes.IndexByte(v, '\\') < 0 {
		return string(v[1 : len(v)-1]), true
	}
	var s string
	if v == nil || json.Unmarshal(v, &s) != nil {
		return "", false
	}
	return s, true
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
	if req, ok := fastRequest(raw); ok {
		return req, nil
	}
	return parseRequest(raw)
}

// parseRequest is ParseRequest's full path, for a request within the size
// limit.
func parseRequest(raw []byte) (*Request, *Error) {
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
		if !json.Valid(trimmed) {
			return nil, ErrParse.Withf("message is not valid JSON")
		}
		return nil, ErrInvalidRequest.Withf("batches are not supported")
	default:
		if !json.Valid(trimmed) {
			return nil, ErrParse.Withf("message is not valid JSON")
		}
		return nil, ErrInvalidRequest.Withf("a request must be a JSON object")
	}
	env, err := decodeEnvelope(trimmed)
	if err != nil {
		return nil, ErrParse.Withf("message is not valid JSON: %s", jsonProblem(err))
	}
	if nestedDeeper(trimmed, MaxDepth) {
		return nil, ErrInvalidRequest.Withf("message nests arrays and objects deeper than %d levels", MaxDepth)
	}
	if version, ok := jsonString(env.JSONRPC); !ok || version != Version {
		return nil, ErrInvalidRequest.Withf(`"jsonrpc" must be "2.0"`)
	}
	if env.ID != nil {
		switch env.ID[0] {
		case '"', 'n', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		default:
			return nil, ErrInvalidRequest.Withf(`"id" must be a string, a number or null`)
		}
	}
	method, ok := jsonString(env.Method)
	if !ok || method == "" {
		return nil, ErrInvalidRequest.Withf(`"method" must be a non-empty string`)
	}
	params := env.Params
	if params == nil {
		params = json.RawMessage("{}")
	}
	return &Request{JSONRPC: Version, ID: bytes.Clone(env.ID), Method: method, Params: params}, nil
}

// MaxDepth bounds how deeply a request nests arrays and objects
// (PROTOCOL §11). What the broker stores and sends of a request nests a
// few levels deeper than the request did (a message inside a task inside
// a result): far below the 10,000 levels past which no JSON decoder here
// reads, so whatever the broker accepts it can read back and deliver.
const MaxDepth = 128

// nestedDeeper reports whether valid JSON raw nests arrays and objects
// deeper than limit.
func nestedDeeper(raw []byte, limit int) bool {
	depth := 0
	for i := 0; i < len(raw); i++ {
		switch raw[i] {
		case '"':
			for i++; i < len(raw) && raw[i] != '"'; i++ {
				if raw[i] == '\\' {
					i++
				}
			}
		case '{', '[':
			if depth++; depth > limit {
				return true
			}
		case '}', ']':
			depth--
		}
	}
	return false
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
	e.name(`{"jsonrpc":"2.0","id":`)
	e.b = strconv.AppendUint(e.b, id, 10)
	e.field(`,"method":`, method)
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
			return nil, fmt.Errorf("wire: encode params: %w", err)
		}
	}
	e.b = append(e.b, '}')
	return bytes.Clone(e.b), nil
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
// is not a response is ErrNotResponse.
func DecodeResponse(raw []byte) (id json.RawMessage, result json.RawMessage, rpcErr *Error, err error) {
	if id, result, ok := fastResult(raw); ok {
		return id, result, nil, nil
	}
	return decodeResponse(raw)
}

// fastResult splits a successful response written as EncodeResult writes
// it, {"jsonrpc":"2.0","id":<id>,"result":<result>} without a space: a
// caller's every answer but its errors. Checking the id and the result as
// valid JSON then checks the whole, and nothing is walked twice. ok is
// false for anything else, which DecodeResponse reads the full way.
func fastResult(raw []byte) (id, result json.RawMessage, ok bool) {
	const head, mid = `{"jsonrpc":"2.0","id":`, `,"result":`
	if !bytes.HasPrefix(raw, []byte(head)) || raw[len(raw)-1] != '}' {
		return nil, nil, false
	}
	end := skipValue(raw, len(head))
	if end <= len(head) || !bytes.HasPrefix(raw[end:], []byte(mid)) {
		return nil, nil, false
	}
	// Capped, as the full path's are: an append to either cannot write
	// into raw.
	id, result = raw[len(head):end:end], raw[end+len(mid):len(raw)-1:len(raw)-1]
	if len(result) == 0 || isSpace(result[0]) || isSpace(result[len(result)-1]) || !validJSON(id) || !validJSON(result) {
		return nil, nil, false
	}
	return id, result, true
}

// decodeResponse is DecodeResponse's full path.
func decodeResponse(raw []byte) (id json.RawMessage, result json.RawMessage, rpcErr *Error, err error) {
	env, err := decodeEnvelope(raw)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %v", ErrNotResponse, err)
	}
	if env.Method != nil {
		return nil, nil, nil, fmt.Errorf("%w: it has a method", ErrNotResponse)
	}
	if env.Error != nil && !bytes.Equal(env.Error, null) {
		var e Error
		if err := Unmarshal(env.Error, &e); err != nil {
			return env.ID, nil, nil, fmt.Errorf("%w: bad error object: %v", ErrNotResponse, err)
		}
		return env.ID, nil, &e, nil
	}
	if env.Result == nil {
		return env.ID, nil, nil, fmt.Errorf("%w: neither result nor error", ErrNotResponse)
	}
	return env.ID, env.Result, nil, nil
}

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
	if err := json.Unmarshal(raw, &n); err != nil {
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

// jsonProblem rewrites encoding/json's errors in the protocol's terms, so
// that no Go type name reaches a client.
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field != "" {
			return fmt.Sprintf("%s: want %s, got %s", te.Field, jsonKind(te.Type.Kind().String()), te.Value)
		}
		return fmt.Sprintf("want %s, got %s", jsonKind(te.Type.Kind().String()), te.Value)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("%v (at byte %d)", se, se.Offset)
	}
	var fe *FieldError
	if errors.As(err, &fe) {
		return fe.Error()
	}
	return err.Error()
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
