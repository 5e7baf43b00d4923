// Package host is where a host application picks its bus by config and
// gets a runtime per chat session: the one place that knows every bus.
//
//	h, err := host.Open(ctx, host.Config{Bus: host.NATS})
//	...
//	defer h.Close()
//	rt, err := h.Session(ctx, "chat-1")
//	d, err := rt.Spawn(ctx, wire.AgentCard{Name: "discussant"})
package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/internal/brokerid"
	"github.com/a2a-bus/a2a-bus/internal/connfile"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/pipebus"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/store/pebblestore"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// BusKind names a bus. The zero value is invalid: a host says which bus
// it wants (ParseBus maps "" to NATS, the default).
type BusKind uint8

// The buses.
const (
	_ BusKind = iota
	// NATS is the default: an embedded NATS server (or a running broker's).
	NATS
	// Pipe runs the broker as a child process and talks JSON-RPC lines
	// over its stdio.
	Pipe
)

// String returns the bus's config name.
func (k BusKind) String() string {
	switch k {
	case NATS:
		return "nats"
	case Pipe:
		return "pipe"
	}
	return fmt.Sprintf("BusKind(%d)", uint8(k))
}

// ErrUnknownBus is returned by ParseBus and Open for a bus that does not
// exist.
var ErrUnknownBus = errors.New("host: unknown bus")

// ParseBus reads a bus name from config: "nats" (or "", the default) or
// "pipe".
func ParseBus(s string) (BusKind, error) {
	switch strings.ToLower(s) {
	case "", "nats":
		return NATS, nil
	case "pipe":
		return Pipe, nil
	}
	return 0, fmt.Errorf("%w %q (want nats or pipe)", ErrUnknownBus, s)
}

// Config configures a host's connection to the broker. Bus must be set;
// every other zero value is the default. Open refuses a config that
// Validate refuses.
type Config struct {
	// Bus selects the bus; it must be set (see ParseBus).
	Bus BusKind
	// ConnectionFile, with NATS only, connects to the running broker that
	// wrote it (a2a-bus serve). "" runs the broker in this process, on an
	// embedded NATS server.
	ConnectionFile string
	// BrokerCommand, with Pipe only, is the broker to start as a child,
	// which must speak the pipe on its stdio. nil means a2a-bus serve
	// --bus=pipe from PATH.
	BrokerCommand []string
	// DataDir is where a broker this host starts keeps its durable
	// store of tasks and registrations: in this process (NATS without a
	// connection file), or passed to a Pipe child that runs the
	// default command. "" means the platform's state folder, as for
	// a2a-bus serve (DefaultDataDir), so that a restarted broker keeps
	// every acknowledged task and every delegate's name. One data dir
	// serves one broker at a time: a second is refused
	// (pebblestore.ErrLocked). Ignored when Broker.Store is set.
	DataDir string
	// Memory keeps tasks and registrations in memory only: a restart of
	// the broker loses them (delegates waiting on a lost task are told,
	// runtime.Resync.Lost). For tests and throwaway hosts; DataDir must
	// be "".
	Memory bool
	// Broker configures the broker when it runs in this process (NATS
	// without a connection file).
	Broker broker.Config
	// Runtime configures each session's runtime.
	Runtime runtime.Config
	// HealthTimeout is how long a broker in another process (a Pipe
	// child, or the sidecar joined through ConnectionFile) may take to
	// answer a health call before the host takes it for dead though it
	// has not exited (stopped, deadlocked, writing garbage): a child is
	// killed and started again on the same data dir, a sidecar's
	// connection is closed and the connection file read and dialed again,
	// as when the broker dies. The host asks when a call has waited this
	// long without an answer, and every 10 s besides. 0 means
	// DefaultHealthTimeout.
	HealthTimeout time.Duration
	// NoHealthCheck turns that check off: a broker held at a breakpoint
	// is then waited for, not killed. HealthTimeout must be 0.
	NoHealthCheck bool
	// Logger receives the host's logs, and the broker's and the bus's when
	// they run in this process. nil discards them: a library logs only
	// where its caller says.
	Logger *slog.Logger
}

