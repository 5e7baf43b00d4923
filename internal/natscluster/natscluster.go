// Package natscluster starts a cluster of real nats-server processes with
// JetStream on loopback, for tests (Start) and for programs that are not
// tests, such as the bench (Launch): the server is built from the module
// the project depends on, each node has its own ports, config file, store
// directory and log, and every process is killed and waited for when the
// test ends, or at Close.
package natscluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/a2a-bus/a2a-bus/internal/testbin"
)

// ServerPackage is the package the nodes' binary is built from.
const ServerPackage = "github.com/nats-io/nats-server/v2"

// Deadlines. Generous: the machine running the tests may be slow and
// busy; they bound a wait that would otherwise hang, they do not time
// anything.
const (
	readyTimeout = 60 * time.Second // a node answers healthz with a meta leader
	stopTimeout  = 30 * time.Second // a node exits after SIGTERM
	startTries   = 5                // starts of a cluster whose port was taken meanwhile
	logTailLines = 40               // lines of each node's log shown on failure
)

// Options configures a cluster. The zero value is a plain JetStream
// cluster.
type Options struct {
	// Extra is appended verbatim to every node's config file, so that a
	// test can add, say, an authorization block with an auth_callout.
	Extra string
	// SyncAlways sets jetstream { sync_interval: always }: every write is
	// fsynced before it is acknowledged, instead of every two minutes.
	SyncAlways bool
	// Name is the cluster's name ("a2a" when empty).
	Name string
	// ProbeUser and ProbePassword are a user of Extra's config that may
	// use JetStream: Start then checks as that user that a stream can be
	// placed on every node. Without them, a cluster whose config asks
	// clients for credentials is not probed.
	ProbeUser, ProbePassword string
}

// Cluster is a running cluster. Its methods are safe for concurrent use,
// except that one node must not be killed, stopped or restarted by two
// callers at once.
type Cluster struct {
	t     testing.TB // the test of Start; nil for a cluster from Launch
	bin   string
	opts  Options
	nodes []*node
	// dir is the folder of the nodes that Launch made and Close removes;
	// "" for a cluster from Start, whose folder the test removes.
	dir       string
	closeOnce sync.Once
}

type node struct {
	index     int
	name      string
	client    int // client port
	route     int // cluster port
	monitor   int // HTTP monitoring port
	dir       string
	conf      string
	log       string
	mu        sync.Mutex
	proc      *exec.Cmd
	exited    chan struct{} // closed once proc has been waited for
	waitErr   error
	logHandle *os.File
}

// Start starts n nodes clustered with JetStream and waits until every
// one of them answers and knows a JetStream meta leader, and the leader
// counts every node as a current, online peer. It fails the test
// when they do not. Every node is killed and waited for when the test
// ends; if the test failed, the tail of each node's log is logged.
// One node is a plain JetStream server, with no cluster.
func Start(t testing.TB, n int, opts Options) *Cluster {
	t.Helper()
	c := newCluster(testbin.Build(t, ServerPackage), opts)
	c.t = t
	// Made before the cleanup is registered, so that it is removed only
	// after every node has exited and its log has been shown.
	base := t.TempDir()
	t.Cleanup(c.cleanup)
	if err := c.start(base, n, t.Logf); err != nil {
		t.Fatalf("natscluster: %v", err)
	}
	return c
}

// Launch is Start for a program that is not a test: it starts n nodes
// of the nats-server binary bin in a temporary folder and waits until
// they are ready as Start does. It returns an error, with the tail of
// each node's log, when they are not. Close kills the nodes and removes
// the folder. Restart, Stop and WaitHealthy, which report to a test,
// panic on their failure instead.
func Launch(bin string, n int, opts Options) (*Cluster, error) {
	base, err := os.MkdirTemp("", "natscluster-")
	if err != nil {
		return nil, fmt.Errorf("natscluster: %w", err)
	}
	c := newCluster(bin, opts)
	c.dir = base
	if err := c.start(base, n, func(string, ...any) {}); err != nil {
		tails := c.tails()
		c.Close()
		return nil, fmt.Errorf("natscluster: %w\n%s", err, tails)
	}
	return c, nil
}

