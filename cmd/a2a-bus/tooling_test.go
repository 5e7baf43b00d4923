package main_test

import (
	"encoding/json"
	"errors"
	"os/exec"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/internal/testbin"
)

// TestNATSToolingSeesTheBroker: the official NATS CLI, built from its
// module, lists a running serve as a service, with its two endpoints and
// the requests, errors and time it served, the session's requests (served
// on their own connections) included.
func TestNATSToolingSeesTheBroker(t *testing.T) {
	b := startServe(t)
	host, err := nats.Connect(b.conn.URL, nats.Token(b.conn.Token))
	require.NoError(t, err)
	defer host.Close()
	var creds struct{ URL, User, Password string }
	require.Nil(t, call(t, host, "a2a.host.rpc", "a2a.sessions.open", map[string]any{"contextId": "chat-1"}, &creds))
	sess, err := nats.Connect(creds.URL, nats.UserInfo(creds.User, creds.Password), nats.CustomInboxPrefix("_INBOX.chat-1"))
	require.NoError(t, err)
	defer sess.Close()
	card := map[string]any{"name": "discussant"}
	require.Nil(t, call(t, sess, "a2a.rpc.chat-1", "a2a.agents.register", map[string]any{"contextId": "chat-1", "card": card}, nil))
	e := call(t, sess, "a2a.rpc.chat-1", "a2a.no.such.method", map[string]any{}, nil)
	require.NotNil(t, e)

	cli := testbin.Tool(t, "github.com/nats-io/natscli/nats")
	run := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command(cli, append([]string{"--no-context", "--server", b.conn.URL, "--token", b.conn.Token}, args...)...)
		cmd.Env = testEnv(t)
		out, err := cmd.Output()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("nats %v: %v\n%s", args, err, exit.Stderr)
		}
		require.NoError(t, err)
		return out
	}

	var infos []micro.Info
	require.NoError(t, json.Unmarshal(run("micro", "ls", "--json"), &infos))
	require.Len(t, infos, 1, "one broker")
	info := infos[0]
	assert.Equal(t, "a2a-bus", info.Name)
	assert.NotEmpty(t, info.ID)
	assert.Regexp(t, `^\d+\.\d+\.\d+`, info.Version)
	subjects := map[string]string{}
	for _, ep := range info.Endpoints {
		subjects[ep.Name] = ep.Subject
	}
	assert.Equal(t, map[string]string{"session": "a2a.rpc.*", "host": "a2a.host.rpc"}, subjects, "the subjects of docs/PROTOCOL.md")
	assert.Contains(t, string(run("micro", "ls")), "a2a-bus", "the table lists it too")

	var stats []micro.Stats
	require.NoError(t, json.Unmarshal(run("micro", "stats", "a2a-bus", "--json"), &stats))
	require.Len(t, stats, 1)
	byName := map[string]*micro.EndpointStats{}
	for _, ep := range stats[0].Endpoints {
		byName[ep.Name] = ep
	}
	require.Contains(t, byName, "session")
	require.Contains(t, byName, "host")
	assert.Equal(t, 2, byName["session"].NumRequests, "a register and an unknown method")
	assert.Equal(t, 1, byName["session"].NumErrors)
	assert.Contains(t, byName["session"].LastError, "-32601")
	assert.Positive(t, byName["session"].ProcessingTime)
	assert.Equal(t, 1, byName["host"].NumRequests, "a2a.sessions.open")
	assert.Zero(t, byName["host"].NumErrors)
}
