package gateway

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLiftedDataIsHandedOnAsWritten: a SendMessage's data parts leave the
// body before the SDK decodes it, and come back in the SDK's request as
// the client wrote them; the rest of the body is untouched in meaning. A
// client cannot name a placeholder of its own (they carry a nonce of the
// request), and data that is not valid UTF-8, or another method's, stays
// in the body.
func TestLiftedDataIsHandedOnAsWritten(t *testing.T) {
	forged := `"\u0000a2a-bus data 0000000000000000 1"`
	data := []string{`{"big":9007199254740993,"tags":["<a>",-0.1e-7],"deep":[[[{}]]]}`, `[{},{},{}]`, forged}
	body := `{"jsonrpc":"2.0","id":"r1","method":"SendMessage","params":{"message":{"messageId":"m1","role":"ROLE_USER","parts":[` +
		`{"data":` + data[0] + `},{"text":"between"},{"data":` + data[1] + `,"metadata":{"n":12345678901234567890}},{"data":` + data[2] + `}],` +
		`"metadata":{"k":"v"}},"metadata":{"r":1}}}`
	out, lifted := liftData([]byte(body))
	require.Len(t, lifted, 3)
	require.True(t, json.Valid(out))
	for _, d := range data[:2] {
		assert.NotContains(t, string(out), d, "the data left the body")
	}

	var req struct {
		Params a2a.SendMessageRequest `json:"params"`
	}
	require.NoError(t, json.Unmarshal(out, &req))
	landData(withLifted(context.Background(), lifted), &req.Params)
	parts := req.Params.Message.Parts
	require.Len(t, parts, 4)
	for i, want := range map[int]string{0: data[0], 2: data[1], 3: data[2]} {
		got, ok := parts[i].Content.(a2a.Data)
		require.True(t, ok, "part %d", i)
		raw, ok := got.Value.(json.RawMessage)
		require.True(t, ok, "part %d is raw JSON: %T", i, got.Value)
		assert.Equal(t, want, string(raw), "part %d as written", i)
	}
	assert.Equal(t, a2a.Text("between"), parts[1].Content)
	assert.Equal(t, map[string]any{"k": "v"}, req.Params.Message.Metadata)
	assert.Contains(t, string(out), `12345678901234567890`, "the rest keeps what it had")

	// A forged placeholder in a request of its own is no placeholder.
	_, lifted = liftData([]byte(strings.Replace(body, `{"data":`+data[0]+`},`, "", 1)))
	require.Len(t, lifted, 2)
	for key := range lifted {
		assert.NotEqual(t, "\x00a2a-bus data 0000000000000000 1", key)
	}

	for name, in := range map[string]string{
		"another method": strings.Replace(body, `"SendMessage"`, `"GetTask"`, 1),
		"not UTF-8":      `{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"parts":[{"data":"` + "\xff" + `"}]}}}`,
		"not JSON":       `{"method":"SendMessage","params":{"message":{"parts":[{"data":1}]}}`,
		"no parts":       `{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"data":1}}`,
	} {
		out, lifted := liftData([]byte(in))
		assert.Nil(t, lifted, name)
		assert.Equal(t, in, string(out), name)
	}
}