func newCluster(bin string, opts Options) *Cluster {
	if opts.Name == "" {
		opts.Name = "a2a"
	}
	return &Cluster{bin: bin, opts: opts}
}

// start starts n nodes in base, on other ports again while a port chosen
// was taken meanwhile (logf tells of each such try). A failed start
// leaves no node running.
func (c *Cluster) start(base string, n int, logf func(format string, args ...any)) error {
	if n < 1 {
		return fmt.Errorf("%d nodes", n)
	}
	var err error
	for try := range startTries {
		if err = c.startOnce(base, try, n); err == nil {
			return nil
		}
		c.killAll()
		if !errors.Is(err, errPortTaken) {
			break
		}
		logf("natscluster: start %d: %v; trying other ports", try+1, err)
	}
	return err
}

// errPortTaken: a node could not bind a port chosen for it, which
// something else took between the choice and the bind.
var errPortTaken = errors.New("a port was taken meanwhile")

// startOnce makes the nodes' configs on fresh ports and starts them.
func (c *Cluster) startOnce(base string, try, n int) error {
	ports, err := freePorts(3 * n)
	if err != nil {
		return err
	}
	c.nodes = make([]*node, n)
	routes := make([]string, n)
	for i := range n {
		nd := &node{
			index:   i,
			name:    fmt.Sprintf("n%d", i),
			client:  ports[3*i],
			route:   ports[3*i+1],
			monitor: ports[3*i+2],
		}
		nd.dir = filepath.Join(base, fmt.Sprintf("try%d", try), nd.name)
		if err := os.MkdirAll(nd.dir, 0o700); err != nil {
			return err
		}
		nd.conf = filepath.Join(nd.dir, "server.conf")
		nd.log = filepath.Join(nd.dir, "server.log")
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", nd.route)
		c.nodes[i] = nd
	}
	for _, nd := range c.nodes {
		if err := os.WriteFile(nd.conf, []byte(c.config(nd, routes)), 0o600); err != nil {
			return err
		}
	}
	for _, nd := range c.nodes {
		if err := c.launch(nd); err != nil {
			return err
		}
	}
	for _, nd := range c.nodes {
		if err := c.waitReady(nd); err != nil {
			return err
		}
	}
	return c.waitPeers()
}

// config is the config file of nd.
func (c *Cluster) config(nd *node, routes []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "server_name: %s\n", nd.name)
	fmt.Fprintf(&b, "listen: 127.0.0.1:%d\n", nd.client)
	fmt.Fprintf(&b, "http: 127.0.0.1:%d\n", nd.monitor)
	if len(routes) > 1 {
		fmt.Fprintf(&b, "cluster {\n  name: %s\n  listen: 127.0.0.1:%d\n  routes: [\n", c.opts.Name, nd.route)
		for _, r := range routes {
			fmt.Fprintf(&b, "    %s\n", r)
		}
		b.WriteString("  ]\n}\n")
	}
	fmt.Fprintf(&b, "jetstream {\n  store_dir: %q\n", filepath.Join(nd.dir, "store"))
	if c.opts.SyncAlways {
		b.WriteString("  sync_interval: always\n")
	}
	b.WriteString("}\n")
	if c.opts.Extra != "" {
		b.WriteString(c.opts.Extra)
		b.WriteString("\n")
	}
	return b.String()
}

