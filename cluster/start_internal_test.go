package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// flakyKV is a bucket whose stream has no leader for its first calls,
// as after a server of the cluster restarted: writes and reads find no
// one to answer them.
type flakyKV struct {
	jetstream.KeyValue
	failures int
	calls    int
	stored   map[string][]byte
}

func (f *flakyKV) Create(_ context.Context, key string, value []byte, _ ...jetstream.KVCreateOpt) (uint64, error) {
	f.calls++
	if f.calls <= f.failures {
		return 0, jetstream.ErrNoStreamResponse
	}
	if _, ok := f.stored[key]; ok {
		return 0, jetstream.ErrKeyExists
	}
	f.stored[key] = value
	return 1, nil
}

// The broker's first start waits out a cluster without a stream leader
// (within the start's bound), instead of stopping at the first request
// nobody answered.
func TestTheBaseGenerationWaitsForTheStreamsLeader(t *testing.T) {
	kv := &flakyKV{failures: 3, stored: map[string][]byte{}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := newRevocations(ctx, nil, kv, nil)
	require.NoError(t, err)
	assert.Equal(t, 4, kv.calls)
	assert.NotZero(t, r.base)

	// Past the start's bound, it gives up, saying why.
	kv = &flakyKV{failures: 1 << 30, stored: map[string][]byte{}}
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = newRevocations(ctx, nil, kv, nil)
	require.Error(t, err)
	assert.True(t, errors.Is(err, jetstream.ErrNoStreamResponse), "%v", err)
}
