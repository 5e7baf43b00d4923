// Package liveview serves a live picture of a running broker to a web
// browser: its sessions and their agents, the open tasks with their
// members (who waits on whom), and a timeline of the task events across
// sessions, newest first. a2a-bus serve --ui runs it.
//
// It reads only what a host may read, through one connection with the
// host credential: the admin methods (a2a.admin.info, .sessions, .agents,
// .tasks, every page) for the snapshot, and the sessions' notifications
// (a2a.session.*.events) for the timeline, subscribed while at least one
// page follows the stream. A change reaches the view once per recipient
// that is told of it; the view keeps it once (see Entry).
//
// The page, its script and its style are embedded: one HTML file, no
// framework, nothing fetched from elsewhere. They are served without the
// token; the data endpoints require it as "Authorization: Bearer", and
// every request must name a loopback host unless Config.AllowRemote
// (docs/PROTOCOL.md, "The live view", is the contract):
//
//	GET /                 the page (/app.js, /style.css beside it)
//	GET /api/snapshot     one JSON Snapshot
//	GET /api/events       JSON lines: a "reset" with the timeline, then
//	                      "entry", "changed" and "ping" lines
//
// A viewer that falls more than Config.Buffer lines behind is cut (its
// page reconnects and starts again from the timeline), so that no page
// holds up the broker or another page; at most Config.MaxViewers streams
// are open at once, one more is answered 503.
package liveview
