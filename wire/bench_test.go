package wire_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/wire"
)

// The benchmarks of the wire's public paths, one each for what a round
// trip encodes and reads: the task event a session receives, the send a
// session makes, the task result the broker answers with, the size the
// broker counts, and the answers to requests it will not serve.

func BenchmarkMarshalNotification(b *testing.B) {
	ev := benchEvent()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := wire.MarshalNotification(wire.NotifyTaskEvent, ev); err != nil {
			b.Fatal(err)
		}
	}
}

// benchSend is the send a session makes in a round trip.
func benchSend() wire.SendParams {
	text := "Shall we share the roundtable? I take seat 1."
	return wire.SendParams{Token: "5c2f7a8e9b0d4c1f8a6e3b2d1c0f9e8d5c2f7a8e9b0d4c1f", To: "discussant-2",
		Message: &wire.Message{MessageID: "m-1", Parts: []wire.Part{{Kind: wire.KindText, Text: &text}}}}
}

func BenchmarkEncodeRequest(b *testing.B) {
	send := benchSend()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := wire.EncodeRequest(17, wire.MethodSend, send); err != nil {
			b.Fatal(err)
		}
	}
}

// benchResult is a task result as the broker answers a send.
func benchResult() wire.TaskResult {
	ev := benchEvent()
	task := *ev.Task
	task.History = []wire.Message{*ev.Message}
	return wire.TaskResult{Task: &task}
}

func BenchmarkEncodeResult(b *testing.B) {
	r := benchResult()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := wire.EncodeResult(json.RawMessage("17"), r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodedLen(b *testing.B) {
	task := benchResult().Task
	b.ReportAllocs()
	for b.Loop() {
		if wire.EncodedLen(task) == 0 {
			b.Fatal("refused")
		}
	}
}

func BenchmarkPeekID(b *testing.B) {
	raw, err := wire.EncodeRequest(17, wire.MethodSend, benchSend())
	require.NoError(b, err)
	b.ReportAllocs()
	for b.Loop() {
		if string(wire.PeekID(raw)) != "17" {
			b.Fatal("no id")
		}
	}
}

func BenchmarkResponseError(b *testing.B) {
	ok, err := wire.EncodeResult(json.RawMessage("17"), benchResult())
	require.NoError(b, err)
	bad := wire.ErrorResponse(json.RawMessage("17"), wire.ErrUnknownTask.Withf("no task t-1"))
	for _, c := range []struct {
		name  string
		raw   []byte
		isErr bool
	}{{"result", ok, false}, {"error", bad, true}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if (wire.ResponseError(c.raw) != nil) != c.isErr {
					b.Fatal("misread")
				}
			}
		})
	}
}
