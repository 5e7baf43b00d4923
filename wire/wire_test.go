package wire_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/wire"
)

func TestErrorTable(t *testing.T) {
	want := map[string]int{
		"A2A_UNKNOWN_TASK": -32001, "A2A_UNKNOWN_AGENT": -32040, "A2A_NO_PEERS": -32041,
		"A2A_AMBIGUOUS_PEER": -32042, "A2A_CROSS_CONTEXT_DENIED": -32043, "A2A_TASK_LIMIT": -32044,
		"A2A_UNAUTHORIZED": -32045, "A2A_INVALID_TRANSITION": -32046, "A2A_REPLAY_GAP": -32047,
		"A2A_AGENT_LIMIT": -32048, "A2A_BUSY": -32049,
		"PARSE_ERROR": -32700, "INVALID_REQUEST": -32600, "METHOD_NOT_FOUND": -32601,
		"INVALID_PARAMS": -32602, "INTERNAL_ERROR": -32603,
	}
	got := map[string]int{}
	for _, e := range wire.Codes {
		got[e.DataCode()] = e.Code
	}
	assert.Equal(t, want, got)
}

func TestErrorIsSurvivesTheWire(t *testing.T) {
	sent := wire.ErrAmbiguousPeer.Withf("two of them")
	sent.Data.Candidates = []string{"a", "b"}
	raw := wire.ErrorResponse(json.RawMessage("7"), sent)
	_, err := wire.DecodeResult(raw)
	require.Error(t, err)
	assert.ErrorIs(t, err, wire.ErrAmbiguousPeer)
	assert.NotErrorIs(t, err, wire.ErrNoPeers)
	assert.ErrorIs(t, fmt.Errorf("wrapped: %w", err), wire.ErrAmbiguousPeer)
	var we *wire.Error
	require.True(t, errors.As(err, &we))
	assert.Equal(t, []string{"a", "b"}, we.Data.Candidates)
	assert.Equal(t, "two of them", we.Message)
	// Withf leaves the sentinel alone.
	assert.Equal(t, "ambiguous peer", wire.ErrAmbiguousPeer.Message)
	assert.Nil(t, wire.ErrAmbiguousPeer.Data.Candidates)
}

func TestTimeIsRFC3339UTCWithMilliseconds(t *testing.T) {
	loc := time.FixedZone("X", 2*3600)
	tm := wire.NewTime(time.Date(2026, 9, 5, 14, 3, 4, 123456789, loc))
	b, err := json.Marshal(tm)
	require.NoError(t, err)
	assert.Equal(t, `"2026-09-05T12:03:04.123Z"`, string(b))
	zero := wire.NewTime(time.Date(2026, 9, 5, 12, 0, 0, 0, time.UTC))
	b, _ = json.Marshal(zero)
	assert.Equal(t, `"2026-09-05T12:00:00.000Z"`, string(b), "milliseconds always shown")
	var back wire.Time
	require.NoError(t, json.Unmarshal(b, &back))
	assert.True(t, back.Equal(zero.Time))
}

func TestPartEncodingKeepsPresence(t *testing.T) {
	empty := wire.TextPart("")
	b, err := json.Marshal(empty)
	require.NoError(t, err)
	assert.JSONEq(t, `{"kind":"text","text":""}`, string(b))
	var null wire.Part
	require.NoError(t, json.Unmarshal([]byte(`{"kind":"data","data":null}`), &null))
	require.NoError(t, null.Validate("p"))
	b, _ = json.Marshal(null)
	assert.JSONEq(t, `{"kind":"data","data":null}`, string(b))
	f := wire.FileBytesPart("a.bin", "application/octet-stream", []byte{0, 1, 2})
	require.NoError(t, f.Validate("p"))
	b, _ = json.Marshal(f)
	assert.JSONEq(t, `{"kind":"file","file":{"name":"a.bin","mimeType":"application/octet-stream","bytes":"AAEC"}}`, string(b))
}

func TestStates(t *testing.T) {
	for _, s := range wire.States {
		assert.True(t, s.Valid())
		assert.NotEqual(t, s.Open(), s.Terminal(), string(s))
	}
	assert.False(t, wire.State("done").Valid())
	assert.False(t, wire.State("done").Open())
	assert.False(t, wire.State("done").Terminal())
}

