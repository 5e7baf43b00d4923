package natscluster_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/a2a-bus/a2a-bus/internal/natscluster"
	"github.com/a2a-bus/a2a-bus/internal/testbin"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(testbin.Exit))
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

// calloutConfig asks every client but the user "app" for credentials
// through an auth callout that no service answers: the server refuses
// them once its auth timeout (2 s, the default) has passed, the same as
// a client's default connect timeout.
func calloutConfig(t *testing.T) string {
	t.Helper()
	kp, err := nkeys.CreateAccount()
	require.NoError(t, err)
	issuer, err := kp.PublicKey()
	require.NoError(t, err)
	return fmt.Sprintf(`accounts { APP { jetstream: enabled, users: [ {user: app, password: apppw} ] } }
authorization {
  auth_callout { issuer: %s, account: APP, auth_users: [ app ] }
}
`, issuer)
}

// A cluster whose clients need credentials from an auth callout starts:
// with a probe user, the placement probe runs as that user; without one
// it is skipped once the server refuses a client without credentials,
// which it does only when the callout's wait has passed.
func TestAClusterWithAnAuthCalloutStarts(t *testing.T) {
	t.Run("with a probe user", func(t *testing.T) {
		c := natscluster.Start(t, 3, natscluster.Options{Extra: calloutConfig(t), ProbeUser: "app", ProbePassword: "apppw"})
		require.NoError(t, createR3(t, c.URL(1), nats.UserInfo("app", "apppw")), "the probe saw a stream placed on every node")
	})
	t.Run("without", func(t *testing.T) {
		natscluster.Start(t, 3, natscluster.Options{Extra: calloutConfig(t)})
	})
}

// createR3 connects to url with opts and makes there a stream with a
// replica on each of three nodes.
func createR3(t *testing.T, url string, opts ...nats.Option) error {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3})
	return err
}

// A program that is not a test launches a cluster from a binary it built:
// the cluster is ready for an R3 stream at once, its nodes' processes are
// known, and Close (twice) kills them and removes their folder. A binary
// that is no server fails the launch, and leaves nothing behind.
func TestLaunchWithoutATest(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	bin := testbin.Build(t, natscluster.ServerPackage)

	c, err := natscluster.Launch(bin, 3, natscluster.Options{Name: "launched"})
	require.NoError(t, err)
	defer c.Close()
	require.Len(t, c.PIDs(), 3)
	require.NoError(t, createR3(t, c.URL(2)), "a launched cluster places a stream on every node")
	entries, err := os.ReadDir(tmp)
	require.NoError(t, err)
	require.NotEmpty(t, entries, "the nodes' folder")

	c.Close()
	c.Close()
	for i := range c.N() {
		assert.False(t, c.Running(i))
	}
	assert.Empty(t, c.PIDs())
	entries, err = os.ReadDir(tmp)
	require.NoError(t, err)
	assert.Empty(t, entries, "Close removes the nodes' folder")

	_, err = natscluster.Launch(os.Args[0], 2, natscluster.Options{})
	require.Error(t, err, "a test binary is no nats-server")
	entries, err = os.ReadDir(tmp)
	require.NoError(t, err)
	assert.Empty(t, entries, "a failed launch removes the nodes' folder")
}

// One node is a plain JetStream server: it keeps a file stream's
// messages across a kill and a restart.
func TestOneNodeIsAPlainServer(t *testing.T) {
	c := natscluster.Start(t, 1, natscluster.Options{})
	assert.NotContains(t, c.Log(0), "Cluster name is")
	publish := func(n int) *jetstream.StreamInfo {
		t.Helper()
		nc, err := nats.Connect(c.URL(0))
		require.NoError(t, err)
		defer nc.Close()
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
		require.NoError(t, err)
		for range n {
			_, err := js.Publish(ctx, "s.x", []byte("x"))
			require.NoError(t, err)
		}
		info, err := s.Info(ctx)
		require.NoError(t, err)
		return info
	}
	assert.Equal(t, uint64(3), publish(3).State.Msgs)
	c.Kill(0)
	c.Restart(0)
	assert.Equal(t, uint64(4), publish(1).State.Msgs)
}
