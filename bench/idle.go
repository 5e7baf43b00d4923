//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/a2a-bus/a2a-bus/host"
	"github.com/a2a-bus/a2a-bus/natsbus"
	a2art "github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"
)

// delegatesPerSession is how many delegates each session of the idle
// delegates rows spawns: within the broker's default of 64 live agents
// per session, so that serve runs with its default settings.
const delegatesPerSession = 50

// idle: what serve and a Go host cost while nothing happens, and what a
// session costs serve, against a2a-bus serve built from this checkout
// (NATS, memory store). The CPU rows read serve's CPU time from /proc
// and this process's from getrusage, over a window in which this
// process does nothing but hold the connections; the memory rows read
// serve's resident memory before and after its sessions open. Linux
// only: elsewhere the section is skipped.
func (r *runner) idle() error {
	if err := raiseFileLimit(); err != nil {
		return err
	}
	bin, cleanup, err := buildServe()
	if err != nil {
		return err
	}
	defer cleanup()
	window := 20 * time.Second
	if r.quick {
		window = 10 * time.Second
	}
	for _, n := range []int{1000, 10000} {
		bound := map[int]float64{1000: 0.5, 10000: 2}[n]
		name := fmt.Sprintf("idle CPU, %s delegates waiting (%s sessions × %d), Go host joined by connection file, %v", grouped(n), grouped(n/delegatesPerSession), delegatesPerSession, window)
		r.idleRow(name, func() (Result, error) { return idleDelegates(bin, n, window, bound) })
	}
	natsServer, cleanupServer, err := build("github.com/nats-io/nats-server/v2", "nats-server")
	if err != nil {
		return err
	}
	defer cleanupServer()
	// The sessions' own connections idle in a rhythm of pings (a client's
	// every 30 s, the server's to the broker's links every 60 s) and the
	// broker's minute housekeeping: their window is a whole period of it,
	// or a shorter one would measure where in the period it fell.
	const credSessions = 2000
	credWindow := time.Minute
	if r.quick {
		credWindow = 30 * time.Second
	}
	floorName := fmt.Sprintf("idle CPU, %s bare connections to a bare nats-server, serve's pings, one subscription each (the floor of the next row), %v", grouped(credSessions), credWindow)
	var floorCPU Result
	r.idleRowOf("nats-server", floorName, func() (res Result, err error) {
		floorCPU, err = bareConnections(natsServer, credSessions, credWindow)
		return floorCPU, err
	})
	name := fmt.Sprintf("idle CPU, %s sessions on their own credential connections, no traffic, %v", grouped(credSessions), credWindow)
	r.idleRow(name, func() (res Result, err error) {
		res, err = idleSessions(bin, credSessions, credWindow)
		if f := floorCPU.Metrics["server-cpu-%"]; err == nil && f > 0 {
			res.Ratio, res.Against = res.Metrics["broker-cpu-%"]/f, floorName
		}
		return res, err
	})
	n := 10000
	if r.quick {
		n = 2000
	}
	floorName = fmt.Sprintf("RSS, %s bare connections to a bare nats-server, serve's pings, one subscription each (the floor of the own-connection row)", grouped(n))
	var floorRSS Result
	r.idleRowOf("nats-server", floorName, func() (res Result, err error) {
		floorRSS, err = bareConnections(natsServer, n, 0)
		return floorRSS, err
	})
	for _, own := range []bool{false, true} {
		shape := map[bool]string{false: "one Go host connection", true: "their own credential connections (the Node host's shape)"}[own]
		name := fmt.Sprintf("RSS, %s sessions on %s", grouped(n), shape)
		r.idleRow(name, func() (res Result, err error) {
			res, err = sessionMemory(bin, n, own, own && !r.quick)
			if f := floorRSS.Metrics["KiB/connection"]; own && err == nil && f > 0 {
				res.Ratio, res.Against = res.Metrics["KiB/session"]/f, floorName+", per connection"
			}
			return res, err
		})
	}
	return nil
}

