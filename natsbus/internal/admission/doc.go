// Package admission decides what the broker and its embedded server take
// on, and how much waits: the fair queue that runs the sessions'
// requests (Queue), and the watchdog that bounds the bytes waiting to be
// written to session connections (Watchdog).
//
// It knows nothing of NATS: package natsbus feeds it requests and the
// server's session connections, and carries out its decisions.
package admission
