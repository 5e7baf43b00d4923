package broker_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/store/pebblestore"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// A request that nests data deeper than wire.MaxDepth is refused; one at
// the limit is stored, sent, listed, replayed and read back after a
// restart. (A 20 KB request nested just under the decoders' own limit of
// 10,000 levels was once accepted, then stored a level deeper: its task
// could not be read, and the store refused to open.)
func TestWhatTheBrokerAcceptsItCanReadBack(t *testing.T) {
	dir := t.TempDir()
	st, err := pebblestore.Open(dir, pebblestore.Options{})
	require.NoError(t, err)
	e := newEnv(t, broker.Config{Store: st})
	a := e.register("s1", "alice")
	b := e.register("s2", "bob")
	send := func(levels int, oneway bool) []byte {
		// {params {message {parts [ {data: ...} ] } } } in the envelope: 5 levels.
		data := strings.Repeat("[", levels-5) + strings.Repeat("]", levels-5)
		params := json.RawMessage(`{"token":"` + a.token + `","to":"bob","oneway":` + map[bool]string{true: "true", false: "false"}[oneway] +
			`,"message":{"parts":[{"kind":"data","data":` + data + `}]}}`)
		req, err := wire.EncodeRequest(1, wire.MethodSend, params)
		require.NoError(t, err)
		return e.broker.ServeRPC(context.Background(), transport.Caller{Scope: transport.ScopeSession, Session: "s1"}, req)
	}
	for _, oneway := range []bool{false, true} {
		resp := send(9995, oneway)
		rpcErr := wire.ResponseError(resp)
		require.NotNil(t, rpcErr)
		assert.Equal(t, wire.ErrInvalidRequest.Code, rpcErr.Code)
	}
	resp := send(wire.MaxDepth, false)
	require.True(t, json.Valid(resp))
	var r wire.TaskResult
	require.NoError(t, wire.Unmarshal(mustResult(t, resp), &r))
	e.event("s2")
	require.Nil(t, wire.ResponseError(send(wire.MaxDepth, true)))
	e.event("s2")
	got, err := b.get(r.Task.ID)
	require.NoError(t, err)
	assert.Equal(t, r.Task.ID, got.ID)
	_, err = b.tryCall(wire.MethodListTasks, nil)
	require.NoError(t, err)
	zero, empty := uint64(0), e.broker.Epoch()
	replay, err := e.call("s2", wire.MethodReplay, wire.ReplayParams{ContextID: "s2", Epoch: &empty, AfterSeq: &zero})
	require.NoError(t, err)
	var rr wire.ReplayResult
	require.NoError(t, wire.Unmarshal(replay, &rr))
	assert.Len(t, rr.Events, 2)

	e.broker.Close()
	require.NoError(t, st.Close())
	st, err = pebblestore.Open(dir, pebblestore.Options{})
	require.NoError(t, err, "the store opens again")
	rec, err := st.Get(context.Background(), r.Task.ID)
	require.NoError(t, err)
	assert.Equal(t, r.Task.ID, rec.Task.ID)
	require.NoError(t, st.Close())
}

func mustResult(t *testing.T, resp []byte) json.RawMessage {
	t.Helper()
	res, err := wire.DecodeResult(resp)
	require.NoError(t, err)
	return res
}
