package main_test

// This test is a host written from the protocol document alone, with a
// plain nats.go client: it imports nothing of the project but the helper
// that builds the command. It computes subject tokens itself.

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var plain = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

func token(session string) string {
	if plain.MatchString(session) {
		return session
	}
	return "~" + base64.RawURLEncoding.EncodeToString([]byte(session))
}

type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    struct {
		Code string `json:"code"`
	} `json:"data"`
}

func (e *rpcError) Error() string { return fmt.Sprintf("%s: %s", e.Data.Code, e.Message) }

var nextID int

// call sends one JSON-RPC request and decodes its result into out.
func call(t *testing.T, nc *nats.Conn, subject, method string, params, out any) *rpcError {
	t.Helper()
	nextID++
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": nextID, "method": method, "params": params})
	require.NoError(t, err)
	msg, err := nc.Request(subject, body, 5*time.Second)
	require.NoError(t, err)
	var resp struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      int             `json:"id"`
		Result  json.RawMessage `json:"result"`
		Error   *rpcError       `json:"error"`
	}
	require.NoError(t, json.Unmarshal(msg.Data, &resp))
	require.Equal(t, "2.0", resp.JSONRPC)
	require.Equal(t, nextID, resp.ID)
	if resp.Error != nil {
		return resp.Error
	}
	if out != nil {
		require.NoError(t, json.Unmarshal(resp.Result, out))
	}
	return nil
}

type event struct {
	Recipient          string `json:"recipient"`
	RecipientContextID string `json:"recipientContextId"`
	ContextID          string `json:"contextId"`
	Seq                uint64 `json:"seq"`
	Epoch              string `json:"epoch"`
	TaskID             string `json:"taskId"`
	Kind               string `json:"kind"`
	Final              bool   `json:"final"`
	Task               struct {
		Status struct {
			State string `json:"state"`
		} `json:"status"`
	} `json:"task"`
	Message *struct {
		Parts []struct {
			Text string `json:"text"`
		} `json:"parts"`
	} `json:"message"`
}

// sessionRuntime is one chat session's connection, with the credential
// the host opened for it.
type sessionRuntime struct {
	id     string
	nc     *nats.Conn
	events *nats.Subscription
}

func (s *sessionRuntime) rpc() string { return "a2a.rpc." + token(s.id) }

func (s *sessionRuntime) next(t *testing.T) event {
	t.Helper()
	msg, err := s.events.NextMsg(10 * time.Second)
	require.NoError(t, err)
	var n struct {
		JSONRPC string `json:"jsonrpc"`
		Method  string `json:"method"`
		Params  event  `json:"params"`
	}
	require.NoError(t, json.Unmarshal(msg.Data, &n))
	require.Equal(t, "a2a.task.event", n.Method)
	return n.Params
}

func TestForeignHostRoundTripOverNATS(t *testing.T) {
	b := startServe(t)
	host, err := nats.Connect(b.conn.URL, nats.Token(b.conn.Token))
	require.NoError(t, err)
	defer host.Close()

	open := func(session string) *sessionRuntime {
		var creds struct{ URL, User, Password string }
		require.Nil(t, call(t, host, "a2a.host.rpc", "a2a.sessions.open", map[string]any{"contextId": session}, &creds))
		nc, err := nats.Connect(creds.URL, nats.UserInfo(creds.User, creds.Password), nats.CustomInboxPrefix("_INBOX."+token(session)))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		sub, err := nc.SubscribeSync("a2a.session." + token(session) + ".events")
		require.NoError(t, err)
		require.NoError(t, nc.Flush())
		return &sessionRuntime{id: session, nc: nc, events: sub}
	}
	chat1, chat2 := open("chat-1"), open("chat.2 (work)")

	type registered struct {
		AgentID, Token, InstanceID string
	}
	var d1, d2 registered
	card := map[string]any{"name": "discussant", "description": "takes a roundtable seat"}
	require.Nil(t, call(t, chat1.nc, chat1.rpc(), "a2a.agents.register", map[string]any{"contextId": chat1.id, "card": card}, &d1))
	require.Nil(t, call(t, chat2.nc, chat2.rpc(), "a2a.agents.register", map[string]any{"contextId": chat2.id, "card": card}, &d2))
	assert.Equal(t, "discussant", d1.AgentID)
	assert.Equal(t, "discussant-2", d2.AgentID)

	var list struct {
		Agents []struct{ AgentID, ContextID string }
	}
	require.Nil(t, call(t, chat1.nc, chat1.rpc(), "a2a.agents.list", map[string]any{"token": d1.Token}, &list))
	require.Len(t, list.Agents, 1)
	assert.Equal(t, "discussant-2", list.Agents[0].AgentID)
	assert.Equal(t, chat2.id, list.Agents[0].ContextID)

	// A session's token does not work from the other session's subject.
	e := call(t, chat2.nc, chat2.rpc(), "a2a.agents.list", map[string]any{"token": d1.Token}, nil)
	require.NotNil(t, e)
	assert.Equal(t, "A2A_UNAUTHORIZED", e.Data.Code)
	assert.Equal(t, -32045, e.Code)

	var sent struct {
		Task struct {
			ID, AgentName, AgentContextID string
		}
	}
	require.Nil(t, call(t, chat1.nc, chat1.rpc(), "a2a.message.send", map[string]any{
		"token":   d1.Token,
		"message": map[string]any{"parts": []any{map[string]any{"kind": "text", "text": "claim seat 3?"}}},
	}, &sent))
	assert.Equal(t, "discussant-2", sent.Task.AgentName)
	assert.Equal(t, chat2.id, sent.Task.AgentContextID)

	created := chat2.next(t)
	assert.Equal(t, "created", created.Kind)
	assert.Equal(t, "discussant-2", created.Recipient)
	assert.Equal(t, chat2.id, created.RecipientContextID)
	assert.Equal(t, chat1.id, created.ContextID)
	assert.Equal(t, uint64(1), created.Seq)
	assert.Equal(t, sent.Task.ID, created.TaskID)

	require.Nil(t, call(t, chat2.nc, chat2.rpc(), "a2a.tasks.update", map[string]any{
		"token": d2.Token, "taskId": created.TaskID, "state": "completed",
		"message": map[string]any{"parts": []any{map[string]any{"kind": "text", "text": "seat 3 is yours"}}},
	}, nil))

	woken := chat1.next(t)
	assert.Equal(t, "discussant", woken.Recipient)
	assert.Equal(t, chat1.id, woken.RecipientContextID)
	assert.Equal(t, "completed", woken.Task.Status.State)
	assert.True(t, woken.Final)
	require.NotNil(t, woken.Message)
	assert.Equal(t, "seat 3 is yours", woken.Message.Parts[0].Text)

	// Replay finds the same event by seq.
	var replay struct {
		Epoch   string
		LastSeq uint64
		Events  []json.RawMessage
	}
	require.Nil(t, call(t, chat1.nc, chat1.rpc(), "a2a.events.replay", map[string]any{"contextId": chat1.id, "epoch": woken.Epoch, "afterSeq": 0}, &replay))
	assert.Equal(t, uint64(1), replay.LastSeq)
	assert.Len(t, replay.Events, 1)

	// Nothing of chat-1's reached chat-2.
	_, err = chat2.events.NextMsg(100 * time.Millisecond)
	assert.ErrorIs(t, err, nats.ErrTimeout)
}
