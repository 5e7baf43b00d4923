// Package cluster puts a broker's state on a NATS JetStream cluster, so
// that several brokers (one per host) serve one bus: the tasks, the
// registrations and names (store/jsstore), each session's notifications
// (store/jsevents), the brokers' leases and the session credentials'
// generations, all in the cluster's streams, replicated as configured.
// docs/PROTOCOL.md, "The cluster binding", is the contract.
//
//	nc, _ := nats.Connect(urls)
//	c, err := cluster.Open(ctx, nc, cluster.Config{Broker: "laptop", Replicas: 3})
//	...
//	defer c.Close()
//	cfg := broker.Config{Store: c.Store(), Cluster: c.Broker()}
//	busCfg := natsbus.Config{URL: urls, QueueGroup: cluster.QueueGroup}
//	busCfg.Callout.Revocations = c.Revocations()
package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/a2a-bus/a2a-bus/broker"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/store/jsevents"
	"github.com/a2a-bus/a2a-bus/store/jsstore"
)

// Named errors of Open.
var (
	// ErrMismatch: this broker's settings disagree with the cluster's.
	ErrMismatch = errors.New("cluster: this broker's settings disagree with the cluster's")
	// ErrNameInUse: a live broker of the cluster has this broker's name.
	ErrNameInUse = errors.New("cluster: another live broker has this broker's name")
)

// issuerKey is the key of the callout issuer in the meta bucket.
const issuerKey = "callout-issuer"

// QueueGroup is the queue group in which the brokers of a cluster take
// requests (natsbus.Config.QueueGroup): each request is served once, by
// any of them.
const QueueGroup = "a2a-bus"

// Defaults of Config's zero fields.
const (
	DefaultPrefix    = "a2a"
	DefaultLeaseTerm = 5 * time.Second
)

// Config configures a broker's share of the cluster. Every broker of one
// cluster uses the same Prefix and Replicas.
type Config struct {
	// Broker names this broker among the cluster's: letters, digits, '-'
	// and '_', at most 64; the same across its restarts (a host's name
	// does), so that a broker that comes back within the orphan timeout
	// finds its agents kept. Two live brokers must not share one.
	Broker string
	// Prefix names the cluster's streams and buckets ("a2a").
	Prefix string
	// Replicas is each stream's number of copies (1 when zero; 3 keeps
	// every acknowledged change through the loss of one server).
	Replicas int
	// Window is how many notifications are kept per session for replay
	// (broker.DefaultReplayWindow when zero).
	Window int
	// LeaseTerm is how long a broker's lease holds after its last
	// renewal (DefaultLeaseTerm when zero); the broker renews it every
	// fifth of that.
	LeaseTerm time.Duration
	// Timeout bounds one call's wait for the cluster (jsstore.Config's).
	Timeout time.Duration
	// Issuer is the public key of the auth callout's issuer
	// (natsbus.CalloutIssuer of the seed), "" when the brokers issue no
	// session credentials. The first broker records it; one with another
	// is refused, since the servers would refuse what it answers.
	Issuer string
}

var validBroker = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Cluster is one broker's share of the cluster's state.
type Cluster struct {
	cfg    Config
	store  *jsstore.Store
	events *jsevents.Log
	leases *leases
	revs   *revocations
}

