package e2e_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/internal/connfile"
	"github.com/a2a-bus/a2a-bus/internal/natscluster"
	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/wire"
)

// clusterToken is the NATS token of the test clusters' clients: brokers
// and hosts.
const clusterToken = "cluster-test-token-0123456789abcdef"

// testCluster is three hosts on one machine: three nats-server processes
// clustered with JetStream, and on each a broker (a2a-bus serve
// --state=jetstream, a real process) joined to its own node.
type testCluster struct {
	t       *testing.T
	nats    *natscluster.Cluster
	dir     string
	brokers []*exec.Cmd
	// joinArgs are host i's broker's flags that join it to node i (its
	// --nats-url and what goes with it), and any others of the test.
	joinArgs func(i int) []string
}

// startTestCluster starts a cluster whose clients (the brokers and the
// hosts) give clusterToken; flags are added to every broker's.
func startTestCluster(t *testing.T, flags ...string) *testCluster {
	t.Helper()
	c := &testCluster{}
	c.joinArgs = func(i int) []string { return append([]string{"--nats-url", c.url(i)}, flags...) }
	c.start(t, natscluster.Options{Extra: fmt.Sprintf("authorization { token: %q }\n", clusterToken)})
	return c
}

// start starts the three nodes with opts, then the three brokers at once,
// each joined to its node by c.joinArgs. Every broker is stopped at the
// end of the test.
func (c *testCluster) start(t *testing.T, opts natscluster.Options) {
	t.Helper()
	c.t, c.dir = t, t.TempDir()
	c.nats = natscluster.Start(t, 3, opts)
	c.brokers = make([]*exec.Cmd, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() { c.startBroker(i) })
	}
	wg.Wait()
	t.Cleanup(func() {
		for i := range c.brokers {
			c.stopBroker(i)
		}
	})
}

// url is node i's URL with the token.
func (c *testCluster) url(i int) string {
	return strings.Replace(c.nats.URL(i), "nats://", "nats://"+clusterToken+"@", 1)
}

// startBroker starts host i's broker on node i and waits until it serves.
func (c *testCluster) startBroker(i int) {
	t := c.t
	path := filepath.Join(c.dir, fmt.Sprintf("b%d.json", i))
	args := append([]string{"serve", "--state=jetstream", "--broker-name", fmt.Sprintf("host%d", i),
		"--replicas", "3", "--connection-file", path, "--data-dir", "", "--log-level=warn", "--exit-with-parent=false"}, c.joinArgs(i)...)
	cmd := exec.Command(testbin.A2ABus(t), args...)
	cmd.Env = append(os.Environ(), "HOME="+c.dir)
	ready := newLineSignal(path)
	logPath := filepath.Join(c.dir, fmt.Sprintf("b%d.log", i))
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	require.NoError(t, err)
	t.Cleanup(func() {
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("broker %d's log:\n%s", i, b)
		}
	})
	cmd.Stderr = io.MultiWriter(ready, logf)
	require.NoError(t, cmd.Start())
	c.brokers[i] = cmd
	ready.wait(t, 60*time.Second, fmt.Sprintf("broker %d serves", i))
}

// killBroker kills host i's broker with SIGKILL.
func (c *testCluster) killBroker(i int) {
	if cmd := c.brokers[i]; cmd != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		c.brokers[i] = nil
	}
}

// stopBroker stops host i's broker with SIGTERM.
func (c *testCluster) stopBroker(i int) {
	if cmd := c.brokers[i]; cmd != nil {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		c.brokers[i] = nil
	}
}

// host dials node i as a host does, naming its host's broker as that
// broker's connection file does.
func (c *testCluster) host(i int) *natsbus.Client {
	t := c.t
	info, err := connfile.Read(filepath.Join(c.dir, fmt.Sprintf("b%d.json", i)))
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("host%d", i), info.Broker, "the broker's name in its connection file")
	cl, err := natsbus.Dial(natsbus.ClientConfig{URL: c.nats.URL(i), Token: clusterToken, Broker: info.Broker})
	require.NoError(t, err)
	t.Cleanup(func() { cl.Close() })
	return cl
}

// delegate spawns a delegate in session on host client cl.
func (c *testCluster) delegate(cl *natsbus.Client, session, name string) *runtime.Delegate {
	t := c.t
	ctx := context.Background()
	s, err := cl.Session(ctx, session)
	require.NoError(t, err)
	rt, err := runtime.New(ctx, s, runtime.Config{Feed: runtime.FeedConfig{CheckInterval: 200 * time.Millisecond}})
	require.NoError(t, err)
	t.Cleanup(func() { rt.Close() })
	d, err := rt.Spawn(ctx, wire.AgentCard{Name: name})
	require.NoError(t, err)
	return d
}

// sessionTap records every notification the cluster publishes to any
// session, by the session its subject names.
type sessionTap struct {
	mu    sync.Mutex
	wrong []string // notifications whose recipientContextId is not their subject's session
	seqs  map[string][]uint64
	sub   *nats.Subscription
}

