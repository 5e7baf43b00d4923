package broker

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"hash/maphash"
	"sync"

	"github.com/go-json-experiment/json/jsontext"

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
	if testHookLockingSend != nil {
		testHookLockingSend(instance, key)
	}
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
// sets on it, and with its JSON values canonical.
func asSent(m *wire.Message) *wire.Message {
	if m == nil {
		return nil
	}
	c := *m
	c.Role, c.From, c.TaskID, c.ContextID = "", "", "", ""
	c.Metadata = canonical(c.Metadata)
	c.Parts = canonicalParts(c.Parts)
	return &c
}

func canonicalParts(parts []wire.Part) []wire.Part {
	out := make([]wire.Part, len(parts))
	for i, p := range parts {
		p.Data, p.Metadata = canonical(p.Data), canonical(p.Metadata)
		if p.Kind == wire.KindData && p.Data == nil {
			p.Data = json.RawMessage("null") // data null is data, not absence
		}
		out[i] = p
	}
	return out
}

func canonicalArtifacts(as []wire.Artifact) []wire.Artifact {
	out := make([]wire.Artifact, len(as))
	for i, a := range as {
		a.Metadata, a.Parts = canonical(a.Metadata), canonicalParts(a.Parts)
		out[i] = a
	}
	return out
}

// canonical is raw JSON in its RFC 8785 canonical form (members sorted,
// numbers and strings in one spelling, no white space), so that a retry
// re-encoded by another JSON library has the same digest; null is
// absence.
func canonical(raw json.RawMessage) json.RawMessage {
	if raw == nil || string(raw) == "null" {
		return nil
	}
	v := jsontext.Value(bytes.Clone(raw))
	if v.Canonicalize() != nil {
		return raw
	}
	if string(v) == "null" {
		return nil
	}
	return json.RawMessage(v)
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
	return digest(sendIntent{Method: wire.MethodSend, To: p.To, TaskID: p.TaskID, Oneway: p.Oneway, Message: asSent(p.Message), Metadata: canonical(p.Metadata)})
}

func updateDigest(p *wire.UpdateParams) string {
	return digest(updateIntent{Method: wire.MethodUpdateTask, State: p.State, Message: asSent(p.Message), Artifacts: canonicalArtifacts(p.Artifacts)})
}

// key is one change's idempotency key within a task, made by one member
// instance: each member's keys are its own.
type key struct {
	by     string // the member instance
	name   string // "" means the change has none
	digest string
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
	if err := appliedAs(r, k); err != nil {
		return err
	}
	r.Apply(k.by, k.name, k.digest)
	return nil
}

// appliedAs is errApplied, errKeyReused, or nil when r holds no such key.
func appliedAs(r *store.Record, k key) error {
	if k.name == "" {
		return nil
	}
	if d, ok := r.FindApplied(k.by, k.name); ok {
		if d == k.digest {
			return errApplied
		}
		return errKeyReused
	}
	return nil
}

func keyReused(name string) *wire.Error {
	return wire.ErrInvalidParams.Withf("messageId %s was already used for a different change; a retry must repeat the change exactly, and a new change needs a new messageId", wire.Quote(name))
}

// pushWindow remembers, per sender instance, the keys of its latest
// oneway pushes: pushes are not stored, so neither are their keys, and a
// broker restart forgets them. A key is kept as its hash, so that an
// entry costs the same whatever the key's length.
type pushWindow struct {
	mu   sync.Mutex
	byIn map[string]*pushKeys
}

// pushWindowSize bounds the keys kept per sender instance: at about 100
// bytes an entry, 6.4 KB per instance.
const pushWindowSize = 64

type pushKeys struct {
	mu    sync.Mutex
	order [][16]byte
	seen  map[[16]byte]pushSeen
}

type pushSeen struct {
	digest    string
	delivered string // the recipient's agentId
}

func pushKeyOf(name string) [16]byte {
	sum := sha256.Sum256([]byte(name))
	return [16]byte(sum[:16])
}

// find returns what a push under this key did, if the window holds it.
func (w *pushWindow) find(instance, name string) (pushSeen, bool) {
	w.mu.Lock()
	k := w.byIn[instance]
	w.mu.Unlock()
	if k == nil {
		return pushSeen{}, false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	s, ok := k.seen[pushKeyOf(name)]
	return s, ok
}

// record adds a push's key to its sender's window. The caller holds the
// sender (agent.enter), so that a departure's forget comes after it.
func (w *pushWindow) record(instance, name string, s pushSeen) {
	w.mu.Lock()
	if w.byIn == nil {
		w.byIn = map[string]*pushKeys{}
	}
	k := w.byIn[instance]
	if k == nil {
		k = &pushKeys{seen: map[[16]byte]pushSeen{}}
		w.byIn[instance] = k
	}
	w.mu.Unlock()
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.order) >= pushWindowSize {
		delete(k.seen, k.order[0])
		k.order = k.order[1:]
	}
	h := pushKeyOf(name)
	k.order = append(k.order, h)
	k.seen[h] = s
}

// forget drops a departed instance's window.
func (w *pushWindow) forget(instance string) {
	w.mu.Lock()
	delete(w.byIn, instance)
	w.mu.Unlock()
}

// windows is how many instances have a push window, for tests.
func (w *pushWindow) windows() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.byIn)
}
