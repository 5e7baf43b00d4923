package main

import (
	"testing"

	"github.com/a2a-bus/a2a-bus/internal/natscluster"
)

// BenchmarkCluster runs the cluster section's cases on one cluster of
// three nats-server processes and three brokers, in this process, for a
// profile of its side (the brokers, the runtimes, the callers):
//
//	go test ./bench -run '^$' -bench 'Cluster/round-trip' -benchtime 200x -cpuprofile cpu.out
func BenchmarkCluster(b *testing.B) {
	bin, cleanup, err := build("github.com/nats-io/nats-server/v2", "nats-server")
	if err != nil {
		b.Fatal(err)
	}
	defer cleanup()
	nc, err := natscluster.Launch(bin, clusterNodes, natscluster.Options{Name: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	c, err := openBenchCluster(nc)
	if err != nil {
		b.Fatal(err)
	}
	defer c.close()
	rt, err := c.roundTripOp("rt")
	if err != nil {
		b.Fatal(err)
	}
	creators, err := c.creators()
	if err != nil {
		b.Fatal(err)
	}
	b.Run("bare-request-reply", c.bareRequestReply)
	b.Run("bare-publish", c.barePublish(1))
	b.Run("round-trip", latencyOf(rt))
	b.Run("bare-publish-parallel", c.barePublish(clusterCallers))
	b.Run("creates", inParallelOf(creators, "tasks/s"))
}
