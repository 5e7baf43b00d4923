package wire

// Codes and States let the tests walk the tables.
var (
	Codes  = codes
	States = states
)

// AppendTime is the encoder's time writer.
var AppendTime = appendTime

// FastEvent and FullEvent are DecodeEvent's two paths.
var (
	FastEvent = fastEvent
	FullEvent = decodeEvent
)

// FastRequest and FullRequest are ParseRequest's two paths.
var (
	FastRequest = fastRequest
	FullRequest = parseRequest
)

// FullResponse is DecodeResponse's full path.
var FullResponse = decodeResponse

// FastResult is DecodeResponse's fast path.
var FastResult = fastResult
