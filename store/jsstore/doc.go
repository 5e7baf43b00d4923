// Package jsstore is the task store, registry and name claims of brokers
// that share their state on a NATS JetStream cluster: a store.Store and a
// store.Names that every broker opening it with the same prefix sees
// alike.
//
// # Buckets
//
// Two key-value buckets, each a stream made as nats.go makes a KV bucket
// (so `nats kv` reads them), history 1, on file storage, with
// Config.Replicas copies: <prefix>_tasks holds the tasks and their
// indexes, <prefix>_agents the registrations and names. Unlike a stock
// bucket, the streams allow atomic batch publish (several keys written
// all or none, each with its own compare-and-set) and per-message TTLs,
// and do not allow direct get. Keys (every token after the first is
// encoded: base64url without padding, "=" for the empty string, so that
// an id holding '.', '*' or '>' is still one token):
//
//	t.<id>                  the record (store.Record.Encode)
//	m.<instance>.r|a.<id>   member index: requester (r), assignee (a)
//	o.<instance>.r|a.<id>   the same, while the task is open
//	c.<session>             the open tasks the session requested (a count)
//	e.<updatedAt>.<id>      terminal index: Unix ns, 19 digits
//	s.<instance>.<sendKey>  send index: the task id
//	r.<instance>            a registration (JSON)
//	n.<agentId>             the instance holding the name
//
// # Changes
//
// Every change is one write: a compare-and-set on one key
// (Nats-Expected-Last-Subject-Sequence), or an atomic batch of several.
// Create writes the task (required absent), its member and open index
// entries, its session's count (required unchanged since it was read
// and found under the cap) and its send key (required absent) in one
// batch: two brokers creating for one session at once cannot both take
// the last slot, two keyed sends cannot both create, and no crash leaves
// half a task, so the count never needs repair. Update is a
// compare-and-set on the task's revision; when the task opens or ends
// it is a batch with the open index and the count. A failed
// compare-and-set (JetStream codes 10071, and 10164 while another write
// of the key is in flight) reads again and applies fn again. Prune
// deletes a task and its index entries in a batch that requires the
// task's revision it read: a task changed or pruned meanwhile by another
// broker is left alone. A removal is a purge marker carrying a
// Nats-TTL of two seconds, so that removed keys do not pile up; readers
// take a marker for an absent key. The markers an update leaves in the
// terminal index (an ended task reopened or changed again) are purged
// right after it, as Prune counts that index's keys.
//
// A store remembers what it last read or wrote of 1,024 tasks and
// session counts, with their revisions, and sends a change at once as a
// compare-and-set on that revision: the broker reads a task right before
// it changes it, so an update is one round trip. A stale guess fails its
// compare-and-set and is read again; an update whose fn refuses a
// guessed task is judged again on the task the leader holds; a create
// refused by a guessed count reads it before answering ErrLimit.
//
// Every write carries a Nats-Msg-Id; a request whose answer is lost, or
// that finds no stream leader (an election after a node died), is sent
// again with the same id until Config.Timeout, and the stream's
// duplicate window (60 s) makes the second send a no-op if the first was
// stored: a change is made once, and ErrUnavailable is the only answer
// that leaves its outcome unknown.
//
// # Reads
//
// Without direct get, every read (STREAM.MSG.GET, and the STREAM.INFO
// that lists keys) is answered by the stream leader, which holds only
// what a quorum has stored, and which, after an election, answers only
// once it has applied everything its predecessor acknowledged: a read
// sees every change acknowledged before it began, on any node. (A
// leader cut off from its peers may answer from its state until it
// notices, as NATS has no leader leases.) A batch is applied to the
// leader's store under a lock that reads take, so no read sees half of
// one.
//
// # Bounds
//
// Key lists come from STREAM.INFO with a subject filter, answered by the
// stream leader with the matching subjects (in pages of 100,000, which
// keys made or removed between two pages may shift). List reads the subjects
// of one index, chosen by the query: o.<instance> for a member's open
// tasks, m.<instance> for all of a member's, o.*.r for every open task,
// e.* for a terminal state, t.* for everything. It keeps only the 256
// lowest ids after Query.After while reading them, then reads those tasks
// (eight at a time) until the page is full, and reads the index again
// from the last id while the page is not full and ids remain. Its memory
// is bounded by the page, 256 ids and one answer of the server; its
// reads by the index's keys per 256 ids read, and the tasks read. Index
// keys of tasks removed in the last two seconds may be read, and their
// tasks found missing. OpenCount reads the session counts: one read per
// session with open tasks. Prune reads the terminal index's keys (not
// the tasks) and then the tasks it deletes. Registrations reads one key
// per registration.
//
// # Durability
//
// A change is acknowledged once the stream leader has stored it after a
// quorum of replicas (two of three) wrote it to their Raft logs. It is
// fsynced only if the servers run with jetstream { sync_interval: always
// }; otherwise the servers sync every two minutes, and a change
// acknowledged then lost by a quorum of servers at once (a power cut of
// the whole cluster) may be lost.
//
// # Limits
//
// A record is written whole: the cluster's max_payload must exceed the
// largest record (a task at the broker's task limit plus its idempotency
// keys). A key is at most 2 KiB (instances, ids and send keys of
// wire.MaxIDBytes fit). A call that keeps losing its compare-and-set
// gives up after 2,000 tries (ErrContended).
package jsstore
