//go:build linux

package natsbus_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/natsbus"
	a2art "github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// The session-cost measure: what the embedded server and the broker hold
// and spend for sessions that each sit on a connection of their own with
// their credential (a host whose sessions run elsewhere), while nothing
// happens. It runs only when asked:
//
//	A2A_SESSION_COST=2000 go test ./natsbus -run TestSessionCost -v
//
// with A2A_SESSION_COST_IDLE the idle window (a duration, 20s by default)
// and A2A_SESSION_COST_PROFILES a folder where the heap and CPU profiles
// are written (heap.pprof, cpu.pprof). The sessions' clients run in a
// child process (this test binary again), so that what this process
// holds and spends is the broker's and the server's alone.
const (
	costEnv      = "A2A_SESSION_COST"
	costIdleEnv  = "A2A_SESSION_COST_IDLE"
	costOutEnv   = "A2A_SESSION_COST_PROFILES"
	costChildEnv = "A2A_SESSION_COST_CHILD" // url and token, for the child
)

func TestSessionCost(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv(costEnv))
	if n <= 0 {
		t.Skip("a measure: set " + costEnv + " to the number of sessions")
	}
	idle := 20 * time.Second
	if s := os.Getenv(costIdleEnv); s != "" {
		var err error
		idle, err = time.ParseDuration(s)
		require.NoError(t, err)
	}
	out := os.Getenv(costOutEnv)
	// As serve runs it: every bound at its default.
	b, err := natsbus.New(natsbus.Config{})
	require.NoError(t, err)
	br, err := broker.New(context.Background(), b, broker.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close(); br.Close() })
	runtime.GC()
	before := readCost(t)

	child := exec.Command(os.Args[0], "-test.run=^TestSessionCostClients$", "-test.v")
	child.Env = append(os.Environ(), costChildEnv+"="+b.Server().URL()+" "+b.Server().Token(), costEnv+"="+strconv.Itoa(n))
	child.Stderr = os.Stderr
	stdin, err := child.StdinPipe()
	require.NoError(t, err)
	stdout, err := child.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	var waited sync.Once
	wait := func() {
		waited.Do(func() {
			stdin.Close()
			if err := child.Wait(); err != nil {
				t.Errorf("the clients' process: %v", err)
			}
		})
	}
	t.Cleanup(wait)
	lines := bufio.NewScanner(stdout)
	ready := false
	for lines.Scan() {
		fmt.Fprintln(os.Stderr, "clients:", lines.Text())
		if lines.Text() == "ready" {
			ready = true
			break
		}
	}
	require.True(t, ready, "the clients' process ended before its sessions were open")
	go func() { _, _ = io.Copy(io.Discard, stdout) }()

	// Every session's events reach its connection: it has subscribers,
	// which a session no one opened has not.
	none, ok := b.Subscribers(costSession(n))
	require.True(t, ok)
	for i := range n {
		subs, ok := b.Subscribers(costSession(i))
		require.True(t, ok)
		require.Greater(t, subs, none, "session %d's subscribers", i)
	}
	time.Sleep(2 * time.Second) // settle
	runtime.GC()
	after := readCost(t)
	t.Logf("%d sessions: RSS %.1f MiB (%.1f KiB/session), heap in use %.1f MiB (%.1f KiB/session), stacks %.1f MiB (%.1f KiB/session), goroutines %d (%.1f/session)",
		n, mib(after.rss), kib(after.rss-before.rss)/float64(n),
		mib(after.heap), kib(after.heap-before.heap)/float64(n),
		mib(after.stack), kib(after.stack-before.stack)/float64(n),
		after.goroutines, float64(after.goroutines-before.goroutines)/float64(n))
	if out != "" {
		f, err := os.Create(filepath.Join(out, "heap.pprof"))
		require.NoError(t, err)
		require.NoError(t, pprof.Lookup("heap").WriteTo(f, 0))
		require.NoError(t, f.Close())
		f, err = os.Create(filepath.Join(out, "goroutine.txt"))
		require.NoError(t, err)
		require.NoError(t, pprof.Lookup("goroutine").WriteTo(f, 1))
		require.NoError(t, f.Close())
	}

	var cpuFile *os.File
	if out != "" {
		cpuFile, err = os.Create(filepath.Join(out, "cpu.pprof"))
		require.NoError(t, err)
		require.NoError(t, pprof.StartCPUProfile(cpuFile))
	}
	looks := b.Server().WatchdogLooks()
	cpu0, wakes0, made0, start := processCPU(t), threadWakes(t), goroutinesMade(), time.Now()
	time.Sleep(idle)
	cpu1, wakes1, made1, elapsed := processCPU(t), threadWakes(t), goroutinesMade(), time.Since(start)
	assert.Equal(t, looks, b.Server().WatchdogLooks(), "the watchdog looked while nothing was published")
	if cpuFile != nil {
		pprof.StopCPUProfile()
		require.NoError(t, cpuFile.Close())
	}
	// The CPU share is noisy on a busy machine; the wake-ups it is made
	// of (a ping, a timer) are counted too: the process's threads woken,
	// and the goroutines started (a timer's function runs on one).
	t.Logf("%d idle sessions over %v: %.2f %% of a core, %.0f thread wake-ups and %.0f goroutines started a second", n, idle,
		100*(cpu1-cpu0).Seconds()/elapsed.Seconds(), float64(wakes1-wakes0)/elapsed.Seconds(), float64(made1-made0)/elapsed.Seconds())
	// What the idle window left, uncollected: the pings have grown the
	// stacks that the collection before it had shrunk.
	idled := readCost(t)
	t.Logf("%d sessions after the idle window: RSS %.1f KiB/session, heap in use %.1f KiB/session, stacks %.1f KiB/session",
		n, kib(idled.rss-before.rss)/float64(n), kib(idled.heap-before.heap)/float64(n), kib(idled.stack-before.stack)/float64(n))
	wait()
}

