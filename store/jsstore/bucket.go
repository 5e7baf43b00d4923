package jsstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// JetStream error codes the store acts on.
const (
	codeWrongLastSeq   = 10071 // a compare-and-set found another revision
	codeSubjectBusy    = 10164 // another write to the subject is in flight
	codeBatchDuplicate = 10201 // the batch's message id was seen: it is stored
	codeDupInProcess   = 10158 // the message id is being stored now
	codeBatchIncomplet = 10176 // a message of the batch went missing
	codeTooManyBatches = 10210 // the stream has too many open batches
	codeNotLeader      = 10009
	codeNoPeers        = 10005 // no suitable peers for a stream's replicas
)

// errTryAgain marks an error as one to try again after.
var errTryAgain = errors.New("jsstore: try again")

// Headers.
const (
	hdrExpectSubjSeq = "Nats-Expected-Last-Subject-Sequence"
	hdrMsgID         = "Nats-Msg-Id"
	hdrBatchID       = "Nats-Batch-Id"
	hdrBatchSeq      = "Nats-Batch-Sequence"
	hdrBatchCommit   = "Nats-Batch-Commit"
	hdrTTL           = "Nats-TTL"
	hdrRollup        = "Nats-Rollup"
	hdrKVOp          = "KV-Operation"
)

// maxConflicts bounds the compare-and-set tries of one call.
const maxConflicts = 2000

// bucket is one KV bucket, read and written through its stream.
type bucket struct {
	st     *Store
	name   string
	stream string           // KV_<name>
	pre    string           // $KV.<name>.
	str    jetstream.Stream // made without direct get: reads go to the leader
}

// entry is a key's latest message.
type entry struct {
	rev     uint64 // its stream sequence; 0 when the key has none
	data    []byte
	deleted bool // a removal marker: the key is absent
}

func (e entry) live() bool { return e.rev != 0 && !e.deleted }

// absentRev is the revision a write that requires the key absent
// expects: 0, or that of its removal marker.
func (e entry) absentRev() uint64 {
	if e.deleted {
		return e.rev
	}
	return 0
}

// get reads key's latest message from the stream leader.
func (b *bucket) get(ctx context.Context, key string) (entry, error) {
	var e entry
	err := b.st.retry(ctx, "read "+b.name+" "+key, func(ctx context.Context) error {
		m, err := b.str.GetLastMsgForSubject(ctx, b.pre+key)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			e = entry{}
			return nil
		case err != nil:
			return err
		}
		e = entry{rev: m.Sequence, data: m.Data}
		switch m.Header.Get(hdrKVOp) {
		case "DEL", "PURGE":
			e.deleted, e.data = true, nil
		}
		return nil
	})
	return e, err
}

// op is one write of a change.
type op struct {
	key    string
	data   []byte
	expect int64 // the key's revision required (0: absent); -1: none
	remove bool  // a removal marker instead of a value
}

const anyRev = -1

func put(key string, data []byte, expect int64) op { return op{key: key, data: data, expect: expect} }
func remove(key string, expect int64) op           { return op{key: key, expect: expect, remove: true} }

func (b *bucket) msg(o op) (*nats.Msg, error) {
	subj := b.pre + o.key
	if len(subj) > maxSubject {
		return nil, fmt.Errorf("jsstore: a key of %d bytes is longer than %d", len(subj), maxSubject)
	}
	m := nats.NewMsg(subj)
	m.Data = o.data
	if o.expect >= 0 {
		m.Header.Set(hdrExpectSubjSeq, strconv.FormatInt(o.expect, 10))
	}
	if o.remove {
		m.Header.Set(hdrKVOp, "PURGE")
		m.Header.Set(hdrRollup, "sub")
		m.Header.Set(hdrTTL, markerTTL)
	}
	return m, nil
}

// pubAck is the stream's answer to a publish or a batch commit.
type pubAck struct {
	Stream    string              `json:"stream"`
	Seq       uint64              `json:"seq"`
	Duplicate bool                `json:"duplicate"`
	Error     *jetstream.APIError `json:"error"`
}

