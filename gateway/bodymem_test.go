package gateway_test

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/gateway"
	"github.com/a2a-bus/a2a-bus/wire"
)

// heapPeak samples the heap in use until stop is called, and returns the
// highest figure seen.
func heapPeak() (stop func() uint64) {
	var peak atomic.Uint64
	done, quit := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
			select {
			case <-quit:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	return func() uint64 { close(quit); <-done; return peak.Load() }
}

// dataBody is a SendMessage whose data part is n copies of unit, as
// large as fits limit bytes.
func dataBody(id int, unit string, limit int) []byte {
	head := `{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"configuration":{"returnImmediately":true},"message":{"messageId":"m` +
		strings.Repeat("x", 8) + string(rune('a'+id%26)) + string(rune('a'+id/26)) + `","role":"ROLE_USER","parts":[{"data":[`
	tail := `]}]}}}`
	n := (limit - len(head) - len(tail) + 1) / (len(unit) + 1)
	return []byte(head + strings.TrimSuffix(strings.Repeat(unit+",", n), ",") + tail)
}

// The bound the test holds the gateway to (docs/PROTOCOL.md §12, Limits;
// docs/RELIABILITY.md): the heap grows by at most bodyFactor times the
// gateway's budget of bodies in service (MaxInFlightBytes), plus what the
// broker keeps of what it accepted. Measured with the broker in the same
// process: about 32 for the densest body the scan lets through
// ([10,10,…], through the SDK, the broker and back), 1.5–2 for refused
// ones.
const bodyFactor = 48

// serveAtOnce posts n copies of a body built by mk at once, the i-th with
// tokens[i%len(tokens)], and returns the answers and the peak growth of
// the heap.
func serveAtOnce(t *testing.T, e *env, agent string, tokens []string, n int, mk func(i int) []byte) ([][]byte, uint64) {
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = mk(i)
	}
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	base := m.HeapInuse
	stop := heapPeak()
	out := make([][]byte, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { out[i] = e.postAs(tokens[i%len(tokens)], agent, bodies[i]) })
	}
	wg.Wait()
	peak := stop()
	return out, peak - min(peak, base)
}

// Bodies whose decoded form is some 40 times their size ([{},{},…]: 16 of
// them at once took 600 MiB) are refused before the SDK decodes them, and
// the gateway's heap stays within its bound while they are served.
func TestHostileBodiesStayWithinTheMemoryBound(t *testing.T) {
	// Four clients: each may hold a quarter of the budget, so together
	// they fill it.
	e := newClientsEnv(t, broker.Config{}, gateway.Config{})
	var tokens []string
	for i := range 4 {
		tokens = append(tokens, e.issue(fmt.Sprint("client-", i)).Token)
	}
	d := e.delegate("chat-1", "scribe")
	budget := int64(8 * wire.DefaultMaxMessageBytes) // the default
	const n = 16
	outs, grew := serveAtOnce(t, e.env, d.ID(), tokens, n, func(i int) []byte { return dataBody(i, "{}", wire.DefaultMaxMessageBytes) })
	for _, out := range outs {
		assert.Contains(t, string(out), `"code":-32600`)
		assert.Contains(t, string(out), `"id":1`)
	}
	// Refused after the scan, each holds little more than its bytes.
	t.Logf("%d hostile 1 MiB bodies at once: the heap grew by %.1f MiB (bound %d MiB)", n, float64(grew)/(1<<20), 4*budget>>20)
	assert.LessOrEqual(t, grew, uint64(4*budget), "the heap grew past its bound")

	// The densest body the scan lets through, [10,10,…], 960 KiB each (the
	// broker's message limit leaves room for its envelope): served
	// in the budget, 8 at a time.
	outs, grew = serveAtOnce(t, e.env, d.ID(), tokens, n, func(i int) []byte { return dataBody(i, "10", wire.DefaultMaxMessageBytes-64<<10) })
	served := 0
	for _, out := range outs {
		if strings.Contains(string(out), `"result"`) {
			served++
			continue
		}
		// Slow (under -race): a request that waited BusyWait is refused.
		assert.Contains(t, string(out), `"code":-32603,"message":"the gateway is busy`)
	}
	assert.GreaterOrEqual(t, served, n/2, "a budget's worth is served at once")
	kept := uint64(n * wire.DefaultMaxMessageBytes) // the broker's memory store keeps each message
	t.Logf("%d dense 960 KiB bodies at once: the heap grew by %.1f MiB (bound %d MiB + %d MiB the broker keeps)", n, float64(grew)/(1<<20), bodyFactor*budget>>20, kept>>20)
	assert.LessOrEqual(t, grew, uint64(bodyFactor*budget)+kept, "the heap grew past its bound")
}
