// Package wire holds the a2a-bus wire contract shared by the broker, the
// session runtime, every bus and the command: JSON-RPC 2.0 envelopes, the
// A2A objects (AgentCard, Part, Message, Task), the method parameters and
// results, the notifications, and the table of error codes.
//
// Everything here is plain data with JSON encodings that match the
// protocol document (docs/PROTOCOL.md) byte for byte in field names.
// Decoding validates shapes: a Part, Message or AgentCard that decodes
// without error is valid.
package wire