// freePorts returns n distinct loopback ports that were free a moment
// ago: all are held open until all are chosen, so no two are the same.
// Another process may still take one before a node binds it: Start then
// tries again on other ports.
func freePorts(n int) ([]int, error) {
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// launch starts nd's process, its output appended to its log.
func (c *Cluster) launch(nd *node) error {
	f, err := os.OpenFile(nd.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "=== natscluster: start %s at %s\n", nd.name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(c.bin, "-c", nd.conf)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", nd.name, err)
	}
	exited := make(chan struct{})
	nd.mu.Lock()
	nd.proc, nd.exited, nd.logHandle, nd.waitErr = cmd, exited, f, nil
	nd.mu.Unlock()
	go func() {
		err := cmd.Wait()
		nd.mu.Lock()
		nd.waitErr = err
		nd.mu.Unlock()
		f.Close()
		close(exited)
	}()
	return nil
}

// waitReady waits until nd answers healthz with a meta leader known, or
// its process exits, or the deadline passes.
func (c *Cluster) waitReady(nd *node) error {
	_, exited := nd.current()
	url := fmt.Sprintf("http://127.0.0.1:%d/healthz?js-meta-only=true", nd.monitor)
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(readyTimeout)
	last := "no answer"
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		select {
		case <-exited:
			if logHas(nd.log, "address already in use") {
				return fmt.Errorf("%s exited: %w", nd.name, errPortTaken)
			}
			return fmt.Errorf("%s exited before it was ready: %v\n%s", nd.name, nd.exitErr(), tail(nd.log, logTailLines))
		default:
		}
		if resp, err := client.Get(url); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(body))
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v (healthz: %s)\n%s", nd.name, readyTimeout, last, tail(nd.log, logTailLines))
		}
		select {
		case <-exited:
		case <-time.After(wait):
		}
	}
}

// waitPeers waits until the JetStream meta leader counts every running
// node as a current, online peer, and, when a client may connect without
// credentials, until a stream with a replica on every running node can
// be made: the leader places no stream on a node whose statistics it
// has not yet heard ("no suitable peers for placement").
func (c *Cluster) waitPeers() error {
	if err := c.waitMetaPeers(); err != nil {
		return err
	}
	return c.probePlacement()
}