// bareConnections is the floor of the credential sessions' rows: a
// nats-server built from this module's build list, configured as serve
// configures the one it embeds where an idle connection's cost is
// concerned (loopback, its pings), and n nats.go connections from this
// process, each pinging as the Go client does, with one subscription and
// a flush (which the server answers, as it answers a session's). It
// reports the server's resident memory per connection, and with window
// > 0 its CPU over window. What a session costs beyond this is the
// broker's; this much is the transport's, for one connection a session.
func bareConnections(natsServer string, n int, window time.Duration) (res Result, err error) {
	client, server := natsbus.Keepalives()
	dir, err := os.MkdirTemp("", "a2a-bus-bench-bare-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	port, err := freePort()
	if err != nil {
		return res, err
	}
	conf := filepath.Join(dir, "bare.conf")
	text := fmt.Sprintf("listen: \"127.0.0.1:%d\"\nping_interval: %q\nping_max: %d\nmax_connections: %d\n", port, server.Interval.String(), server.MaxOut, n+64)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		return res, err
	}
	cmd := exec.Command(natsServer, "-c", conf)
	var logged bytes.Buffer
	cmd.Stderr = &logged
	if err := cmd.Start(); err != nil {
		return res, err
	}
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	}()
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	var first *nats.Conn
	for deadline := time.Now().Add(serveReadyTimeout); ; time.Sleep(20 * time.Millisecond) {
		if first, err = nats.Connect(url); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("nats-server did not take connections within %v: %v: %s", serveReadyTimeout, err, logged.String())
		}
	}
	first.Close()
	if err := enoughFiles(cmd.Process.Pid, n); err != nil {
		return res, err
	}
	time.Sleep(settle)
	before, err := residentKiB(cmd.Process.Pid)
	if err != nil {
		return res, err
	}
	conns := make([]*nats.Conn, n)
	defer inParallel(n, func(i int) error {
		if conns[i] != nil {
			conns[i].Close()
		}
		return nil
	})
	err = inParallel(n, func(i int) error {
		nc, err := nats.Connect(url, nats.PingInterval(client.Interval), nats.MaxPingsOutstanding(client.MaxOut))
		if err != nil {
			return fmt.Errorf("connection %d: %w", i, err)
		}
		conns[i] = nc
		if _, err := nc.Subscribe(natsbus.EventsSubject(fmt.Sprintf("bare-%05d", i)), func(*nats.Msg) {}); err != nil {
			return fmt.Errorf("connection %d: %w", i, err)
		}
		return nc.Flush()
	})
	if err != nil {
		return res, err
	}
	time.Sleep(settle)
	after, err := residentKiB(cmd.Process.Pid)
	if err != nil {
		return res, err
	}
	res.Metrics = map[string]float64{"rss-MiB": float64(after) / 1024, "KiB/connection": float64(after-before) / float64(n)}
	if window > 0 {
		cpu, _, err := idleCPU(cmd.Process.Pid, window)
		if err != nil {
			return res, err
		}
		res.Metrics["server-cpu-%"] = cpu
	}
	return res, nil
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// idleRow runs one row of serve and adds its result, or a failed row
// that says why: one row's failure does not end the run.
func (r *runner) idleRow(name string, row func() (Result, error)) {
	r.idleRowOf("serve", name, row)
}

// idleRowOf is idleRow for a row of bus (serve, or the bare nats-server
// of a floor).
func (r *runner) idleRowOf(bus, name string, row func() (Result, error)) {
	fmt.Fprintf(os.Stderr, "bench: %-12s %s\n", bus, name)
	res, err := row()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %s %s failed: %v\n", bus, name, err)
		res = Result{Target: "failed: " + err.Error(), Met: met(false)}
	}
	res.Bus, res.Case, res.AllocsPerOp = bus, name, -1
	r.add(res)
}

