package wire

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// TimeFormat is RFC 3339 in UTC with milliseconds, the protocol's only
// timestamp form.
const TimeFormat = "2006-01-02T15:04:05.000Z07:00"

// Time is a timestamp that encodes as TimeFormat in UTC.
type Time struct{ time.Time }

// NewTime returns t in UTC, truncated to milliseconds as the wire carries it.
func NewTime(t time.Time) Time { return Time{t.UTC().Truncate(time.Millisecond)} }

// MarshalJSON implements json.Marshaler.
func (t Time) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, len(TimeFormat)+2)
	b = append(b, '"')
	b = t.UTC().AppendFormat(b, TimeFormat)
	return append(b, '"'), nil
}

// UnmarshalJSON implements json.Unmarshaler; it accepts any RFC 3339 time,
// and null as no change, as encoding/json does for its own types.
func (t *Time) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return err
	}
	t.Time = v.UTC()
	return nil
}

// State is a task state.
type State string

// The task states. The first three are open; the others are terminal.
const (
	StateSubmitted     State = "submitted"
	StateWorking       State = "working"
	StateInputRequired State = "input-required"
	StateCompleted     State = "completed"
	StateFailed        State = "failed"
	StateCanceled      State = "canceled"
	StateRejected      State = "rejected"
)

// states lists every state, open ones first.
var states = []State{StateSubmitted, StateWorking, StateInputRequired, StateCompleted, StateFailed, StateCanceled, StateRejected}

// Valid reports whether s is one of the seven states.
func (s State) Valid() bool {
	for _, v := range states {
		if s == v {
			return true
		}
	}
	return false
}

// Terminal reports whether s admits no further change.
func (s State) Terminal() bool {
	switch s {
	case StateCompleted, StateFailed, StateCanceled, StateRejected:
		return true
	}
	return false
}

// Open reports whether s is a valid non-terminal state.
func (s State) Open() bool {
	switch s {
	case StateSubmitted, StateWorking, StateInputRequired:
		return true
	}
	return false
}

// Role is the author of a message.
type Role string

// The roles: user for the task's requester, agent for its assignee.
const (
	RoleUser  Role = "user"
	RoleAgent Role = "agent"
)

// Skill is one skill of an AgentCard.
type Skill struct {
	ID          string   `json:"id,omitempty"`
	Name        string   `json:"name,omitempty"`
	Description string   `json:"description,omitempty"`
	Tags        []string `json:"tags,omitempty"`
}

// AgentCard describes an agent. The client fills in Name and the
// descriptive fields; the broker adds AgentID, ContextID and RegisteredAt.
type AgentCard struct {
	Name               string          `json:"name"`
	Description        string          `json:"description,omitempty"`
	Version            string          `json:"version,omitempty"`
	Skills             []Skill         `json:"skills,omitempty"`
	DefaultInputModes  []string        `json:"defaultInputModes,omitempty"`
	DefaultOutputModes []string        `json:"defaultOutputModes,omitempty"`
	Metadata           json.RawMessage `json:"metadata,omitempty"`
	AgentID            string          `json:"agentId,omitempty"`
	ContextID          string          `json:"contextId,omitempty"`
	RegisteredAt       *Time           `json:"registeredAt,omitempty"`
}

// MaxNameLen is the longest card name.
const MaxNameLen = 64

var nameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// ValidName reports whether s is a valid card name: 1 to 64 of A-Za-z0-9._-
func ValidName(s string) bool { return nameRE.MatchString(s) }

// Validate checks the card as the client sends it.
func (c *AgentCard) Validate(path string) error {
	if !ValidName(c.Name) {
		return fieldErr(path+".name", "must be 1 to %d of A-Za-z0-9._- (got %s)", MaxNameLen, Quote(c.Name))
	}
	return validMetadata(path, c.Metadata)
}

// MaxIDBytes is the longest session id (contextId) or instance id.
const MaxIDBytes = 256

// ValidateID checks a session id or instance id: 1 to MaxIDBytes bytes of
// UTF-8 without control characters.
func ValidateID(field, s string) error {
	switch {
	case s == "":
		return fieldErr(field, "required")
	case len(s) > MaxIDBytes:
		return fieldErr(field, "longer than %d bytes", MaxIDBytes)
	case !utf8.ValidString(s):
		return fieldErr(field, "not valid UTF-8")
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return fieldErr(field, "contains a control character")
		}
	}
	return nil
}

// PartKind is the kind of a Part.
type PartKind string

// The part kinds.
const (
	KindText PartKind = "text"
	KindData PartKind = "data"
	KindFile PartKind = "file"
)

// Part is one piece of a message or artifact: exactly one of Text (kind
// text), Data (kind data) or File (kind file). Pointers and raw JSON keep
// presence, so an empty text and a null datum are both valid.
type Part struct {
	Kind     PartKind        `json:"kind"`
	Text     *string         `json:"text,omitempty"`
	Data     json.RawMessage `json:"data,omitempty"`
	File     *File           `json:"file,omitempty"`
	Metadata json.RawMessage `json:"metadata,omitempty"`
}

