package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-bus/a2a-bus/internal/secret"
)

// A part's data is what a client's body holds most of, and of any shape:
// decoded by the SDK into Go values it costs tens of times its bytes, and
// its numbers pass through float64. So the gateway never decodes it. Before
// the SDK sees a SendMessage or SendStreamingMessage, liftData takes each
// part's data out of the body, as raw JSON, and leaves a placeholder
// string that only this request can name (a random nonce); landData puts
// the raw JSON back in the SDK's request, and the broker gets it byte for
// byte (PROTOCOL.md §12, Limits and Translation). Outbound, Part hands the
// SDK the broker's raw JSON too.

// liftedKey carries a request's lifted data, by placeholder.
type liftedKey struct{}

// liftable are the methods whose params hold a message with parts.
var liftable = map[string]bool{"SendMessage": true, "SendStreamingMessage": true}

// liftData returns body with the data of its message's parts replaced by
// placeholders, and the data by placeholder; body itself and nil when
// there is none, or the body is not a request with a message (the scan
// and the SDK then say what is wrong with it).
func liftData(body []byte) ([]byte, map[string]json.RawMessage) {
	if !bytes.Contains(body, []byte(`"data"`)) {
		return body, nil
	}
	var top map[string]json.RawMessage
	var method string
	if json.Unmarshal(body, &top) != nil || json.Unmarshal(top["method"], &method) != nil || !liftable[method] {
		return body, nil
	}
	var params, msg map[string]json.RawMessage
	var parts []map[string]json.RawMessage
	if json.Unmarshal(top["params"], &params) != nil || json.Unmarshal(params["message"], &msg) != nil ||
		json.Unmarshal(msg["parts"], &parts) != nil {
		return body, nil
	}
	nonce := secret.Hex(8)
	lifted := map[string]json.RawMessage{}
	for i, p := range parts {
		data, ok := p["data"]
		if !ok || !utf8.Valid(data) {
			// Not valid UTF-8 (which the broker refuses): left to the SDK,
			// which makes it U+FFFD.
			continue
		}
		key := fmt.Sprintf("\x00a2a-bus data %s %d", nonce, i)
		p["data"], _ = json.Marshal(key)
		lifted[key] = data
	}
	if len(lifted) == 0 {
		return body, nil
	}
	var err error
	if msg["parts"], err = json.Marshal(parts); err != nil {
		return body, nil
	}
	if params["message"], err = json.Marshal(msg); err != nil {
		return body, nil
	}
	if top["params"], err = json.Marshal(params); err != nil {
		return body, nil
	}
	out, err := json.Marshal(top)
	if err != nil {
		return body, nil
	}
	return out, lifted
}

func withLifted(ctx context.Context, lifted map[string]json.RawMessage) context.Context {
	return context.WithValue(ctx, liftedKey{}, lifted)
}

// landData puts the data liftData took out of the request's body back in
// the SDK's request, as raw JSON.
func landData(ctx context.Context, req *a2a.SendMessageRequest) {
	lifted, _ := ctx.Value(liftedKey{}).(map[string]json.RawMessage)
	if lifted == nil || req == nil || req.Message == nil {
		return
	}
	for _, p := range req.Message.Parts {
		if p == nil {
			continue
		}
		if d, ok := p.Content.(a2a.Data); ok {
			if key, ok := d.Value.(string); ok {
				if raw, ok := lifted[key]; ok {
					p.Content = a2a.Data{Value: raw}
				}
			}
		}
	}
}
