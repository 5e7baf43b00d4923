package wire

import "encoding/json"

// The method names.
const (
	MethodRegister     = "a2a.agents.register"
	MethodDeregister   = "a2a.agents.deregister"
	MethodListAgents   = "a2a.agents.list"
	MethodSend         = "a2a.message.send"
	MethodGetTask      = "a2a.tasks.get"
	MethodListTasks    = "a2a.tasks.list"
	MethodUpdateTask   = "a2a.tasks.update"
	MethodCancelTask   = "a2a.tasks.cancel"
	MethodReplay       = "a2a.events.replay"
	MethodSessionOpen  = "a2a.sessions.open"
	MethodSessionClose = "a2a.sessions.close"

	// The admin extension: host-only, read-only.
	MethodAdminInfo     = "a2a.admin.info"
	MethodAdminAgents   = "a2a.admin.agents"
	MethodAdminTasks    = "a2a.admin.tasks"
	MethodAdminSessions = "a2a.admin.sessions"

	// The A2A gateway's host methods (a2a-bus serve --a2a-listen).
	MethodGatewayClientIssue  = "a2a.gateway.clients.issue"
	MethodGatewayClientRevoke = "a2a.gateway.clients.revoke"

	// NotifyTaskEvent and NotifyPush are the two notifications.
	NotifyTaskEvent = "a2a.task.event"
	NotifyPush      = "a2a.push"
)

// RegisterParams are the params of a2a.agents.register.
type RegisterParams struct {
	ContextID  string     `json:"contextId"`
	Card       *AgentCard `json:"card"`
	InstanceID string     `json:"instanceId,omitempty"`
}

// RegisterResult is the result of a2a.agents.register.
type RegisterResult struct {
	AgentID    string    `json:"agentId"`
	Token      string    `json:"token"`
	InstanceID string    `json:"instanceId"`
	Card       AgentCard `json:"card"`
}

// TokenParams are the params of methods that take only a token
// (a2a.agents.deregister, a2a.agents.list).
type TokenParams struct {
	Token string `json:"token"`
}

// ListAgentsResult is the result of a2a.agents.list.
type ListAgentsResult struct {
	Agents []AgentCard `json:"agents"`
	Page
}

// SendParams are the params of a2a.message.send.
type SendParams struct {
	Token    string          `json:"token"`
	To       string          `json:"to,omitempty"`
	TaskID   string          `json:"taskId,omitempty"`
	Message  *Message        `json:"message"`
	Oneway   bool            `json:"oneway,omitempty"`
	Metadata json.RawMessage `json:"metadata,omitempty"`
}

// SendResult is the result of a2a.message.send: Task, or Delivered for a
// oneway send.
type SendResult struct {
	Task      *Task  `json:"task,omitempty"`
	Delivered string `json:"delivered,omitempty"`
}

// TaskParams are the params of a2a.tasks.get.
type TaskParams struct {
	Token  string `json:"token"`
	TaskID string `json:"taskId"`
}

// CancelParams are the params of a2a.tasks.cancel. MessageID, when
// given, makes the cancel retry-safe: a retry returns the task as it is.
type CancelParams struct {
	Token     string `json:"token"`
	TaskID    string `json:"taskId"`
	MessageID string `json:"messageId,omitempty"`
}

// TaskResult is the result of the methods that return one task.
type TaskResult struct {
	Task *Task `json:"task"`
}

// ListRole filters a2a.tasks.list by the caller's role in the task.
type ListRole string

// The roles a task list can be filtered by.
const (
	ListRequester ListRole = "requester"
	ListAssignee  ListRole = "assignee"
)

// The page sizes of the list methods.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// PageParams are the paging params of every list method, named as A2A
// 1.0's ListTasks names them. A page holds at most PageSize items (0:
// DefaultPageSize; above MaxPageSize: -32602), and fewer when their
// bytes would pass the payload limit.
type PageParams struct {
	PageSize int `json:"pageSize,omitempty"`
	// PageToken continues a list where the previous page's NextPageToken
	// left it; "" starts at the beginning.
	PageToken string `json:"pageToken,omitempty"`
}

