package wire_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/a2a-bus/a2a-bus/wire"
)

// FuzzParseRequest: any bytes are a request or one of the protocol's
// errors, never a panic; what parses has a method and object-or-raw
// params, and its id, when present, is a string, number or null.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"a2a.agents.list","params":{"token":"t"}}`,
		`{"jsonrpc":"2.0","method":"a2a.push"}`, `{"jsonrpc":"2.0","id":null,"method":"m","params":[]}`,
		`[{"jsonrpc":"2.0","id":1,"method":"m"}]`, `{"ID":1,"jsonrpc":"2.0","method":"m"}`, "\xff", `{"a":`, `"x"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		req, perr := wire.ParseRequest(raw, 4096)
		if perr != nil {
			switch perr.Code {
			case -32700, -32600:
			default:
				t.Fatalf("unexpected code %d for %q", perr.Code, raw)
			}
			if req != nil {
				t.Fatal("both a request and an error")
			}
			return
		}
		if req.Method == "" || req.Params == nil {
			t.Fatalf("parsed without method or params: %+v", req)
		}
		if req.ID != nil {
			var id any
			if err := json.Unmarshal(req.ID, &id); err != nil {
				t.Fatalf("id %q is not JSON", req.ID)
			}
			switch id.(type) {
			case string, float64, nil:
			default:
				t.Fatalf("id %q of a forbidden type", req.ID)
			}
		}
		if len(raw) > 4096 {
			t.Fatal("over the limit yet parsed")
		}
	})
}

// FuzzValidate: decoding and validating a message, an artifact and a card
// never panics, and what is valid stays valid once encoded and decoded
// again.
func FuzzValidate(f *testing.F) {
	for _, s := range []string{
		`{"parts":[{"kind":"text","text":"hi"}]}`,
		`{"parts":[{"kind":"data","data":null,"metadata":{}}]}`,
		`{"parts":[{"kind":"file","file":{"name":"a","bytes":"aGk="}}],"metadata":null}`,
		`{"parts":[{"kind":"file","file":{"uri":"x","bytes":"aGk="}}]}`,
		`{"name":"discussant","skills":[{"id":"s","tags":["a"]}],"metadata":{"k":1}}`,
		`{"parts":[]}`, `{"name":"a b"}`, `{"parts":[{"kind":"text","text":"x","data":1}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var m wire.Message
		if json.Unmarshal(raw, &m) == nil && m.Validate("message") == nil {
			again := roundTrip(t, &m)
			if err := again.Validate("message"); err != nil {
				t.Fatalf("valid message %q is invalid after a round trip: %v", raw, err)
			}
		}
		var a wire.Artifact
		if json.Unmarshal(raw, &a) == nil && a.Validate("artifact") == nil {
			again := roundTrip(t, &a)
			if err := again.Validate("artifact"); err != nil {
				t.Fatalf("valid artifact %q is invalid after a round trip: %v", raw, err)
			}
		}
		var c wire.AgentCard
		if json.Unmarshal(raw, &c) == nil && c.Validate("card") == nil {
			again := roundTrip(t, &c)
			if err := again.Validate("card"); err != nil {
				t.Fatalf("valid card %q is invalid after a round trip: %v", raw, err)
			}
		}
	})
}

func roundTrip[T any](t *testing.T, v *T) *T {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("a valid value does not encode: %v", err)
	}
	var out T
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&out); err != nil {
		t.Fatalf("its encoding %s does not decode: %v", b, err)
	}
	return &out
}

// FuzzPeekID: wherever ParseRequest reads an id, PeekID reads the same.
func FuzzPeekID(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"m"}`, `{"id":"x\"y","method":"m","jsonrpc":"2.0","params":{"id":2}}`,
		`{"jsonrpc":"2.0","ID":1,"id":null,"method":"m"}`, `{"jsonrpc":"2.0","method":"m","params":[1,{"a":"}"}]}`,
		` { "id" : -1.5e3 , "jsonrpc":"2.0","method":"m" } `, `{"jsonrpc":"2.0","id":1,"id":2,"method":"m"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		req, err := wire.ParseRequest(raw, len(raw)+1)
		if err != nil {
			return
		}
		if got := wire.PeekID(raw); !bytes.Equal(got, req.ID) {
			t.Fatalf("PeekID(%q) = %q, ParseRequest's id = %q", raw, got, req.ID)
		}
	})
}