// File is the content of a file part: exactly one of Bytes (standard
// base64 with padding) and URI.
type File struct {
	Name     string  `json:"name,omitempty"`
	MimeType string  `json:"mimeType,omitempty"`
	Bytes    *string `json:"bytes,omitempty"`
	URI      *string `json:"uri,omitempty"`
}

// TextPart returns a text part.
func TextPart(s string) Part { return Part{Kind: KindText, Text: &s} }

// DataPart returns a data part holding v encoded as JSON.
func DataPart(v any) (Part, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return Part{}, err
	}
	return Part{Kind: KindData, Data: b}, nil
}

// FileBytesPart returns a file part carrying data inline.
func FileBytesPart(name, mimeType string, data []byte) Part {
	s := base64.StdEncoding.EncodeToString(data)
	return Part{Kind: KindFile, File: &File{Name: name, MimeType: mimeType, Bytes: &s}}
}

// FileURIPart returns a file part pointing at uri.
func FileURIPart(name, mimeType, uri string) Part {
	return Part{Kind: KindFile, File: &File{Name: name, MimeType: mimeType, URI: &uri}}
}

// Validate checks that p is exactly one of the three shapes.
func (p *Part) Validate(path string) error { return p.validate(partPath{path, -1}) }

// partPath names a part in an error: the part at owner, or (i >= 0) the
// i-th of owner's parts. It is spelled out only for an error, so that a
// valid message costs no strings.
type partPath struct {
	owner string
	i     int
}

func (pp partPath) String() string {
	if pp.i < 0 {
		return pp.owner
	}
	return pp.owner + ".parts[" + strconv.Itoa(pp.i) + "]"
}

func (p *Part) validate(path partPath) error {
	switch p.Kind {
	case KindText, KindData, KindFile:
	case "":
		return fieldErr(path.String()+".kind", "required (text, data or file)")
	default:
		return fieldErr(path.String()+".kind", "must be text, data or file (got %s)", Quote(string(p.Kind)))
	}
	text, data, file := p.Text != nil, p.Data != nil, p.File != nil
	own := (p.Kind == KindText && text) || (p.Kind == KindData && data) || (p.Kind == KindFile && file)
	if !own || (text && data) || (text && file) || (data && file) {
		var present []string
		for _, m := range []struct {
			name string
			has  bool
		}{{"text", text}, {"data", data}, {"file", file}} {
			if m.has {
				present = append(present, m.name)
			}
		}
		return fieldErr(path.String(), "a %s part has exactly the member %q (has %s)", p.Kind, string(p.Kind), listOrNone(present))
	}
	if p.Kind == KindFile {
		f := p.File
		if (f.Bytes == nil) == (f.URI == nil) {
			return fieldErr(path.String()+".file", "needs exactly one of bytes and uri")
		}
		if f.Bytes != nil {
			if _, err := base64.StdEncoding.Strict().DecodeString(*f.Bytes); err != nil || strings.ContainsAny(*f.Bytes, "\r\n") {
				return fieldErr(path.String()+".file.bytes", "must be standard base64 with padding")
			}
		}
	}
	if !metadataOK(p.Metadata) {
		return fieldErr(path.String()+".metadata", "must be an object")
	}
	return nil
}

// validMetadata checks the metadata of the object at owner.
func validMetadata(owner string, m json.RawMessage) error {
	if !metadataOK(m) {
		return fieldErr(owner+".metadata", "must be an object")
	}
	return nil
}

// metadataOK reports whether m is absent, null or an object.
func metadataOK(m json.RawMessage) bool {
	if m == nil {
		return true
	}
	t := bytes.TrimLeft(m, " \t\r\n")
	return len(t) > 0 && (t[0] == '{' || bytes.Equal(t, null))
}

// MaxParts is the most parts one message or artifact may have.
const MaxParts = 1000

// MaxCardBytes is the largest encoded AgentCard: every live agent's card
// is kept in memory and sent by every a2a.agents.list.
const MaxCardBytes = 16 << 10

// validParts checks the parts of the object at owner.
func validParts(owner string, parts []Part) error {
	if len(parts) == 0 {
		return fieldErr(owner+".parts", "needs at least one part")
	}
	if len(parts) > MaxParts {
		return fieldErr(owner+".parts", "has %d parts; at most %d", len(parts), MaxParts)
	}
	for i := range parts {
		if err := parts[i].validate(partPath{owner, i}); err != nil {
			return err
		}
	}
	return nil
}

