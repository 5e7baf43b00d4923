package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// leases are the brokers' leases: one key per broker in a bucket whose
// entries expire LeaseTerm after they were written (the bucket's
// MaxAge), so that a lease holds while its broker rewrites it and lapses
// by the cluster's own clock when it stops: no timer of the broker that
// died is involved.
type leases struct {
	kv jetstream.KeyValue
}

// Renew implements broker.SharedLeases.
func (l *leases) Renew(ctx context.Context, broker string) error {
	if _, err := l.kv.Put(ctx, broker, []byte(time.Now().UTC().Format(time.RFC3339Nano))); err != nil {
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

// epochKey is the key of the cluster's epoch in the meta bucket.
const epochKey = "epoch"

// epoch returns the cluster's epoch, made by the first broker that asks.
func epoch(ctx context.Context, kv jetstream.KeyValue, fresh string) (string, error) {
	e, err := createOrGet(ctx, kv, epochKey, fresh)
	if err != nil {
		return "", fmt.Errorf("cluster: the cluster's epoch: %w", err)
	}
	return e, nil
}