// Open opens (and on the first broker, makes) the cluster's streams on nc,
// which stays the caller's. It waits for JetStream within ctx.
func Open(ctx context.Context, nc *nats.Conn, cfg Config) (*Cluster, error) {
	if !validBroker.MatchString(cfg.Broker) {
		return nil, fmt.Errorf("cluster: broker name %q: 1 to 64 letters, digits, '-' or '_'", cfg.Broker)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.Window <= 0 {
		cfg.Window = broker.DefaultReplayWindow
	}
	if cfg.LeaseTerm <= 0 {
		cfg.LeaseTerm = DefaultLeaseTerm
	}
	if cfg.LeaseTerm < 500*time.Millisecond {
		return nil, fmt.Errorf("cluster: lease term %v: at least 500ms", cfg.LeaseTerm)
	}
	c := &Cluster{cfg: cfg}
	var err error
	if c.store, err = jsstore.Open(ctx, nc, jsstore.Config{Replicas: cfg.Replicas, Prefix: cfg.Prefix, Timeout: cfg.Timeout}); err != nil {
		return nil, err
	}
	if c.events, err = jsevents.Open(ctx, nc, jsevents.Config{Stream: eventsStream(cfg.Prefix), Prefix: cfg.Prefix + ".log", Replicas: cfg.Replicas, Window: cfg.Window, MaxBytes: broker.DefaultReplayBytes}); err != nil {
		c.Close()
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("cluster: %w", err)
	}
	kv := func(name string, ttl time.Duration) (jetstream.KeyValue, error) {
		kv, err := bucket(ctx, js, jetstream.KeyValueConfig{
			Bucket: cfg.Prefix + "_" + name, History: 1, TTL: ttl, Storage: jetstream.FileStorage, Replicas: cfg.Replicas,
		})
		if err != nil {
			return nil, fmt.Errorf("cluster: the %s bucket: %w", name, err)
		}
		return kv, nil
	}
	leasesKV, err := kv("leases", cfg.LeaseTerm)
	if err != nil {
		c.Close()
		return nil, err
	}
	c.leases = &leases{kv: leasesKV, nc: nc, run: randomRun()}
	meta, err := kv("meta", 0)
	if err != nil {
		c.Close()
		return nil, err
	}
	if cfg.Issuer != "" {
		got, err := createOrGet(ctx, meta, issuerKey, cfg.Issuer)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("cluster: the callout issuer: %w", err)
		}
		if got != cfg.Issuer {
			c.Close()
			return nil, fmt.Errorf("%w: the cluster's brokers answer the auth callout as issuer %s; this broker's seed is %s's", ErrMismatch, got, cfg.Issuer)
		}
	}
	if err := c.leases.claim(ctx, cfg.Broker, cfg.LeaseTerm); err != nil {
		c.Close()
		return nil, err
	}
	revKV, err := kv("credentials", 0)
	if err != nil {
		c.Close()
		return nil, err
	}
	if c.revs, err = newRevocations(ctx, nc, meta, revKV); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// eventsStream is the name of the notifications' stream.
func eventsStream(prefix string) string { return strings.ToUpper(prefix) + "_EVENTS" }

// Store is the cluster's task store and registry, for broker.Config.Store.
func (c *Cluster) Store() store.Store { return c.store }

// Broker is what broker.Config.Cluster needs.
func (c *Cluster) Broker() *broker.Cluster {
	return &broker.Cluster{
		Broker:     c.cfg.Broker,
		Epoch:      c.events.Epoch(),
		Registry:   c.store,
		Events:     events{c.events},
		Leases:     c.leases,
		LeaseEvery: c.cfg.LeaseTerm / 5,
	}
}

// Revocations is the cluster's record of revoked session credentials,
// for natsbus.CalloutConfig.Revocations.
func (c *Cluster) Revocations() natsbus.Revocations { return c.revs }

// Close closes the store and the log (not the connection). Idempotent.
func (c *Cluster) Close() error {
	var errs []error
	if c.events != nil {
		errs = append(errs, c.events.Close())
	}
	if c.store != nil {
		errs = append(errs, c.store.Close())
	}
	return errors.Join(errs...)
}

// events adapts the log to the broker: a replay from before the oldest
// kept notification is the broker's to answer (A2A_REPLAY_GAP), from
// the bounds the log gives.
type events struct{ *jsevents.Log }

func (e events) Since(ctx context.Context, session string, afterSeq uint64, maxBytes int) ([]json.RawMessage, uint64, uint64, error) {
	msgs, oldest, last, err := e.Log.Since(ctx, session, afterSeq, maxBytes)
	if errors.Is(err, jsevents.ErrGap) {
		return nil, oldest, last, nil
	}
	return msgs, oldest, last, err
}

// attemptTimeout bounds one request to make or open a bucket: a request
// made while the cluster elects a leader, or that meets another broker's
// making the same bucket, may go unanswered.
const attemptTimeout = 3 * time.Second

// bucket makes the bucket, or opens it when another broker has made it,
// trying again until ctx ends.
func bucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	wait := 50 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		kv, err := js.CreateKeyValue(actx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			kv, err = js.KeyValue(actx, cfg.Bucket)
		}
		cancel()
		if err == nil {
			return kv, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}
