//go:build unix

package e2e_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTheGatewayGoesOnAfterServeIsStopped stops serve for 15 s (SIGSTOP,
// as a laptop lid or a debugger does) in the middle of a flood of big
// reads through its gateway, and continues it: the server's write
// deadlines passed while nothing ran, and it may cut the in-process
// links it was writing to. The reads are answered, the gateway answers
// within seconds of the continue, and a stream open across the stop sees
// its task end.
func TestTheGatewayGoesOnAfterServeIsStopped(t *testing.T) {
	if testing.Short() {
		t.Skip("stops serve for 15 s")
	}
	t.Parallel()
	g := newGatewayScene(t, "debug")
	small := g.start(t, "and a note")
	streamed := g.stream(t, small)
	flooded := make(chan map[string]int, 1)
	underWay := make(chan struct{})
	go func() { flooded <- g.flood(t, 50, underWay) }()
	<-underWay
	require.NoError(t, g.s.cmd.Process.Signal(syscall.SIGSTOP))
	// The stop's length is the point: it outlasts the server's 3 s write
	// deadline and the clients' 10 s ping interval (natsbus's, which no
	// test can shorten), so that at the continue they all fire late at
	// once. The test runs in parallel with others meanwhile.
	time.Sleep(15 * time.Second)
	require.NoError(t, g.s.cmd.Process.Signal(syscall.SIGCONT))
	continued := time.Now()
	assert.Equal(t, map[string]int{"ok": 50}, <-flooded, "the reads under way across the stop are answered")
	t.Logf("the reads were all answered %v after the continue", time.Since(continued).Round(time.Millisecond))
	g.answersAgain(t, small, time.Now())
	g.ends(t, small, streamed)
	g.logCuts(t)
}
