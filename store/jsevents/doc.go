// Package jsevents keeps each session's notifications in one JetStream
// stream, for brokers of a cluster that share it: it numbers them per
// recipient session with a dense seq that any broker may assign, keeps the
// last Window of them for replay (and, with Config.MaxBytes, no more than
// so many bytes of them per broker), and has the stream publish each one
// to the session's event subject once, and only once, it is stored.
//
// # Layout
//
// One stream (Config.Stream, default "A2A_EVENTS") captures
// <prefix>.*.* (Config.Prefix, default "a2a.log"). A session whose subject
// token is <T> (natsbus.SubjectToken) has two subjects in it:
//
//   - <prefix>.<T>.e: its notifications, one message each, the JSON-RPC
//     notification as the body and its seq in the A2a-Seq header (the body
//     carries the same seq). At most Window are kept (the stream's
//     MaxMsgsPerSubject), the oldest dropped first; Config.MaxBytes
//     bounds their bytes too (see Bytes below).
//   - <prefix>.<T>.m: a marker left by Forget, no body, A2a-Seq the
//     session's last seq, so that the seq outlives the notifications.
//
// The session's last seq is the A2a-Seq of its last message on
// <prefix>.<T>.* (either kind). The stream has no limit but the per-subject
// one (no MaxAge, MaxMsgs or MaxBytes): any other limit could drop a
// session's last message, and its seq would start again at 1, which a
// runtime still following it would take for old notifications.
//
// # Numbering
//
// Append reads the session's last message (seq s, stream sequence q) and
// publishes notification s+1 to <prefix>.<T>.e with
// Nats-Expected-Last-Subject-Sequence: q and
// Nats-Expected-Last-Subject-Sequence-Subject: <prefix>.<T>.*, a
// compare-and-set on the session's last message. When another broker got
// there first the stream refuses it (JetStream error 10071, or 10164 on a
// replicated stream while another write to the session is in flight), and
// Append reads again and retries with the next seq. So every notification
// of a session gets a distinct seq, seqs are dense (1, 2, 3, …), and the
// stream holds a session's notifications in seq order. Each Append carries
// one Nats-Msg-Id through its retries: an attempt whose answer was lost
// (a timeout, a leader change) and that was stored is not stored twice.
// Within one Log, appends to one session take turns (a lock per session);
// appends to different sessions do not wait for each other.
//
// # Delivery
//
// Nothing publishes to a session's event subject directly: the stream's
// RePublish (source <prefix>.*.e, destination
// a2a.session.{{wildcard(1)}}.events) has the stream leader publish each
// notification there after storing it, in stream order, so a publish the
// compare-and-set refuses never reaches a live subscriber, and a session's
// subscribers get its notifications in seq order. The republished message
// has the body as appended (byte for byte what a replay returns) and the
// headers A2a-Seq, Nats-Msg-Id and the expected-sequence headers of the
// publish, plus Nats-Stream, Nats-Subject, Nats-Sequence, Nats-Time-Stamp
// and Nats-Last-Sequence added by the server. Markers are not republished.
//
// Republishing is done by the stream leader as it applies each entry,
// from memory, at most once: when the leader dies or steps down, a
// notification stored but not yet republished by it is not republished by
// the new leader (which applied it as a follower), and one the new leader
// applies after taking over may be republished twice. A live subscriber
// may so miss a notification (it sees a gap in seq and replays it) or get
// one twice (the runtime drops a seq it has had).
//
// # Bytes
//
// JetStream bounds bytes per stream, not per subject, and a stream-wide
// MaxBytes would evict the oldest messages of the whole stream, a
// session's last one among them. So each Log bounds the bytes of a
// session itself (Config.MaxBytes, the bodies' lengths, as the broker
// counts them on one host): it remembers the stream sequences and sizes
// of the notifications it appended to the session, and when those it still
// counts pass MaxBytes it purges the session's <prefix>.<T>.e below the
// oldest of its own that fit, with a filtered purge ($JS.API.STREAM.PURGE,
// subject and sequence). The oldest go first, whoever appended them; the
// purge never reaches the Log's own newest, so never the session's last
// message, which is that one or a later one (nor the marker subject): the
// seq goes on. A replay that asks for purged ones gets ErrGap, with the
// oldest kept, as after an eviction by the window. The newest
// notification is kept even when it alone is over the bound, as on one
// host.
//
// The counts are made in runs of appends of at most MaxBytes/32 bytes
// (a notification larger than that is a run of its own), and a purge takes
// whole runs, the fewest that bring the count within MaxBytes: it drops
// less than one run more than it must, and a session of small
// notifications costs a purge per run, not per append. A purge that fails is counted
// (Stats.PurgeErrors) and tried again by the session's next Append from
// that Log; the Append itself has succeeded.
//
// Each Log bounds what it appended, and knows nothing of the others'
// appends but that its purges take their older notifications too: a
// session keeps at most MaxBytes per Log (per broker) that appends to it,
// plus, for each, a last notification that alone is over the bound. The
// counts live in the Log's memory, with its other state of the session,
// for the sessions it used last: 4096 while idle (64 in each of 64 shards
// of a keyed hash), the least recently used forgotten first, each with at
// most 66 runs of 16 bytes. A session forgotten (or a broker restarted)
// is counted again from zero; the notifications appended before are not
// counted but are purged, being older, as soon as the new count passes
// MaxBytes; until then the session may keep up to MaxBytes more of them
// each time it was forgotten (at most Window notifications in all). A
// Forget resets the count.
//
// # Reading
//
// The last message of a session and the first of its kept notifications
// are read from the stream leader ($JS.API.STREAM.MSG.GET), so a read
// after an acknowledged Append sees it. The notifications themselves are
// read with a batched direct get, which any replica may answer; a replica
// behind the leader answers with fewer, which is detected (the leader said
// which seq is the last) and completed from the leader.
//
// # Epoch
//
// The stream is created with a random epoch in its metadata (Log.Epoch):
// a session's seq counts within it, and a stream deleted and made again
// gets a new one, so runtimes know that numbering started over.
package jsevents
