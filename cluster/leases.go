package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// leases are the brokers' leases: one key per broker in a bucket whose
// entries expire LeaseTerm after they were written (the bucket's
// MaxAge), so that a lease holds while its broker rewrites it and lapses
// by the cluster's own clock when it stops: no timer of the broker that
// died is involved.
//
// A lease holds the run id of the broker that renews it, so that a second
// live broker under one name is told (claim).
type leases struct {
	kv  jetstream.KeyValue
	nc  *nats.Conn
	run string // this broker run's id
}

func randomRun() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// claim waits until no other run holds broker's lease: a lease of an
// earlier run of this broker (killed a moment ago) lapses within a term;
// one renewed meanwhile by another run is a live broker of the same
// name, ErrNameInUse.
func (l *leases) claim(ctx context.Context, broker string, term time.Duration) error {
	stream, subject := "KV_"+l.kv.Bucket(), "$KV."+l.kv.Bucket()+"."+broker
	_, first, err := leaderGet(ctx, l.nc, stream, subject)
	if err != nil {
		return fmt.Errorf("cluster: read the lease of broker %q: %w", broker, err)
	}
	deadline := time.Now().Add(term + term/2)
	for first != 0 && time.Now().Before(deadline) {
		t := time.NewTimer(term / 10)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		val, rev, err := leaderGet(ctx, l.nc, stream, subject)
		switch {
		case err != nil:
			return fmt.Errorf("cluster: read the lease of broker %q: %w", broker, err)
		case val == nil:
			return nil // lapsed
		case rev != first:
			return fmt.Errorf("%w: %q (run %s renews its lease); give this broker another --broker-name", ErrNameInUse, broker, val)
		}
	}
	return nil
}

// Renew implements broker.SharedLeases.
func (l *leases) Renew(ctx context.Context, broker string) error {
	if _, err := l.kv.Put(ctx, broker, []byte(l.run)); err != nil {
		return fmt.Errorf("cluster: renew the lease of broker %q: %w", broker, err)
	}
	return nil
}

// Live implements broker.SharedLeases.
func (l *leases) Live(ctx context.Context) (map[string]bool, error) {
	keys, err := l.kv.Keys(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, fmt.Errorf("cluster: read the brokers' leases: %w", err)
	}
	live := make(map[string]bool, len(keys))
	for _, k := range keys {
		live[k] = true
	}
	return live, nil
}
