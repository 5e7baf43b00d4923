// Package runtime is what a host runs once per chat session: it gives the
// session's delegates their A2A handle and keeps everything about them
// straight, whichever bus is below.
//
// Feed turns a session's subscription into the session's notifications
// in seq order without gaps, replaying what the bus lost.
package runtime
