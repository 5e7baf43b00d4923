package gateway

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// MetaKey is the metadata member under which a task, a message or an
// error carries what a2a-bus knows and A2A 1.0 has no field for
// (docs/PROTOCOL.md §12).
const MetaKey = "a2aBus"

// States map both ways: a2a-bus keeps the A2A 0.3 names.
var toState = map[wire.State]a2a.TaskState{
	wire.StateSubmitted:     a2a.TaskStateSubmitted,
	wire.StateWorking:       a2a.TaskStateWorking,
	wire.StateInputRequired: a2a.TaskStateInputRequired,
	wire.StateCompleted:     a2a.TaskStateCompleted,
	wire.StateFailed:        a2a.TaskStateFailed,
	wire.StateCanceled:      a2a.TaskStateCanceled,
	wire.StateRejected:      a2a.TaskStateRejected,
}

// State is the A2A 1.0 name of a state; "" for one a2a-bus does not have.
func State(s wire.State) a2a.TaskState { return toState[s] }

// FromState is the a2a-bus name of an A2A 1.0 state; ok is false for one
// a2a-bus does not have (TASK_STATE_AUTH_REQUIRED).
func FromState(s a2a.TaskState) (wire.State, bool) {
	for w, v := range toState {
		if v == s {
			return w, true
		}
	}
	return "", false
}

// Role is the A2A 1.0 name of a role.
func Role(r wire.Role) a2a.MessageRole {
	if r == wire.RoleAgent {
		return a2a.MessageRoleAgent
	}
	return a2a.MessageRoleUser
}

// Part turns an a2a-bus part into an A2A 1.0 part: text, data, a file by
// its bytes (raw) or by its URI (url).
func Part(p *wire.Part) (*a2a.Part, error) {
	out := &a2a.Part{}
	if err := decodeMeta(p.Metadata, &out.Metadata); err != nil {
		return nil, err
	}
	switch p.Kind {
	case wire.KindText:
		out.Content = a2a.Text(*p.Text)
	case wire.KindData:
		// The broker's JSON as it is (json.RawMessage): no tree to build
		// and encode again, and every number as written (lift.go).
		if !json.Valid(p.Data) {
			return nil, errors.New("data part: not JSON")
		}
		out.Content = a2a.Data{Value: json.RawMessage(p.Data)}
	case wire.KindFile:
		out.Filename, out.MediaType = p.File.Name, p.File.MimeType
		if p.File.Bytes != nil {
			raw, err := base64.StdEncoding.DecodeString(*p.File.Bytes)
			if err != nil {
				return nil, fmt.Errorf("file part: %w", err)
			}
			out.Content = a2a.Raw(raw)
		} else {
			out.Content = a2a.URL(*p.File.URI)
		}
	default:
		return nil, fmt.Errorf("part of kind %q", p.Kind)
	}
	return out, nil
}

// FromPart turns an A2A 1.0 part into an a2a-bus part.
func FromPart(p *a2a.Part) (wire.Part, error) {
	if p == nil {
		return wire.Part{}, errors.New("a part is null")
	}
	var out wire.Part
	if p.Metadata != nil {
		m, err := json.Marshal(p.Metadata)
		if err != nil {
			return wire.Part{}, err
		}
		out.Metadata = m
	}
	switch c := p.Content.(type) {
	case a2a.Text:
		s := string(c)
		out.Kind, out.Text = wire.KindText, &s
	case a2a.Data:
		d, err := json.Marshal(c.Value)
		if err != nil {
			return wire.Part{}, err
		}
		out.Kind, out.Data = wire.KindData, d
	case a2a.Raw:
		s := base64.StdEncoding.EncodeToString(c)
		out.Kind, out.File = wire.KindFile, &wire.File{Name: p.Filename, MimeType: p.MediaType, Bytes: &s}
	case a2a.URL:
		s := string(c)
		out.Kind, out.File = wire.KindFile, &wire.File{Name: p.Filename, MimeType: p.MediaType, URI: &s}
	default:
		return wire.Part{}, errors.New("a part has no content")
	}
	return out, nil
}

