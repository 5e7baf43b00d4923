package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/wire"
)

// post sends a JSON-RPC body to the agent's endpoint and returns the
// answer's body.
func (e *env) post(agent string, body []byte) []byte { return e.postAs(token, agent, body) }

// postAs is post with that bearer token.
func (e *env) postAs(tok, agent string, body []byte) []byte {
	resp, err := (&http.Client{Transport: bearer{tok}}).Post(e.base+"/agents/"+agent, "application/json", bytes.NewReader(body))
	require.NoError(e.t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return out
}

// exact is JSON whose numbers a float64 would change.
const exact = `{"big":9007199254740993,"u":12345678901234567890,"f":-0.1e-7,"nested":[{"x":[9007199254740993,-0.1e-7]},[12345678901234567890]]}`

var exactNumbers = []string{"9007199254740993", "12345678901234567890", "-0.1e-7"}

func TestNumbersTravelAsWritten(t *testing.T) {
	e := newEnv(t)
	d := e.delegate("chat-1", "scribe")
	sendBody := func(method string) []byte {
		return []byte(`{"jsonrpc":"2.0","id":1,"method":"` + method + `","params":{"metadata":{"r":` + exact + `},` +
			`"configuration":{"returnImmediately":true},"message":{"messageId":"m-` + method + `","role":"ROLE_USER","metadata":{"m":` + exact + `},` +
			`"parts":[{"text":"hi"},{"data":` + exact + `,"metadata":{"p":` + exact + `}}]}}}`)
	}
	send := func(method string) []byte { return e.post(d.ID(), sendBody(method)) }
	contains := func(what string, b []byte, n int) {
		for _, num := range exactNumbers {
			assert.GreaterOrEqual(t, strings.Count(string(b), num), n, "%s keeps %s as written: %s", what, num, b)
		}
		// As numbers, not inside an id (a task's id is random hex).
		assert.NotRegexp(t, `[:,\[]9007199254740992\b`, string(b), what)
		assert.NotRegexp(t, `[:,\[]-1e-0?8\b`, string(b), what)
	}
	// Inbound: what the delegate reads is what the client wrote.
	out := send("SendMessage")
	ev, err := d.Wait(ctxT(t))
	require.NoError(t, err)
	task, err := d.Task(ctxT(t), ev.Task.TaskID)
	require.NoError(t, err)
	require.Len(t, task.History, 1)
	m := task.History[0]
	require.Len(t, m.Parts, 2)
	contains("the data part", m.Parts[1].Data, 2)
	contains("the part's metadata", m.Parts[1].Metadata, 2)
	contains("the message's metadata", m.Metadata, 2)
	contains("the request's metadata (the task's)", task.Metadata, 2)
	// Outbound: the send's answer, GetTask, a stream, an artifact.
	contains("the SendMessage answer", out, 8)
	_, err = d.Update(ctxT(t), task.ID, wire.StateWorking, nil, wire.Artifact{Name: "a", Metadata: []byte(`{"a":` + exact + `}`),
		Parts: []wire.Part{{Kind: wire.KindData, Data: []byte(exact)}}})
	require.NoError(t, err)
	got := e.post(d.ID(), []byte(`{"jsonrpc":"2.0","id":2,"method":"GetTask","params":{"id":"`+task.ID+`"}}`))
	contains("GetTask", got, 12)
	// A stream's first event is the task, with the message.
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.base+"/agents/"+d.ID(), bytes.NewReader(sendBody("SendStreamingMessage")))
	require.NoError(t, err)
	resp, err := e.http.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	rd := bufio.NewReaderSize(resp.Body, 1<<16)
	line := ""
	for !strings.HasPrefix(line, "data:") {
		line, err = rd.ReadString('\n')
		require.NoError(t, err)
	}
	contains("the stream", []byte(line), 8)
}
