// Package natsbus carries the broker's traffic over NATS, the default bus:
// an embedded NATS server bound to loopback with authentication required,
// or an existing NATS server or cluster.
//
// A session sends its requests on a2a.rpc.<T> and receives its
// notifications on a2a.session.<T>.events, <T> being its subject token
// (SubjectToken); the host sends host-only requests on a2a.host.rpc. The
// broker takes the calling session from the request subject, and the
// embedded server enforces the per-session credentials that
// a2a.sessions.open issues, so a session cannot reach another's subjects.
//
// Bus is the broker side; Client is the session side, in-process (Bus.Connect)
// or over TCP (Dial).
package natsbus
