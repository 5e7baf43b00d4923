// Package schema generates docs/schema/a2a-bus.schema.json, the JSON
// Schema of every object, request, response and notification on the wire,
// from the Go types of package wire (github.com/invopop/jsonschema
// reflects them; what reflection cannot say, such as a part's one member
// per kind, is added here). A test fails when the file and the types
// drift apart, and validates what a broker really sends against it. Hosts
// in other languages generate their types from the file.
package schema

import (
	"encoding/json"
	"reflect"

	"github.com/invopop/jsonschema"

	"github.com/a2a-bus/a2a-bus/wire"
)

// Path is the schema file, from the repository's root.
const Path = "docs/schema/a2a-bus.schema.json"

// Method is one method: the types of its params and of its result, and
// who may call it.
type Method struct {
	Name   string
	Params any
	Result any
	// Host marks a method only the host calls (a2a.host.rpc on NATS).
	Host bool
}

// Empty is the result of a2a.agents.deregister: {}.
type Empty struct{}

// Methods are every method, in the order of PROTOCOL §4 and §10.
var Methods = []Method{
	{wire.MethodRegister, wire.RegisterParams{}, wire.RegisterResult{}, false},
	{wire.MethodDeregister, wire.TokenParams{}, Empty{}, false},
	{wire.MethodListAgents, wire.ListAgentsParams{}, wire.ListAgentsResult{}, false},
	{wire.MethodSend, wire.SendParams{}, wire.SendResult{}, false},
	{wire.MethodGetTask, wire.TaskParams{}, wire.TaskResult{}, false},
	{wire.MethodListTasks, wire.ListTasksParams{}, wire.ListTasksResult{}, false},
	{wire.MethodUpdateTask, wire.UpdateParams{}, wire.TaskResult{}, false},
	{wire.MethodCancelTask, wire.CancelParams{}, wire.TaskResult{}, false},
	{wire.MethodReplay, wire.ReplayParams{}, wire.ReplayResult{}, false},
	{wire.MethodSessionOpen, wire.SessionParams{}, wire.SessionCredentials{}, true},
	{wire.MethodSessionClose, wire.SessionCloseParams{}, wire.SessionCloseResult{}, true},
	{wire.MethodAdminInfo, Empty{}, wire.AdminInfo{}, true},
	{wire.MethodAdminAgents, wire.PageParams{}, wire.AdminAgents{}, true},
	{wire.MethodAdminTasks, wire.PageParams{}, wire.AdminTasks{}, true},
	{wire.MethodAdminSessions, wire.PageParams{}, wire.AdminSessions{}, true},
}

// Notifications are the notifications' params types.
var Notifications = map[string]any{
	wire.NotifyTaskEvent: wire.TaskEvent{},
	wire.NotifyPush:      wire.Push{},
}

// Def is the name of a type's definition in the schema's $defs.
func Def(v any) string { return reflect.TypeOf(v).Name() }

// Generate returns the schema file's content.
func Generate() ([]byte, error) {
	r := &jsonschema.Reflector{
		AllowAdditionalProperties: true, // unknown members are ignored (PROTOCOL §3)
		Mapper:                    mapper,
	}
	defs := jsonschema.Definitions{}
	add := func(v any) {
		s := r.Reflect(v)
		for name, d := range s.Definitions {
			defs[name] = d
		}
	}
	add(wire.Error{})
	for _, m := range Methods {
		add(m.Params)
		add(m.Result)
	}
	for _, n := range []string{wire.NotifyTaskEvent, wire.NotifyPush} {
		add(Notifications[n])
	}
	refine(defs)

	methods := map[string]any{}
	for _, m := range Methods {
		methods[m.Name] = map[string]any{
			"params": "#/$defs/" + Def(m.Params),
			"result": "#/$defs/" + Def(m.Result),
			"caller": map[bool]string{true: "host", false: "session"}[m.Host],
		}
	}
	notes := map[string]any{}
	for n, v := range Notifications {
		notes[n] = map[string]any{"params": "#/$defs/" + Def(v)}
	}
	doc := map[string]any{
		"$schema":         "https://json-schema.org/draft/2020-12/schema",
		"$id":             "https://github.com/a2a-bus/a2a-bus/" + Path,
		"title":           "a2a-bus wire contract",
		"description":     "Every object, request params, result and notification params of docs/PROTOCOL.md, generated from the Go types (internal/schema). x-methods maps each method to its params and result, x-notifications each notification to its params; a request, a response and a notification are JSON-RPC 2.0 envelopes around them, an error is #/$defs/Error.",
		"$defs":           defs,
		"x-methods":       methods,
		"x-notifications": notes,
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// mapper gives the types with their own JSON encoding their schema.
func mapper(t reflect.Type) *jsonschema.Schema {
	switch t {
	case reflect.TypeFor[wire.Time]():
		return &jsonschema.Schema{Type: "string", Format: "date-time", Description: "RFC 3339, UTC, milliseconds"}
	case reflect.TypeFor[json.RawMessage]():
		return &jsonschema.Schema{Description: "any JSON value"}
	}
	return nil
}

// refine adds what reflection cannot see: the values of the enums, a
// part's one member per kind, metadata as an object or null.
func refine(defs jsonschema.Definitions) {
	enum := func(def, field string, values ...any) {
		if d, ok := defs[def]; ok && d.Properties != nil {
			if p, ok := d.Properties.Get(field); ok {
				p.Enum = values
			}
		}
	}
	states := []any{"submitted", "working", "input-required", "completed", "failed", "canceled", "rejected"}
	enum("TaskStatus", "state", states...)
	enum("ListTasksParams", "state", states...)
	enum("UpdateParams", "state", "working", "input-required", "completed", "failed", "rejected")
	enum("ListTasksParams", "role", "requester", "assignee")
	enum("Message", "role", "user", "agent")
	enum("Part", "kind", "text", "data", "file")
	enum("TaskEvent", "kind", "created", "message", "status")
	objectOrNull := &jsonschema.Schema{Type: "", OneOf: []*jsonschema.Schema{{Type: "object"}, {Type: "null"}}}
	for _, d := range defs {
		if d.Properties == nil {
			continue
		}
		if _, ok := d.Properties.Get("metadata"); ok {
			d.Properties.Set("metadata", objectOrNull)
		}
	}
	one := uint64(1)
	for _, def := range []string{"Message", "Artifact"} {
		if d, ok := defs[def]; ok && d.Properties != nil {
			if p, ok := d.Properties.Get("parts"); ok {
				p.MinItems = &one
			}
		}
	}
	if part, ok := defs["Part"]; ok {
		one := func(kind, member string) *jsonschema.Schema {
			props := jsonschema.NewProperties()
			props.Set("kind", &jsonschema.Schema{Const: kind})
			return &jsonschema.Schema{Properties: props, Required: []string{"kind", member}}
		}
		part.OneOf = []*jsonschema.Schema{one("text", "text"), one("data", "data"), one("file", "file")}
	}
	if file, ok := defs["File"]; ok {
		file.OneOf = []*jsonschema.Schema{{Required: []string{"bytes"}}, {Required: []string{"uri"}}}
	}
}