// idleDelegates: n delegates of a Go host joined by the connection file,
// each blocked in Wait, while nothing happens; the CPU of serve and of
// the host (this process) over window, with bound the target for both
// together, in percent of a core.
func idleDelegates(bin string, n int, window time.Duration, bound float64) (res Result, err error) {
	srv, err := startServe(bin)
	if err != nil {
		return res, err
	}
	defer srv.stop()
	ctx := context.Background()
	h, err := host.Open(ctx, host.Config{Bus: host.NATS, ConnectionFile: srv.connFile})
	if err != nil {
		return res, err
	}
	defer h.Close()
	rts := make([]*a2art.Runtime, n/delegatesPerSession)
	defer closeAll(rts)
	delegates := make([]*a2art.Delegate, n)
	err = inParallel(len(rts), func(i int) error {
		rt, err := h.Session(ctx, fmt.Sprintf("idle-%05d", i))
		if err != nil {
			return fmt.Errorf("session %d: %w", i, err)
		}
		rts[i] = rt
		for j := range delegatesPerSession {
			d, err := rt.Spawn(ctx, wire.AgentCard{Name: fmt.Sprintf("worker-%d", j)})
			if err != nil {
				return fmt.Errorf("session %d, delegate %d: %w", i, j, err)
			}
			delegates[i*delegatesPerSession+j] = d
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	waitCtx, stopWaiting := context.WithCancel(ctx)
	var waiters sync.WaitGroup
	var woken atomic.Int64
	var stopped atomic.Pointer[error]
	defer func() {
		stopWaiting()
		waiters.Wait()
	}()
	for _, d := range delegates {
		waiters.Go(func() {
			for {
				if _, err := d.Wait(waitCtx); err != nil {
					if waitCtx.Err() == nil {
						stopped.CompareAndSwap(nil, &err)
					}
					return
				}
				woken.Add(1)
			}
		})
	}
	time.Sleep(settle)
	brokerCPU, hostCPU, err := idleCPU(srv.pid(), window)
	if err != nil {
		return res, err
	}
	if p := stopped.Load(); p != nil {
		return res, fmt.Errorf("a delegate stopped waiting: %w", *p)
	}
	if w := woken.Load(); w > 0 {
		fmt.Fprintf(os.Stderr, "bench: serve %d events came to the idle delegates\n", w)
	}
	sum := brokerCPU + hostCPU
	return Result{
		Metrics: map[string]float64{"cpu-%": sum, "broker-cpu-%": brokerCPU, "host-cpu-%": hostCPU},
		Target:  fmt.Sprintf("broker + host < %g %% of a core", bound),
		Met:     met(sum < bound),
	}, nil
}

// idleSessions: n sessions, each on a connection of its own with the
// session credential the host opened it with (a2a.sessions.open), each
// with its runtime (subscribed, and synced once), and no traffic; the
// CPU of serve over window, and of this process beside it.
func idleSessions(bin string, n int, window time.Duration) (res Result, err error) {
	srv, err := startServe(bin)
	if err != nil {
		return res, err
	}
	defer srv.stop()
	h, err := host.Open(context.Background(), host.Config{Bus: host.NATS, ConnectionFile: srv.connFile})
	if err != nil {
		return res, err
	}
	defer h.Close()
	if err := enoughFiles(srv.pid(), n); err != nil {
		return res, err
	}
	undo, err := credentialSessions(h, n)
	defer undo()
	if err != nil {
		return res, err
	}
	time.Sleep(settle)
	brokerCPU, hostCPU, err := idleCPU(srv.pid(), window)
	if err != nil {
		return res, err
	}
	const bound = 0.5
	return Result{
		Metrics: map[string]float64{"broker-cpu-%": brokerCPU, "host-cpu-%": hostCPU},
		Target:  fmt.Sprintf("broker < %g %% of a core", bound),
		Met:     met(brokerCPU < bound),
	}, nil
}

// sessionMemory: serve's resident memory before and after n sessions
// open, each with its runtime (subscribed, and synced once): all on the
// Go host's one connection, or (own) each on a connection of its own with
// its session credential. With target, the total is held to 300 MB.
func sessionMemory(bin string, n int, own, target bool) (res Result, err error) {
	srv, err := startServe(bin)
	if err != nil {
		return res, err
	}
	defer srv.stop()
	ctx := context.Background()
	h, err := host.Open(ctx, host.Config{Bus: host.NATS, ConnectionFile: srv.connFile})
	if err != nil {
		return res, err
	}
	defer h.Close()
	if own {
		if err := enoughFiles(srv.pid(), n); err != nil {
			return res, err
		}
	}
	time.Sleep(settle)
	before, err := residentKiB(srv.pid())
	if err != nil {
		return res, err
	}
	if own {
		undo, err := credentialSessions(h, n)
		defer undo()
		if err != nil {
			return res, err
		}
	} else {
		rts := make([]*a2art.Runtime, n)
		defer closeAll(rts)
		err := inParallel(n, func(i int) error {
			rt, err := h.Session(ctx, fmt.Sprintf("rss-%05d", i))
			if err != nil {
				return fmt.Errorf("session %d: %w", i, err)
			}
			rts[i] = rt
			return nil
		})
		if err != nil {
			return res, err
		}
	}
	time.Sleep(settle)
	after, err := residentKiB(srv.pid())
	if err != nil {
		return res, err
	}
	res = Result{Metrics: map[string]float64{"rss-MiB": float64(after) / 1024, "KiB/session": float64(after-before) / float64(n)}}
	if target {
		const bound = 300e6 // bytes
		res.Target = "RSS < 300 MB"
		res.Met = met(float64(after)*1024 < bound)
	}
	return res, nil
}

// settle is how long a row lets serve and the host settle after its
// setup, before it measures.
const settle = 2 * time.Second

// credentialSessions opens n sessions the way a host whose sessions run
// elsewhere does (the Node host's shape): the host asks for each
// session's credential, and each session connects with its own and
// starts its runtime. undo closes what was opened, runtimes first; it is
// to be called whether or not err is nil.
func credentialSessions(h *host.Host, n int) (undo func(), err error) {
	ctx := context.Background()
	hc, ok := h.Client().(transport.HostCaller)
	if !ok {
		return func() {}, errors.New("the host's client makes no host calls")
	}
	clients := make([]*natsbus.Client, n)
	rts := make([]*a2art.Runtime, n)
	undo = func() {
		closeAll(rts)
		inParallel(n, func(i int) error {
			if clients[i] != nil {
				clients[i].Close()
			}
			return nil
		})
	}
	var redialed atomic.Int64
	var firstRedial atomic.Pointer[error]
	err = inParallel(n, func(i int) error {
		id := fmt.Sprintf("cred-%05d", i)
		raw, err := hc.CallHost(ctx, wire.MethodSessionOpen, wire.SessionParams{ContextID: id})
		if err != nil {
			return fmt.Errorf("open session %d: %w", i, err)
		}
		var cred wire.SessionCredentials
		if err := wire.Unmarshal(raw, &cred); err != nil {
			return fmt.Errorf("open session %d: %w", i, err)
		}
		var c *natsbus.Client
		for attempt := 1; ; attempt++ {
			c, err = natsbus.Dial(natsbus.ClientConfig{URL: cred.URL, User: cred.User, Password: cred.Password, Session: id})
			if err == nil {
				break
			}
			if attempt == dialAttempts {
				return fmt.Errorf("connect session %d: %w", i, err)
			}
			redialed.Add(1)
			failed := err
			firstRedial.CompareAndSwap(nil, &failed)
		}
		clients[i] = c
		sess, err := c.Session(ctx, id)
		if err != nil {
			return fmt.Errorf("session %d: %w", i, err)
		}
		rt, err := a2art.New(ctx, sess, a2art.Config{})
		if err != nil {
			sess.Close()
			return fmt.Errorf("runtime of session %d: %w", i, err)
		}
		rts[i] = rt
		return nil
	})
	if k := redialed.Load(); k > 0 {
		fmt.Fprintf(os.Stderr, "bench: serve %d dials of %d sessions' connections failed and were tried again; the first: %v\n", k, n, *firstRedial.Load())
	}
	return undo, err
}

// dialAttempts is how often a session's connection is tried: a serve busy
// with thousands of connections may let a connection's handshake time
// out, which is a figure of its own and not the memory being measured.
const dialAttempts = 3

// closeAll closes the runtimes that were started, a few at a time.
func closeAll(rts []*a2art.Runtime) {
	inParallel(len(rts), func(i int) error {
		if rts[i] != nil {
			rts[i].Close()
		}
		return nil
	})
}

// inParallel runs fn(0) to fn(n-1) on a few goroutines, and returns the
// first error; after one, no new call starts.
func inParallel(n int, fn func(i int) error) error {
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

// idleCPU measures the CPU time serve (pid) and this process use over
// window, each in percent of one core.
func idleCPU(pid int, window time.Duration) (broker, self float64, err error) {
	b0, err := processCPU(pid)
	if err != nil {
		return 0, 0, err
	}
	s0, err := selfCPU()
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	time.Sleep(window)
	b1, err := processCPU(pid)
	if err != nil {
		return 0, 0, err
	}
	s1, err := selfCPU()
	if err != nil {
		return 0, 0, err
	}
	el := time.Since(start).Seconds()
	return 100 * (b1 - b0).Seconds() / el, 100 * (s1 - s0).Seconds() / el, nil
}

// clockTicks is the unit of the CPU times in /proc/<pid>/stat (USER_HZ):
// 100 a second on every architecture Go runs Linux on.
const clockTicks = 100

// processCPU reads the user and system CPU time of a process, all its
// threads, from /proc/<pid>/stat.
func processCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command's name, in parentheses, may hold spaces: the fields
	// are counted from the last ')', after which comes field 3 (state);
	// utime and stime are fields 14 and 15.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	var ticks int64
	for _, s := range f[11:13] {
		t, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += t
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// selfCPU is this process's user and system CPU time, all its threads.
func selfCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// raiseFileLimit sets this process's soft limit on open files to its
// hard limit. Each session on a connection of its own holds a socket
// here and one in serve: 10,000 sessions need more than the usual
// default of 1,024 on both sides. The Go runtime raises its own soft
// limit at start-up but gives a child it starts the limit it found;
// once the process sets the limit itself, a child inherits the new one,
// so serve starts with it too (and raises its own in turn).
func raiseFileLimit() error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	lim.Cur = lim.Max
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
}

// enoughFiles checks that this process and serve (pid) may each open a
// socket for n sessions, and some to spare.
func enoughFiles(pid, n int) error {
	need := uint64(n) + 256
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	if lim.Cur < need {
		return fmt.Errorf("this process may open %d files, and %d sessions need %d (raise ulimit -n)", lim.Cur, n, need)
	}
	theirs, err := fileLimit(pid)
	if err != nil {
		return err
	}
	if theirs < need {
		return fmt.Errorf("serve may open %d files, and %d sessions need %d (raise ulimit -n)", theirs, n, need)
	}
	return nil
}

// fileLimit reads a process's soft limit on open files from
// /proc/<pid>/limits.
func fileLimit(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "Max open files"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				if f[0] == "unlimited" {
					return 1 << 62, nil
				}
				return strconv.ParseUint(f[0], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("/proc/%d/limits: no open files limit", pid)
}

// served is a2a-bus serve on NATS with its memory store, started for one
// row.
type served struct {
	cmd      *exec.Cmd
	dir      string
	connFile string
	log      *serveLog
	exited   chan struct{} // closed once the process has been waited for
	stopOnce sync.Once
}

// serveReadyTimeout bounds the wait for serve's connection file.
const serveReadyTimeout = 30 * time.Second

// startServe starts serve and waits until it serves: the connection
// file's path is the first line on its stderr.
func startServe(bin string) (*served, error) {
	dir, err := os.MkdirTemp("", "a2a-bus-bench-idle-")
	if err != nil {
		return nil, err
	}
	s := &served{dir: dir, connFile: filepath.Join(dir, "connection.json"), log: &serveLog{first: make(chan string, 1)}, exited: make(chan struct{})}
	s.cmd = exec.Command(bin, "serve", "--bus=nats", "--data-dir=", "--connection-file="+s.connFile, "--log-level=warn")
	s.cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+dir, "XDG_STATE_HOME="+dir)
	s.cmd.Stderr = s.log
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	go func() {
		s.cmd.Wait()
		close(s.exited)
	}()
	select {
	case line := <-s.log.first:
		if _, err := os.Stat(s.connFile); err != nil {
			s.stop()
			return nil, fmt.Errorf("serve did not start: %s", line)
		}
		return s, nil
	case <-s.exited:
		s.stop()
		return nil, fmt.Errorf("serve exited at start: %v", s.cmd.ProcessState)
	case <-time.After(serveReadyTimeout):
		s.stop()
		return nil, fmt.Errorf("serve wrote no connection file in %v", serveReadyTimeout)
	}
}

func (s *served) pid() int { return s.cmd.Process.Pid }

// stop interrupts serve, kills it if it has not exited within 15 s,
// waits for it, and says what it logged. Idempotent.
func (s *served) stop() {
	s.stopOnce.Do(func() {
		s.cmd.Process.Signal(os.Interrupt)
		select {
		case <-s.exited:
		case <-time.After(15 * time.Second):
			fmt.Fprintln(os.Stderr, "bench: serve did not stop within 15 s of SIGINT: killed")
			s.cmd.Process.Kill()
			<-s.exited
		}
		os.RemoveAll(s.dir)
		if n, head := s.log.logged(); n > 0 {
			fmt.Fprintf(os.Stderr, "bench: serve logged %d lines; the first:\n\t%s\n", n, strings.Join(head, "\n\t"))
		}
	})
}

// serveLog receives serve's stderr: it hands on the first line (the
// connection file's path) and keeps the first few of the others.
type serveLog struct {
	mu    sync.Mutex
	rest  []byte // an unfinished line
	first chan string
	sent  bool
	lines int
	head  []string
}

// serveLogHead is how many lines of serve's log a row shows.
const serveLogHead = 5

func (l *serveLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rest = append(l.rest, p...)
	for {
		i := bytes.IndexByte(l.rest, '\n')
		if i < 0 {
			break
		}
		line := string(l.rest[:i])
		l.rest = l.rest[i+1:]
		if !l.sent {
			l.sent = true
			l.first <- line
			continue
		}
		l.lines++
		if len(l.head) < serveLogHead {
			l.head = append(l.head, line)
		}
	}
	return len(p), nil
}

// logged returns how many lines serve logged after the first, and the
// first few of them.
func (l *serveLog) logged() (int, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lines, l.head
}

// grouped writes n with thousands separated by commas.
func grouped(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
