package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/cluster"
	"github.com/a2a-bus/a2a-bus/gateway"
	"github.com/a2a-bus/a2a-bus/internal/brokerid"
	"github.com/a2a-bus/a2a-bus/internal/connfile"
	"github.com/a2a-bus/a2a-bus/internal/secret"
	"github.com/a2a-bus/a2a-bus/internal/version"
	"github.com/a2a-bus/a2a-bus/liveview"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/pipebus"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/store/pebblestore"
	"github.com/a2a-bus/a2a-bus/wire"
)

// serveOptions are serve's settings, from flags and the config file.
type serveOptions struct {
	bus                string
	listen             string
	allowRemote        bool
	a2aListen          string
	wsListen           string
	wsOrigins          string
	ui                 bool
	uiListen           string
	natsURL            string
	natsCreds          string
	state              string
	brokerName         string
	replicas           int
	calloutSeed        string
	calloutTTL         time.Duration
	systemURL          string
	systemCreds        string
	connectionFile     string
	dataDir            string
	retention          time.Duration
	retentionTasks     int
	maxTasksPerContext int
	maxAgentsPerSess   int
	maxConnsPerSess    int
	maxMessageBytes    int
	replayWindow       int
	orphanTimeout      time.Duration
	a2aAbandonAfter    time.Duration
	logLevel           string
	exitWithParent     bool
	parentPID          int
	acceptDataLoss     bool
	config             string
	printConfig        bool
	// origins says where each setting came from: an A2A_BUS_* variable
	// meant for NATS does not stop a broker on the pipe.
	origins map[string]origin
}

