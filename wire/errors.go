package wire

import (
	"encoding/json"
	"errors"
	"fmt"
)

// The stable string codes carried in error.data.code. They are the contract;
// the numeric codes are their JSON-RPC companions.
const (
	CodeUnknownTask          = "A2A_UNKNOWN_TASK"
	CodeUnknownAgent         = "A2A_UNKNOWN_AGENT"
	CodeNoPeers              = "A2A_NO_PEERS"
	CodeAmbiguousPeer        = "A2A_AMBIGUOUS_PEER"
	CodeCrossContextDenied   = "A2A_CROSS_CONTEXT_DENIED"
	CodeTaskLimit            = "A2A_TASK_LIMIT"
	CodeUnauthorized         = "A2A_UNAUTHORIZED"
	CodeInvalidTransition    = "A2A_INVALID_TRANSITION"
	CodeReplayGap            = "A2A_REPLAY_GAP"
	CodeAgentLimit           = "A2A_AGENT_LIMIT"
	CodeBusy                 = "A2A_BUSY"
	CodeParseError           = "PARSE_ERROR"
	CodeInvalidRequest       = "INVALID_REQUEST"
	CodeMethodNotFound       = "METHOD_NOT_FOUND"
	CodeInvalidParams        = "INVALID_PARAMS"
	CodeInternalError        = "INTERNAL_ERROR"
	numericParseError        = -32700
	numericInvalidRequest    = -32600
	numericMethodNotFound    = -32601
	numericInvalidParams     = -32602
	numericInternalError     = -32603
	numericUnknownTask       = -32001
	numericUnknownAgent      = -32040
	numericNoPeers           = -32041
	numericAmbiguousPeer     = -32042
	numericCrossContext      = -32043
	numericTaskLimit         = -32044
	numericUnauthorized      = -32045
	numericInvalidTransition = -32046
	numericReplayGap         = -32047
	numericAgentLimit        = -32048
	numericBusy              = -32049
)

// The error table of the protocol, in one place. Each sentinel names one
// row; match a received error with errors.Is(err, wire.ErrUnknownTask).
// Build a response error with the sentinel's Withf.
var (
	// ErrParse: the message is not JSON (or not UTF-8). Answered with id null.
	ErrParse = sentinel(numericParseError, CodeParseError, "parse error")
	// ErrInvalidRequest: not a JSON-RPC 2.0 request object, a batch, or a
	// message over the size limit. Answered with id null.
	ErrInvalidRequest = sentinel(numericInvalidRequest, CodeInvalidRequest, "invalid request")
	// ErrMethodNotFound: no such method on this bus or subject.
	ErrMethodNotFound = sentinel(numericMethodNotFound, CodeMethodNotFound, "method not found")
	// ErrInvalidParams: params of the wrong shape, or a value the method
	// refuses (a wrong `to`, sending to oneself).
	ErrInvalidParams = sentinel(numericInvalidParams, CodeInvalidParams, "invalid params")
	// ErrInternal: the broker failed (a store error); the request may be retried.
	ErrInternal = sentinel(numericInternalError, CodeInternalError, "internal error")
	// ErrUnknownTask: no such task.
	ErrUnknownTask = sentinel(numericUnknownTask, CodeUnknownTask, "unknown task")
	// ErrUnknownAgent: no live agent of that name, or the caller is not a
	// member of the task.
	ErrUnknownAgent = sentinel(numericUnknownAgent, CodeUnknownAgent, "unknown agent")
	// ErrNoPeers: `to` omitted and no other live agent.
	ErrNoPeers = sentinel(numericNoPeers, CodeNoPeers, "no peers")
	// ErrAmbiguousPeer: `to` omitted and more than one candidate; the
	// candidates are in Data.Candidates.
	ErrAmbiguousPeer = sentinel(numericAmbiguousPeer, CodeAmbiguousPeer, "ambiguous peer")
	// ErrCrossContextDenied is reserved for wire compatibility (addressing
	// rule 3). The broker never produces it.
	ErrCrossContextDenied = sentinel(numericCrossContext, CodeCrossContextDenied, "cross-context access denied")
	// ErrTaskLimit: the session's open-task cap is reached.
	ErrTaskLimit = sentinel(numericTaskLimit, CodeTaskLimit, "task limit reached")
	// ErrUnauthorized: missing, unknown or revoked token, or a request for
	// another session than the caller's.
	ErrUnauthorized = sentinel(numericUnauthorized, CodeUnauthorized, "unauthorized")
	// ErrInvalidTransition: a change to a terminal task, or by the wrong member.
	ErrInvalidTransition = sentinel(numericInvalidTransition, CodeInvalidTransition, "invalid transition")
	// ErrReplayGap: the events asked for are no longer kept; Data.Epoch and
	// Data.OldestSeq say what is.
	ErrReplayGap = sentinel(numericReplayGap, CodeReplayGap, "replay gap")
	// ErrAgentLimit: a live-agent cap is reached, the session's or the
	// host's; the message names it.
	ErrAgentLimit = sentinel(numericAgentLimit, CodeAgentLimit, "agent limit reached")
	// ErrBusy: the calling session has too many requests waiting for the
	// broker; the request was not served. Retry after a pause.
	ErrBusy = sentinel(numericBusy, CodeBusy, "busy")
)

