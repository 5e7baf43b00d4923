package wire_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/a2a-bus/a2a-bus/wire"
)

// TestValidationNamesTheFieldAtFault: each check's error, word for word,
// with the path of the member at fault (docs/PROTOCOL.md, errors).
func TestValidationNamesTheFieldAtFault(t *testing.T) {
	text, bad, good := "hi", "not base64!", "aGk="
	ok := wire.Part{Kind: wire.KindText, Text: &text}
	msg := func(parts ...wire.Part) *wire.Message { return &wire.Message{Parts: parts} }
	for _, c := range []struct {
		check func() error
		want  string // "" for no error
	}{
		{func() error { return msg(ok).Validate("message") }, ""},
		{func() error { return msg().Validate("message") }, "message.parts: needs at least one part"},
		{func() error { return msg(make([]wire.Part, wire.MaxParts+1)...).Validate("message") }, "message.parts: has 1001 parts; at most 1000"},
		{func() error { return msg(ok, wire.Part{Text: &text}).Validate("message") }, "message.parts[1].kind: required (text, data or file)"},
		{func() error { return msg(ok, ok, wire.Part{Kind: "image"}).Validate("message") }, `message.parts[2].kind: must be text, data or file (got "image")`},
		{func() error { return msg(wire.Part{Kind: wire.KindText}).Validate("message") }, `message.parts[0]: a text part has exactly the member "text" (has none)`},
		{func() error { return msg(wire.Part{Kind: wire.KindData, Text: &text}).Validate("message") }, `message.parts[0]: a data part has exactly the member "data" (has text)`},
		{func() error {
			return msg(wire.Part{Kind: wire.KindText, Text: &text, Data: json.RawMessage(`1`), File: &wire.File{}}).Validate("message")
		}, `message.parts[0]: a text part has exactly the member "text" (has text, data, file)`},
		{func() error { return msg(wire.Part{Kind: wire.KindFile, File: &wire.File{}}).Validate("message") }, "message.parts[0].file: needs exactly one of bytes and uri"},
		{func() error {
			return msg(wire.Part{Kind: wire.KindFile, File: &wire.File{Bytes: &good, URI: &good}}).Validate("message")
		}, "message.parts[0].file: needs exactly one of bytes and uri"},
		{func() error {
			return msg(wire.Part{Kind: wire.KindFile, File: &wire.File{Bytes: &bad}}).Validate("message")
		}, "message.parts[0].file.bytes: must be standard base64 with padding"},
		{func() error {
			return msg(wire.Part{Kind: wire.KindFile, File: &wire.File{Bytes: &good}}).Validate("message")
		}, ""},
		{func() error {
			return msg(ok, wire.Part{Kind: wire.KindText, Text: &text, Metadata: json.RawMessage(`[]`)}).Validate("message")
		}, "message.parts[1].metadata: must be an object"},
		{func() error {
			return (&wire.Message{Parts: []wire.Part{ok}, Metadata: json.RawMessage(` null`)}).Validate("message")
		}, ""},
		{func() error {
			return (&wire.Message{Parts: []wire.Part{ok}, Metadata: json.RawMessage(`"x"`)}).Validate("message")
		}, "message.metadata: must be an object"},
		{func() error {
			return (&wire.Message{Parts: []wire.Part{ok}, Metadata: json.RawMessage(` `)}).Validate("message")
		}, "message.metadata: must be an object"},
		{func() error {
			return (&wire.Message{Parts: []wire.Part{ok}, MessageID: strings.Repeat("m", wire.MaxIDBytes+1)}).Validate("message")
		}, "message.messageId: longer than 256 bytes"},
		{func() error { return (&wire.Artifact{}).Validate("artifacts[3]") }, "artifacts[3].parts: needs at least one part"},
		{func() error { return (&wire.Artifact{Parts: []wire.Part{{Kind: "x"}}}).Validate("artifacts[3]") }, `artifacts[3].parts[0].kind: must be text, data or file (got "x")`},
		{func() error {
			return (&wire.Artifact{Parts: []wire.Part{ok}, Metadata: json.RawMessage(`1`)}).Validate("artifacts[3]")
		}, "artifacts[3].metadata: must be an object"},
		{func() error { return (&wire.AgentCard{Name: "a", Metadata: json.RawMessage(`1`)}).Validate("card") }, "card.metadata: must be an object"},
		{func() error { return (&wire.Part{Kind: wire.KindData}).Validate("part") }, `part: a data part has exactly the member "data" (has none)`},
		{func() error {
			return (&wire.Part{Kind: wire.KindData, Data: json.RawMessage(`{}`), Metadata: json.RawMessage(`0`)}).Validate("part")
		}, "part.metadata: must be an object"},
	} {
		err := c.check()
		if c.want == "" {
			assert.NoError(t, err)
		} else if assert.Error(t, err, c.want) {
			assert.Equal(t, c.want, err.Error())
		}
	}
}

// TestAValidMessageCostsNoAllocation: the paths of the members are made
// only for an error. (A file's bytes are decoded to be checked: that
// costs their decoding.)
func TestAValidMessageCostsNoAllocation(t *testing.T) {
	text, uri := "hi", "https://example.com/f"
	m := &wire.Message{MessageID: "m-1", Metadata: json.RawMessage(`{}`), Parts: []wire.Part{
		{Kind: wire.KindText, Text: &text},
		{Kind: wire.KindData, Data: json.RawMessage(`{"a":1}`), Metadata: json.RawMessage(`{}`)},
		{Kind: wire.KindFile, File: &wire.File{Name: "f", URI: &uri}},
	}}
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		if err := m.Validate("message"); err != nil {
			t.Fatal(err)
		}
	}))
}
