package jsevents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// stored is one message of the stream as read back.
type stored struct {
	subject string
	sseq    uint64 // its stream sequence
	seq     uint64 // its A2a-Seq
	data    []byte
}

// msgGetRequest is the body of $JS.API.STREAM.MSG.GET: one message, by
// stream sequence (Seq), the first at or after Seq on a subject
// (NextFor), or the last on a subject (LastFor; wildcards allowed).
type msgGetRequest struct {
	Seq     uint64 `json:"seq,omitempty"`
	LastFor string `json:"last_by_subj,omitempty"`
	NextFor string `json:"next_by_subj,omitempty"`
}

type msgGetResponse struct {
	Error   *jetstream.APIError `json:"error,omitempty"`
	Message *struct {
		Subject  string `json:"subject"`
		Sequence uint64 `json:"seq"`
		Header   []byte `json:"hdrs,omitempty"`
		Data     []byte `json:"data,omitempty"`
	} `json:"message,omitempty"`
}

// leaderGet reads one message from the stream's leader, which answers
// with what it has applied, an acknowledged publish included. found is
// false when there is no such message. It retries while the stream has no
// leader, until ctx ends or the Log closes.
func (l *Log) leaderGet(ctx context.Context, req msgGetRequest) (m stored, found bool, err error) {
	body, err := json.Marshal(req)
	if err != nil {
		return stored{}, false, err
	}
	backoff := minBackoff
	for {
		m, found, err = l.leaderGetOnce(ctx, body)
		if err == nil || !transient(err) {
			return m, found, err
		}
		if err := sleep(ctx, l.done, &backoff); err != nil {
			return stored{}, false, fmt.Errorf("read %s: %w", body, err)
		}
	}
}

func (l *Log) leaderGetOnce(ctx context.Context, body []byte) (stored, bool, error) {
	actx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	msg, err := l.nc.RequestWithContext(actx, l.getSubj, body)
	if err != nil {
		return stored{}, false, err
	}
	var resp msgGetResponse
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return stored{}, false, fmt.Errorf("unreadable answer to %s: %w", body, err)
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return stored{}, false, nil
		}
		return stored{}, false, resp.Error
	}
	if resp.Message == nil {
		return stored{}, false, fmt.Errorf("answer to %s without a message", body)
	}
	m := stored{subject: resp.Message.Subject, sseq: resp.Message.Sequence, data: resp.Message.Data}
	if len(resp.Message.Header) > 0 {
		h, err := nats.DecodeHeadersMsg(resp.Message.Header)
		if err != nil {
			return stored{}, false, fmt.Errorf("message %d: headers: %w", m.sseq, err)
		}
		if m.seq, err = seqOf(h); err != nil {
			return stored{}, false, fmt.Errorf("message %d: %w", m.sseq, err)
		}
	} else {
		return stored{}, false, fmt.Errorf("message %d on %s: no %s header", m.sseq, m.subject, HeaderSeq)
	}
	if m.data == nil {
		m.data = []byte{}
	}
	return m, true, nil
}

func seqOf(h nats.Header) (uint64, error) {
	v := h.Get(HeaderSeq)
	seq, err := strconv.ParseUint(v, 10, 64)
	if err != nil || seq == 0 {
		return 0, fmt.Errorf("%s header %q: not a seq", HeaderSeq, v)
	}
	return seq, nil
}

// lastOf reads the last message on filter (a session's <prefix>.<T>.*)
// from the leader: its A2a-Seq is the session's last seq.
func (l *Log) lastOf(ctx context.Context, filter string) (stored, bool, error) {
	return l.leaderGet(ctx, msgGetRequest{LastFor: filter})
}

// getSeq reads the message at stream sequence sseq from the leader.
func (l *Log) getSeq(ctx context.Context, sseq uint64) (stored, error) {
	m, found, err := l.leaderGet(ctx, msgGetRequest{Seq: sseq})
	if err == nil && !found {
		err = fmt.Errorf("no message at stream sequence %d", sseq)
	}
	return m, err
}

// directRequest is the body of a batched $JS.API.DIRECT.GET: up to Batch
// messages on NextFor from stream sequence Seq, stopping once MaxBytes
// (subjects, headers and bodies) are sent.
type directRequest struct {
	Seq      uint64 `json:"seq"`
	NextFor  string `json:"next_by_subj"`
	Batch    int    `json:"batch"`
	MaxBytes int    `json:"max_bytes,omitempty"`
}

// errNoDirect: no replica answered a direct get.
var errNoDirect = errors.New("no replica answered the direct get")

// direct reads a batch of messages with a direct get, which any replica of
// the stream may answer, from its own store: what it returns was stored,
// but a replica behind the leader may return fewer than the leader would.
func (l *Log) direct(ctx context.Context, req directRequest) ([]stored, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	actx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	inbox := l.nc.NewRespInbox()
	sub, err := l.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := l.nc.PublishRequest(l.directSubj, inbox, body); err != nil {
		return nil, err
	}
	var out []stored
	for {
		msg, err := sub.NextMsgWithContext(actx)
		if err != nil {
			return out, err
		}
		switch status := msg.Header.Get("Status"); status {
		case "":
		case "204": // end of batch
			return out, nil
		case "404": // nothing at or after Seq
			return out, nil
		case "503":
			return out, errNoDirect
		default:
			return out, fmt.Errorf("direct get %s: status %s %s", body, status, msg.Header.Get("Description"))
		}
		m := stored{subject: msg.Header.Get(jetstream.SubjectHeader), data: msg.Data}
		if m.sseq, err = strconv.ParseUint(msg.Header.Get(jetstream.SequenceHeader), 10, 64); err != nil {
			return out, fmt.Errorf("direct get: message without a stream sequence: %w", err)
		}
		if m.seq, err = seqOf(msg.Header); err != nil {
			return out, fmt.Errorf("direct get: message %d: %w", m.sseq, err)
		}
		if m.data == nil {
			m.data = []byte{}
		}
		out = append(out, m)
	}
}
