// Package broker is the host-wide A2A broker of ADR 0162: the registry of
// live agents with host-unique names, capability tokens, the routing of
// a2a.message.send, the durable task lifecycle with membership by instance
// id, and the per-session numbered notifications with replay.
//
// The broker is a transport.Handler written against the transport.Bus
// contract; it knows nothing of NATS or pipes. Its tasks live in a
// store.Store.
//
//	bus := fakebus.New(fakebus.Config{})
//	b, err := broker.New(context.Background(), bus, broker.Config{})
//	...
//	defer b.Close()
//	defer bus.Close()
//
// # Lock order
//
// A goroutine takes the broker's locks in this order, outermost first:
// holding a lock of one rank, it takes only locks of later ranks, but
// for a second agent (rank 2), which it takes in the agents' order.
// Several locks share the last rank, and none of them is taken under
// another.
//
//  1. An instance's lock (Broker.instances, lockInstance): a
//     registration, a departure, the release of a held registration;
//     in a cluster, also the copy of the instance's registration
//     brought in line (reconcile), a take-over and the release of a
//     lapsed broker's agent, each of which reads the registration under
//     it and writes only at the revision read.
//     Or a send's key lock (Broker.sendLocks, lockSend): a keyed send,
//     from before it looks its key up until it has made its task or
//     pushed. One at a time, and never both, but for a keyed send's
//     catch-up (see below).
//  2. Agents (agent.mu): an operation holds the agents it acts as or on
//     (enter, shared) for its whole length; two at most, in ascending
//     agent.order (enterPair). revoke takes an agent exclusively for a
//     moment, waiting for its holds, with an instance's lock held and
//     no agent.
//  3. A task's stripe (Broker.stripes, lockTask): one at a time. It is
//     held from before a change of the task is made until that change's
//     notification is numbered: through the store's change, its fsync
//     included. So a task's next change is computed from the last one
//     acknowledged, a task's events are numbered in the order of its
//     changes, and the store's optimistic check (store.Tasks.Update)
//     never fails between two of the broker's changes (only a prune can
//     make it try again). Changes to one task take one sync each;
//     changes to different tasks share syncs.
//  4. The store's own locks, inside its calls. An update's fn runs on
//     the caller's goroutine with none of them held, and takes no lock.
//  5. Leaves, under which nothing is taken, no store is called, and the
//     bus is not called: the registry (registry.mu), the event log's
//     map (eventLog.mu), a session's log (sessionLog.mu), the
//     instances the cluster's watch left to bring in line
//     (mirrorState.mu), the task ids
//     (taskIDs.mu), the push windows (pushWindow.mu, then, let go first,
//     pushKeys.mu), and the loggers'.
//
// In a cluster, a catch-up with the cluster's registrations (catchUp)
// brings instances in line: it takes their locks, one at a time, and may
// revoke agents. It is called holding no agent and no instance's lock:
// before a request holds its caller or any other agent (a token not
// known yet, a list, a send's addressee, a session's close). A keyed
// send looks its addressee up under its key's lock, so a catch-up may
// take instance locks under a send's key lock; no path takes a send's
// key lock under an instance's lock.
//
// The bus is called without any of these held but those of ranks 1 and
// 2: a notification is numbered and kept under its session's log (post)
// and published after (publish), once the one numbered before it in its
// session has been, so that a session's notifications reach the bus in
// seq order by sequence, not by a lock held across the bus's I/O. A task's
// event is posted under the task's stripe and published once the stripe
// is let go. Between a post and its publish a goroutine only lets go of
// locks: the session's later notifications wait for the publish, and
// whatever they hold waits with them. A request returns only after its
// own notification is published, so that a departure, which waits for
// the agent's holds, comes after the push of an operation it waited for.
package broker