// Page is what every list result carries besides its items:
// NextPageToken is "" on the last page.
type Page struct {
	NextPageToken string `json:"nextPageToken"`
}

// ListAgentsParams are the params of a2a.agents.list.
type ListAgentsParams struct {
	Token string `json:"token"`
	// AgentID, when set, narrows the list to the live agent of that
	// agentId: one page of at most its card, read from the broker's index
	// (not a walk of the list). No card when the list would not show it
	// (unknown, the caller itself, hidden); pageToken is not used.
	AgentID string `json:"agentId,omitempty"`
	PageParams
}

// ListTasksParams are the params of a2a.tasks.list.
type ListTasksParams struct {
	Token string   `json:"token"`
	State State    `json:"state,omitempty"`
	Role  ListRole `json:"role,omitempty"`
	PageParams
}

// ListTasksResult is the result of a2a.tasks.list.
type ListTasksResult struct {
	Tasks []*Task `json:"tasks"`
	Page
}

// UpdateParams are the params of a2a.tasks.update.
type UpdateParams struct {
	Token     string     `json:"token"`
	TaskID    string     `json:"taskId"`
	State     State      `json:"state"`
	Message   *Message   `json:"message,omitempty"`
	Artifacts []Artifact `json:"artifacts,omitempty"`
	// MessageID is the update's idempotency key; without it, the
	// message's messageId is, when the update carries a message.
	MessageID string `json:"messageId,omitempty"`
}

// ReplayParams are the params of a2a.events.replay: Epoch and AfterSeq
// together, or neither (where the session stands); pointers keep their
// presence.
type ReplayParams struct {
	ContextID string  `json:"contextId"`
	Epoch     *string `json:"epoch,omitempty"`
	AfterSeq  *uint64 `json:"afterSeq,omitempty"`
}

// ReplayResult is the result of a2a.events.replay: whole notifications, in
// seq order.
type ReplayResult struct {
	Epoch   string            `json:"epoch"`
	LastSeq uint64            `json:"lastSeq"`
	Events  []json.RawMessage `json:"events"`
}

// SessionParams are the params of a2a.sessions.open.
type SessionParams struct {
	ContextID string `json:"contextId"`
}

// SessionCloseParams are the params of a2a.sessions.close.
type SessionCloseParams struct {
	ContextID string `json:"contextId"`
	// KeepAgents leaves the session's agents registered; by default they
	// are deregistered, as if each had called a2a.agents.deregister.
	KeepAgents bool `json:"keepAgents,omitempty"`
}

// SessionCloseResult is the result of a2a.sessions.close.
type SessionCloseResult struct {
	// Deregistered lists the agentIds of the agents the close
	// deregistered.
	Deregistered []string `json:"deregistered"`
}

// SessionCredentials is the result of a2a.sessions.open.
type SessionCredentials struct {
	URL      string `json:"url"`
	User     string `json:"user"`
	Password string `json:"password"`
	// WSURL is the broker's WebSocket listener, where a web page uses
	// the same credential; absent when it has none.
	WSURL string `json:"wsUrl,omitempty"`
}

// EventKind says what changed in an a2a.task.event.
type EventKind string

// The event kinds.
const (
	EventCreated EventKind = "created"
	EventMessage EventKind = "message"
	EventStatus  EventKind = "status"
)

// EventHead is the part every notification's params share.
type EventHead struct {
	Recipient          string `json:"recipient"`
	RecipientContextID string `json:"recipientContextId"`
	ContextID          string `json:"contextId"`
	Seq                uint64 `json:"seq"`
	Epoch              string `json:"epoch"`
}

// TaskEvent is the params of a2a.task.event.
type TaskEvent struct {
	EventHead
	TaskID  string    `json:"taskId"`
	Kind    EventKind `json:"kind"`
	Task    *Task     `json:"task"`
	Message *Message  `json:"message,omitempty"`
	Final   bool      `json:"final"`
}