func serveFlags(o *serveOptions, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.bus, "bus", "nats", "the bus: nats or pipe")
	fs.StringVar(&o.listen, "listen", "", "NATS: the address for clients in other processes (default 127.0.0.1 and a free port)")
	fs.BoolVar(&o.allowRemote, "allow-remote", false, "NATS: allow a --listen, --a2a-listen, --ws-listen or --ui-listen address off loopback")
	fs.StringVar(&o.a2aListen, "a2a-listen", "", "NATS: serve the A2A 1.0 gateway on this address (127.0.0.1:0 for a free port); off by default")
	fs.StringVar(&o.wsListen, "ws-listen", "", "NATS: serve NATS over WebSocket on this address for web pages, such as Electron's renderers (127.0.0.1:0 for a free port); off by default")
	fs.StringVar(&o.wsOrigins, "ws-origins", strings.Join(natsbus.DefaultWebSocketOrigins, ","), `--ws-listen: the origins a page may connect from, comma-separated: scheme://host[:port|:*], scheme://* (any host), *://* (any scheme but http and https: an app's own, such as app://), "file://", "null"`)
	fs.BoolVar(&o.ui, "ui", false, "NATS: serve a live view of the sessions, agents and tasks for a web browser (its address is logged, and joins the connection file)")
	fs.StringVar(&o.uiListen, "ui-listen", defaultUIListen, "--ui: the live view's address")
	fs.StringVar(&o.natsURL, "nats-url", "", "NATS: use this server or cluster instead of embedding one")
	fs.StringVar(&o.natsCreds, "nats-creds", "", "NATS: a credentials file for --nats-url")
	fs.StringVar(&o.state, "state", "local", `where the broker keeps its state: "local" (--data-dir, or memory) or "jetstream" (the --nats-url cluster's JetStream, shared with the cluster's other brokers)`)
	fs.StringVar(&o.brokerName, "broker-name", defaultBrokerName(), "--state=jetstream: this broker's name in the cluster, the same across its restarts (letters, digits, - and _)")
	fs.IntVar(&o.replicas, "replicas", 3, "--state=jetstream: copies of each stream the cluster keeps (1 on a single server)")
	fs.StringVar(&o.calloutSeed, "nats-callout-seed", "", "NATS: a file holding the account nkey seed of the --nats-url server's auth_callout issuer: the broker then issues session credentials there (a2a.sessions.open)")
	fs.DurationVar(&o.calloutTTL, "nats-callout-ttl", natsbus.DefaultCalloutUserTTL, "--nats-callout-seed: how long a session connection is admitted before it is checked again")
	fs.StringVar(&o.systemURL, "nats-system-url", "", "--nats-callout-seed: the servers' URL as a system-account user, so that a2a.sessions.close closes the session's connections at once")
	fs.StringVar(&o.systemCreds, "nats-system-creds", "", "--nats-system-url: a credentials file for it")
	fs.StringVar(&o.connectionFile, "connection-file", "", "NATS: where to write how to connect (default $XDG_RUNTIME_DIR/a2a-bus/connection.json, else connection.json in the state folder)")
	fs.StringVar(&o.dataDir, "data-dir", defaultDataDir(), `the durable task store's folder; "" keeps everything in memory`)
	fs.DurationVar(&o.retention, "retention", broker.DefaultRetention.MaxAge, "how long terminal tasks are kept (0: no limit)")
	fs.IntVar(&o.retentionTasks, "retention-tasks", broker.DefaultRetention.MaxTerminal, "how many terminal tasks are kept at most (0: no limit)")
	fs.IntVar(&o.maxTasksPerContext, "max-tasks-per-context", broker.DefaultMaxTasksPerContext, "open tasks a session may have requested")
	fs.IntVar(&o.maxAgentsPerSess, "max-agents-per-session", broker.DefaultMaxAgentsPerSession, "live agents one session may have")
	fs.IntVar(&o.maxConnsPerSess, "max-connections-per-session", natsbus.DefaultMaxConnectionsPerSession, "NATS: connections open at once with one session's credentials")
	fs.IntVar(&o.maxMessageBytes, "max-message-bytes", wire.DefaultMaxMessageBytes, "the largest request, on every bus; the payload and task limits derive from it")
	fs.IntVar(&o.replayWindow, "replay-window", broker.DefaultReplayWindow, "notifications kept per session for a2a.events.replay")
	fs.DurationVar(&o.a2aAbandonAfter, "a2a-abandon-after", gateway.DefaultAbandonAfter, "the gateway cancels a task whose client stopped waiting for it (a blocking send whose connection closed) after this long with no subscriber and no read (0: never)")
	fs.DurationVar(&o.orphanTimeout, "orphan-timeout", broker.DefaultOrphanTimeout, "after a restart, how long the names and open tasks of agents not yet back are held for them (0: until they come back or their sessions close)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&o.exitWithParent, "exit-with-parent", true, "shut down cleanly when the process that started serve goes away (a sidecar dies with its host)")
	fs.IntVar(&o.parentPID, "parent-pid", 0, "with --exit-with-parent: the host's pid to watch instead of the parent's (for a host that starts serve through a launcher)")
	fs.BoolVar(&o.acceptDataLoss, "accept-data-loss", false, "start even when the data file cannot show that it holds every acknowledged change (it is empty, or its newest commit record is damaged)")
	fs.StringVar(&o.config, "config", "", "a JSON file of settings: keys are these flag names without dashes; A2A_BUS_* variables win over it, flags over both")
	fs.BoolVar(&o.printConfig, "print-config", false, "print the effective settings as a --config file would hold them, and exit")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: a2a-bus serve [flags]

Runs the broker until SIGINT, SIGTERM or SIGHUP, until the process that
started it goes away (--exit-with-parent), or, with --bus=pipe, until the
end of its stdin; then exits 0. Logs go to stderr.

With NATS (the default) the broker embeds a NATS server on 127.0.0.1,
writes a connection file ({"url", "token", "pid"}, mode 0600) and prints
its path as the first line on stderr. --a2a-listen adds an A2A 1.0
gateway for the official A2A SDKs; its URL and bearer token join the
connection file ("a2aUrl", "a2aToken"). --ui adds a live view for a web
browser: open the address it logs ("uiUrl" and "uiToken" in the file).

With --nats-url and --state=jetstream, brokers on several hosts share one
bus on a NATS cluster with JetStream: each keeps its state in the
cluster's streams (--replicas copies), any of them answers any request,
and names are unique across the cluster (docs/PROTOCOL.md, the cluster
binding; README, "Run it across machines").

Examples:
  a2a-bus serve                     # embedded NATS on loopback
  a2a-bus serve --a2a-listen 127.0.0.1:0   # and the A2A gateway
  a2a-bus serve --ui                # and a live view: open the address it logs
  a2a-bus serve --bus=pipe          # JSON-RPC lines on stdin/stdout
  a2a-bus serve --config a2a.json   # {"bus": "pipe", "max-tasks-per-context": 64}
  a2a-bus serve --nats-url nats://n1:4222,nats://n2:4222 --state=jetstream --broker-name laptop

Flags:
`)
		fs.PrintDefaults()
	}
	return fs
}

func runServe(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	// The first line on stderr is the connection file's path: logs wait
	// behind a gate until it is printed.
	gate := &gateWriter{w: stderr}
	defer gate.open()
	var o serveOptions
	fs := serveFlags(&o, stderr)
	// Warnings go through the gate: after the path line on NATS, and after
	// the error line when serve stops before it (a host reading the first
	// line finds the path or the failure).
	origins, err := parseFlagsFrom(fs, args, &o.config, gate)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return report(stderr, "serve", err)
	}
	o.origins = origins
	if err := o.validate(); err != nil {
		return report(stderr, "serve", err)
	}
	if o.printConfig {
		settings := map[string]any{}
		fs.VisitAll(func(f *flag.Flag) {
			if f.Name == "config" || f.Name == "print-config" {
				return
			}
			if g, ok := f.Value.(flag.Getter); ok {
				v := g.Get()
				if d, ok := v.(time.Duration); ok {
					v = d.String()
				}
				settings[f.Name] = v
			}
		})
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(settings)
		return exitOK
	}
	logOut := io.Writer(gate)
	if o.bus == "pipe" {
		gate.open() // no path line on the pipe
	}
	log, err := newLogger(logOut, o.logLevel)
	if err != nil {
		return report(stderr, "serve", err)
	}
	if o.exitWithParent {
		var stop func()
		ctx, stop = watchParent(ctx, o.parentPID)
		defer stop()
	}
	if err := within(ctx, shutdownBound, log, func() error { return serve(ctx, o, log, gate) }); err != nil {
		gate.open()
		return report(stderr, "serve", err)
	}
	return exitOK
}

// shutdownBound is how long serve may take to stop once told to (a
// signal, the parent gone): a full or stuck disk may hold up the task
// store's close, which gives up after its own 2 s, and a broker told to
// stop stops, within 5 s.
const shutdownBound = 4 * time.Second

// errShutdownAbandoned ends serve when its shutdown took too long.
var errShutdownAbandoned = fmt.Errorf("the shutdown did not finish within %v; exiting without it (every acknowledged change is on disk)", shutdownBound)

// within runs run, and returns its error; once ctx is done it waits for
// run at most bound, then returns errShutdownAbandoned, leaving run to
// end with the process.
func within(ctx context.Context, bound time.Duration, log *slog.Logger, run func() error) error {
	done := make(chan error, 1)
	go func() { done <- run() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		log.Error("shutdown abandoned", "after", bound)
		return errShutdownAbandoned
	}
}

func (o *serveOptions) validate() error {
	switch o.bus {
	case "nats", "pipe":
	default:
		return usageErrorf("--bus: %q is not nats or pipe", o.bus)
	}
	if o.maxTasksPerContext < 1 {
		return usageErrorf("--max-tasks-per-context: must be at least 1")
	}
	if err := wire.NewLimits(o.maxMessageBytes).Valid(); err != nil {
		return usageErrorf("--max-message-bytes: %v", err)
	}
	if o.maxAgentsPerSess < 1 || o.maxConnsPerSess < 1 {
		return usageErrorf("--max-agents-per-session and --max-connections-per-session must be at least 1")
	}
	if o.replayWindow < 1 {
		return usageErrorf("--replay-window: must be at least 1")
	}
	if o.orphanTimeout < 0 {
		return usageErrorf("--orphan-timeout: must not be negative")
	}
	if o.a2aAbandonAfter < 0 {
		return usageErrorf("--a2a-abandon-after: must not be negative")
	}
	if o.retention < 0 || o.retentionTasks < 0 {
		return usageErrorf("--retention and --retention-tasks must not be negative")
	}
	if o.natsCreds != "" && o.natsURL == "" {
		return usageErrorf("--nats-creds: needs --nats-url")
	}
	if o.natsURL != "" && (o.listen != "" || o.allowRemote && !o.ui) {
		return usageErrorf("--listen and --allow-remote configure the embedded server; --nats-url uses another")
	}
	if !o.ui && o.uiListen != defaultUIListen && o.origins["ui-listen"] == fromFlag {
		return usageErrorf("--ui-listen: needs --ui")
	}
	switch o.state {
	case "local":
		if o.brokerName != defaultBrokerName() && o.origins["broker-name"] == fromFlag {
			return usageErrorf("--broker-name: for --state=jetstream")
		}
	case "jetstream":
		if o.natsURL == "" || o.bus != "nats" {
			return usageErrorf("--state=jetstream: needs --nats-url (a NATS cluster with JetStream)")
		}
		if o.replicas < 1 || o.replicas > 5 {
			return usageErrorf("--replicas: 1 to 5")
		}
		if !natsbus.ValidBrokerName(o.brokerName) {
			return usageErrorf("--broker-name: %q: 1 to 64 letters, digits, - or _", o.brokerName)
		}
	default:
		return usageErrorf("--state: %q is not local or jetstream", o.state)
	}
	if o.calloutSeed == "" && (o.systemURL != "" || o.systemCreds != "") {
		return usageErrorf("--nats-system-url and --nats-system-creds: for --nats-callout-seed")
	}
	if o.calloutSeed != "" && o.natsURL == "" {
		return usageErrorf("--nats-callout-seed: needs --nats-url")
	}
	if o.systemCreds != "" && o.systemURL == "" {
		return usageErrorf("--nats-system-creds: needs --nats-system-url")
	}
	if o.a2aListen != "" && o.natsURL != "" {
		return usageErrorf("--a2a-listen: the gateway needs the embedded NATS server, not --nats-url")
	}
	if o.wsListen == "" && (o.origins["ws-origins"] == fromFlag || o.origins["ws-origins"] == fromFile) {
		return usageErrorf("--ws-origins: for --ws-listen")
	}
	if o.wsListen != "" && o.natsURL != "" {
		return usageErrorf("--ws-listen: a listener of the embedded NATS server; with --nats-url, configure that server's websocket block")
	}
	if o.bus == "pipe" {
		for name, set := range map[string]*bool{"listen": ptr(o.listen != ""), "allow-remote": &o.allowRemote, "nats-url": ptr(o.natsURL != ""), "nats-creds": ptr(o.natsCreds != ""), "connection-file": ptr(o.connectionFile != ""), "a2a-listen": ptr(o.a2aListen != ""),
			"ws-listen": ptr(o.wsListen != ""), "ui": &o.ui, "ui-listen": ptr(o.origins["ui-listen"] != 0)} {
			if *set && o.origins[name] != fromEnv {
				return usageErrorf("--%s is for the NATS bus, not --bus=pipe", name)
			}
		}
		// From the environment they are meant for NATS brokers: ignored.
		o.listen, o.allowRemote, o.natsURL, o.natsCreds, o.connectionFile, o.a2aListen, o.wsListen, o.ui = "", false, "", "", "", "", "", false
	}
	if o.dataDir == noDataDir {
		return errors.New("no default data dir: neither XDG_STATE_HOME nor HOME is set; give --data-dir (\"\" keeps tasks in memory)")
	}
	if _, err := newLogger(io.Discard, o.logLevel); err != nil {
		return err
	}
	if o.bus == "nats" && o.natsURL == "" {
		if err := natsbus.CheckListen(o.listen, o.allowRemote); err != nil {
			return usageErrorf("--listen: %v", err)
		}
	}
	if o.a2aListen != "" {
		if err := natsbus.CheckListen(o.a2aListen, o.allowRemote); err != nil {
			return usageErrorf("--a2a-listen: %v", err)
		}
	}
	if o.wsListen != "" {
		if err := natsbus.CheckListen(o.wsListen, o.allowRemote); err != nil {
			return usageErrorf("--ws-listen: %v", err)
		}
		if err := (natsbus.ServerConfig{WebSocketOrigins: o.wsOriginList()}).Validate(); err != nil {
			return usageErrorf("--ws-origins: %v", err)
		}
	}
	if o.ui {
		if err := natsbus.CheckListen(o.uiListen, o.allowRemote); err != nil {
			return usageErrorf("--ui-listen: %v", err)
		}
	}
	return nil
}

// defaultUIListen is --ui-listen's default: loopback, a free port.
const defaultUIListen = "127.0.0.1:0"

func ptr[T any](v T) *T { return &v }

// wsOriginList is --ws-origins as a list: "" is none.
func (o *serveOptions) wsOriginList() []string {
	list := []string{}
	for _, p := range strings.Split(o.wsOrigins, ",") {
		if p = strings.TrimSpace(p); p != "" {
			list = append(list, p)
		}
	}
	return list
}

// abandonAfter sets the gateway's abandon clock from the flag, whose 0
// means never.
func abandonAfter(cfg *gateway.Config, d time.Duration) {
	cfg.AbandonAfter, cfg.NeverAbandon = d, d == 0
}

// brokerConfig is the broker's config from the flags. The A2A gateway's
// session and agent are the broker's own whether the gateway is on or
// off: no session can open the one or register the other, so that none
// can read what the gateway's clients left in the store. It returns the
// gateway agent's instance id, kept in the data dir.
func (o *serveOptions) brokerConfig(st store.Store, log *slog.Logger) (broker.Config, string, error) {
	orphan := o.orphanTimeout
	if orphan == 0 {
		orphan = broker.Forever // the flag's 0 disables; the Config's 0 is the default
	}
	cfg := broker.Config{
		BusName: o.bus,
		// The flags' 0 means no limit, as a Retention's zero field does.
		Retention:           &store.Retention{MaxAge: o.retention, MaxTerminal: o.retentionTasks},
		Store:               st,
		MaxTasksPerContext:  o.maxTasksPerContext,
		MaxAgentsPerSession: o.maxAgentsPerSess,
		MaxMessageBytes:     o.maxMessageBytes,
		ReplayWindow:        o.replayWindow,
		OrphanTimeout:       orphan,
		Logger:              log,
	}
	instance, err := brokerid.Own(&cfg, o.dataDir)
	return cfg, instance, err
}

func serve(ctx context.Context, o serveOptions, log *slog.Logger, gate *gateWriter) error {
	if o.bus == "pipe" {
		return servePipe(ctx, o, log)
	}
	return serveNATS(ctx, o, log, gate)
}

func serveNATS(ctx context.Context, o serveOptions, log *slog.Logger, gate *gateWriter) error {
	path := o.connectionFile
	if path == "" {
		p, warning, err := connfile.DefaultPath()
		if warning != "" {
			log.Warn(warning) // through the gate: after the path line
		}
		if err != nil {
			return err
		}
		path = p
	}
	// A running broker is told by its connection file first.
	claim, err := connfile.Lock(path)
	if err != nil {
		return err
	}
	defer claim.Release()
	busCfg := natsbus.Config{
		URL:       o.natsURL,
		CredsFile: o.natsCreds,
		Server: natsbus.ServerConfig{Listen: o.listen, AllowRemote: o.allowRemote, MaxConnectionsPerSession: o.maxConnsPerSess,
			WebSocketListen: o.wsListen, WebSocketOrigins: o.wsOriginList()},
		MaxMessageBytes: o.maxMessageBytes,
		Logger:          log,
	}
	if o.calloutSeed != "" {
		seed, err := readSeed(o.calloutSeed)
		if err != nil {
			return err
		}
		busCfg.Callout = natsbus.CalloutConfig{Seed: seed, UserTTL: o.calloutTTL, SystemURL: o.systemURL, SystemCredsFile: o.systemCreds}
	}
	var (
		st     store.Store
		shared *sharedState
	)
	if o.state == "jetstream" {
		issuer := ""
		if busCfg.Callout.Seed != "" {
			if issuer, err = natsbus.CalloutIssuer(busCfg.Callout.Seed); err != nil {
				return fmt.Errorf("--nats-callout-seed: %w", err)
			}
		}
		if shared, err = openCluster(ctx, o, issuer, log); err != nil {
			return err
		}
		defer shared.Close()
		st = shared.Store()
		busCfg.QueueGroup = cluster.QueueGroup
		if o.calloutSeed != "" {
			busCfg.Callout.Revocations = shared.Revocations()
		}
	} else {
		if st, err = openStore(o.dataDir, o.acceptDataLoss, log); err != nil {
			return err
		}
		defer st.Close()
	}
	bus, err := natsbus.New(busCfg)
	if err != nil {
		return err
	}
	defer bus.Close()
	info := connfile.Info{URL: bus.URL(), PID: os.Getpid()}
	if srv := bus.Server(); srv != nil {
		info.Token, info.WSURL = srv.Token(), srv.WebSocketURL()
	}
	// The gateway's port is taken before the connection file is written;
	// clients that come early wait in the listen queue until it serves.
	var gwListener net.Listener
	if o.a2aListen != "" {
		if gwListener, err = net.Listen("tcp", o.a2aListen); err != nil {
			return fmt.Errorf("--a2a-listen: %w", err)
		}
		defer gwListener.Close()
		info.A2AURL, info.A2AToken = "http://"+gwListener.Addr().String(), secret.Hex(32)
	}
	// So is the live view's.
	var uiListener net.Listener
	if o.ui {
		if uiListener, err = net.Listen("tcp", o.uiListen); err != nil {
			return fmt.Errorf("--ui-listen: %w", err)
		}
		defer uiListener.Close()
		info.UIURL, info.UIToken = "http://"+uiListener.Addr().String()+"/", secret.Hex(32)
	}
	cfg, gwInstance, err := o.brokerConfig(st, log)
	if err != nil {
		return err
	}
	if shared != nil {
		cfg.Cluster = shared.Broker()
		info.Broker = cfg.Cluster.Broker
	}
	// The host issues the gateway's client credentials through the
	// broker's host methods (PROTOCOL.md §12).
	var gwClients *gateway.Clients
	if gwListener != nil {
		gwClients = gateway.NewClients()
		cfg.HostMethods = gwClients.HostMethods()
	}
	b, err := broker.New(ctx, bus, cfg)
	if err != nil {
		return err
	}
	defer b.Close()
	// The connection file is written once the broker serves: a host that
	// joins by it as soon as it appears is answered, not told that no
	// broker serves.
	if err := claim.Write(info); err != nil {
		return err
	}
	stopGateway := func() {}
	if gwListener != nil {
		if stopGateway, err = startGateway(ctx, bus, gwListener, info, gwInstance, gwClients, o, log); err != nil {
			return err
		}
	}
	stopUI := func() {}
	if uiListener != nil {
		if stopUI, err = startUI(bus, uiListener, info, o, log); err != nil {
			stopGateway()
			return err
		}
	}
	fmt.Fprintln(gate.w, path)
	gate.open()
	log.Info("serving on NATS", "url", bus.URL(), "connectionFile", path, "embedded", bus.Server() != nil, "a2aGateway", info.A2AURL, "webSocket", info.WSURL)
	if uiListener != nil {
		// The token travels in the fragment, which a browser never sends.
		log.Info("live view: open this address in a browser", "url", info.UIURL+"#token="+info.UIToken)
	}
	<-ctx.Done()
	log.Info("shutting down", "why", why(ctx))
	stopUI()
	stopGateway()
	bus.Close()
	b.Close()
	st.Close() // it logs what it gave up waiting for
	if err := claim.Release(); err != nil {
		log.Warn("removing the connection file failed", "error", err)
	}
	log.Info("stopped")
	return nil
}

// startGateway serves the A2A 1.0 gateway on ln, as a client of the
// broker through an in-process connection. stop ends its streams, lets
// its agent go and closes the HTTP server, within a second.
func startGateway(ctx context.Context, bus *natsbus.Bus, ln net.Listener, info connfile.Info, instance string, clients *gateway.Clients, o serveOptions, log *slog.Logger) (stop func(), err error) {
	// The client makes its connection again if the server cuts it (a
	// flood the gateway falls behind on): a cut is a line in the log.
	client, err := bus.Connect(natsbus.ClientConfig{Logger: log.With("client", "a2a-gateway")})
	if err != nil {
		return nil, err
	}
	gcfg := gateway.Config{Instance: instance, Token: info.A2AToken, BaseURL: info.A2AURL, MaxBodyBytes: int64(o.maxMessageBytes), Version: version.String(),
		Clients: clients, Logger: log}
	abandonAfter(&gcfg, o.a2aAbandonAfter)
	g, err := gateway.New(ctx, client, gcfg)
	if err != nil {
		client.Close()
		return nil, err
	}
	srv := g.Server()
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(gateway.LimitListener(ln)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("the A2A gateway stopped", "error", err)
		}
	}()
	log.Info("A2A gateway", "url", info.A2AURL+"/agents")
	return func() {
		g.Close() // ends the streams and blocking sends; the agent stays registered
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			srv.Close()
		}
		<-served
		client.Close()
	}, nil
}

// startUI serves the live view on ln, through a host connection of its
// own: in process with the embedded server, else dialed as the broker's
// own is. stop ends its streams and closes the HTTP server, within a
// second.
func startUI(bus *natsbus.Bus, ln net.Listener, info connfile.Info, o serveOptions, log *slog.Logger) (stop func(), err error) {
	log = log.With("client", "live-view")
	var client *natsbus.Client
	if bus.Server() != nil {
		client, err = bus.Connect(natsbus.ClientConfig{Logger: log})
	} else {
		client, err = natsbus.Dial(natsbus.ClientConfig{URL: o.natsURL, CredsFile: o.natsCreds, Logger: log})
	}
	if err != nil {
		return nil, fmt.Errorf("live view: %w", err)
	}
	view, err := liveview.New(client, liveview.Config{Token: info.UIToken, AllowRemote: o.allowRemote, Logger: log})
	if err != nil {
		client.Close()
		return nil, err
	}
	srv := &http.Server{Handler: view.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 30 * time.Second, MaxHeaderBytes: 64 << 10,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("the live view stopped", "error", err)
		}
	}()
	return func() {
		view.Close() // ends the streams
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			srv.Close()
		}
		<-served
		client.Close()
	}, nil
}

// errParentGone ends serve when its parent process has gone.
var errParentGone = errors.New("the parent process is gone (--exit-with-parent)")

// why says what ended ctx: the parent's death, else a signal.
func why(ctx context.Context) string {
	if cause := context.Cause(ctx); errors.Is(cause, errParentGone) {
		return cause.Error()
	}
	return "a signal"
}

// gateWriter holds what is written until it opens.
type gateWriter struct {
	w      io.Writer
	mu     sync.Mutex
	opened bool
	held   bytes.Buffer
}

func (g *gateWriter) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.opened {
		return g.held.Write(p)
	}
	return g.w.Write(p)
}

// open lets writes through, the held ones first. Idempotent.
func (g *gateWriter) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.opened {
		g.opened = true
		g.w.Write(g.held.Bytes())
		g.held.Reset()
	}
}

func servePipe(ctx context.Context, o serveOptions, log *slog.Logger) error {
	st, err := openStore(o.dataDir, o.acceptDataLoss, log)
	if err != nil {
		return err
	}
	defer st.Close()
	in, out := pipebus.Stdio(log)
	bus, err := pipebus.New(in, out, pipebus.Config{MaxMessageBytes: o.maxMessageBytes, Logger: log})
	if err != nil {
		in.Close()
		out.Close()
		return err
	}
	cfg, _, err := o.brokerConfig(st, log)
	if err != nil {
		bus.Close()
		return err
	}
	b, err := broker.New(ctx, bus, cfg)
	if err != nil {
		bus.Close()
		return err
	}
	log.Info("serving on the pipe", "maxMessageBytes", o.maxMessageBytes)
	select {
	case <-ctx.Done():
		log.Info("shutting down", "why", why(ctx))
	case <-bus.Done():
	}
	bus.Close()
	b.Close()
	st.Close() // it logs what it gave up waiting for
	if err := bus.Err(); err != nil {
		return err
	}
	log.Info("stopped")
	return nil
}

// noDataDir is the data dir's default when there is none: serve refuses
// to start rather than keep tasks in memory unasked.
const noDataDir = "(none: set XDG_STATE_HOME or HOME)"

// defaultDataDir is the platform's state folder (connfile.Places).
func defaultDataDir() string {
	d, err := connfile.DefaultDataDir()
	if err != nil {
		return noDataDir
	}
	return d
}

// openStore opens the durable store in dir, or a memory store for "".
func openStore(dir string, acceptDataLoss bool, log *slog.Logger) (store.Store, error) {
	if dir == "" {
		log.Info("tasks are kept in memory only (--data-dir \"\")")
		return store.NewMemory(), nil
	}
	st, err := pebblestore.Open(dir, pebblestore.Options{Logger: log, AcceptDataLoss: acceptDataLoss, OnDataLoss: func(problem string) {
		log.Warn("the data file may have lost acknowledged changes; starting anyway (--accept-data-loss)", "dataDir", dir, "problem", problem)
	}})
	if err != nil {
		return nil, err
	}
	log.Info("durable task store", "dataDir", dir)
	return st, nil
}
