package wire_test

import (
	"bytes"
	"testing"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/wire"
)

// routeSeeds are notifications as the broker writes them, then lines whose
// route a decode reads in some other way than the first members say: a
// later "params" or "recipientContextId", spelled plainly or with
// escapes, and lines that are not JSON.
func routeSeeds(t testing.TB) [][]byte {
	text := "a <b> & \"c\"\n"
	head := wire.EventHead{Recipient: "discussant-2", RecipientContextID: "s-2", ContextID: "s-1", Seq: 7, Epoch: "e"}
	ev, err := wire.MarshalNotification(wire.NotifyTaskEvent, &wire.TaskEvent{EventHead: head, TaskID: "t", Kind: wire.EventCreated,
		Message: &wire.Message{MessageID: "m", Role: wire.RoleUser, Parts: []wire.Part{{Kind: wire.KindText, Text: &text}}}})
	require.NoError(t, err)
	push, err := wire.MarshalNotification(wire.NotifyPush, &wire.Push{EventHead: head, From: "discussant",
		Message: &wire.Message{MessageID: "m", Role: wire.RoleUser, Parts: []wire.Part{{Kind: wire.KindText, Text: &text}}}})
	require.NoError(t, err)
	seeds := [][]byte{ev, push}
	for _, s := range []string{
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a","recipientContextId":"b"}}`,
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a","recipient\u0043ontextId":"b"}}`,
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a"},"params":{"recipientContextId":"b"}}`,
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a"},"params":{}}`,
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a"},"p\u0061rams":{"recipient\u0043ontextId":"b"}}`,
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a","x":{"recipientContextId":"b"}}}`,
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a\u0062","contextId":"\u00e9"}}`,
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a","recipientContextId":null}}`,
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":""}}`,
		"{\"jsonrpc\":\"2.0\",\"method\":\"m\",\"params\":{\"recipientContextId\":\"\xff\"}}",
		`{"params":{"contextId":"c","data":[{"recipientContextId":"evil"}]},"method":"m"}`,
		`{"jsonrpc":"2.0","id":17,"result":{"task":{"contextId":"x"}}}`,
		` { "id" : "x\"y" , "ID" : 1 , "error" : {"code":-32700} } `,
		`{"method":"m","params":[1,2]}`, `{}`, `[]`, `{"a":"\"}"}`,
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a"`,
		`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a"},]`,
	} {
		seeds = append(seeds, []byte(s))
	}
	return seeds
}

// FuzzReadRouteIsADecode: on a JSON object, ReadRoute reads the route a
// decode by the library reads; on anything else it may read a route
// (which the receiver's decode refuses) or none, and never panics.
func FuzzReadRouteIsADecode(f *testing.F) {
	for _, s := range routeSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		r, ok := wire.ReadRoute(line)
		if !jsontext.Value(line).IsValid(jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)) {
			return
		}
		if trimmed := bytes.TrimLeft(line, " \t\r\n"); trimmed[0] != '{' {
			require.False(t, ok, "a route read of %q", line)
			return
		}
		require.True(t, ok, "no route read of the object %q", line)
		var full struct {
			ID     jsontext.Value `json:"id"`
			Method jsontext.Value `json:"method"`
			Params struct {
				RecipientContextID string `json:"recipientContextId"`
				ContextID          string `json:"contextId"`
			} `json:"params"`
		}
		if wire.LibraryUnmarshal(line, &full) != nil {
			return // params, or one of its two members, of another type: ignored, where a decode fails
		}
		session := full.Params.RecipientContextID
		if session == "" {
			session = full.Params.ContextID
		}
		assert.Equal(t, full.Method != nil, r.Notification, "method of %q", line)
		if r.Notification {
			assert.Equal(t, session, r.Session, "session of %q", line)
		} else {
			assert.Equal(t, []byte(full.ID), r.ID, "id of %q", line)
		}
	})
}

func TestReadRoute(t *testing.T) {
	seeds := routeSeeds(t)
	for _, tc := range []struct {
		line string
		want wire.Route
		ok   bool
	}{
		{string(seeds[0]), wire.Route{Notification: true, Session: "s-2"}, true},
		{string(seeds[1]), wire.Route{Notification: true, Session: "s-2"}, true},
		{string(seeds[2]), wire.Route{Notification: true, Session: "b"}, true},
		{string(seeds[3]), wire.Route{Notification: true, Session: "b"}, true},
		{string(seeds[4]), wire.Route{Notification: true, Session: "b"}, true},
		{string(seeds[5]), wire.Route{Notification: true, Session: "a"}, true},
		{string(seeds[6]), wire.Route{Notification: true, Session: "b"}, true},
		{string(seeds[7]), wire.Route{Notification: true, Session: "a"}, true},
		{string(seeds[8]), wire.Route{Notification: true, Session: "ab"}, true},
		{string(seeds[9]), wire.Route{Notification: true}, true},
		{`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a","recipientContextId":null,"contextId":"c"}}`, wire.Route{Notification: true, Session: "c"}, true},
		{`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a","x":"params"}}`, wire.Route{Notification: true, Session: "a"}, true},
		{`{"jsonrpc":"2.0","id":17,"result":{"task":{"contextId":"x"}}}`, wire.Route{ID: []byte("17")}, true},
		{`{"method":"m","params":{"recipientContextId":7,"contextId":"c"}}`, wire.Route{Notification: true, Session: "c"}, true},
		{`[]`, wire.Route{}, false},
		{`{"jsonrpc":"2.0","method":"m","params":{"recipientContextId":"a"`, wire.Route{}, false},
	} {
		r, ok := wire.ReadRoute([]byte(tc.line))
		assert.Equal(t, tc.ok, ok, tc.line)
		assert.Equal(t, tc.want, r, tc.line)
	}
}