// DefaultHealthTimeout is Config.HealthTimeout's default. A broker
// answers a health call (a2a.admin.info) from memory, in well under a
// millisecond; 5 s leaves room for one starved by a busy desktop (swap,
// a long GC pause, a debug build) without killing it, and still finds a
// stuck one within about 10 s of the first call that stalls (that call's
// 5 s, then the health call's): a hiccup to a user, not a hang.
const DefaultHealthTimeout = 5 * time.Second

// Validate reports the first setting of cfg that is missing, out of range
// or at odds with another.
func (cfg Config) Validate() error { return cfg.validate(false) }

// validate is Validate; local says that the broker runs in this process
// on a bus the host was given, whatever cfg.Bus says.
func (cfg Config) validate(local bool) error {
	switch {
	case !local && cfg.Bus != NATS && cfg.Bus != Pipe:
		return fmt.Errorf("%w: Config.Bus is %v: want NATS or Pipe (see ParseBus)", ErrUnknownBus, cfg.Bus)
	case cfg.ConnectionFile != "" && (local || cfg.Bus != NATS):
		return errors.New("host: Config.ConnectionFile joins a broker on NATS: set Bus to NATS, or drop it")
	case cfg.BrokerCommand != nil && (local || cfg.Bus != Pipe):
		return errors.New("host: Config.BrokerCommand starts a broker on a pipe: set Bus to Pipe, or drop it")
	case cfg.Memory && cfg.DataDir != "":
		return errors.New("host: Memory and DataDir both set: choose one")
	case cfg.HealthTimeout < 0:
		return fmt.Errorf("host: Config.HealthTimeout is %v: want 0 (DefaultHealthTimeout) or more; NoHealthCheck turns the check off", cfg.HealthTimeout)
	case cfg.NoHealthCheck && cfg.HealthTimeout != 0:
		return errors.New("host: Config.NoHealthCheck and HealthTimeout both set: choose one")
	}
	return cfg.Runtime.Validate()
}

// liveness is how the host checks a broker in another process.
func (cfg *Config) liveness() liveness {
	switch {
	case cfg.NoHealthCheck:
		return liveness{}
	case cfg.HealthTimeout == 0:
		return liveness{timeout: DefaultHealthTimeout}
	}
	return liveness{timeout: cfg.HealthTimeout}
}

// DefaultDataDir is the data dir a host's broker uses when
// Config.DataDir is "": the platform's state folder, where a2a-bus serve
// keeps its own by default (docs/PROTOCOL.md §2.2).
func DefaultDataDir() (string, error) { return connfile.DefaultDataDir() }

// dataDir resolves the data dir a broker this host starts uses: "" for
// memory.
func (cfg *Config) dataDir() (string, error) {
	switch {
	case cfg.Memory:
		return "", nil
	case cfg.DataDir != "":
		return cfg.DataDir, nil
	}
	d, err := DefaultDataDir()
	if err != nil {
		return "", fmt.Errorf("host: no data dir (%w): set Config.DataDir, or Config.Memory to keep tasks in memory", err)
	}
	return d, nil
}

// openDataDir opens the durable store of a broker in this process.
func (h *Host) openDataDir() error {
	if h.cfg.Broker.Store != nil {
		return nil
	}
	dir, err := h.cfg.dataDir()
	if err != nil || dir == "" {
		return err
	}
	h.cfg.DataDir = dir
	st, err := pebblestore.Open(h.cfg.DataDir, pebblestore.Options{Logger: h.cfg.Logger})
	if err == nil {
		// The data dir may be serve's too: the gateway's identities on
		// it are the broker's own here as well (docs/PROTOCOL.md §12).
		if _, err = brokerid.Own(&h.cfg.Broker, h.cfg.DataDir); err != nil {
			st.Close()
			return err
		}
	}
	if errors.Is(err, pebblestore.ErrLocked) {
		return fmt.Errorf("host: %w: another broker (a2a-bus serve, or another host) uses this data dir; join it with Config.ConnectionFile, or give this host its own Config.DataDir", err)
	}
	if err != nil {
		return err
	}
	h.closers = append(h.closers, closer{"store", st.Close})
	h.cfg.Broker.Store = st
	return nil
}

// closer is one thing Close closes, named for the tests of the order.
type closer struct {
	name  string
	close func() error
}

// Host is a host's connection to the broker.
type Host struct {
	cfg      Config
	client   transport.Client
	rejoiner *rejoiner // for a broker in another process
	desc     string
	closers  []closer // closed last first
}

