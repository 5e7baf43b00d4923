package cluster_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/a2a-bus/a2a-bus/cluster"
	"github.com/a2a-bus/a2a-bus/internal/natscluster"
	"github.com/a2a-bus/a2a-bus/internal/testbin"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(testbin.Exit))
}

// shared is the cluster the package's tests share, each under a prefix
// of its own (their streams apart).
var shared struct {
	nc *natscluster.Cluster
	n  atomic.Int64
}

// TestOnOneCluster runs the tests that need a cluster on one: starting
// three nodes costs more than most of the tests.
func TestOnOneCluster(t *testing.T) {
	shared.nc = natscluster.Start(t, 3, natscluster.Options{})
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, nc *natscluster.Cluster)
	}{
		{"ThreeBrokersOpenOneClusterAtOnce", testThreeBrokersOpenOneClusterAtOnce},
		{"ALeaseLapsesWhenItsBrokerStopsRenewingIt", testALeaseLapsesWhenItsBrokerStopsRenewingIt},
		{"ARevocationHoldsForEveryBroker", testARevocationHoldsForEveryBroker},
		{"AKeyedSendRetriedOnTwoBrokersMakesOneTask", testAKeyedSendRetriedOnTwoBrokersMakesOneTask},
		{"ASecondLiveBrokerOfOneNameIsRefused", testASecondLiveBrokerOfOneNameIsRefused},
		{"ABrokerWithAnotherIssuerIsRefused", testABrokerWithAnotherIssuerIsRefused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := fmt.Sprintf("t%d", shared.n.Add(1))
			prefixes.Store(t, prefix)
			tc.fn(t, shared.nc)
		})
	}
}

// prefixes maps each subtest to its prefix.
var prefixes sync.Map

// open opens one broker's share on node i, under the test's prefix.
func open(t *testing.T, nc *natscluster.Cluster, i int, name string) *cluster.Cluster {
	t.Helper()
	conn, err := nats.Connect(nc.URL(i))
	require.NoError(t, err)
	t.Cleanup(conn.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prefix, _ := prefixes.Load(t)
	c, err := cluster.Open(ctx, conn, cluster.Config{Broker: name, Prefix: prefix.(string), Replicas: 3, LeaseTerm: 3 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func testThreeBrokersOpenOneClusterAtOnce(t *testing.T, nc *natscluster.Cluster) {
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

func testALeaseLapsesWhenItsBrokerStopsRenewingIt(t *testing.T, nc *natscluster.Cluster) {
	a, b := open(t, nc, 0, "a"), open(t, nc, 1, "b")
	ctx := context.Background()
	la, lb := a.Broker().Leases, b.Broker().Leases
	require.NoError(t, la.Renew(ctx, "a"))
	require.NoError(t, lb.Renew(ctx, "b"))
	live, err := lb.Live(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"a": true, "b": true}, live, "each sees the other's lease")
	// b goes on renewing; a stops: a's lease lapses by the cluster's
	// clock (the term is 3 s here).
	require.Eventually(t, func() bool {
		if err := lb.Renew(ctx, "b"); err != nil {
			return false
		}
		live, err := lb.Live(ctx)
		return err == nil && !live["a"] && live["b"]
	}, 30*time.Second, 100*time.Millisecond, "a's lease never lapsed")
}

func testARevocationHoldsForEveryBroker(t *testing.T, nc *natscluster.Cluster) {
	a, b := open(t, nc, 0, "a"), open(t, nc, 2, "b")
	ctx := context.Background()
	ra, rb := a.Revocations(), b.Revocations()
	g, err := ra.Current(ctx, "chat.1")
	require.NoError(t, err)
	gb, err := rb.Current(ctx, "chat.1")
	require.NoError(t, err)
	require.Equal(t, g, gb, "one generation for the cluster")

	// Revoked on b, ended for a at once; revoked on both at once, each
	// ends a generation, and the last is new to both.
	ended, err := rb.Revoke(ctx, "chat.1")
	require.NoError(t, err)
	require.Equal(t, g, ended)
	now, err := ra.Current(ctx, "chat.1")
	require.NoError(t, err)
	require.NotEqual(t, g, now)
	var wg sync.WaitGroup
	var ends [2]uint64
	for i, r := range []interface {
		Revoke(context.Context, string) (uint64, error)
	}{ra, rb} {
		wg.Go(func() {
			var err error
			ends[i], err = r.Revoke(ctx, "chat.1")
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	require.NotEqual(t, ends[0], ends[1], "two revocations ended one generation")
	last, err := rb.Current(ctx, "chat.1")
	require.NoError(t, err)
	for _, old := range []uint64{g, now, ends[0], ends[1]} {
		require.NotEqual(t, old, last)
	}
	// Another session is untouched.
	other, err := ra.Current(ctx, "chat.2")
	require.NoError(t, err)
	require.Equal(t, g, other)
}

func testASecondLiveBrokerOfOneNameIsRefused(t *testing.T, nc *natscluster.Cluster) {
	a := open(t, nc, 0, "laptop")
	require.NoError(t, a.Broker().Leases.Renew(context.Background(), "laptop"))
	// a goes on renewing, as a live broker does.
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				_ = a.Broker().Leases.Renew(context.Background(), "laptop")
			}
		}
	})
	conn, err := nats.Connect(nc.URL(1))
	require.NoError(t, err)
	t.Cleanup(conn.Close)
	prefix, _ := prefixes.Load(t)
	_, err = cluster.Open(context.Background(), conn, cluster.Config{Broker: "laptop", Prefix: prefix.(string), Replicas: 3, LeaseTerm: 3 * time.Second})
	close(done)
	wg.Wait()
	require.ErrorIs(t, err, cluster.ErrNameInUse)

	// Once a stops renewing, its lease lapses and the name is free: a
	// broker restarted after a crash waits for it, then starts.
	b := open(t, nc, 1, "laptop")
	require.NotNil(t, b)
}

func testABrokerWithAnotherIssuerIsRefused(t *testing.T, nc *natscluster.Cluster) {
	conn, err := nats.Connect(nc.URL(0))
	require.NoError(t, err)
	t.Cleanup(conn.Close)
	prefix, _ := prefixes.Load(t)
	cfg := cluster.Config{Broker: "a", Prefix: prefix.(string), Replicas: 3, Issuer: "ISSUER-ONE"}
	a, err := cluster.Open(context.Background(), conn, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { a.Close() })
	cfg.Broker, cfg.Issuer = "b", "ISSUER-TWO"
	_, err = cluster.Open(context.Background(), conn, cfg)
	require.ErrorIs(t, err, cluster.ErrMismatch)
	cfg.Issuer = "ISSUER-ONE"
	b, err := cluster.Open(context.Background(), conn, cfg)
	require.NoError(t, err)
	b.Close()
}