// codes lists every row of the error table, in the protocol's order.
var codes = []*Error{
	ErrUnknownTask, ErrUnknownAgent, ErrNoPeers, ErrAmbiguousPeer,
	ErrCrossContextDenied, ErrTaskLimit, ErrUnauthorized,
	ErrInvalidTransition, ErrReplayGap, ErrAgentLimit, ErrBusy,
	ErrParse, ErrInvalidRequest, ErrMethodNotFound, ErrInvalidParams, ErrInternal,
}

// Error is a JSON-RPC error object. It is also a Go error: errors.Is
// matches two Errors with the same numeric code and data.code, so a caller
// tests a response with errors.Is(err, wire.ErrTaskLimit).
type Error struct {
	Code    int        `json:"code"`
	Message string     `json:"message"`
	Data    *ErrorData `json:"data,omitempty"`
}

// ErrorData is error.data. Code is always set by this broker; the other
// fields belong to particular codes.
type ErrorData struct {
	Code string `json:"code"`
	// Candidates lists the agentIds that made a peer ambiguous.
	Candidates []string `json:"candidates,omitempty"`
	// Epoch is the broker's current epoch (A2A_REPLAY_GAP).
	Epoch string `json:"epoch,omitempty"`
	// OldestSeq is the oldest seq still kept (A2A_REPLAY_GAP).
	OldestSeq uint64 `json:"oldestSeq,omitempty"`
}

func sentinel(code int, dataCode, msg string) *Error {
	return &Error{Code: code, Message: msg, Data: &ErrorData{Code: dataCode}}
}

// Error implements error.
func (e *Error) Error() string {
	if e.Data != nil && e.Data.Code != "" {
		return fmt.Sprintf("%s (%d): %s", e.Data.Code, e.Code, e.Message)
	}
	return fmt.Sprintf("jsonrpc error %d: %s", e.Code, e.Message)
}

// Is reports whether target is an *Error with the same code and data.code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok || t.Code != e.Code {
		return false
	}
	return t.DataCode() == e.DataCode()
}

// DataCode returns error.data.code, or "" when there is none.
func (e *Error) DataCode() string {
	if e == nil || e.Data == nil {
		return ""
	}
	return e.Data.Code
}

// Withf returns a copy of the sentinel e with a specific message.
func (e *Error) Withf(format string, args ...any) *Error {
	c := *e
	c.Message = fmt.Sprintf(format, args...)
	if e.Data != nil {
		d := *e.Data
		c.Data = &d
	}
	return &c
}

// AsError returns err as an *Error: err itself when it is one (or wraps
// one), else ErrInternal with err's text.
func AsError(err error) *Error {
	var we *Error
	if errors.As(err, &we) {
		return we
	}
	return ErrInternal.Withf("%v", err)
}

// ErrorResponse encodes a response carrying e. id is the raw request id;
// nil means null.
func ErrorResponse(id json.RawMessage, e *Error) []byte {
	b, err := json.Marshal(Response{JSONRPC: Version, ID: id, Error: e})
	if err != nil {
		// Only a malformed id could fail; answer with id null.
		b, _ = json.Marshal(Response{JSONRPC: Version, Error: e})
	}
	return b
}