// write makes ops, one change, atomically: all or none (an atomic batch
// when there are several). A compare-and-set that fails returns an error
// that conflict recognises. A request whose answer is lost is sent again
// under the same message id, so that the change is made once. It returns
// the stream sequence of the change's last message (0 when a lost
// answer's change was recognised as made).
func (b *bucket) write(ctx context.Context, ops ...op) (uint64, error) {
	msgs := make([]*nats.Msg, len(ops))
	for i, o := range ops {
		m, err := b.msg(o)
		if err != nil {
			return 0, err
		}
		msgs[i] = m
	}
	msgs[0].Header.Set(hdrMsgID, nuid.Next())
	var seq uint64
	err := b.st.retry(ctx, "write "+b.name+" "+ops[0].key, func(ctx context.Context) error {
		last := msgs[len(msgs)-1]
		if len(msgs) > 1 {
			id := nuid.Next()
			for i, m := range msgs {
				m.Header.Set(hdrBatchID, id)
				m.Header.Set(hdrBatchSeq, strconv.Itoa(i+1))
			}
			last.Header.Set(hdrBatchCommit, "1")
			for _, m := range msgs[:len(msgs)-1] {
				if err := b.st.nc.PublishMsg(m); err != nil {
					return err
				}
			}
		}
		resp, err := b.st.nc.RequestMsgWithContext(ctx, last)
		if err != nil {
			return err
		}
		var ack pubAck
		if err := json.Unmarshal(resp.Data, &ack); err != nil {
			return fmt.Errorf("jsstore: an answer of the stream does not decode: %w", err)
		}
		if ack.Error != nil {
			if ack.Error.ErrorCode == codeBatchDuplicate {
				seq = 0 // an earlier try's batch was stored
				return nil
			}
			return ack.Error
		}
		seq = ack.Seq
		return nil
	})
	return seq, err
}

// conflict reports whether err is a failed compare-and-set.
func conflict(err error) bool {
	var a *jetstream.APIError
	return errors.As(err, &a) && (a.ErrorCode == codeWrongLastSeq || a.ErrorCode == codeSubjectBusy)
}

// transient reports whether a request that failed with err may succeed
// if sent again: its answer was lost, or the stream had no leader.
func transient(err error) bool {
	if errors.Is(err, errTryAgain) {
		return true
	}
	var a *jetstream.APIError
	if errors.As(err, &a) {
		switch a.ErrorCode {
		case codeDupInProcess, codeBatchIncomplet, codeTooManyBatches, codeNotLeader:
			return true
		}
		return a.Code == 503
	}
	return errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionReconnecting)
}

// retry runs fn, each time with a deadline of its own, until it
// succeeds, fails for good, or the store's timeout has passed since the
// first try.
func (s *Store) retry(ctx context.Context, what string, fn func(context.Context) error) error {
	deadline := time.Now().Add(s.timeout)
	wait := 10 * time.Millisecond
	for {
		end := time.Now().Add(s.attempt)
		if end.After(deadline) {
			end = deadline
		}
		actx, cancel := context.WithDeadline(ctx, end)
		err := fn(actx)
		cancel()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("jsstore: %s: %w", what, ctx.Err())
		case !transient(err):
			return fmt.Errorf("jsstore: %s: %w", what, err)
		case time.Now().Add(wait).After(deadline):
			return fmt.Errorf("jsstore: %s: %w: %w", what, ErrUnavailable, err)
		}
		if err := pause(ctx, wait); err != nil {
			return fmt.Errorf("jsstore: %s: %w", what, err)
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// backoff waits before the next try of a compare-and-set that failed
// try times: a random time growing with try, so that racing writers
// spread out. It gives up after maxConflicts tries.
func backoff(ctx context.Context, try int, what string) error {
	if try >= maxConflicts {
		return fmt.Errorf("jsstore: %s: %w", what, ErrContended)
	}
	if try < 2 {
		return ctx.Err()
	}
	limit := time.Duration(1<<min(try, 8)) * 100 * time.Microsecond
	return pause(ctx, rand.N(limit))
}

func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
