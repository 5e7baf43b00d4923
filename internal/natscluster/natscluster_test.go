package natscluster_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/a2a-bus/a2a-bus/internal/natscluster"
	"github.com/a2a-bus/a2a-bus/internal/testbin"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { testbin.Cleanup() }))
}

// A three-node cluster keeps an R3 stream's acknowledged messages across
// a kill -9 of one node and its restart, and the restarted node serves
// clients again on its old port.
func TestAClusterSurvivesAKilledNode(t *testing.T) {
	c := natscluster.Start(t, 3, natscluster.Options{SyncAlways: true, Extra: "# extra"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range c.N() {
		assert.Contains(t, c.Log(i), "Server is ready")
	}

	nc, err := nats.Connect(c.URL(0))
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3})
	require.NoError(t, err)
	for range 10 {
		_, err := js.Publish(ctx, "s.x", []byte("x"))
		require.NoError(t, err)
	}
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.Len(t, info.Cluster.Replicas, 2, "the stream is on all three nodes")

	c.Kill(2)
	assert.False(t, c.Running(2))
	for i := range 5 {
		// Until the two left elect a leader (if n2 led), nobody answers;
		// the message id keeps a publish whose answer was lost from
		// counting twice.
		require.Eventually(t, func() bool {
			_, err := js.Publish(ctx, "s.x", []byte("y"), jetstream.WithMsgID(fmt.Sprint("y", i)))
			return err == nil
		}, 30*time.Second, 10*time.Millisecond, "two of three nodes are a quorum")
	}
	c.Restart(2)
	assert.True(t, c.Running(2))
	c.WaitHealthy(ctx, 2)

	nc2, err := nats.Connect(c.URL(2))
	require.NoError(t, err)
	defer nc2.Close()
	js2, err := jetstream.New(nc2)
	require.NoError(t, err)
	s2, err := js2.Stream(ctx, "S")
	require.NoError(t, err)
	info, err = s2.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(15), info.State.Msgs)

	c.Stop(1)
	assert.False(t, c.Running(1))
	assert.True(t, strings.HasPrefix(c.URLs()[1], "nats://127.0.0.1:"))
}
