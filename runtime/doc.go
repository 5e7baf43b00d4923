// Package runtime is what a host runs once per chat session (the ADR's
// per-session runtime): it gives the session's delegates their A2A handle
// and keeps everything about them straight, whichever bus is below.
//
// A Runtime belongs to the session's parent, which spawns delegates with
// it but has no A2A handle of its own: nothing on a Runtime sends a
// message. Each Delegate is one delegate's handle: Peers, Send, Push,
// Reply, Task, Tasks, Update, Cancel, Wait and Settle. A delegate cannot
// spawn a delegate: a Delegate has no Spawn, so there is no nested
// delegation to refuse.
//
// # Names
//
// Spawn registers the delegate's card. The broker makes names unique on
// the host, so a delegate that asked to be discussant may be discussant-2:
// ID returns the assigned id and Prompt a sentence that tells the
// delegate so. Each delegate also gets a stable instance id, under which it
// registers again after a broker restart and keeps access to its tasks.
//
// # What a delegate sees
//
// Wait returns, one at a time and in the order the broker numbered them:
//
//   - task events (created, message, status) of tasks the delegate is a
//     member of, and pushes addressed to it; never an event of another
//     session or of another delegate, even on a bus that broadcasts;
//   - a Resync, after a break the runtime could not bridge by replay: the
//     broker restarted (the delegate was registered again, and RenamedFrom
//     says if its id changed), events were lost beyond the replay window,
//     or the delegate's wait queue overflowed. Resync.Changed holds the
//     delegate's tasks that changed meanwhile, read fresh from the broker;
//     pushes sent during the break may be lost. Resync.Lost names the
//     tasks the delegate knew open that the broker no longer has (it
//     restarted without a durable store, or pruned the task after it
//     ended unheard): no event will come for them, so a delegate waiting
//     on one is woken by the Resync instead of waiting until its own
//     timeout, and can send the work again.
//
// A break the runtime can bridge is invisible: a seq gap, a slow
// subscriber's drops and a lost subscription are replayed at once, and a
// last event lost with no signal is found by the feed's check (every
// 24-36 s while a delegate waits, FeedConfig.CheckInterval), so
// a waiting delegate wakes with what it waits for. After Settle every
// call, and a Wait in progress, returns ErrSettled.
//
// # Lost tasks
//
// A task is known open to a delegate when the last it heard of it (its own
// call's result, a task event, a Task or Tasks read, or an earlier Resync)
// was a non-terminal state; once it hears the task ended it no longer is,
// and what is heard out of order (an older updatedAt) changes nothing.
// Each Resync reads every page of the delegate's tasks, in both roles; a
// known open task missing from them is read on its own, and only
// A2A_UNKNOWN_TASK (wire.ErrUnknownTask) makes it lost: a task that is
// read is not lost (it is in Changed if it changed), and one whose read
// fails otherwise stays known open for the next Resync. A lost id is
// reported once, then forgotten. A task last seen terminal that is gone is
// not reported: its outcome was told. After a broker restart the Resync
// comes once the runtime's subscription, ended with the old broker's
// connection, is made again (within a couple of seconds of the new
// broker being reachable), or at the latest at the feed's next check
// (FeedConfig.CheckInterval, about 30 s) while a delegate waits: the
// check is for a restart no connection showed (a broker behind a NATS
// server that stayed up).
//
// Feed, which turns a session's subscription into its notifications in
// seq order without gaps, is usable on its own.
package runtime
