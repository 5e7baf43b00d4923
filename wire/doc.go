// Package wire holds the a2a-bus wire contract shared by the broker, the
// session runtime, every bus and the command: JSON-RPC 2.0 envelopes, the
// A2A objects (AgentCard, Part, Message, Task), the method parameters and
// results, the notifications, and the table of error codes.
//
// Everything here is plain data with JSON encodings that match the
// protocol document (docs/PROTOCOL.md) byte for byte in field names.
// Decoding checks JSON types and nothing more: DecodeParams turns a type
// mismatch into ErrInvalidParams naming the field, and ignores members
// whose names match a field only when case is ignored. What a value must
// hold (a Part's kind and content, a Message's parts, an AgentCard's name,
// an id's length) is checked by the Validate methods, which the broker
// calls on everything it accepts.
package wire
