package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/internal/natscluster"
	"github.com/a2a-bus/a2a-bus/transport/fakebus"
	"github.com/a2a-bus/a2a-bus/wire"
)

// brokerOn starts a broker whose state is the cluster's, on node i, with
// a fake bus of its own for its sessions' requests: what the brokers
// share is all in JetStream.
func brokerOn(t *testing.T, nc *natscluster.Cluster, i int, name string) *fakebus.Bus {
	t.Helper()
	c := open(t, nc, i, name)
	bus := fakebus.New(fakebus.Config{})
	cfg := c.Broker()
	b, err := broker.New(context.Background(), bus, broker.Config{Store: c.Store(), Cluster: cfg})
	require.NoError(t, err)
	t.Cleanup(func() {
		bus.Close()
		b.Close()
	})
	return bus
}

func call(bus *fakebus.Bus, session, method string, params any, out any) error {
	s, err := bus.Session(context.Background(), session)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := s.Call(ctx, method, params)
	if err == nil && out != nil {
		err = json.Unmarshal(res, out)
	}
	return err
}

// A keyed send retried through two brokers at once (a host's requests are
// spread over them) makes one task: the loser of the race answers with
// the winner's.
func testAKeyedSendRetriedOnTwoBrokersMakesOneTask(t *testing.T, nc *natscluster.Cluster) {
	b1, b2 := brokerOn(t, nc, 0, "a"), brokerOn(t, nc, 1, "b")
	var asker, worker wire.RegisterResult
	require.NoError(t, call(b1, "s1", wire.MethodRegister, wire.RegisterParams{ContextID: "s1", Card: &wire.AgentCard{Name: "asker"}}, &asker))
	require.NoError(t, call(b2, "s2", wire.MethodRegister, wire.RegisterParams{ContextID: "s2", Card: &wire.AgentCard{Name: "worker"}}, &worker))
	for round := range 20 {
		key := fmt.Sprintf("retry-%d", round)
		params := map[string]any{"token": asker.Token, "to": "worker",
			"message": map[string]any{"messageId": key, "role": "user", "parts": []any{map[string]any{"kind": "text", "text": "once"}}}}
		var ids [2]string
		var errs [2]error
		var wg sync.WaitGroup
		for i, bus := range []*fakebus.Bus{b1, b2} {
			wg.Go(func() {
				var r wire.TaskResult
				errs[i] = call(bus, "s1", wire.MethodSend, params, &r)
				if r.Task != nil {
					ids[i] = r.Task.ID
				}
			})
		}
		wg.Wait()
		require.NoError(t, errs[0], "round %d", round)
		require.NoError(t, errs[1], "round %d", round)
		assert.Equal(t, ids[0], ids[1], "round %d: two tasks for one key", round)
	}
}
