package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A cluster of real nats-server processes with JetStream on loopback, as
// the cluster tests start one: a binary built from this module's build
// list, each node with its own ports, config file, store directory and
// log, the same full routes list on every node.

// clusterReadyTimeout bounds the wait for a started cluster: every node
// answers with a meta leader known, and the leader can place a stream
// on every node.
const clusterReadyTimeout = 60 * time.Second

// clusterStartTries is how many times a cluster is started on fresh
// ports when a port chosen for it was taken before a node bound it.
const clusterStartTries = 3

type natsCluster struct {
	bin   string
	dir   string
	nodes []*natsNode
}

type natsNode struct {
	name                   string
	client, route, monitor int
	dir, conf, log         string
	cmd                    *exec.Cmd
	exited                 chan struct{}
}

// startNATSCluster starts n nodes of bin clustered with JetStream, and
// waits until they are ready. close kills them.
func startNATSCluster(bin string, n int) (*natsCluster, error) {
	dir, err := os.MkdirTemp("", "a2a-bus-bench-cluster-")
	if err != nil {
		return nil, err
	}
	c := &natsCluster{bin: bin, dir: dir}
	for try := range clusterStartTries {
		err = c.start(filepath.Join(dir, fmt.Sprint("try", try)), n)
		if err == nil {
			return c, nil
		}
		c.kill()
		if !errors.Is(err, errClusterPortTaken) {
			break
		}
	}
	os.RemoveAll(dir)
	return nil, err
}

var errClusterPortTaken = errors.New("a port was taken meanwhile")

func (c *natsCluster) start(base string, n int) error {
	ports := make([]int, 3*n)
	ls := make([]net.Listener, 0, len(ports))
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			for _, l := range ls {
				l.Close()
			}
			return err
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	for _, l := range ls {
		l.Close()
	}
	c.nodes = make([]*natsNode, n)
	routes := make([]string, n)
	for i := range c.nodes {
		nd := &natsNode{name: fmt.Sprint("n", i), client: ports[3*i], route: ports[3*i+1], monitor: ports[3*i+2]}
		nd.dir = filepath.Join(base, nd.name)
		nd.conf, nd.log = filepath.Join(nd.dir, "server.conf"), filepath.Join(nd.dir, "server.log")
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", nd.route)
		c.nodes[i] = nd
	}
	for _, nd := range c.nodes {
		var b strings.Builder
		fmt.Fprintf(&b, "server_name: %s\nlisten: 127.0.0.1:%d\nhttp: 127.0.0.1:%d\n", nd.name, nd.client, nd.monitor)
		fmt.Fprintf(&b, "cluster {\n  name: bench\n  listen: 127.0.0.1:%d\n  routes: [%s]\n}\n", nd.route, strings.Join(routes, ", "))
		fmt.Fprintf(&b, "jetstream {\n  store_dir: %q\n}\n", filepath.Join(nd.dir, "store"))
		if err := os.MkdirAll(nd.dir, 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(nd.conf, []byte(b.String()), 0o600); err != nil {
			return err
		}
	}
	for _, nd := range c.nodes {
		f, err := os.Create(nd.log)
		if err != nil {
			return err
		}
		nd.cmd = exec.Command(c.bin, "-c", nd.conf)
		nd.cmd.Stdout, nd.cmd.Stderr = f, f
		nd.cmd.SysProcAttr = childProcAttr()
		if err := nd.cmd.Start(); err != nil {
			f.Close()
			nd.cmd = nil
			return fmt.Errorf("start %s: %w", nd.name, err)
		}
		nd.exited = make(chan struct{})
		go func() {
			nd.cmd.Wait()
			f.Close()
			close(nd.exited)
		}()
	}
	deadline := time.Now().Add(clusterReadyTimeout)
	for _, nd := range c.nodes {
		if err := nd.waitReady(deadline); err != nil {
			return err
		}
	}
	return c.probePlacement(deadline)
}

// waitReady waits until nd answers healthz with a JetStream meta leader
// known.
func (nd *natsNode) waitReady(deadline time.Time) error {
	url := fmt.Sprintf("http://127.0.0.1:%d/healthz?js-meta-only=true", nd.monitor)
	client := &http.Client{Timeout: 2 * time.Second}
	last := "no answer"
	for {
		select {
		case <-nd.exited:
			logged, _ := os.ReadFile(nd.log)
			if bytes.Contains(logged, []byte("address already in use")) {
				return fmt.Errorf("%s exited: %w", nd.name, errClusterPortTaken)
			}
			return fmt.Errorf("%s exited before it was ready:\n%s", nd.name, logged)
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
			return fmt.Errorf("%s not ready within %v (healthz: %s)", nd.name, clusterReadyTimeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// probePlacement makes and removes a stream with a replica on every
// node until that works: the meta leader places no stream on a node it
// has not yet heard from.
func (c *natsCluster) probePlacement(deadline time.Time) error {
	nc, err := nats.Connect(c.url(0))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cfg := jetstream.StreamConfig{Name: "bench_probe", Subjects: []string{"bench.probe"}, Storage: jetstream.MemoryStorage, Replicas: len(c.nodes)}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := js.CreateStream(ctx, cfg)
		if err == nil {
			err = js.DeleteStream(ctx, cfg.Name)
		}
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no stream of %d replicas can be made: %w", len(c.nodes), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pids are the nodes' process ids.
func (c *natsCluster) pids() []int {
	var pids []int
	for _, nd := range c.nodes {
		pids = append(pids, nd.cmd.Process.Pid)
	}
	return pids
}

// url is node i's client URL.
func (c *natsCluster) url(i int) string {
	return fmt.Sprintf("nats://127.0.0.1:%d", c.nodes[i].client)
}

// kill kills every node and waits for it.
func (c *natsCluster) kill() {
	for _, nd := range c.nodes {
		if nd != nil && nd.cmd != nil {
			nd.cmd.Process.Kill()
			<-nd.exited
		}
	}
}

// close kills every node and removes their folders.
func (c *natsCluster) close() {
	c.kill()
	os.RemoveAll(c.dir)
}
