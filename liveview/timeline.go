package liveview

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/a2a-bus/a2a-bus/wire"
)

// Entry is one line of the timeline: a change of a task (kind created,
// message or status) or a push, as the notification that told of it
// said; or a gap, while no page followed the view and it took nothing.
//
// A change is told to the task's member that did not make it (PROTOCOL.md
// §5); should it reach the view more than once (told to more than one
// recipient, or delivered again), it is kept once: a task's changes are
// told apart by the task id, the kind, the state and updatedAt, which
// strictly increases with each change of a task (§3). A push is told
// apart by its recipient session's epoch and seq.
type Entry struct {
	// N numbers the entries in the order the view took them, from 1.
	N uint64 `json:"n"`
	// At is the task's updatedAt; for a push, when the view took it.
	At wire.Time `json:"at"`
	// Kind is created, message, status, push or gap.
	Kind   string     `json:"kind"`
	TaskID string     `json:"taskId,omitempty"`
	State  wire.State `json:"state,omitempty"`
	// Final is set when the task reached a terminal state.
	Final bool `json:"final,omitempty"`
	// From made the change (or sent the push); To was told of it.
	From Member `json:"from"`
	To   Member `json:"to"`
	// Requester and Assignee are the task's members (tasks only).
	Requester *Member `json:"requester,omitempty"`
	Assignee  *Member `json:"assignee,omitempty"`
	// Text is the message's text, cut at MaxText characters.
	Text string `json:"text,omitempty"`
	// Since is, for a gap, when the view stopped taking notifications
	// (it takes them while a page follows it); At is when it started
	// again. What happened in between is not in the timeline.
	Since *wire.Time `json:"since,omitempty"`

	key string // tells the change (or push) apart
}

// Member is an agent and its session.
type Member struct {
	AgentID   string `json:"agentId"`
	ContextID string `json:"contextId"`
}

// MaxText is the most characters of a message's text an Entry carries.
const MaxText = 280

// Stream lines: one JSON object each, with "type".
type (
	resetLine struct {
		Type string `json:"type"` // "reset"
		// Entries is the timeline, newest first.
		Entries []*Entry `json:"entries"`
	}
	entryLine struct {
		Type  string `json:"type"` // "entry"
		Entry *Entry `json:"entry"`
	}
)

// Lines that carry nothing but their type.
var (
	changedLine = []byte(`{"type":"changed"}` + "\n")
	pingLine    = []byte(`{"type":"ping"}` + "\n")
)

// entryOf reads a notification; ok is false for one that is neither a
// task event nor a push.
func entryOf(raw []byte) (e *Entry, ok bool) {
	ev, err := wire.DecodeEvent(raw)
	if err != nil {
		return nil, false
	}
	h := ev.Head()
	to := Member{h.Recipient, h.RecipientContextID}
	if p := ev.Push; p != nil {
		return &Entry{At: wire.NewTime(time.Now()), Kind: "push", From: Member{p.From, h.ContextID}, To: to, Text: textOf(p.Message),
			key: "push\x00" + h.Epoch + "\x00" + h.RecipientContextID + "\x00" + strconv.FormatUint(h.Seq, 10)}, true
	}
	te := ev.TaskEvent
	if te == nil || te.Task == nil {
		return nil, false
	}
	t := te.Task
	req, asg := Member{t.RequesterName, t.ContextID}, Member{t.AgentName, t.AgentContextID}
	// The change was made by the member that was not told of it.
	from := asg
	if to == asg {
		from = req
	}
	if te.Message != nil && te.Message.From != "" {
		from.AgentID = te.Message.From
	}
	e = &Entry{At: t.UpdatedAt, Kind: string(te.Kind), TaskID: te.TaskID, State: t.Status.State, Final: te.Final,
		From: from, To: to, Requester: &req, Assignee: &asg, Text: textOf(te.Message)}
	e.key = strings.Join([]string{"task", te.TaskID, string(te.Kind), string(t.Status.State), t.UpdatedAt.UTC().Format(time.RFC3339Nano)}, "\x00")
	return e, true
}

// textOf is a message's text parts, cut at MaxText characters.
func textOf(m *wire.Message) string {
	if m == nil {
		return ""
	}
	var b strings.Builder
	for _, p := range m.Parts {
		if p.Text == nil {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(*p.Text)
		if b.Len() > 4*MaxText {
			break
		}
	}
	s := strings.TrimSpace(b.String())
	if utf8.RuneCountInString(s) <= MaxText {
		return s
	}
	r := []rune(s)
	return string(r[:MaxText-1]) + "…"
}

// timeline keeps the newest entries, each once, and the keys of more
// than it keeps, so that a change told again after its entry went is
// not taken for a new one.
type timeline struct {
	max     int
	n       uint64
	entries []*Entry // oldest first
	seen    map[string]struct{}
	order   []string // the keys in seen, oldest first
}

func newTimeline(max int) timeline {
	return timeline{max: max, seen: map[string]struct{}{}}
}

// add keeps e unless its change is kept already, and returns its stream
// line.
func (t *timeline) add(e *Entry) (line []byte, fresh bool) {
	if _, dup := t.seen[e.key]; dup {
		return nil, false
	}
	t.seen[e.key] = struct{}{}
	t.order = append(t.order, e.key)
	if len(t.order) > 4*t.max {
		delete(t.seen, t.order[0])
		t.order = t.order[1:]
	}
	t.n++
	e.N = t.n
	t.entries = append(t.entries, e)
	if len(t.entries) > t.max {
		t.entries = t.entries[1:]
	}
	return jsonLine(entryLine{Type: "entry", Entry: e}), true
}

// addGap notes that the view took nothing from since to now.
func (t *timeline) addGap(since time.Time) {
	s := wire.NewTime(since)
	t.n++
	t.entries = append(t.entries, &Entry{N: t.n, At: wire.NewTime(time.Now()), Kind: "gap", Since: &s})
	if len(t.entries) > t.max {
		t.entries = t.entries[1:]
	}
}

// resetLine is the line that starts a stream: the timeline, newest first.
func (t *timeline) resetLine() []byte {
	r := resetLine{Type: "reset", Entries: make([]*Entry, 0, len(t.entries))}
	for i := len(t.entries) - 1; i >= 0; i-- {
		r.Entries = append(r.Entries, t.entries[i])
	}
	return jsonLine(r)
}

func jsonLine(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only strings, numbers and times
	}
	return append(b, '\n')
}