func TestDecodeNotificationHead(t *testing.T) {
	h, err := wire.DecodeNotificationHead([]byte(`{"jsonrpc":"2.0","method":"a2a.push","params":{"contextId":"old","seq":3}}`))
	require.NoError(t, err)
	assert.Equal(t, wire.NotificationHead{Method: "a2a.push", ContextID: "old", Seq: 3}, h, "an older producer's event has no recipientContextId")
	h, err = wire.DecodeNotificationHead([]byte(`{"jsonrpc":"2.0","method":"a2a.push","params":{"recipientContextId":"new","contextId":"old","epoch":"e"}}`))
	require.NoError(t, err)
	assert.Equal(t, wire.NotificationHead{Method: "a2a.push", RecipientContextID: "new", ContextID: "old", Epoch: "e"}, h)
}

func TestParamsMatchMembersByExactName(t *testing.T) {
	tests := []struct {
		name, params string
		want         wire.SendParams
	}{
		{"case variant ignored", `{"TOKEN":"t","To":"x"}`, wire.SendParams{}},
		{"exact wins over a later variant", `{"token":"t","Token":"zzz"}`, wire.SendParams{Token: "t"}},
		{"nested variant ignored", `{"token":"t","message":{"Parts":[{"kind":"text","text":"a"}],"parts":[{"kind":"text","text":"b","TEXT":"c"}]}}`,
			wire.SendParams{Token: "t", Message: &wire.Message{Parts: []wire.Part{wire.TextPart("b")}}}},
		{"escaped name is still exact", `{"\u0074oken":"t"}`, wire.SendParams{Token: "t"}},
		{"escaped variant ignored", `{"\u0054oken":"t"}`, wire.SendParams{}},
		{"Kelvin sign does not fold into k", `{"tas\u212aId":"x","token":"t"}`, wire.SendParams{Token: "t"}},
		{"client data keeps its members", `{"token":"t","metadata":{"Token":1,"TO":2}}`, wire.SendParams{Token: "t", Metadata: json.RawMessage(`{"Token":1,"TO":2}`)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got wire.SendParams
			require.Nil(t, wire.DecodeParams(json.RawMessage(tc.params), &got))
			if tc.want.Message == nil {
				assert.Nil(t, got.Message)
			} else {
				require.NotNil(t, got.Message)
				require.Len(t, got.Message.Parts, len(tc.want.Message.Parts))
				for i := range tc.want.Message.Parts {
					assert.Equal(t, *tc.want.Message.Parts[i].Text, *got.Message.Parts[i].Text)
				}
				got.Message, tc.want.Message = nil, nil
			}
			if tc.want.Metadata != nil {
				assert.JSONEq(t, string(tc.want.Metadata), string(got.Metadata))
				got.Metadata, tc.want.Metadata = nil, nil
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestQuoteCutsOnACharacterBoundary(t *testing.T) {
	// 79 ASCII bytes then a 3-byte character straddling byte 80.
	long := strings.Repeat("a", 79) + "€€€"
	q := wire.Quote(long)
	unq, err := strconv.Unquote(q)
	require.NoError(t, err)
	assert.True(t, utf8.ValidString(unq), "%q", unq)
	assert.Equal(t, strings.Repeat("a", 79)+"…", unq)

	assert.Equal(t, `"a\"b\n"`, wire.Quote("a\"b\n"), "quotes and control characters are escaped")
	assert.Equal(t, `"short"`, wire.Quote("short"))
}

func TestResponseErrorTellsErrorsFromResults(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	ok, err := wire.EncodeResult(json.RawMessage(`"id-1"`), map[string]string{"text": `,"error":{"code":1}` + big})
	require.NoError(t, err)
	assert.Nil(t, wire.ResponseError(ok), "a result, even one that mentions an error")

	for _, id := range []string{`7`, `"a,b}"`, `null`} {
		resp := wire.ErrorResponse(json.RawMessage(id), wire.ErrUnknownTask.Withf("no task"))
		e := wire.ResponseError(resp)
		require.NotNil(t, e, id)
		assert.Equal(t, wire.ErrUnknownTask.Code, e.Code)
		assert.Equal(t, "no task", e.Message)
	}
	// Another layout takes the slow path to the same answer.
	e := wire.ResponseError([]byte(` { "error": {"code": -32601, "message": "m"}, "id": 1, "jsonrpc": "2.0" }`))
	require.NotNil(t, e)
	assert.Equal(t, -32601, e.Code)
	assert.Nil(t, wire.ResponseError([]byte(`{"id":1,"jsonrpc":"2.0","result":{}}`)))
	assert.Nil(t, wire.ResponseError([]byte(`not json`)))
}

func TestARequestNestsAtMostMaxDepthLevels(t *testing.T) {
	nest := func(levels int) []byte {
		// The envelope and params take two levels; data the rest.
		data := strings.Repeat("[", levels-2) + strings.Repeat("]", levels-2)
		return []byte(`{"jsonrpc":"2.0","id":1,"method":"m","params":{"data":` + data + `}}`)
	}
	_, perr := wire.ParseRequest(nest(wire.MaxDepth), 1<<20)
	assert.Nil(t, perr, "MaxDepth levels are fine")
	_, perr = wire.ParseRequest(nest(wire.MaxDepth+1), 1<<20)
	require.NotNil(t, perr)
	assert.Equal(t, wire.ErrInvalidRequest.Code, perr.Code)
	assert.Contains(t, perr.Message, "deeper than")
	// Brackets inside strings do not count.
	deepText := `{"jsonrpc":"2.0","id":1,"method":"m","params":{"text":"` + strings.Repeat("[{", 5000) + `\"` + `"}}`
	_, perr = wire.ParseRequest([]byte(deepText), 1<<20)
	assert.Nil(t, perr)
}

// TestCloneSharesNothing: a task's clone can be changed through every
// pointer and slice it holds without changing the task.
func TestCloneSharesNothing(t *testing.T) {
	texts := []string{"a", "b", "c"}
	file, uri := "aGk=", "https://example.com/f" // both set: Clone copies what it is given
	msg := func() wire.Message {
		return wire.Message{MessageID: "m", Metadata: []byte(`{"k":1}`), Parts: []wire.Part{
			{Kind: wire.KindText, Text: &texts[0]}, {Kind: wire.KindData, Data: []byte(`[1]`)},
			{Kind: wire.KindText, Text: &texts[1]}, {Kind: wire.KindFile, File: &wire.File{Bytes: &file, URI: &uri}}, {Kind: wire.KindText, Text: &texts[2]},
		}}
	}
	status := msg()
	task := &wire.Task{ID: "t", Status: wire.TaskStatus{State: wire.StateWorking, Message: &status}, History: []wire.Message{msg(), msg()},
		Artifacts: []wire.Artifact{{ArtifactID: "a", Parts: msg().Parts, Metadata: []byte(`{}`)}}, Metadata: []byte(`{"z":2}`)}
	want, err := json.Marshal(task)
	require.NoError(t, err)
	c := task.Clone()
	var into wire.Task
	task.CloneInto(&into)
	for _, c := range []*wire.Task{c, &into} {
		require.Equal(t, task, c)
		tamper := func(m *wire.Message) {
			m.MessageID = "x"
			m.Metadata[0] = 'X'
			for i := range m.Parts {
				p := &m.Parts[i]
				if p.Text != nil {
					*p.Text = "tampered"
				}
				if p.Data != nil {
					p.Data[0] = 'X'
				}
				if p.File != nil {
					p.File.Name = "x"
					*p.File.Bytes = "tampered"
					*p.File.URI = "tampered"
				}
			}
		}
		tamper(c.Status.Message)
		for i := range c.History {
			tamper(&c.History[i])
		}
		tamper(&wire.Message{Parts: c.Artifacts[0].Parts, Metadata: c.Artifacts[0].Metadata})
		c.Metadata[0] = 'X'
		got, err := json.Marshal(task)
		require.NoError(t, err)
		assert.JSONEq(t, string(want), string(got), "the clone shares something with the task")
	}
}

// TestParamsMustBeAnObject: a send or an update whose params are not an
// object is -32602, whichever way its params are read.
func TestParamsMustBeAnObject(t *testing.T) {
	for _, method := range []string{wire.MethodSend, wire.MethodUpdateTask, wire.MethodGetTask} {
		for _, params := range []string{`null`, `[]`, `"x"`, `1`} {
			raw := `{"jsonrpc":"2.0","id":1,"method":"` + method + `","params":` + params + `}`
			req, perr := wire.ParseRequest([]byte(raw), 0)
			require.Nil(t, perr, raw)
			var v any = &wire.SendParams{}
			if method == wire.MethodUpdateTask {
				v = &wire.UpdateParams{}
			}
			werr := req.DecodeParams(v)
			require.NotNil(t, werr, raw)
			assert.Equal(t, wire.ErrInvalidParams.Code, werr.Code, raw)
			assert.Equal(t, "params must be an object", werr.Message, raw)
		}
	}
}