// probePlacement makes and removes a memory stream with a replica on
// every running node, until that works. A cluster whose config asks
// clients for credentials (Options.Extra) is probed as
// Options.ProbeUser, or not at all when there is none.
func (c *Cluster) probePlacement() error {
	var running []int
	for i := range c.nodes {
		if c.Running(i) {
			running = append(running, i)
		}
	}
	if len(running) < 2 {
		return nil
	}
	// The connect waits for the server's refusal: an auth callout answers
	// none only when the server's auth timeout (2 s by default) has
	// passed, after the client's own default timeout.
	opts := []nats.Option{nats.NoReconnect(), nats.Timeout(readyTimeout)}
	if c.opts.ProbeUser != "" {
		opts = append(opts, nats.UserInfo(c.opts.ProbeUser, c.opts.ProbePassword))
	}
	nc, err := nats.Connect(c.URL(running[0]), opts...)
	if err != nil && c.opts.ProbeUser == "" && !errors.Is(err, nats.ErrNoServers) {
		// A server that wants credentials the probe lacks refuses it
		// (an authorization error; on a loaded machine, an auth
		// callout's wait can end the handshake otherwise: "expected
		// PONG, got PING"): the probe is skipped, as the server answers.
		return nil
	}
	if err != nil {
		return fmt.Errorf("probe placement: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("probe placement: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	name := "natscluster_probe"
	cfg := jetstream.StreamConfig{Name: name, Subjects: []string{"natscluster.probe"}, Storage: jetstream.MemoryStorage, Replicas: len(running)}
	for {
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := js.CreateStream(actx, cfg)
		if err == nil {
			err = js.DeleteStream(actx, name)
		}
		acancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("probe placement: a stream of %d replicas cannot be made: %w", len(running), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Cluster) waitMetaPeers() error {
	if len(c.nodes) == 1 {
		return nil // no cluster, no meta leader
	}
	type jsz struct {
		Meta *struct {
			Leader   string `json:"leader"`
			Replicas []struct {
				Name    string `json:"name"`
				Current bool   `json:"current"`
				Offline bool   `json:"offline"`
			} `json:"replicas"`
		} `json:"meta_cluster"`
	}
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(readyTimeout)
	last := "no meta leader"
	for {
		running := map[string]bool{}
		for i, nd := range c.nodes {
			if c.Running(i) {
				running[nd.name] = true
			}
		}
		for i, nd := range c.nodes {
			if !running[nd.name] {
				continue
			}
			resp, err := client.Get(c.MonitorURL(i) + "/jsz")
			if err != nil {
				continue
			}
			var z jsz
			err = json.NewDecoder(resp.Body).Decode(&z)
			resp.Body.Close()
			if err != nil || z.Meta == nil || z.Meta.Leader != nd.name {
				continue
			}
			online := 1 // the leader
			for _, r := range z.Meta.Replicas {
				if running[r.Name] && r.Current && !r.Offline {
					online++
				}
			}
			if online == len(running) {
				return nil
			}
			last = fmt.Sprintf("meta leader %s sees %d of %d running nodes current and online", nd.name, online, len(running))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %s", readyTimeout, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// current returns nd's last process started and the channel closed once
// it has exited; nil for a node never started.
func (nd *node) current() (proc *exec.Cmd, exited chan struct{}) {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return nd.proc, nd.exited
}

func (nd *node) exitErr() error {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return nd.waitErr
}

// N returns the number of nodes.
func (c *Cluster) N() int { return len(c.nodes) }

// URL returns the client URL of node i.
func (c *Cluster) URL(i int) string {
	return fmt.Sprintf("nats://127.0.0.1:%d", c.nodes[i].client)
}

// URLs returns the client URLs of every node, in node order.
func (c *Cluster) URLs() []string {
	out := make([]string, len(c.nodes))
	for i := range c.nodes {
		out[i] = c.URL(i)
	}
	return out
}

// Name returns the server_name of node i.
func (c *Cluster) Name(i int) string { return c.nodes[i].name }

// MonitorURL returns the base URL of node i's HTTP monitoring endpoint.
func (c *Cluster) MonitorURL(i int) string {
	return fmt.Sprintf("http://127.0.0.1:%d", c.nodes[i].monitor)
}

// Kill kills node i with SIGKILL and waits for its process to exit.
func (c *Cluster) Kill(i int) {
	nd := c.nodes[i]
	proc, exited := nd.current()
	if proc == nil {
		return
	}
	_ = proc.Process.Kill()
	<-exited
}

// Stop stops node i with SIGTERM (a clean shutdown) and waits for its
// process to exit; one that does not exit within a deadline is killed
// and the test fails.
func (c *Cluster) Stop(i int) {
	if c.t != nil {
		c.t.Helper()
	}
	nd := c.nodes[i]
	proc, exited := nd.current()
	if proc == nil {
		return
	}
	if err := proc.Process.Signal(syscall.SIGTERM); err != nil {
		// No SIGTERM on this system, or the process is gone.
		_ = proc.Process.Kill()
	}
	select {
	case <-exited:
	case <-time.After(stopTimeout):
		_ = proc.Process.Kill()
		<-exited
		c.fail(false, "natscluster: %s did not exit within %v of SIGTERM", nd.name, stopTimeout)
	}
}

// Restart starts the given nodes again, after Kill or Stop, each on its
// same ports and store directory, and waits until each answers with a
// meta leader known and the leader counts every running node as a
// current, online peer. Nodes restarted together start at once: a
// cluster stopped whole has no meta leader until a quorum is back. It
// fails the test when a node does not come back.
func (c *Cluster) Restart(nodes ...int) {
	if c.t != nil {
		c.t.Helper()
	}
	for _, i := range nodes {
		if c.Running(i) {
			c.fail(true, "natscluster: restart %s: it is still running", c.nodes[i].name)
			return
		}
	}
	var err error
	// The old process's listening ports may linger a moment after it
	// exits; a node whose bind failed is started again.
	for try := range startTries {
		if err = c.restart(nodes); err == nil {
			return
		}
		if !errors.Is(err, errPortTaken) {
			break
		}
		time.Sleep(time.Duration(try+1) * 200 * time.Millisecond)
	}
	c.fail(true, "natscluster: restart %v: %v", nodes, err)
}

// restart starts those of nodes that are not running and waits until
// every one of nodes is ready and counted by the meta leader.
func (c *Cluster) restart(nodes []int) error {
	for _, i := range nodes {
		if !c.Running(i) {
			if err := c.launch(c.nodes[i]); err != nil {
				return err
			}
		}
	}
	for _, i := range nodes {
		if err := c.waitReady(c.nodes[i]); err != nil {
			return err
		}
	}
	return c.waitPeers()
}

// Running reports whether node i's process is running.
func (c *Cluster) Running(i int) bool {
	nd := c.nodes[i]
	_, exited := nd.current()
	if exited == nil {
		return false
	}
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

// WaitHealthy waits until node i answers a full healthz (every stream
// and consumer it holds is current), or fails the test at the deadline.
// After a Restart, it tells when the node has caught up.
func (c *Cluster) WaitHealthy(ctx context.Context, i int) {
	if c.t != nil {
		c.t.Helper()
	}
	nd := c.nodes[i]
	url := fmt.Sprintf("http://127.0.0.1:%d/healthz", nd.monitor)
	client := &http.Client{Timeout: 2 * time.Second}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	last := "no answer"
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := client.Do(req); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(body))
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			c.fail(true, "natscluster: %s not healthy (healthz: %s)", nd.name, last)
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Log returns what node i has written to its log so far.
func (c *Cluster) Log(i int) string {
	b, _ := os.ReadFile(c.nodes[i].log)
	return string(b)
}

// fail reports a failure to the test of Start, which ends it when
// fatal; a cluster from Launch has no test to fail, and panics.
func (c *Cluster) fail(fatal bool, format string, args ...any) {
	if c.t == nil {
		panic(fmt.Sprintf(format, args...))
	}
	c.t.Helper()
	if fatal {
		c.t.Fatalf(format, args...)
	}
	c.t.Errorf(format, args...)
}

// Close kills every node and waits for it to exit, then removes the
// folder that Launch made for the nodes. It is idempotent. A cluster
// from Start is closed when its test ends, and may be closed before.
func (c *Cluster) Close() {
	c.closeOnce.Do(func() {
		c.killAll()
		if c.dir != "" {
			_ = os.RemoveAll(c.dir)
		}
	})
}

// PIDs returns the process ids of the running nodes, in node order.
func (c *Cluster) PIDs() []int {
	var pids []int
	for i, nd := range c.nodes {
		if proc, _ := nd.current(); proc != nil && c.Running(i) {
			pids = append(pids, proc.Process.Pid)
		}
	}
	return pids
}

// cleanup kills every node and, if the test failed, logs the tail of
// each node's log.
func (c *Cluster) cleanup() {
	c.Close()
	if c.t.Failed() {
		c.t.Log(c.tails())
	}
}

// tails is the tail of every node's log, for a failed start or test.
func (c *Cluster) tails() string {
	var b strings.Builder
	for _, nd := range c.nodes {
		if nd != nil {
			fmt.Fprintf(&b, "natscluster: tail of %s's log (%s):\n%s\n", nd.name, nd.log, tail(nd.log, logTailLines))
		}
	}
	return b.String()
}

func (c *Cluster) killAll() {
	for i, nd := range c.nodes {
		if nd != nil {
			c.Kill(i)
		}
	}
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

func logHas(path, s string) bool {
	b, err := os.ReadFile(path)
	return err == nil && bytes.Contains(b, []byte(s))
}

// Port returns node i's client port.
func (c *Cluster) Port(i int) int { return c.nodes[i].client }

// String describes the cluster for logs.
func (c *Cluster) String() string {
	parts := make([]string, len(c.nodes))
	for i, nd := range c.nodes {
		parts[i] = nd.name + "=" + strconv.Itoa(nd.client)
	}
	return "natscluster[" + strings.Join(parts, " ") + "]"
}
