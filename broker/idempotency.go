package broker

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"hash/maphash"
	"sync"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/wire"
)

// Idempotency (docs/PROTOCOL.md §4.11): a change that carries a client's
// key is applied once. The key of a send that creates a task is kept with
// the task and indexed by the requester instance (store.FindSend); the
// keys of later changes are kept in the task's record (store.Applied);
// the keys of oneway pushes, which are not stored, in a window in memory.
// Each key comes with the digest of the change it named, so that a retry
// (the same change) can be told from a different change under a reused
// key (-32602).

// sendStripes serialize the sends of one (instance, messageId), so that a
// retry racing its first attempt finds the task the first one made.
const sendStripes = 256

func (b *Broker) lockSend(instance, key string) func() {
	var h maphash.Hash
	h.SetSeed(stripeSeed)
	h.WriteString(instance)
	h.WriteByte(0)
	h.WriteString(key)
	m := &b.sendLocks[h.Sum64()%sendStripes]
	m.Lock()
	return m.Unlock
}

// digest names a change by its content: 16 bytes of SHA-256 over its JSON.
func digest(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		return "" // validated on the way in: cannot happen
	}
	sum := sha256.Sum256(data)
	return base64.RawStdEncoding.EncodeToString(sum[:16])
}

// asSent is a message as its sender wrote it, without what the broker
// sets on it.
func asSent(m *wire.Message) *wire.Message {
	if m == nil {
		return nil
	}
	c := *m
	c.Role, c.From, c.TaskID, c.ContextID = "", "", "", ""
	return &c
}

// The changes a key can name, as digested.
type (
	sendIntent struct {
		Method   string          `json:"method"`
		To       string          `json:"to,omitempty"`
		TaskID   string          `json:"taskId,omitempty"`
		Oneway   bool            `json:"oneway,omitempty"`
		Message  *wire.Message   `json:"message"`
		Metadata json.RawMessage `json:"metadata,omitempty"`
	}
	updateIntent struct {
		Method    string          `json:"method"`
		State     wire.State      `json:"state"`
		Message   *wire.Message   `json:"message,omitempty"`
		Artifacts []wire.Artifact `json:"artifacts,omitempty"`
	}
)

func sendDigest(p *wire.SendParams) string {
	return digest(sendIntent{Method: wire.MethodSend, To: p.To, TaskID: p.TaskID, Oneway: p.Oneway, Message: asSent(p.Message), Metadata: compact(p.Metadata)})
}

// compact drops the insignificant white space of raw JSON, so that a
// retry's re-encoding of the same metadata has the same digest.
func compact(raw json.RawMessage) json.RawMessage {
	if raw == nil {
		return nil
	}
	var buf bytes.Buffer
	if json.Compact(&buf, raw) != nil {
		return raw
	}
	return buf.Bytes()
}

// key is one change's idempotency key within a task. The two members
// keep theirs apart: each names its own changes.
type key struct {
	name   string // "" means the change has none
	digest string
}

func memberKey(m member, k string) string {
	if m == assignee {
		return "a:" + k
	}
	return "r:" + k
}

// errApplied aborts a change whose key the task already holds with the
// same digest: it was applied before.
var errApplied = errors.New("change already applied")

// errKeyReused aborts a change whose key the task holds for another one.
var errKeyReused = errors.New("key reused")

// checkKey tells a retry (errApplied) or a reuse (errKeyReused) from a
// new change, and records a new one.
func checkKey(r *store.Record, k key) error {
	if k.name == "" {
		return nil
	}
	if d, ok := r.FindApplied(k.name); ok {
		if d == k.digest {
			return errApplied
		}
		return errKeyReused
	}
	r.Apply(k.name, k.digest)
	return nil
}

func keyReused(name string) *wire.Error {
	return wire.ErrInvalidParams.Withf("messageId %s was already used for a different change; a retry must repeat the change exactly, and a new change needs a new messageId", wire.Quote(name))
}

// pushWindow remembers, per sender instance, the keys of its latest
// oneway pushes: pushes are not stored, so neither are their keys, and a
// broker restart forgets them.
type pushWindow struct {
	mu   sync.Mutex
	byIn map[string]*pushKeys
}

// pushWindowSize bounds the keys kept per sender instance.
const pushWindowSize = 256

type pushKeys struct {
	mu    sync.Mutex
	order []string
	seen  map[string]pushSeen
}

type pushSeen struct{ digest, delivered string }

// of returns the window of an instance, made on first use.
func (w *pushWindow) of(instance string) *pushKeys {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byIn == nil {
		w.byIn = map[string]*pushKeys{}
	}
	k := w.byIn[instance]
	if k == nil {
		k = &pushKeys{seen: map[string]pushSeen{}}
		w.byIn[instance] = k
	}
	return k
}

// forget drops a departed instance's window.
func (w *pushWindow) forget(instance string) {
	w.mu.Lock()
	delete(w.byIn, instance)
	w.mu.Unlock()
}

func (k *pushKeys) find(name string) (pushSeen, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	s, ok := k.seen[name]
	return s, ok
}

func (k *pushKeys) record(name string, s pushSeen) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.order) >= pushWindowSize {
		delete(k.seen, k.order[0])
		k.order = k.order[1:]
	}
	k.order = append(k.order, name)
	k.seen[name] = s
}
