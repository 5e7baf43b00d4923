package cluster

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/a2a-bus/a2a-bus/natsbus"
)

// revocations is natsbus.Revocations shared by the brokers of a cluster:
// a key per session revoked at least once, holding its generation, and
// one base generation, made by the first broker, for the sessions never
// revoked. Revoke is a compare-and-set, so that two brokers closing one
// session at once both end the generation they read or retry.
type revocations struct {
	kv   jetstream.KeyValue
	base uint64
}

var _ natsbus.Revocations = (*revocations)(nil)

// baseKey is the key of the base generation in the meta bucket.
const baseKey = "revocation-base"

func newRevocations(ctx context.Context, meta, kv jetstream.KeyValue) (*revocations, error) {
	fresh := strconv.FormatUint(randomGeneration(), 10)
	v, err := createOrGet(ctx, meta, baseKey, fresh)
	if err != nil {
		return nil, fmt.Errorf("cluster: the credentials' base generation: %w", err)
	}
	base, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("cluster: the credentials' base generation %q: %w", v, err)
	}
	return &revocations{kv: kv, base: base}, nil
}

// sessionKey is a session's key: KV keys allow fewer characters than
// session ids hold.
func sessionKey(session string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(session))
}

// Current implements natsbus.Revocations.
func (r *revocations) Current(ctx context.Context, session string) (uint64, error) {
	g, _, err := r.read(ctx, session)
	return g, err
}

// read returns the session's generation and the revision it was read at
// (0: never revoked).
func (r *revocations) read(ctx context.Context, session string) (uint64, uint64, error) {
	e, err := r.kv.Get(ctx, sessionKey(session))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return r.base, 0, nil
	case err != nil:
		return 0, 0, fmt.Errorf("cluster: read the session's credential generation: %w", err)
	}
	g, err := strconv.ParseUint(string(e.Value()), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("cluster: the session's credential generation %q: %w", e.Value(), err)
	}
	return g, e.Revision(), nil
}

// Revoke implements natsbus.Revocations.
func (r *revocations) Revoke(ctx context.Context, session string) (uint64, error) {
	for {
		ended, rev, err := r.read(ctx, session)
		if err != nil {
			return 0, err
		}
		next := randomGeneration()
		for next == ended || next == r.base {
			next = randomGeneration()
		}
		val := []byte(strconv.FormatUint(next, 10))
		if rev == 0 {
			_, err = r.kv.Create(ctx, sessionKey(session), val)
		} else {
			_, err = r.kv.Update(ctx, sessionKey(session), val, rev)
		}
		switch {
		case err == nil:
			return ended, nil
		case conflict(err):
			continue // another broker revoked it meanwhile: again
		case ctx.Err() != nil:
			return 0, ctx.Err()
		default:
			return 0, fmt.Errorf("cluster: revoke the session's credentials: %w", err)
		}
	}
}

// conflict reports whether err is a lost compare-and-set: the key changed
// since it was read (10071), or another write to it is under way on a
// replicated stream (10164).
func conflict(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

func randomGeneration() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return binary.BigEndian.Uint64(b[:])
}

// createOrGet stores val under key unless the key holds a value, and
// returns what the key holds.
func createOrGet(ctx context.Context, kv jetstream.KeyValue, key, val string) (string, error) {
	if _, err := kv.Create(ctx, key, []byte(val)); err == nil {
		return val, nil
	} else if !errors.Is(err, jetstream.ErrKeyExists) {
		return "", err
	}
	e, err := kv.Get(ctx, key)
	if err != nil {
		return "", err
	}
	return string(e.Value()), nil
}
