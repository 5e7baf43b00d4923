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
//
// The package has three parts. The transport is Bus and Client (bus.go,
// client.go, replies.go, service.go, subject.go). The embedded server and
// the credentials it issues are Server (server.go, server_*.go), which
// the bus starts unless it is given a URL. On a server it does not embed,
// the bus issues session credentials through the server's auth callout
// when given the issuer's seed (callout.go, revocations.go), and brokers
// sharing a cluster share its requests in a queue group
// (Config.QueueGroup). Admission, which requests run and which wait, and
// which session connections are cut so that what waits for them stays
// bounded, is package natsbus/internal/admission, which knows nothing of
// NATS.
//
// Each Config's zero value is its defaults; Validate reports what New,
// StartServer and Dial refuse.
package natsbus
