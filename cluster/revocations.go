package cluster

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
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
	nc   *nats.Conn
	base uint64
}

var _ natsbus.Revocations = (*revocations)(nil)

// baseKey is the key of the base generation in the meta bucket.
const baseKey = "revocation-base"

func newRevocations(ctx context.Context, nc *nats.Conn, meta, kv jetstream.KeyValue) (*revocations, error) {
	fresh := strconv.FormatUint(randomGeneration(), 10)
	v, err := createOrGet(ctx, meta, baseKey, fresh)
	if err != nil {
		return nil, fmt.Errorf("cluster: the credentials' base generation: %w", err)
	}
	base, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("cluster: the credentials' base generation %q: %w", v, err)
	}
	return &revocations{kv: kv, nc: nc, base: base}, nil
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
//
// It reads from the stream's leader, not through a direct get (which a
// replica that is behind may answer): a credential revoked a moment ago
// is refused by every broker.
func (r *revocations) read(ctx context.Context, session string) (uint64, uint64, error) {
	val, rev, err := leaderGet(ctx, r.nc, "KV_"+r.kv.Bucket(), "$KV."+r.kv.Bucket()+"."+sessionKey(session))
	switch {
	case err != nil:
		return 0, 0, fmt.Errorf("cluster: read the session's credential generation: %w", err)
	case val == nil:
		return r.base, rev, nil
	}
	g, err := strconv.ParseUint(string(val), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("cluster: the session's credential generation %q: %w", val, err)
	}
	return g, rev, nil
}

// leaderGet reads the last message on subject from stream's leader:
// its data and sequence; nil data when there is none or it is a KV
// delete or purge marker (then rev is the marker's, 0 when none).
//
// A request unanswered (a stream just made, whose leader is being
// elected; a leader that changed) is sent again, each try bounded, until
// ctx ends.
func leaderGet(ctx context.Context, nc *nats.Conn, stream, subject string) ([]byte, uint64, error) {
	req, _ := json.Marshal(map[string]string{"last_by_subj": subject})
	var m *nats.Msg
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		var err error
		m, err = nc.RequestWithContext(actx, "$JS.API.STREAM.MSG.GET."+stream, req)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, 0, fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, 0, fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-t.C:
		}
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message struct {
			Seq  uint64 `json:"seq"`
			Data []byte `json:"data"`
			Hdrs []byte `json:"hdrs"`
		} `json:"message"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, 0, fmt.Errorf("a message get answer does not decode: %w", err)
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return nil, 0, nil
		}
		return nil, 0, resp.Error
	}
	if len(resp.Message.Hdrs) > 0 {
		if h, err := nats.DecodeHeadersMsg(resp.Message.Hdrs); err == nil {
			if op := h.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
				return nil, resp.Message.Seq, nil
			}
		}
	}
	if resp.Message.Data == nil {
		resp.Message.Data = []byte{}
	}
	return resp.Message.Data, resp.Message.Seq, nil
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
//
// A request nobody answered (a stream without a leader, as while a
// server that restarted rejoins) is sent again, backing off, until ctx
// ends: a broker starting then waits for the cluster within its start's
// bound rather than stopping at once.
func createOrGet(ctx context.Context, kv jetstream.KeyValue, key, val string) (string, error) {
	wait := 50 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		v, err := createOrGetOnce(actx, kv, key, val)
		cancel()
		if err == nil || !unanswered(err) || ctx.Err() != nil {
			return v, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", err
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}

// unanswered reports whether err says that a request found no one to
// answer it in time, which a later try may.
func unanswered(err error) bool {
	var a *jetstream.APIError
	if errors.As(err, &a) {
		return a.Code == 503
	}
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded)
}

func createOrGetOnce(ctx context.Context, kv jetstream.KeyValue, key, val string) (string, error) {
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
