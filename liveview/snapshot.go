package liveview

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/a2a-bus/a2a-bus/wire"
)

// Snapshot is what GET /api/snapshot answers: the broker as its admin
// methods show it.
type Snapshot struct {
	// At is when the view read it.
	At   wire.Time      `json:"at"`
	Info wire.AdminInfo `json:"info"`
	// Sessions, by contextId.
	Sessions []wire.AdminSession `json:"sessions"`
	// Agents are the live agents, by agentId.
	Agents []Agent `json:"agents"`
	// OpenTasks, oldest first: the requester (requesterName in
	// contextId) waits on the assignee (agentName in agentContextId).
	OpenTasks []wire.AdminTask `json:"openTasks"`
	// Truncated is set when a list stopped at MaxItems.
	Truncated bool `json:"truncated,omitempty"`
}

// Agent is a live agent as the page shows it.
type Agent struct {
	AgentID      string     `json:"agentId"`
	Name         string     `json:"name"`
	ContextID    string     `json:"contextId"`
	Description  string     `json:"description,omitempty"`
	RegisteredAt *wire.Time `json:"registeredAt,omitempty"`
}

// MaxItems bounds each list of a snapshot: a page cannot show more
// usefully, and the view reads no further.
const MaxItems = 5000

// snapshotFresh is how long a snapshot read serves the pages that ask
// while the view takes no notification. While notifications flow, a
// request that waited for a read to end takes that read's snapshot if it
// started after the request came: however many pages ask at once, one
// read serves them.
const snapshotFresh = 250 * time.Millisecond

// snapshots reads one snapshot at a time and keeps the last.
type snapshots struct {
	turn  chan struct{} // holds a token while a reader reads
	fresh time.Duration // snapshotFresh, but in tests
	body  []byte
	at    time.Time
	began time.Time // when the read of body began
	// Tests' hooks: came when a request has come, read when a read
	// begins (it may hold the read).
	came, read func()
	// changes counts the notifications the view took; a snapshot read
	// before the last one is not served again (a page that asks on a
	// "changed" hint gets what changed).
	changes   atomic.Uint64
	atChanges uint64
}

func newSnapshots() *snapshots { return &snapshots{turn: make(chan struct{}, 1), fresh: snapshotFresh} }

// snapshot returns the snapshot as JSON: the last one, if it is fresh,
// else a new one.
func (v *View) snapshot(ctx context.Context) ([]byte, error) {
	came := time.Now()
	if v.snap.came != nil {
		v.snap.came()
	}
	select {
	case v.snap.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-v.ctx.Done():
		return nil, ErrClosed
	}
	defer func() { <-v.snap.turn }()
	changes := v.snap.changes.Load()
	if v.snap.body != nil && (time.Since(v.snap.at) < v.snap.fresh && v.snap.atChanges == changes || !v.snap.began.Before(came)) {
		return v.snap.body, nil
	}
	began := time.Now()
	if v.snap.read != nil {
		v.snap.read()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(v.ctx, cancel)
	defer stop()
	s, err := v.readSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	v.snap.body, v.snap.at, v.snap.atChanges, v.snap.began = body, time.Now(), changes, began
	return body, nil
}

// readSnapshot asks the broker for a snapshot.
func (v *View) readSnapshot(ctx context.Context) (*Snapshot, error) {
	s := &Snapshot{At: wire.NewTime(time.Now()), Sessions: []wire.AdminSession{}, Agents: []Agent{}, OpenTasks: []wire.AdminTask{}}
	if err := v.call(ctx, wire.MethodAdminInfo, nil, &s.Info); err != nil {
		return nil, err
	}
	err := v.list(ctx, wire.MethodAdminSessions, func(raw json.RawMessage) (string, int, error) {
		var p wire.AdminSessions
		err := json.Unmarshal(raw, &p)
		s.Sessions = append(s.Sessions, p.Sessions...)
		return p.NextPageToken, len(s.Sessions), err
	})
	if err == errTruncated {
		s.Truncated = true
	} else if err != nil {
		return nil, err
	}
	err = v.list(ctx, wire.MethodAdminAgents, func(raw json.RawMessage) (string, int, error) {
		var p wire.AdminAgents
		err := json.Unmarshal(raw, &p)
		for _, c := range p.Agents {
			s.Agents = append(s.Agents, Agent{AgentID: c.AgentID, Name: c.Name, ContextID: c.ContextID, Description: textCut(c.Description), RegisteredAt: c.RegisteredAt})
		}
		return p.NextPageToken, len(s.Agents), err
	})
	if err == errTruncated {
		s.Truncated = true
	} else if err != nil {
		return nil, err
	}
	err = v.list(ctx, wire.MethodAdminTasks, func(raw json.RawMessage) (string, int, error) {
		var p wire.AdminTasks
		err := json.Unmarshal(raw, &p)
		s.OpenTasks = append(s.OpenTasks, p.Open...)
		return p.NextPageToken, len(s.OpenTasks), err
	})
	if err == errTruncated {
		s.Truncated = true
	} else if err != nil {
		return nil, err
	}
	s.Sessions, s.Agents, s.OpenTasks = s.Sessions[:min(len(s.Sessions), MaxItems)], s.Agents[:min(len(s.Agents), MaxItems)], s.OpenTasks[:min(len(s.OpenTasks), MaxItems)]
	return s, nil
}

// errTruncated ends a list at MaxItems.
var errTruncated = fmt.Errorf("liveview: more than %d items", MaxItems)

// list reads the pages of an admin list until its end or MaxItems: page
// decodes one, keeps its items, and returns its nextPageToken and how
// many items are kept.
func (v *View) list(ctx context.Context, method string, page func(json.RawMessage) (string, int, error)) error {
	p := wire.PageParams{PageSize: wire.MaxPageSize}
	for {
		var raw json.RawMessage
		if err := v.call(ctx, method, p, &raw); err != nil {
			return err
		}
		next, n, err := page(raw)
		if err != nil {
			return fmt.Errorf("%s: %w", method, err)
		}
		if next == "" {
			return nil
		}
		if n >= MaxItems {
			return errTruncated
		}
		p.PageToken = next
	}
}

// call makes one host call, within CallTimeout, and decodes its result.
func (v *View) call(ctx context.Context, method string, params, out any) error {
	ctx, cancel := context.WithTimeout(ctx, v.cfg.CallTimeout)
	defer cancel()
	raw, err := v.c.CallHost(ctx, method, params)
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	return nil
}

// textCut cuts a card's description as an entry's text is cut.
func textCut(s string) string {
	if len(s) <= MaxText {
		return s
	}
	return textOf(&wire.Message{Parts: []wire.Part{wire.TextPart(s)}})
}
