package jsstore_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/a2a-bus/a2a-bus/internal/natscluster"
	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/store/jsstore"
	"github.com/a2a-bus/a2a-bus/store/storetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(testbin.Exit))
}

// cluster is the three-node cluster a test binary's tests share, with a
// connection to each node.
type cluster struct {
	*natscluster.Cluster
	conns []*nats.Conn
	next  atomic.Int64 // spreads stores over the nodes
	n     atomic.Int64 // numbers the prefixes
	drop  sync.Map     // prefixes whose buckets are removed at the end
}

// startCluster starts three nodes and connects to each; the connections
// follow the cluster when a node dies.
func startCluster(t testing.TB, opts natscluster.Options) *cluster {
	c := &cluster{Cluster: natscluster.Start(t, 3, opts)}
	for i := range c.N() {
		nc, err := nats.Connect(c.URL(i), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		c.conns = append(c.conns, nc)
	}
	return c
}

// prefix returns a bucket prefix no other test uses, and removes its
// buckets when the test ends.
func (c *cluster) prefix(t testing.TB) string {
	p := fmt.Sprintf("t%d", c.n.Add(1))
	c.dropAtEnd(t, p)
	return p
}

func (c *cluster) dropAtEnd(t testing.TB, prefix string) {
	if _, dup := c.drop.LoadOrStore(prefix, true); dup {
		return
	}
	t.Cleanup(func() {
		js, err := jetstream.New(c.conns[0])
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, b := range []string{"_tasks", "_agents"} {
			if err := js.DeleteStream(ctx, "KV_"+prefix+b); err != nil {
				t.Logf("delete the buckets of %s: %v", prefix, err)
			}
		}
	})
}

// open opens a store of three replicas under prefix on node's
// connection, closed when the test ends.
func (c *cluster) open(t testing.TB, node int, prefix string) *jsstore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := jsstore.Open(ctx, c.conns[node], jsstore.Config{Replicas: 3, Prefix: prefix})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// fresh opens an empty store on the next node.
func (c *cluster) fresh(t *testing.T) *jsstore.Store {
	return c.open(t, int(c.next.Add(1))%c.N(), c.prefix(t))
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestOnACluster runs every test of the package on one three-node
// cluster with R3 buckets, each test under its own bucket prefix; the
// tests that kill a node come last.
func TestOnACluster(t *testing.T) {
	c := startCluster(t, natscluster.Options{})
	t.Run("Suite", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) store.Tasks { return c.fresh(t) })
		storetest.RunUpdate(t, func(t *testing.T) store.Tasks { return c.fresh(t) })
	})
	t.Run("RegistrySuite", func(t *testing.T) {
		storetest.RunRegistry(t, func(t *testing.T) store.Store { return c.fresh(t) })
		// A directory names a prefix; each open is on the next node.
		storetest.RunDurableRegistry(t, func(t *testing.T, dir string) store.Store {
			sum := sha256.Sum256([]byte(dir))
			p := "d" + hex.EncodeToString(sum[:8])
			c.dropAtEnd(t, p)
			return c.open(t, int(c.next.Add(1))%c.N(), p)
		})
	})
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, *cluster)
	}{
		{"AnotherNodesStoreReadsWhatOneAcknowledged", testReopen},
		{"OpenMembersAreTheMembersOfOpenTasks", testOpenMembers},
		{"AReadSeesAnUpdateAcknowledgedOnAnotherNode", testReadYourWritesAcrossNodes},
		{"ARefusalIsJudgedOnTheTaskAsItIs", testRefusalJudgedOnTheTaskAsItIs},
		{"ExactlyOneOfConcurrentClaimsOfANameWins", testNames},
		{"AReleaseNeverFreesAnothersClaim", testReleaseNeverFreesAnothersClaim},
		{"RegistrationWrittenOnlyAsRead", testRegistrationWrittenOnlyAsRead},
		{"RegistrationWritesRacingFromThreeNodesStoreOne", testRacingRegistrationWrites},
		{"RacingUpdatesFromTwoNodesLoseNone", testRacingUpdates},
		{"TheCapHoldsAcrossBrokers", testCapAcrossBrokers},
		{"OfTwoKeyedCreatesOneWins", testKeyedCreatesRace},
		{"ConcurrentPrunesDeleteEachTaskOnceAndNoTaskChangedMeanwhile", testConcurrentPrunes},
		{"PruneCountsAnEndedTaskChangedAgainOnce", testPruneAfterAnEndedTaskChanged},
		{"CloseUnderLoadDropsNoAcknowledgedCreate", testCloseUnderLoad},
		// Last: it kills and restarts a node.
		{"KillingANodeLosesNoAcknowledgedChange", testKillANodeUnderLoad},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, c) })
	}
}