// Push is the params of a2a.push.
type Push struct {
	EventHead
	From    string   `json:"from"`
	Message *Message `json:"message"`
}

// Event is a decoded notification: exactly one of TaskEvent and Push.
type Event struct {
	Method    string
	TaskEvent *TaskEvent
	Push      *Push
}

// Head returns the routing fields of the event.
func (e *Event) Head() EventHead {
	if e.TaskEvent != nil {
		return e.TaskEvent.EventHead
	}
	if e.Push != nil {
		return e.Push.EventHead
	}
	return EventHead{}
}

// eventParams holds the params of either notification, so that one pass
// decodes any of them.
type eventParams struct {
	EventHead
	TaskID  string    `json:"taskId"`
	Kind    EventKind `json:"kind"`
	Task    *Task     `json:"task"`
	Message *Message  `json:"message"`
	Final   bool      `json:"final"`
	From    string    `json:"from"`
}

// eventNote is a notification as DecodeEvent reads it.
type eventNote struct {
	Method string      `json:"method"`
	Params eventParams `json:"params"`
}

// DecodeEvent decodes a notification from the broker, in one pass.
func DecodeEvent(raw []byte) (*Event, error) {
	var n eventNote // read by the codec, it stays on the stack
	d := newDecoder(raw)
	d.decEventNote(&n)
	ok := d.end()
	d.release()
	if !ok {
		lib := new(eventNote)
		if err := libraryUnmarshal(raw, lib); err != nil {
			return nil, err
		}
		n = *lib
	}
	p := &n.Params
	ev := &Event{Method: n.Method}
	switch n.Method {
	case NotifyTaskEvent:
		ev.TaskEvent = &TaskEvent{EventHead: p.EventHead, TaskID: p.TaskID, Kind: p.Kind, Task: p.Task, Message: p.Message, Final: p.Final}
	case NotifyPush:
		ev.Push = &Push{EventHead: p.EventHead, From: p.From, Message: p.Message}
	default:
		return nil, fieldErr("method", "unknown notification %s", Quote(n.Method))
	}
	return ev, nil
}

// AdminInfo is the result of a2a.admin.info.
type AdminInfo struct {
	Version       string  `json:"version"`
	Epoch         string  `json:"epoch"`
	Bus           string  `json:"bus"`
	StartedAt     Time    `json:"startedAt"`
	UptimeSeconds float64 `json:"uptimeSeconds"`
	Agents        int     `json:"agents"`
	Sessions      int     `json:"sessions"`
	OpenTasks     int     `json:"openTasks"`
}

// AdminAgents is the result of a2a.admin.agents: the live agents, by
// agentId, a page at a time.
type AdminAgents struct {
	Agents []AgentCard `json:"agents"`
	Page
}

// AdminTask is one open task in a2a.admin.tasks.
type AdminTask struct {
	ID             string `json:"id"`
	State          State  `json:"state"`
	ContextID      string `json:"contextId"`
	RequesterName  string `json:"requesterName"`
	AgentName      string `json:"agentName"`
	AgentContextID string `json:"agentContextId"`
	UpdatedAt      Time   `json:"updatedAt"`
}

// AdminTasks is the result of a2a.admin.tasks: the open tasks, oldest
// first, a page at a time.
type AdminTasks struct {
	Open []AdminTask `json:"open"`
	Page
}

// AdminSession is one session in a2a.admin.sessions.
type AdminSession struct {
	ContextID string `json:"contextId"`
	Agents    int    `json:"agents"`
	LastSeq   uint64 `json:"lastSeq"`
	Kept      int    `json:"kept"`
	// Subscribers is the number of subscriptions receiving the session's
	// notifications; absent when the bus cannot tell (the pipe).
	Subscribers *int `json:"subscribers,omitempty"`
}

// AdminSessions is the result of a2a.admin.sessions: the sessions by
// contextId, a page at a time.
type AdminSessions struct {
	Epoch    string         `json:"epoch"`
	Sessions []AdminSession `json:"sessions"`
	Page
}