// tap starts a sessionTap on a raw connection to url, a node's URL with
// the credentials of a client that may see every session's
// notifications.
func (c *testCluster) tap(url string) *sessionTap {
	t := c.t
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	tp := &sessionTap{seqs: map[string][]uint64{}}
	tp.sub, err = nc.Subscribe("a2a.session.*.events", func(m *nats.Msg) {
		token := strings.TrimSuffix(strings.TrimPrefix(m.Subject, "a2a.session."), ".events")
		session, err := natsbus.SessionID(token)
		ev, derr := wire.DecodeEvent(m.Data)
		tp.mu.Lock()
		defer tp.mu.Unlock()
		if err != nil || derr != nil || ev.Head().RecipientContextID != session {
			tp.wrong = append(tp.wrong, m.Subject+" "+string(m.Data))
			return
		}
		tp.seqs[session] = append(tp.seqs[session], ev.Head().Seq)
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	return tp
}

// workTask has worker wait until it hears of the task it was sent, work
// it and complete it, and checks that asker learns that it completed.
func workTask(t *testing.T, asker, worker *runtime.Delegate, taskID string) {
	t.Helper()
	ctx := context.Background()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		ev, err := worker.Wait(wctx)
		require.NoError(t, err, "the worker never heard of its task")
		if ev.Task != nil && ev.Task.TaskID == taskID {
			break
		}
	}
	_, err := worker.Update(ctx, taskID, wire.StateWorking, nil)
	require.NoError(t, err)
	_, err = worker.Update(ctx, taskID, wire.StateCompleted, &wire.Message{Parts: []wire.Part{wire.TextPart("done")}})
	require.NoError(t, err)
	assert.Equal(t, wire.StateCompleted, waitFinal(t, asker, taskID))
}

func clusterText(s string) wire.Message { return wire.Message{Parts: []wire.Part{wire.TextPart(s)}} }

// TestClusterADRScenarioAcrossHosts runs the ADR's rules with the agents
// of one bus on three hosts: three nats-servers, three brokers.
func TestClusterADRScenarioAcrossHosts(t *testing.T) {
	c := startTestCluster(t, "--max-tasks-per-context=3")
	tap := c.tap(c.url(0))
	ctx := context.Background()
	hosts := []*natsbus.Client{c.host(0), c.host(1), c.host(2)}

	// Names are unique across the cluster, whichever broker registers.
	d0 := c.delegate(hosts[0], "chat-a", "discussant")
	d1 := c.delegate(hosts[1], "chat-b", "discussant")
	d2 := c.delegate(hosts[2], "chat-c", "discussant")
	assert.Equal(t, []string{"discussant", "discussant-2", "discussant-3"}, []string{d0.ID(), d1.ID(), d2.ID()})

	// Every other live agent is listed, with its session.
	helper := c.delegate(hosts[0], "chat-a", "helper")
	peers, err := d1.Peers(ctx)
	require.NoError(t, err)
	got := map[string]string{}
	for _, p := range peers {
		got[p.AgentID] = p.ContextID
	}
	assert.Equal(t, map[string]string{"discussant": "chat-a", "discussant-3": "chat-c", "helper": "chat-a"}, got)

	// Without to, a send prefers the single same-session peer.
	task, err := d0.Send(ctx, "", clusterText("same session first"), nil)
	require.NoError(t, err)
	assert.Equal(t, "helper", task.AgentName)

	// A send across hosts: the worker on host 2 waits, works, completes;
	// the asker on host 1 learns of it.
	task, err = d1.Send(ctx, "discussant-3", clusterText("work across hosts"), nil)
	require.NoError(t, err)
	assert.Equal(t, "chat-c", task.AgentContextID)
	workTask(t, d1, d2, task.ID)

	// Access is membership: a stranger on any host is told the task does
	// not exist for it.
	_, err = helper.Task(ctx, task.ID)
	require.ErrorIs(t, err, wire.ErrUnknownAgent)

	// The cap on a session's open tasks holds across brokers (requests
	// spread over them).
	for i := range 3 {
		_, err := d0.Send(ctx, "discussant-3", clusterText(fmt.Sprintf("open %d", i)), nil)
		if i < 2 { // one open already: the helper's
			require.NoError(t, err)
		} else {
			require.ErrorIs(t, err, wire.ErrTaskLimit)
		}
	}

	// Every notification went to its recipient's session only, and each
	// session's seqs are dense.
	require.Eventually(t, func() bool {
		tap.mu.Lock()
		defer tap.mu.Unlock()
		return len(tap.seqs["chat-b"]) >= 2 && len(tap.seqs["chat-c"]) >= 3
	}, 30*time.Second, 10*time.Millisecond)
	tap.mu.Lock()
	defer tap.mu.Unlock()
	assert.Empty(t, tap.wrong)
	for s, seqs := range tap.seqs {
		for i, seq := range seqs {
			assert.Equal(t, uint64(i+1), seq, "session %s: seq %d of %v", s, i, seqs)
		}
	}
}