// TestSessionCostClients is TestSessionCost's child: it opens the
// sessions with the host token, connects each with its credential and
// starts its runtime (subscribed), says "ready", and holds them until
// its stdin closes.
func TestSessionCostClients(t *testing.T) {
	parent := os.Getenv(costChildEnv)
	if parent == "" {
		t.Skip("the clients of TestSessionCost")
	}
	url, token, _ := strings.Cut(parent, " ")
	n, err := strconv.Atoi(os.Getenv(costEnv))
	require.NoError(t, err)
	ctx := context.Background()
	h, err := natsbus.Dial(natsbus.ClientConfig{URL: url, Token: token})
	require.NoError(t, err)
	defer h.Close()
	clients := make([]*natsbus.Client, n)
	rts := make([]*a2art.Runtime, n)
	defer func() {
		costParallel(n, func(i int) error {
			if rts[i] != nil {
				rts[i].Close()
			}
			if clients[i] != nil {
				clients[i].Close()
			}
			return nil
		})
	}()
	require.NoError(t, costParallel(n, func(i int) error {
		id := costSession(i)
		raw, err := h.CallHost(ctx, wire.MethodSessionOpen, wire.SessionParams{ContextID: id})
		if err != nil {
			return err
		}
		var cred wire.SessionCredentials
		if err := wire.Unmarshal(raw, &cred); err != nil {
			return err
		}
		// A server busy with thousands of dials may let one time out:
		// dialled again, as a host would.
		var c *natsbus.Client
		for attempt := 1; ; attempt++ {
			c, err = natsbus.Dial(natsbus.ClientConfig{URL: cred.URL, User: cred.User, Password: cred.Password, Session: id})
			if err == nil {
				break
			}
			if attempt == 3 {
				return err
			}
		}
		clients[i] = c
		var sess transport.Session
		if sess, err = c.Session(ctx, id); err != nil {
			return err
		}
		rts[i], err = a2art.New(ctx, sess, a2art.Config{})
		return err
	}))
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
}

func costSession(i int) string { return fmt.Sprintf("cost-%05d", i) }

// costParallel runs fn(0..n-1) on a few goroutines; the first error.
func costParallel(n int, fn func(i int) error) error {
	g, ctx := errgroup.WithContext(context.Background())
	g.SetLimit(16)
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		g.Go(func() error { return fn(i) })
	}
	return g.Wait()
}

type cost struct {
	rss, heap, stack int64
	goroutines       int
}

func readCost(t *testing.T) cost {
	t.Helper()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	status, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	var rss int64
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			require.NoError(t, err)
			rss = kb << 10
		}
	}
	return cost{rss: rss, heap: int64(ms.HeapInuse), stack: int64(ms.StackInuse), goroutines: runtime.NumGoroutine()}
}

func processCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// goroutinesMade counts the goroutines started so far.
func goroutinesMade() uint64 {
	sample := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(sample)
	return sample[0].Value.Uint64()
}

// threadWakes counts the times this process's threads gave up the CPU to
// wait (voluntary context switches), so far: each one woken again is a
// wake-up.
func threadWakes(t *testing.T) int64 {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	require.NoError(t, err)
	var n int64
	for _, task := range tasks {
		status, err := os.ReadFile(task)
		if err != nil {
			continue // the thread ended
		}
		for line := range strings.Lines(string(status)) {
			if rest, ok := strings.CutPrefix(line, "voluntary_ctxt_switches:"); ok {
				k, err := strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
				require.NoError(t, err)
				n += k
			}
		}
	}
	return n
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
func kib(n int64) float64 { return float64(n) / (1 << 10) }
