// Package transport is the contract between the broker and the buses that
// carry its traffic.
//
// A bus has two sides. The broker side (Bus) delivers requests to a
// Handler and publishes notifications to a session. The session side
// (Client, Session, Subscription) sends a session's requests and receives
// its notifications. A bus knows nothing of tasks or names: it carries
// JSON-RPC messages, routed by session id.
//
// Every implementation must pass the conformance suite in
// transport/bustest, which checks each sentence written here.
package transport
