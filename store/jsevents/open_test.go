package jsevents_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/a2a-bus/a2a-bus/store/jsevents"
)

// Logs opened at once through three nodes, as the brokers of a cluster
// that start together open theirs, all join one stream: the Logs whose
// create loses to another's wait for the winner's stream, which the
// cluster may have assigned but not yet made.
func TestClusterLogsOpenedAtOnceJoinOneStream(t *testing.T) {
	c := startCluster(t)
	var urls []string
	for i := range c.N() {
		urls = append(urls, clusterURLs(c, i))
	}
	const rounds = 8
	for round := range rounds {
		cfg := jsevents.Config{Replicas: 3, Stream: fmt.Sprintf("OPEN%d", round), Prefix: fmt.Sprintf("open%d.log", round)}
		logs := make([]*jsevents.Log, len(urls))
		errs := make([]error, len(urls))
		var wg sync.WaitGroup
		for i, u := range urls {
			nc := connect(t, u)
			wg.Go(func() { logs[i], errs[i] = jsevents.Open(testContext(t), nc, cfg) })
		}
		wg.Wait()
		for i, l := range logs {
			if l != nil {
				t.Cleanup(func() { _ = l.Close() })
			}
			if errs[i] != nil {
				t.Fatalf("round %d: open through node %d: %v", round, i, errs[i])
			}
		}
		for _, l := range logs[1:] {
			if l.Epoch() != logs[0].Epoch() {
				t.Fatalf("round %d: epochs %q and %q: two streams", round, logs[0].Epoch(), l.Epoch())
			}
		}
	}
}
