package wire

// Codes and States let the tests walk the tables.
var (
	Codes  = codes
	States = states
)

// AppendTime is the encoder's time writer.
var AppendTime = appendTime

// CodecDecode and LibraryUnmarshal are Unmarshal's two ways: the codec,
// and the library it reads as.
var (
	CodecDecode      = codecDecode
	LibraryUnmarshal = libraryUnmarshal
)

// NewEventNote and NewEnvelope return the unexported types the codec
// reads: a notification as DecodeEvent reads it, and any message as
// ParseRequest and DecodeResponse read it.
func NewEventNote() any { return new(eventNote) }
func NewEnvelope() any  { return new(envelope) }