// Message is one message of a task, or a oneway push. The broker sets Role,
// From, TaskID and ContextID, and MessageID when it is absent.
type Message struct {
	MessageID string          `json:"messageId"`
	Role      Role            `json:"role,omitempty"`
	Parts     []Part          `json:"parts"`
	From      string          `json:"from,omitempty"`
	TaskID    string          `json:"taskId,omitempty"`
	ContextID string          `json:"contextId,omitempty"`
	Metadata  json.RawMessage `json:"metadata,omitempty"`
}

// Validate checks a message as a client sends it.
func (m *Message) Validate(path string) error {
	if err := validParts(path, m.Parts); err != nil {
		return err
	}
	if len(m.MessageID) > MaxIDBytes {
		return fieldErr(path+".messageId", "longer than %d bytes", MaxIDBytes)
	}
	return validMetadata(path, m.Metadata)
}

// Artifact is an output of a task, appended by updates.
type Artifact struct {
	ArtifactID string          `json:"artifactId"`
	Name       string          `json:"name,omitempty"`
	Parts      []Part          `json:"parts"`
	Metadata   json.RawMessage `json:"metadata,omitempty"`
}

// Validate checks an artifact as a client sends it.
func (a *Artifact) Validate(path string) error {
	if err := validParts(path, a.Parts); err != nil {
		return err
	}
	return validMetadata(path, a.Metadata)
}

// TaskStatus is a task's current state.
type TaskStatus struct {
	State     State    `json:"state"`
	Timestamp Time     `json:"timestamp"`
	Message   *Message `json:"message,omitempty"`
}

// Task is a durable unit of work between a requester and an assignee.
// History is omitted (nil) in notifications.
type Task struct {
	ID             string          `json:"id"`
	ContextID      string          `json:"contextId"`
	RequesterName  string          `json:"requesterName"`
	AgentName      string          `json:"agentName"`
	AgentContextID string          `json:"agentContextId"`
	Status         TaskStatus      `json:"status"`
	History        []Message       `json:"history,omitempty"`
	Artifacts      []Artifact      `json:"artifacts"`
	CreatedAt      Time            `json:"createdAt"`
	UpdatedAt      Time            `json:"updatedAt"`
	Metadata       json.RawMessage `json:"metadata,omitempty"`
}

// Clone returns a deep copy of t: nothing the copy holds is shared with t.
func (t *Task) Clone() *Task {
	c := new(Task)
	t.CloneInto(c)
	return c
}

// CloneInto makes *c a deep copy of t, as Clone does, without allocating
// the Task itself: a record holding a Task copies it in place.
func (t *Task) CloneInto(c *Task) {
	*c = *t
	c.Status.Message = t.Status.Message.Clone()
	if t.History != nil {
		c.History = make([]Message, len(t.History))
		for i := range t.History {
			t.History[i].cloneInto(&c.History[i])
		}
	}
	c.Artifacts = make([]Artifact, len(t.Artifacts))
	for i, a := range t.Artifacts {
		a.Parts = cloneParts(a.Parts)
		a.Metadata = bytes.Clone(a.Metadata)
		c.Artifacts[i] = a
	}
	c.Metadata = bytes.Clone(t.Metadata)
}

// Clone returns a deep copy of m (nil for nil).
func (m *Message) Clone() *Message {
	if m == nil {
		return nil
	}
	c := new(Message)
	m.cloneInto(c)
	return c
}

func (m *Message) cloneInto(c *Message) {
	*c = *m
	c.Parts = cloneParts(m.Parts)
	c.Metadata = bytes.Clone(m.Metadata)
}

func cloneParts(ps []Part) []Part {
	if ps == nil {
		return nil
	}
	out := make([]Part, len(ps))
	var texts []string // the parts' texts, copied in one allocation
	for i, p := range ps {
		if p.Text != nil {
			if texts == nil {
				texts = make([]string, 0, len(ps)-i)
			}
			texts = append(texts, *p.Text)
			p.Text = &texts[len(texts)-1]
		}
		p.Data = bytes.Clone(p.Data)
		p.Metadata = bytes.Clone(p.Metadata)
		if p.File != nil {
			f := *p.File
			f.Bytes, f.URI = cloneString(f.Bytes), cloneString(f.URI)
			p.File = &f
		}
		out[i] = p
	}
	return out
}

// cloneString returns a pointer to a copy of *s (nil for nil).
func cloneString(s *string) *string {
	if s == nil {
		return nil
	}
	c := *s
	return &c
}

// WithoutHistory returns a shallow copy of t without its history, as
// notifications carry it.
func (t *Task) WithoutHistory() *Task {
	c := *t
	c.History = nil
	return &c
}

// Quote renders caller-supplied text for an error message or a log: at
// most 80 bytes of it, cut on a character boundary, then Go-quoted so
// that control characters and invalid bytes show as escapes.
func Quote(s string) string {
	return strconv.Quote(Cut(s, 80))
}

// Cut returns s, or at most its first max bytes cut on a character
// boundary and followed by "…".
func Cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