// Open connects to the broker, starting it first when it is to run in
// this process or as a child.
func Open(ctx context.Context, cfg Config) (*Host, error) { return open(ctx, cfg, nil) }

// localBus is a bus whose both sides are in this process, as the tests'
// in-memory bus.
type localBus interface {
	transport.Bus
	transport.Client
}

// open is Open; with local, the broker runs in this process on local,
// whatever cfg.Bus says.
func open(ctx context.Context, cfg Config, local localBus) (*Host, error) {
	if err := cfg.validate(local != nil); err != nil {
		if local != nil {
			local.Close()
		}
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Broker.Logger == nil {
		cfg.Broker.Logger = cfg.Logger
	}
	if cfg.Runtime.Logger == nil {
		cfg.Runtime.Logger = cfg.Logger
	}
	h := &Host{cfg: cfg}
	if h.cfg.Broker.BusName == "" {
		h.cfg.Broker.BusName = cfg.Bus.String()
	}
	var err error
	switch {
	case local != nil:
		err = h.startLocal(ctx, local)
	case cfg.Bus == NATS:
		if cfg.ConnectionFile != "" {
			err = h.dialNATS(ctx, cfg.ConnectionFile)
		} else {
			err = h.embedNATS(ctx)
		}
	default: // Pipe: Validate allows no other
		err = h.startPipe(ctx)
	}
	if err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

func (h *Host) embedNATS(ctx context.Context) error {
	if err := h.openDataDir(); err != nil {
		return err
	}
	bus, err := natsbus.New(natsbus.Config{MaxMessageBytes: h.cfg.Broker.MaxMessageBytes, Logger: h.cfg.Logger})
	if err != nil {
		return err
	}
	if err := h.serve(ctx, bus); err != nil {
		return err
	}
	c, err := bus.Connect(natsbus.ClientConfig{})
	if err != nil {
		return err
	}
	h.closers = append(h.closers, closer{"client", c.Close})
	h.client = c
	h.desc = "nats (embedded server " + bus.URL() + ", in-process connections)"
	return nil
}

// dialNATS joins the running broker that wrote the connection file, and
// rejoins whichever broker writes it next when that one is gone or stops
// answering: a desktop host restarts a crashed or stuck sidecar on the
// same data dir (a stopped one may also continue), and its sessions and
// delegates go on. A dial is bounded by the NATS client's connect
// timeout, handshake included: a stopped sidecar's port takes the
// connection but never answers.
func (h *Host) dialNATS(ctx context.Context, path string) error {
	return h.rejoin(ctx, func(context.Context) (*link, error) {
		info, err := connfile.Read(path)
		if err != nil {
			return nil, fmt.Errorf("host: %w", err)
		}
		if info.Token == "" {
			return nil, fmt.Errorf("host: %s holds no token (the broker uses an external NATS server; connect with natsbus.Dial)", path)
		}
		c, err := natsbus.Dial(natsbus.ClientConfig{URL: info.URL, Token: info.Token, NoReconnect: true, Logger: h.cfg.Logger})
		if err != nil {
			return nil, err
		}
		return &link{client: c, gone: c.Gone(), pid: info.PID,
			desc: "nats (broker pid " + fmt.Sprint(info.PID) + " at " + info.URL + ")"}, nil
	})
}

// startPipe starts the broker as a child on a pipe, and supervises it: a
// child that dies is started again, with backoff, on the same data dir;
// one that is alive but does not answer (stopped, or writing garbage or
// a line that never ends, which the pipe's reader skips) is killed first.
func (h *Host) startPipe(ctx context.Context) error {
	argv := h.cfg.BrokerCommand
	if len(argv) == 0 {
		dir, err := h.cfg.dataDir()
		if err != nil {
			return err
		}
		h.cfg.DataDir = dir
		argv = []string{"a2a-bus", "serve", "--bus=pipe", "--data-dir=" + h.cfg.DataDir}
	}
	return h.rejoin(ctx, func(ctx context.Context) (*link, error) {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stderr = os.Stderr
		child, err := pipebus.Start(cmd, pipebus.ClientConfig{MaxMessageBytes: h.cfg.Broker.MaxMessageBytes, Logger: h.cfg.Logger})
		if err != nil {
			return nil, err
		}
		// A child is up once it answers: one that exits at its start (a
		// data dir it refuses) is a failed dial, backed off like any.
		pctx, cancel := context.WithTimeout(ctx, childAnswerTimeout)
		defer cancel()
		if _, err := child.CallHost(pctx, wire.MethodAdminInfo, nil); err != nil {
			child.Close()
			return nil, fmt.Errorf("host: the broker child did not answer: %w", err)
		}
		// The child is reaped by child; cmd.Process knows when it was, so
		// a late kill never hits a reused pid.
		kill := func() { _ = cmd.Process.Kill() }
		return &link{client: child, gone: child.Done(), kill: kill, pid: child.Pid(),
			desc: fmt.Sprintf("pipe (broker child pid %d: %s)", child.Pid(), strings.Join(argv, " "))}, nil
	})
}

// childAnswerTimeout bounds the wait for a new broker child's first
// answer.
const childAnswerTimeout = 10 * time.Second

// rejoin connects through dial, and keeps connected.
func (h *Host) rejoin(ctx context.Context, dial dialer) error {
	r, err := newRejoiner(ctx, dial, h.cfg.Logger, h.cfg.liveness())
	if err != nil {
		return err
	}
	h.closers = append(h.closers, closer{"client", r.Close})
	h.client, h.rejoiner = r, r
	return nil
}

// startLocal starts a broker in this process on bus, and connects to it
// through bus.
func (h *Host) startLocal(ctx context.Context, bus localBus) error {
	if err := h.openDataDir(); err != nil {
		bus.Close()
		return err
	}
	if err := h.serve(ctx, bus); err != nil {
		return err
	}
	h.client = bus
	h.desc = h.cfg.Broker.BusName + " (in this process)"
	return nil
}

// serve starts a broker on bus, in this process. They close as
// broker.New says: the bus first (no request is served any more, and the
// running ones finish), then the broker, then (a closer registered
// before) the store.
func (h *Host) serve(ctx context.Context, bus transport.Bus) error {
	b, err := broker.New(ctx, bus, h.cfg.Broker)
	if err != nil {
		bus.Close()
		return err
	}
	h.closers = append(h.closers, closer{"broker", b.Close}, closer{"bus", bus.Close})
	return nil
}

// DefaultConnectionFile is where `a2a-bus serve` writes its connection
// file by default on this platform, by the rules every host follows
// (docs/PROTOCOL.md §2.2): for Config.ConnectionFile, to join the
// sidecar. warning, when not "", says why $XDG_RUNTIME_DIR was passed
// over, for the host to log.
func DefaultConnectionFile() (path, warning string, err error) { return connfile.DefaultPath() }

// Describe says which bus the host uses and where the broker runs.
func (h *Host) Describe() string {
	if h.rejoiner != nil {
		return h.rejoiner.describe()
	}
	return h.desc
}

// BrokerPID returns the process id of the broker the host talks to now:
// this process for a broker in it, the child on the pipe, the sidecar
// that wrote the connection file; 0 while the host is rejoining a broker
// that is gone.
func (h *Host) BrokerPID() int {
	if h.rejoiner != nil {
		return h.rejoiner.pid()
	}
	return os.Getpid()
}

// Rejoins counts how often the host lost its broker (in another process)
// and joined it again.
func (h *Host) Rejoins() int {
	if h.rejoiner != nil {
		return h.rejoiner.rejoins()
	}
	return 0
}

// Client returns the session side of the bus, for hosts that want it
// without a runtime.
func (h *Host) Client() transport.Client { return h.client }

// Session starts the runtime of one chat session. Close the runtime when
// the session ends.
func (h *Host) Session(ctx context.Context, id string) (*runtime.Runtime, error) {
	sess, err := h.client.Session(ctx, id)
	if err != nil {
		return nil, err
	}
	rt, err := runtime.New(ctx, sess, h.cfg.Runtime)
	if err != nil {
		sess.Close()
		return nil, err
	}
	return rt, nil
}

// Close releases the connection, and stops the broker if the host
// started it. Idempotent.
func (h *Host) Close() error {
	var errs []error
	for i := len(h.closers) - 1; i >= 0; i-- {
		errs = append(errs, h.closers[i].close())
	}
	h.closers = nil
	return errors.Join(errs...)
}
