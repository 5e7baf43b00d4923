// Package pipebus carries the broker's JSON-RPC over one pair of byte
// streams, one JSON object per line: the plain alternative to NATS for a
// host that runs the broker as a child process (a2a-bus serve --bus=pipe).
//
// Bus is the broker end: it reads requests from an io.Reader and writes
// responses and notifications to an io.Writer. Client is the host end: it
// writes requests, matches responses to calls, and hands each notification
// only to the session named by its recipientContextId (contextId when a
// producer omitted it), since every session shares the one pipe.
//
// The pipe's owner is the host: every call arrives with
// transport.ScopeOwner.
package pipebus
