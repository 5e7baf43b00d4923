package jsstore

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/a2a-bus/a2a-bus/store"
)

// Config configures a Store. The zero value is a store of one replica
// under the prefix "a2a".
type Config struct {
	// Replicas is each bucket's number of copies (1 when zero). A bucket
	// exists once for every broker sharing it: the first Open creates
	// it, and a later one with another number uses it as it is.
	Replicas int
	// Prefix names the buckets: <Prefix>_tasks and <Prefix>_agents
	// ("a2a" when empty). Brokers sharing state use the same prefix;
	// letters, digits, '-' and '_' only.
	Prefix string
	// Timeout bounds how long one call waits for the cluster: a request
	// whose answer is lost, or that finds no stream leader (an election
	// after a node died), is sent again until Timeout has passed since
	// the call began (10 s when zero, at most MaxTimeout).
	Timeout time.Duration
}

// MaxTimeout bounds Config.Timeout: the buckets remember a change's
// message id for dedupWindow, within which a change sent again after a
// lost answer is recognised as made, never made twice.
const MaxTimeout = dedupWindow / 2

const (
	defaultPrefix  = "a2a"
	defaultTimeout = 10 * time.Second
	dedupWindow    = 60 * time.Second
	// markerTTL is how long a key's removal marker stays before the
	// server drops it (a KV delete marker kept for ever would grow the
	// buckets by every task ever pruned).
	markerTTL = "2s"
)

// Named errors.
var (
	// ErrUnavailable is returned when the cluster did not answer a
	// request within Config.Timeout, through every try: a change
	// answered so may have been made or not.
	ErrUnavailable = errors.New("jsstore: the JetStream cluster did not answer in time")
	// ErrContended is returned when one key kept changing under a call
	// through maxConflicts tries of its compare-and-set.
	ErrContended = errors.New("jsstore: a key kept changing under a compare-and-set")
	// ErrSendKeyTaken is returned by Create when another task of the
	// same requester holds the record's send key: a concurrent keyed
	// send, on another broker, won. It matches store.ErrExists; FindSend
	// returns the winner.
	ErrSendKeyTaken = fmt.Errorf("%w: the send key names another task", store.ErrExists)
	// ErrUnsupported is returned by Open when the server lacks what the
	// store needs (atomic batch publish, per-message TTL: nats-server
	// 2.12 or later).
	ErrUnsupported = errors.New("jsstore: the NATS server does not support atomic batches and message TTLs (2.12 or later needed)")
	// ErrCorrupt is returned for a stored value that does not decode.
	ErrCorrupt = errors.New("jsstore: a stored value does not decode")
)

// Store is a store.Store and store.Names on JetStream key-value buckets,
// shared by every broker that opens it with the same prefix. Its methods
// are safe for concurrent use.
type Store struct {
	nc      *nats.Conn
	timeout time.Duration
	attempt time.Duration // one request's own deadline
	tasks   *bucket
	agents  *bucket

	// Guesses of the revisions of keys to change (guess.go): tasks as
	// last read or written (never changed: whoever takes one clones it),
	// and sessions' open-task counts.
	taskGuesses  guesses[*store.Record]
	countGuesses guesses[int]

	mu     sync.RWMutex
	closed bool
	watch  *regWatch      // the registrations' watch, once made
	calls  sync.WaitGroup // calls under way, which Close waits for
}

var (
	_ store.Store = (*Store)(nil)
	_ store.Names = (*Store)(nil)
)

var validPrefix = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// Open opens the store on nc's cluster, creating its buckets when they
// do not exist. nc stays the caller's: Close does not close it.
func Open(ctx context.Context, nc *nats.Conn, cfg Config) (*Store, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = defaultPrefix
	}
	if !validPrefix.MatchString(cfg.Prefix) {
		return nil, fmt.Errorf("jsstore: prefix %q: letters, digits, '-' and '_' only", cfg.Prefix)
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = defaultTimeout
	}
	if cfg.Timeout > MaxTimeout {
		return nil, fmt.Errorf("jsstore: timeout %v: at most %v", cfg.Timeout, MaxTimeout)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jsstore: %w", err)
	}
	s := &Store{
		nc:      nc,
		timeout: cfg.Timeout,
		attempt: max(cfg.Timeout/4, 250*time.Millisecond),
	}
	if s.tasks, err = s.openBucket(ctx, js, cfg.Prefix+"_tasks", cfg.Replicas); err != nil {
		return nil, err
	}
	if s.agents, err = s.openBucket(ctx, js, cfg.Prefix+"_agents", cfg.Replicas); err != nil {
		return nil, err
	}
	return s, nil
}

// bucketConfig is the stream of a bucket: a KV bucket as nats.go makes
// one (so that `nats kv` reads it), of history 1, with reads only from
// the stream leader (no direct get, which a lagging follower may
// answer), atomic batches and per-message TTLs (for removal markers).
func bucketConfig(name string, replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:               "KV_" + name,
		Subjects:           []string{"$KV." + name + ".>"},
		Storage:            jetstream.FileStorage,
		Replicas:           replicas,
		MaxMsgsPerSubject:  1,
		MaxMsgs:            -1,
		MaxBytes:           -1,
		MaxMsgSize:         -1,
		MaxConsumers:       -1,
		Discard:            jetstream.DiscardNew,
		AllowRollup:        true,
		DenyDelete:         true,
		Duplicates:         dedupWindow,
		AllowDirect:        false,
		AllowAtomicPublish: true,
		AllowMsgTTL:        true,
	}
}

func (s *Store) openBucket(ctx context.Context, js jetstream.JetStream, name string, replicas int) (*bucket, error) {
	want := bucketConfig(name, replicas)
	var str jetstream.Stream
	err := s.retry(ctx, "create bucket "+name, func(ctx context.Context) error {
		var err error
		str, err = js.CreateStream(ctx, want)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			// Made by another broker, maybe with another replica count.
			str, err = js.Stream(ctx, want.Name)
		}
		var a *jetstream.APIError
		if errors.As(err, &a) && a.ErrorCode == codeNoPeers {
			// A cluster just started has not yet heard from every node.
			return fmt.Errorf("%w: %w", errTryAgain, err)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	got := str.CachedInfo().Config
	switch {
	case !got.AllowAtomicPublish || !got.AllowMsgTTL:
		return nil, ErrUnsupported
	case got.AllowDirect || got.MaxMsgsPerSubject != 1 || len(got.Subjects) != 1 || got.Subjects[0] != want.Subjects[0] || got.Duplicates < dedupWindow:
		return nil, fmt.Errorf("jsstore: stream %s exists with another configuration (direct get, history, subjects or duplicate window)", want.Name)
	}
	return &bucket{st: s, name: name, stream: want.Name, pre: "$KV." + name + ".", str: str}, nil
}

// enter starts a call; leave ends it. A closed store refuses calls.
func (s *Store) enter() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return store.ErrClosed
	}
	s.calls.Add(1)
	return nil
}

func (s *Store) leave() { s.calls.Done() }

// Close ends the store: calls under way run to their end (a change
// acknowledged is made), later ones get store.ErrClosed. Idempotent. The
// connection stays open.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.calls.Wait()
	return nil
}
