// Package admission decides what the broker takes on, and how much
// waits: the fair queue that runs the sessions' requests (Queue).
//
// It knows nothing of NATS: package natsbus feeds it requests, and
// carries out its decisions.
package admission