// FuzzResponseError: on every response this package encodes, the fast
// path tells a result from an error, and reads the error as it was sent.
// On anything else it does not panic.
func FuzzResponseError(f *testing.F) {
	f.Add([]byte(`7`), []byte(`{"a":",\"error\":"}`), -32040, "no task", []byte(`{}`))
	f.Add([]byte(`"x\"y"`), []byte(`[1,2]`), 0, "", []byte(`{"jsonrpc":"2.0","id":1,"result":{},"error":{}}`))
	f.Add([]byte(`null`), []byte(`"s"`), -32602, "message.parts[0]: …", []byte("\xff"))
	f.Fuzz(func(t *testing.T, id, result []byte, code int, message string, raw []byte) {
		_ = wire.ResponseError(raw)
		if !json.Valid(id) || !json.Valid(result) || !json.Valid([]byte(`{"id":`+string(id)+`}`)) {
			return
		}
		var v any
		if json.Unmarshal(id, &v) != nil {
			return
		}
		switch v.(type) {
		case string, float64, nil:
		default:
			return // not a JSON-RPC id
		}
		ok, err := wire.EncodeResult(json.RawMessage(id), json.RawMessage(result))
		if err != nil {
			return
		}
		if e := wire.ResponseError(ok); e != nil {
			t.Fatalf("result %q read as error %+v", ok, e)
		}
		message = strings.ToValidUTF8(message, "\uFFFD") // what JSON can carry
		sent := &wire.Error{Code: code, Message: message}
		resp := wire.ErrorResponse(json.RawMessage(id), sent)
		e := wire.ResponseError(resp)
		if e == nil || e.Code != code || e.Message != message {
			t.Fatalf("error response %q read as %+v", resp, e)
		}
	})
}

// FuzzParseRequestAgreesWithADecode: the top-level scan reads what a full
// decode of the object by exact member names reads, and accepts exactly
// what that decode accepts.
func FuzzParseRequestAgreesWithADecode(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"a2a.agents.list","params":{"token":"t"}}`,
		`{"jsonrpc":"2.0","method":"m","params":{"a":"}\"{"},"params":[1]}`, `{"jsonrpc":"2\u002e0","\u0069d":"x","method":"m\n"}`,
		` {"method" : "m" , "jsonrpc" : "2.0" , "id" : -0.5e-3 , "Params":{} } `, `{"jsonrpc":"2.0","id":1,"method":"m","params":null}`,
		`{"jsonrpc":"2.0","id":1,"method":"m","x":tru}`, `{"jsonrpc":"2.0","id":{},"method":"m"}`, `{"jsonrpc":"2.0","id":1,"method":"m\ud800"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		req, perr := wire.ParseRequest(raw, len(raw)+1)
		var m map[string]json.RawMessage
		trimmed := bytes.TrimLeft(raw, " \t\r\n")
		if len(trimmed) == 0 || trimmed[0] != '{' || json.Unmarshal(raw, &m) != nil {
			if req != nil {
				t.Fatalf("%q: parsed what a decode refuses", raw)
			}
			return
		}
		var version, method string
		okVersion := json.Unmarshal(m["jsonrpc"], &version) == nil && m["jsonrpc"] != nil && version == "2.0"
		okMethod := json.Unmarshal(m["method"], &method) == nil && m["method"] != nil && method != ""
		id := m["id"]
		okID := id == nil || strings.ContainsRune(`"n-0123456789`, rune(id[0]))
		if want := okVersion && okMethod && okID && utf8Valid(raw); want != (perr == nil) {
			t.Fatalf("%q: accepted %v, a decode says %v (error %v)", raw, perr == nil, want, perr)
		}
		if perr != nil {
			return
		}
		params := m["params"]
		if params == nil {
			params = json.RawMessage("{}")
		}
		if req.Method != method || !bytes.Equal(req.ID, id) || !bytes.Equal(req.Params, params) {
			t.Fatalf("%q: read id %q method %q params %q; a decode reads %q %q %q", raw, req.ID, req.Method, req.Params, id, method, params)
		}
	})
}

func utf8Valid(b []byte) bool { return strings.ToValidUTF8(string(b), "") == string(b) }
