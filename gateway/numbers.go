package gateway

import (
	"bytes"
	"context"
	"encoding/json"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

// Numbers travel as written (docs/PROTOCOL.md §12, Translation). The SDK
// decodes a part's data and every metadata into map[string]any with
// float64 numbers: 9007199254740993 would reach the broker as
// 9007199254740992. So the gateway keeps the body of a request whose
// numbers a float64 would not carry (scanBody: inexact), decodes its
// message's data and metadata again with json.Number, and puts those
// values in the SDK's request (exactNumbers) before it turns it into an
// a2a-bus message. Outbound, Part and decodeMeta decode with json.Number,
// which the SDK encodes as written.

// exactKey carries the body of a request with inexact numbers.
type exactKey struct{}

func withExact(ctx context.Context, body []byte) context.Context {
	return context.WithValue(ctx, exactKey{}, body)
}

// exactRequest is what of a SendMessageRequest holds numbers, with the
// SDK's field names (encoding/json matches them as the SDK does).
type exactRequest struct {
	Params struct {
		Message *struct {
			Parts []*struct {
				Data     *any           `json:"data"`
				Metadata map[string]any `json:"metadata"`
			} `json:"parts"`
			Metadata map[string]any `json:"metadata"`
		} `json:"message"`
		Metadata map[string]any `json:"metadata"`
	} `json:"params"`
}

// exactNumbers replaces, in req, the data of its message's parts and its
// metadata (of the parts, the message, the request) with their values as
// the client wrote them, when the request's body had numbers a float64
// would not carry. What does not match the SDK's request part for part
// is left as the SDK decoded it.
func exactNumbers(ctx context.Context, req *a2a.SendMessageRequest) {
	body, _ := ctx.Value(exactKey{}).([]byte)
	if body == nil || req == nil || req.Message == nil {
		return
	}
	var x exactRequest
	if unmarshalNumbers(body, &x) != nil || x.Params.Message == nil {
		return
	}
	if req.Metadata != nil && x.Params.Metadata != nil {
		req.Metadata = x.Params.Metadata
	}
	m, xm := req.Message, x.Params.Message
	if m.Metadata != nil && xm.Metadata != nil {
		m.Metadata = xm.Metadata
	}
	if len(xm.Parts) != len(m.Parts) {
		return
	}
	for i, p := range m.Parts {
		xp := xm.Parts[i]
		if p == nil || xp == nil {
			continue
		}
		if _, ok := p.Content.(a2a.Data); ok && xp.Data != nil {
			p.Content = a2a.Data{Value: *xp.Data}
		}
		if p.Metadata != nil && xp.Metadata != nil {
			p.Metadata = xp.Metadata
		}
	}
}

// unmarshalNumbers is json.Unmarshal with json.Number for numbers.
func unmarshalNumbers(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	return d.Decode(v)
}