// Message turns an a2a-bus message into an A2A 1.0 message. contextID is
// the one the client knows the task by. from, the sender's agentId, and
// the a2a-bus contextId travel under metadata.a2aBus.
func Message(m *wire.Message, contextID string) (*a2a.Message, error) {
	if m == nil {
		return nil, nil
	}
	out := &a2a.Message{ID: m.MessageID, ContextID: contextID, Role: Role(m.Role), TaskID: a2a.TaskID(m.TaskID)}
	if err := decodeMeta(m.Metadata, &out.Metadata); err != nil {
		return nil, err
	}
	setMeta(&out.Metadata, map[string]any{"from": m.From, "contextId": m.ContextID})
	for i := range m.Parts {
		p, err := Part(&m.Parts[i])
		if err != nil {
			return nil, err
		}
		out.Parts = append(out.Parts, p)
	}
	return out, nil
}

// FromMessage turns a client's A2A 1.0 message into an a2a-bus message:
// its id, parts and metadata. Role, taskId and contextId are the broker's.
func FromMessage(m *a2a.Message) (*wire.Message, error) {
	if m == nil {
		return nil, errors.New("message: required")
	}
	out := &wire.Message{MessageID: m.ID}
	for i, p := range m.Parts {
		wp, err := FromPart(p)
		if err != nil {
			return nil, fmt.Errorf("message.parts[%d]: %w", i, err)
		}
		out.Parts = append(out.Parts, wp)
	}
	if len(m.Metadata) > 0 {
		b, err := json.Marshal(m.Metadata)
		if err != nil {
			return nil, err
		}
		out.Metadata = b
	}
	return out, nil
}

// Artifact turns an a2a-bus artifact into an A2A 1.0 artifact.
func Artifact(a *wire.Artifact) (*a2a.Artifact, error) {
	out := &a2a.Artifact{ID: a2a.ArtifactID(a.ArtifactID), Name: a.Name}
	if err := decodeMeta(a.Metadata, &out.Metadata); err != nil {
		return nil, err
	}
	for i := range a.Parts {
		p, err := Part(&a.Parts[i])
		if err != nil {
			return nil, err
		}
		out.Parts = append(out.Parts, p)
	}
	return out, nil
}

// ClientContextID is the contextId the client gave the task (kept in the
// task's metadata.a2aBus.clientContextId); the task id when there is none.
func ClientContextID(t *wire.Task) string {
	var m struct {
		Bus struct {
			ClientContextID string `json:"clientContextId"`
		} `json:"a2aBus"`
	}
	if t.Metadata != nil && json.Unmarshal(t.Metadata, &m) == nil && m.Bus.ClientContextID != "" {
		return m.Bus.ClientContextID
	}
	return t.ID
}

// Task turns an a2a-bus task into an A2A 1.0 task, with at most
// historyLength messages of its history (the latest; nil: all).
func Task(t *wire.Task, historyLength *int) (*a2a.Task, error) {
	ctxID := ClientContextID(t)
	status, err := Status(&t.Status, ctxID)
	if err != nil {
		return nil, err
	}
	out := &a2a.Task{ID: a2a.TaskID(t.ID), ContextID: ctxID, Status: status}
	if err := decodeMeta(t.Metadata, &out.Metadata); err != nil {
		return nil, err
	}
	bus, _ := out.Metadata[MetaKey].(map[string]any)
	if bus == nil {
		bus = map[string]any{}
	}
	bus["requesterName"], bus["agentName"] = t.RequesterName, t.AgentName
	bus["contextId"], bus["agentContextId"] = t.ContextID, t.AgentContextID
	bus["createdAt"], bus["updatedAt"] = t.CreatedAt.Format(wire.TimeFormat), t.UpdatedAt.Format(wire.TimeFormat)
	setMeta(&out.Metadata, bus)
	history := t.History
	if historyLength != nil && *historyLength >= 0 && *historyLength < len(history) {
		history = history[len(history)-*historyLength:]
	}
	for i := range history {
		m, err := Message(&history[i], ctxID)
		if err != nil {
			return nil, err
		}
		out.History = append(out.History, m)
	}
	for i := range t.Artifacts {
		a, err := Artifact(&t.Artifacts[i])
		if err != nil {
			return nil, err
		}
		out.Artifacts = append(out.Artifacts, a)
	}
	return out, nil
}

// Status turns a task status into its A2A 1.0 form.
func Status(s *wire.TaskStatus, contextID string) (a2a.TaskStatus, error) {
	ts := s.Timestamp.Time
	out := a2a.TaskStatus{State: State(s.State)}
	if !ts.IsZero() {
		out.Timestamp = &ts
	}
	m, err := Message(s.Message, contextID)
	if err != nil {
		return a2a.TaskStatus{}, err
	}
	out.Message = m
	return out, nil
}

