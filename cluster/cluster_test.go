package cluster_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/a2a-bus/a2a-bus/cluster"
	"github.com/a2a-bus/a2a-bus/internal/natscluster"
	"github.com/a2a-bus/a2a-bus/internal/testbin"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { testbin.Cleanup() }))
}

// open opens one broker's share on node i.
func open(t *testing.T, nc *natscluster.Cluster, i int, name string) *cluster.Cluster {
	t.Helper()
	conn, err := nats.Connect(nc.URL(i))
	require.NoError(t, err)
	t.Cleanup(conn.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := cluster.Open(ctx, conn, cluster.Config{Broker: name, Replicas: 3, LeaseTerm: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func TestThreeBrokersOpenOneClusterAtOnce(t *testing.T) {
	nc := natscluster.Start(t, 3, natscluster.Options{})
	cs := make([]*cluster.Cluster, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() { cs[i] = open(t, nc, i, []string{"a", "b", "c"}[i]) })
	}
	wg.Wait()
	for _, c := range cs {
		require.NotNil(t, c)
		require.Equal(t, cs[0].Broker().Epoch, c.Broker().Epoch, "one epoch for the cluster")
	}
}