// Card turns an agent's a2a-bus card into an A2A 1.0 Agent Card served
// at url (the agent's JSON-RPC endpoint), with the gateway's Bearer
// scheme and every required field filled.
func Card(c *wire.AgentCard, url, version string) *a2a.AgentCard {
	out := &a2a.AgentCard{
		Name:                c.AgentID,
		Description:         c.Description,
		Version:             c.Version,
		SupportedInterfaces: []*a2a.AgentInterface{{URL: url, ProtocolBinding: a2a.TransportProtocolJSONRPC, ProtocolVersion: a2a.Version}},
		Capabilities:        a2a.AgentCapabilities{Streaming: true, PushNotifications: false},
		DefaultInputModes:   c.DefaultInputModes,
		DefaultOutputModes:  c.DefaultOutputModes,
		Skills:              []a2a.AgentSkill{},
		SecuritySchemes: a2a.NamedSecuritySchemes{
			"bearer": a2a.HTTPAuthSecurityScheme{Scheme: "Bearer", Description: "the gateway's token, from the broker's connection file (a2aToken)"},
		},
		SecurityRequirements: a2a.SecurityRequirementsOptions{{"bearer": a2a.SecuritySchemeScopes{}}},
	}
	if out.Name == "" {
		out.Name = c.Name
	}
	if out.Description == "" {
		out.Description = "a2a-bus agent " + out.Name
	}
	if out.Version == "" {
		out.Version = version
	}
	if len(out.DefaultInputModes) == 0 {
		out.DefaultInputModes = []string{"text/plain", "application/json"}
	}
	if len(out.DefaultOutputModes) == 0 {
		out.DefaultOutputModes = []string{"text/plain", "application/json"}
	}
	for _, s := range c.Skills {
		sk := a2a.AgentSkill{ID: s.ID, Name: s.Name, Description: s.Description, Tags: s.Tags}
		if sk.ID == "" {
			sk.ID = s.Name
		}
		if sk.Name == "" {
			sk.Name = sk.ID
		}
		if sk.Tags == nil {
			sk.Tags = []string{}
		}
		out.Skills = append(out.Skills, sk)
	}
	return out
}

// Error turns what a call to the broker returned into the A2A 1.0 error a
// client expects: A2A_UNKNOWN_TASK is TaskNotFound, A2A_INVALID_TRANSITION
// of a cancel TaskNotCancelable, -32602 InvalidParams, -32603
// InternalError, any other a ServerError (-32000); each keeps its a2a-bus
// code in the error's details (a2aBusCode, a2aBusError).
func Error(err error, cancel bool) error {
	if err == nil {
		return nil
	}
	var we *wire.Error
	if !errors.As(err, &we) {
		switch {
		case errors.Is(err, transport.ErrUnavailable):
			return a2a.NewError(a2a.ErrInternalError, "the broker is unavailable")
		case errors.Is(err, transport.ErrTooLarge):
			return a2a.NewError(a2a.ErrInvalidParams, "the message is over the broker's message limit (--max-message-bytes)")
		}
		return a2a.NewError(a2a.ErrInternalError, err.Error())
	}
	var target error
	switch {
	case we.Code == wire.ErrUnknownTask.Code:
		target = a2a.ErrTaskNotFound
	case we.Code == wire.ErrInvalidTransition.Code && cancel:
		target = a2a.ErrTaskNotCancelable
	case we.Code == wire.ErrInvalidParams.Code:
		target = a2a.ErrInvalidParams
	case we.Code == wire.ErrInvalidRequest.Code:
		target = a2a.ErrInvalidRequest
	case we.Code == wire.ErrInternal.Code:
		target = a2a.ErrInternalError
	default:
		target = a2a.ErrServerError // -32000, the code and name in the details
	}
	return a2a.NewError(target, we.Message).WithDetails(map[string]any{"a2aBusCode": we.Code, "a2aBusError": we.DataCode()})
}

// decodeMeta decodes an a2a-bus metadata object (nil or null: none).
func decodeMeta(raw json.RawMessage, out *map[string]any) error {
	if raw == nil || string(raw) == "null" {
		return nil
	}
	return unmarshalNumbers(raw, out) // numbers as written
}

// setMeta puts a2a-bus's own fields under MetaKey.
func setMeta(m *map[string]any, bus map[string]any) {
	if *m == nil {
		*m = map[string]any{}
	}
	(*m)[MetaKey] = bus
}
