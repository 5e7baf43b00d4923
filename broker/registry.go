package broker

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/google/uuid"

	"github.com/a2a-bus/a2a-bus/internal/secret"
	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/transport"
	"github.com/a2a-bus/a2a-bus/wire"
)

// agent is one live registration.
//
// mu is held shared by every operation acting as or on the agent, for its
// whole length, and exclusively to revoke the agent (deregister, or a
// replacing register). So an operation authenticated before a revocation
// finishes before it, and one that starts after it sees dead. Operations
// that hold two agents take them in ascending order.
type agent struct {
	mu   sync.RWMutex
	dead bool // guarded by mu

	order     uint64 // lock order, unique
	id        string // agentId: the unique live name
	name      string // card.name as given
	instance  string
	session   string
	tokenHash [32]byte
	card      json.RawMessage // the card as list shows it, encoded once
	hidden    bool            // in a Config.HiddenSessions session

	// In a cluster: the broker the agent belongs to (guarded by the
	// registry's mu), and whether this broker is taking it over.
	broker   string
	adopting atomic.Bool
}

// enter takes a shared hold on a; it reports false, holding nothing, when
// a is dead.
func (a *agent) enter() bool {
	a.mu.RLock()
	if a.dead {
		a.mu.RUnlock()
		return false
	}
	return true
}

func (a *agent) leave() { a.mu.RUnlock() }

// enterPair holds two distinct agents in lock order.
func enterPair(a, c *agent) bool {
	first, second := a, c
	if c.order < a.order {
		first, second = c, a
	}
	if !first.enter() {
		return false
	}
	if !second.enter() {
		first.leave()
		return false
	}
	return true
}

// revoke marks a dead, waiting for the operations that hold it. It reports
// false when a was already dead.
func (a *agent) revoke() bool {
	if testHookRevoking != nil {
		testHookRevoking()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.dead {
		return false
	}
	a.dead = true
	return true
}

// Test hooks: nil but in tests, which learn from them that an operation
// has come to wait for a lock (and so cannot pass it until it is free).
var (
	testHookRevoking        func()
	testHookSwept           func() // the orphan sweep is done
	testHookLockingInstance func(instance string)
	testHookLockingSend     func(instance, key string)
	testHookCatchingUp      func() // a request waits for a cluster catch-up
)

// registry is the set of live agents and their indexes.
type registry struct {
	mu         sync.RWMutex
	order      uint64
	byID       map[string]*agent
	sorted     []*agent // the live agents by agentId, for paged lists
	byToken    map[[32]byte]*agent
	byInstance map[string]*agent
	bySession  map[string]map[string]*agent
	// hint maps a base name to a suffix below which every base-N is taken,
	// so that uniquifying many agents of one name stays cheap. A hint of
	// 2 is no hint: such entries are deleted, so that the map holds only
	// names in use.
	hint map[string]int
	// orphans holds the instances the orphan sweep waits for (members of
	// open tasks and held registrations found at start) that have not
	// registered again; nil once the sweep is done. Registrations delete
	// from it, so it only shrinks.
	orphans map[string]bool
	// held are the registrations found in the store at start whose
	// agents have not registered again, by instance; heldIDs indexes
	// those that hold a name by it. A held name is given to no one else,
	// and a held instance registers only in its own session.
	held    map[string]*hold
	heldIDs map[string]*hold
	// heldIn counts the held registrations of each session.
	heldIn map[string]int
	// reserved are the agentIds of registrations being stored, and of
	// departures being deleted from the store: given to no one else
	// meanwhile, so that the store never holds one name twice.
	reserved map[string]bool
	// arriving counts the new agents whose registrations are being
	// stored, per session and in all (""): the caps count them, so that
	// registrations at once cannot pass a cap while they wait for the
	// disk.
	arriving map[string]int
}

// hold is a registration kept for an agent that has not come back since
// the broker started.
type hold struct {
	instance, session string
	id                string // its agentId; "" when another held it first
	name              string // the card.name it asked for
}

func (r *registry) init() {
	r.byID = map[string]*agent{}
	r.byToken = map[[32]byte]*agent{}
	r.byInstance = map[string]*agent{}
	r.bySession = map[string]map[string]*agent{}
	r.hint = map[string]int{}
	r.held = map[string]*hold{}
	r.heldIDs = map[string]*hold{}
	r.heldIn = map[string]int{}
	r.reserved = map[string]bool{}
	r.arriving = map[string]int{}
}

// taken reports whether an agentId is live, held or being stored. r.mu
// is held.
func (r *registry) taken(id string) bool {
	_, live := r.byID[id]
	_, held := r.heldIDs[id]
	return live || held || r.reserved[id]
}

// uniqueID returns name, or name-N with the lowest free N >= 2. r.mu is
// held.
func (r *registry) uniqueID(name string) string {
	if !r.taken(name) {
		return name
	}
	n := max(r.hint[name], 2)
	for {
		id := name + "-" + strconv.Itoa(n)
		if !r.taken(id) {
			r.hint[name] = n + 1
			return id
		}
		n++
	}
}

func byAgentID(a *agent, id string) int { return strings.Compare(a.id, id) }

// add indexes a. r.mu is held.
func (r *registry) add(a *agent) {
	r.order++
	a.order = r.order
	r.byID[a.id] = a
	i, _ := slices.BinarySearchFunc(r.sorted, a.id, byAgentID)
	r.sorted = slices.Insert(r.sorted, i, a)
	r.byToken[a.tokenHash] = a
	r.byInstance[a.instance] = a
	s := r.bySession[a.session]
	if s == nil {
		s = map[string]*agent{}
		r.bySession[a.session] = s
	}
	s[a.id] = a
	delete(r.orphans, a.instance)
}

// remove drops a from every index. r.mu is held.
func (r *registry) remove(a *agent) {
	if r.byID[a.id] == a {
		delete(r.byID, a.id)
		if i, found := slices.BinarySearchFunc(r.sorted, a.id, byAgentID); found {
			r.sorted = slices.Delete(r.sorted, i, i+1)
		}
		r.free(a.id)
	}
	delete(r.byToken, a.tokenHash)
	if r.byInstance[a.instance] == a {
		delete(r.byInstance, a.instance)
	}
	if s := r.bySession[a.session]; s != nil && s[a.id] == a {
		delete(s, a.id)
		if len(s) == 0 {
			delete(r.bySession, a.session)
		}
	}
}

// free lowers the hint of a base-N id that is no longer taken, keeping
// the lowest-free rule. A hint only ever bounds the search from below,
// so lowering one is always safe. r.mu is held.
func (r *registry) free(id string) {
	i := strings.LastIndexByte(id, '-')
	if i <= 0 {
		return
	}
	if n, err := strconv.Atoi(id[i+1:]); err == nil && n >= 2 {
		if h, ok := r.hint[id[:i]]; ok && n < h {
			if n == 2 {
				delete(r.hint, id[:i])
			} else {
				r.hint[id[:i]] = n
			}
		}
	}
}

// hold keeps a stored registration for its agent. A name already held
// (a store that could not forget an earlier holder) is not held twice:
// the instance is, without it. r.mu is held.
func (r *registry) hold(reg store.Registration) {
	h := &hold{instance: reg.Instance, session: reg.Session, id: reg.AgentID, name: reg.Name}
	if h.id != "" && r.taken(h.id) {
		h.id = ""
	}
	if old := r.held[h.instance]; old != nil {
		r.unhold(old.instance)
	}
	r.held[h.instance] = h
	r.heldIn[h.session]++
	if h.id != "" {
		r.heldIDs[h.id] = h
	}
}

// unhold releases the hold of instance, if any. r.mu is held.
func (r *registry) unhold(instance string) *hold {
	h := r.held[instance]
	if h == nil {
		return nil
	}
	delete(r.held, instance)
	if r.heldIn[h.session]--; r.heldIn[h.session] <= 0 {
		delete(r.heldIn, h.session)
	}
	if h.id != "" && r.heldIDs[h.id] == h {
		delete(r.heldIDs, h.id)
		r.free(h.id)
	}
	return h
}

// sessionLive reports whether a session has live agents.
func (r *registry) sessionLive(session string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.bySession[session]) > 0
}

func (r *registry) liveInstance(instance string) *agent {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.byInstance[instance]
}

// claimsOtherSession reports whether params name, as their contextId, a
// session other than a session-bound caller's own. Such a claim outranks
// any problem with the shape of the params.
func claimsOtherSession(from transport.Caller, params json.RawMessage) bool {
	if from.Scope != transport.ScopeSession {
		return false
	}
	var claim struct {
		ContextID json.RawMessage `json:"contextId"`
	}
	_ = wire.Unmarshal(params, &claim)
	var ctxID string
	return wire.Unmarshal(claim.ContextID, &ctxID) == nil && ctxID != "" && ctxID != from.Session
}

// hashToken is the key of a token in the registry. A token the broker
// minted fits the stack buffer, so that a lookup allocates nothing (the
// plain conversion escapes to the heap).
func hashToken(token string) [32]byte {
	var buf [128]byte
	if len(token) <= len(buf) {
		return sha256.Sum256(append(buf[:0], token...))
	}
	return sha256.Sum256([]byte(token))
}

// instanceStripes is the number of locks that serialize registrations and
// departures by instance id.
const instanceStripes = 256

func (b *Broker) lockInstance(instance string) func() {
	if testHookLockingInstance != nil {
		testHookLockingInstance(instance)
	}
	m := &b.instances[maphash.String(stripeSeed, instance)%instanceStripes]
	m.Lock()
	return m.Unlock
}

// authenticate finds the agent a token belongs to and checks that the
// caller may use it from where it calls. It does not hold the agent.
func (b *Broker) authenticate(from transport.Caller, token string) (*agent, *wire.Error) {
	if token == "" {
		return nil, wire.ErrUnauthorized.Withf("token required")
	}
	// Tokens are looked up by their SHA-256, never compared as text:
	// whatever the map's timing reveals is about the hash of the guess,
	// which tells an attacker nothing about any token (they are 256-bit
	// random, so a hash prefix cannot be steered toward one). A found
	// entry is the token's by construction; there is nothing further to
	// compare.
	hash := hashToken(token)
	b.reg.mu.RLock()
	a := b.reg.byToken[hash]
	b.reg.mu.RUnlock()
	if a == nil && b.clustered() {
		caught := b.catchUp()
		b.reg.mu.RLock()
		a = b.reg.byToken[hash]
		b.reg.mu.RUnlock()
		if a == nil && !caught {
			// The token may be one another broker issued a moment ago:
			// not known is not refused.
			return nil, errNotCaughtUp()
		}
	}
	if a == nil {
		return nil, errRevoked()
	}
	if b.clustered() {
		b.follow(from, a)
	}
	if from.Scope == transport.ScopeSession && a.session != from.Session {
		return nil, wire.ErrUnauthorized.Withf("the token belongs to another session")
	}
	return a, nil
}

// caller decodes token-bearing params into v and authenticates the token
// they carry. The token outranks the params' shape: a bad token is
// A2A_UNAUTHORIZED even when other params are malformed.
func (b *Broker) caller(from transport.Caller, req *wire.Request, v any, token *string) (*agent, *wire.Error) {
	if shapeErr := req.DecodeParams(v); shapeErr != nil {
		var tp struct {
			Token json.RawMessage `json:"token"`
		}
		_ = wire.Unmarshal(req.Params, &tp)
		var tok string
		_ = wire.Unmarshal(tp.Token, &tok)
		if _, err := b.authenticate(from, tok); err != nil {
			return nil, err
		}
		return nil, shapeErr
	}
	return b.authenticate(from, *token)
}

// heldCaller is caller, then fn run as the caller, held for fn's length
// (see agent): a deregistration waits for fn, or fn sees it done.
func (b *Broker) heldCaller(from transport.Caller, req *wire.Request, v any, token *string, fn func(a *agent) (any, *wire.Error)) (any, *wire.Error) {
	a, err := b.caller(from, req, v, token)
	if err != nil {
		return nil, err
	}
	if !a.enter() {
		return nil, errRevoked()
	}
	defer a.leave()
	return fn(a)
}

func errRevoked() *wire.Error { return wire.ErrUnauthorized.Withf("unknown or revoked token") }

// errNotCaughtUp answers a request about an agent this broker's copy of
// the cluster's registry does not show, when the cluster could not be
// read to make sure: the agent may be there all the same.
func errNotCaughtUp() *wire.Error {
	return wire.ErrInternal.Withf("the cluster's registrations could not be read in time; try again")
}

func (b *Broker) register(ctx context.Context, from transport.Caller, req *wire.Request) (any, *wire.Error) {
	p, err := b.registration(from, req)
	if err != nil {
		return nil, err
	}
	if b.clustered() && b.reg.liveInstance(p.InstanceID) == nil {
		// Whether the instance is live, and where, is the cluster's
		// latest word: a registration of it on another broker a moment
		// ago counts (an instance never moves to another session).
		b.catchUp()
	}
	token := secret.Hex(32)
	a := &agent{name: p.Card.Name, instance: p.InstanceID, session: p.ContextID, tokenHash: hashToken(token),
		hidden: b.hiddenSession(p.ContextID)}
	if b.clustered() {
		a.broker = b.ownerFor(ctx, from, true)
	}
	card := *p.Card
	at := wire.NewTime(b.cfg.Now())
	card.ContextID, card.RegisteredAt = p.ContextID, &at
	if err := b.admit(ctx, a, &card); err != nil {
		return nil, err
	}
	b.log.Debug("agent registered", "agentId", a.id, "contextId", a.session)
	return wire.RegisterResult{AgentID: a.id, Token: token, InstanceID: a.instance, Card: card}, nil
}

// registration decodes and checks register's params; it makes an
// instance id when there is none.
func (b *Broker) registration(from transport.Caller, req *wire.Request) (*wire.RegisterParams, *wire.Error) {
	var p wire.RegisterParams
	shapeErr := req.DecodeParams(&p)
	if claimsOtherSession(from, req.Params) {
		return nil, wire.ErrUnauthorized.Withf("register for another session than the caller's")
	}
	if shapeErr != nil {
		return nil, shapeErr
	}
	if err := wire.ValidateID("contextId", p.ContextID); err != nil {
		return nil, wire.ErrInvalidParams.Withf("%v", err)
	}
	if p.Card == nil {
		return nil, wire.ErrInvalidParams.Withf("card: required")
	}
	if err := p.Card.Validate("card"); err != nil {
		return nil, wire.ErrInvalidParams.Withf("%v", err)
	}
	if p.InstanceID == "" {
		p.InstanceID = uuid.NewString()
	} else if err := wire.ValidateID("instanceId", p.InstanceID); err != nil {
		return nil, wire.ErrInvalidParams.Withf("%v", err)
	}
	return &p, nil
}

// maxSuffix is the most bytes uniquifying can add to a name ("-" and a
// counter).
const maxSuffix = 12

// admit names a (its agentId), stores its registration and indexes it
// with its card, replacing the instance's live registration in the same
// session. Everything that can refuse it is checked, and the
// registration stored, before the old registration is revoked: a
// refused registration leaves the old one as it was.
//
// The name: a live or held registration of the same instance under the
// same card.name keeps its agentId; any other gets the lowest free one,
// reserved while it is stored, so that no concurrent registration takes
// it meanwhile.
func (b *Broker) admit(ctx context.Context, a *agent, card *wire.AgentCard) *wire.Error {
	// One registration or departure of an instance at a time.
	unlockInstance := b.lockInstance(a.instance)
	defer unlockInstance()
	if b.ownedElsewhere(a.instance, a.session) {
		return wire.ErrInvalidParams.Withf("instanceId belongs to the broker's own agent")
	}
	card.AgentID = a.name
	if enc, err := json.Marshal(card); err != nil || len(enc)+maxSuffix > wire.MaxCardBytes {
		return wire.ErrInvalidParams.Withf("card: more than %d bytes encoded", wire.MaxCardBytes-maxSuffix)
	}
	if b.clustered() {
		return b.admitShared(ctx, a, card)
	}
	_, err := b.admitAt(ctx, a, card, 0, nil)
	return err
}

// maxRegisterTries bounds how often a change of a registration in a
// cluster reads it again because another broker changed it first.
const maxRegisterTries = 16

// admitShared is admit in a cluster. The instance's registration is
// read under its lock, the registry's copy of it brought in line, the
// registration judged on it and stored at its revision; if another
// broker changed it meanwhile, it is read and judged again. So of two
// registrations of one instance in two sessions through two brokers at
// once, one is refused, and a registration acknowledged is never
// replaced unseen.
func (b *Broker) admitShared(ctx context.Context, a *agent, card *wire.AgentCard) (werr *wire.Error) {
	var claimed []string
	defer func() {
		// The names claimed for tries that did not store them.
		for _, id := range claimed {
			if werr != nil || id != a.id {
				b.releaseUnused(context.WithoutCancel(ctx), id, a.instance)
			}
		}
	}()
	for try := 1; ; try++ {
		cur, rev, err := b.cfg.Cluster.Registry.RegistrationRev(ctx, a.instance)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return b.storeFailure("read the instance's registration in the cluster", err)
		}
		if err := b.align(ctx, a.instance, cur); err != nil {
			return b.storeFailure("read the instance's registration in the cluster", err)
		}
		if cur != nil && cur.Session != a.session {
			return wire.ErrInvalidParams.Withf("instanceId is live in another session")
		}
		changed, werr := b.admitAt(ctx, a, card, rev, &claimed)
		if !changed {
			return werr
		}
		if try == maxRegisterTries {
			return wire.ErrInternal.Withf("the instance's registration kept changing in the cluster; try again")
		}
	}
}

// admitAt is one try of admit, judged on the registry as it is. In a
// cluster it stores the registration at rev, the revision of the
// instance's registration the registry's copy is in line with, and
// reports changed, having changed nothing, when another broker changed
// it first; the names it claims in the cluster are added to claimed.
func (b *Broker) admitAt(ctx context.Context, a *agent, card *wire.AgentCard, rev uint64, claimed *[]string) (changed bool, _ *wire.Error) {
	r := &b.reg
	r.mu.Lock()
	old := r.byInstance[a.instance]
	h := r.held[a.instance]
	var refused *wire.Error
	switch {
	case old != nil && old.session != a.session:
		refused = wire.ErrInvalidParams.Withf("instanceId is live in another session")
	case h != nil && h.session != a.session:
		refused = wire.ErrInvalidParams.Withf("instanceId is held for another session: it was registered there when the broker stopped, and is kept for it until it registers again, its session closes, or the orphan timeout passes")
	default:
		refused = b.capsAllow(old, h, a.session)
	}
	if refused != nil {
		r.mu.Unlock()
		return false, refused
	}
	// A new agent counts against the caps while it is stored.
	arriving := old == nil && h == nil
	if arriving {
		r.arriving[a.session]++
		r.arriving[""]++
	}
	done := func() { // r.mu is held
		if arriving {
			r.arrived(a.session)
		}
	}
	reserved := false
	switch {
	case old != nil && old.name == a.name:
		a.id = old.id
	case h != nil && h.id != "" && h.name == a.name:
		a.id = h.id
	default:
		a.id = r.uniqueID(a.name)
		r.reserved[a.id], reserved = true, true
	}
	r.mu.Unlock()
	if reserved && b.clustered() {
		// The name is the cluster's: claimed there before it is stored.
		if err := b.claimName(ctx, a); err != nil {
			r.mu.Lock()
			done()
			r.mu.Unlock()
			return false, err
		}
		if !slices.Contains(*claimed, a.id) {
			*claimed = append(*claimed, a.id)
		}
	}
	card.AgentID = a.id
	a.card, _ = json.Marshal(card) // checked above, but for the suffix
	reg := store.Registration{Instance: a.instance, Session: a.session, AgentID: a.id, Name: a.name, Card: a.card}
	var err error
	if b.clustered() {
		reg.TokenHash = tokenHashHex(a.tokenHash)
		reg.Broker = a.broker
		err = b.cfg.Cluster.Registry.PutRegistrationAt(ctx, reg, rev)
		if err != nil && !errors.Is(err, store.ErrChanged) && b.landed(ctx, a) {
			err = nil // the answer was lost, not the write
		}
	} else {
		err = b.store.PutRegistration(ctx, reg)
	}
	if err != nil {
		r.mu.Lock()
		if reserved {
			delete(r.reserved, a.id)
			r.free(a.id)
		}
		done()
		r.mu.Unlock()
		if errors.Is(err, store.ErrChanged) {
			return true, nil
		}
		return false, b.storeFailure("store the registration", err)
	}
	if old != nil && old.id != a.id && b.clustered() {
		b.releaseName(context.WithoutCancel(ctx), old.id, a.instance)
	}
	if old != nil {
		// The same delegate registering again in its session replaces its
		// registration: a new token, the old one revoked, its tasks left
		// open. revoke waits for the old registration's running
		// operations; the instance lock keeps anyone else from revoking
		// it meanwhile.
		old.revoke()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if old != nil {
		r.remove(old)
	}
	r.unhold(a.instance)
	delete(r.reserved, a.id)
	r.add(a)
	done()
	return false, nil
}

// arrived ends the count of an arriving agent. r.mu is held.
func (r *registry) arrived(session string) {
	for _, k := range []string{session, ""} {
		if r.arriving[k]--; r.arriving[k] <= 0 {
			delete(r.arriving, k)
		}
	}
}

// ownedElsewhere reports whether instance is the id of one of the
// broker's own agents (Config.OwnedInstances), which register only in a
// hidden session, and session is not one.
func (b *Broker) ownedElsewhere(instance, session string) bool {
	return under(b.cfg.OwnedInstances, instance) && !b.hiddenSession(session)
}

// capsAllow checks the agent caps for a new registration in session. A
// session's count and the host's are its live agents, those held for
// them since a restart (which may all come back, and which the store
// keeps: restarts in a row cannot pile them up), and those being stored.
// A replacing registration (old != nil, same session) adds no agent, nor
// does one that ends its own hold (h != nil). r.mu is held.
func (b *Broker) capsAllow(old *agent, h *hold, session string) *wire.Error {
	if old != nil || h != nil {
		return nil
	}
	r := &b.reg
	if len(r.bySession[session])+r.heldIn[session]+r.arriving[session] >= b.cfg.MaxAgentsPerSession {
		if r.heldIn[session] > 0 {
			return wire.ErrAgentLimit.Withf("session already has %d live agents and agents held for it since a restart (%d) (--max-agents-per-session); deregister some, or close the session to let the held ones go", b.cfg.MaxAgentsPerSession, r.heldIn[session])
		}
		return wire.ErrAgentLimit.Withf("session already has %d live agents (--max-agents-per-session); deregister some first", b.cfg.MaxAgentsPerSession)
	}
	if len(r.byID)+len(r.held)+r.arriving[""] >= b.cfg.MaxAgents {
		if len(r.held) > 0 {
			return wire.ErrAgentLimit.Withf("the host already has %d live agents and agents held since a restart (%d); deregister some first, or close the sessions of those that will not come back", b.cfg.MaxAgents, len(r.held))
		}
		return wire.ErrAgentLimit.Withf("the host already has %d live agents; deregister some first", b.cfg.MaxAgents)
	}
	return nil
}

func (b *Broker) deregister(ctx context.Context, from transport.Caller, req *wire.Request) (any, *wire.Error) {
	var p wire.TokenParams
	shapeErr := req.DecodeParams(&p)
	a, err := b.authenticate(from, p.Token)
	if err != nil {
		return nil, err
	}
	if shapeErr != nil {
		return nil, shapeErr
	}
	gone, werr := b.depart(ctx, a)
	if werr != nil {
		return nil, werr
	}
	if !gone {
		return nil, errRevoked()
	}
	return struct{}{}, nil
}

// depart deregisters a: its token stops working at once, and its open
// tasks are closed, even if the caller stops waiting. It reports false
// when a was gone already. If some closing cannot be stored, the error
// says so (the agent stays revoked; the tasks are closed by the orphan
// sweep of the next start).
//
// In a cluster only a's own registration goes, at the revision read
// under the instance's lock: a token whose registration the cluster has
// replaced or deleted, unseen by this broker's copy, was gone already;
// its copy is revoked, and the successor's registration, name and tasks
// are left alone.
func (b *Broker) depart(ctx context.Context, a *agent) (bool, *wire.Error) {
	unlockInstance := b.lockInstance(a.instance)
	defer unlockInstance()
	var rev uint64
	if b.clustered() {
		cur, r, err := b.cfg.Cluster.Registry.RegistrationRev(ctx, a.instance)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return false, b.storeFailure("read the agent's registration in the cluster", err)
		}
		if cur == nil || cur.TokenHash != tokenHashHex(a.tokenHash) {
			if err := b.align(ctx, a.instance, cur); err != nil {
				b.log.Debug("bringing a replaced agent's copy in line failed", "agentId", a.id, "error", err)
			}
			if a.revoke() { // align found another copy here, or failed
				b.reg.mu.Lock()
				b.reg.remove(a)
				b.reg.mu.Unlock()
			}
			return false, nil
		}
		rev = r
	}
	if !a.revoke() {
		return false, nil
	}
	// Its name stays reserved until the store has forgotten it: were it
	// given to another meanwhile, a crash could leave the store with the
	// name twice.
	b.reg.mu.Lock()
	b.reg.remove(a)
	b.reg.reserved[a.id] = true
	b.reg.mu.Unlock()
	b.pushes.forget(a.instance)
	b.log.Debug("agent deregistered", "agentId", a.id, "contextId", a.session)
	ctx = context.WithoutCancel(ctx)
	var failed *wire.Error
	var err error
	mine := true
	if b.clustered() {
		mine, err = b.deleteOwn(ctx, a, rev)
	} else {
		err = b.store.DeleteRegistration(ctx, a.instance)
	}
	switch {
	case err != nil:
		// The store still has it: so does the registry, as a hold, until
		// the session closes or a restart's orphan timeout lets it go.
		b.log.Error("deregistered agent's registration not removed from the store; its name stays held", "agentId", a.id, "error", err)
		failed = wire.ErrInternal.Withf("the agent is deregistered, but removing its registration from the store failed: its name stays held")
		b.reg.mu.Lock()
		delete(b.reg.reserved, a.id)
		b.reg.hold(store.Registration{Instance: a.instance, Session: a.session, AgentID: a.id, Name: a.name})
		b.reg.mu.Unlock()
	case !mine:
		// Replaced or let go through another broker meanwhile: what is
		// left is the successor's, or done by whoever let a go.
		b.reg.mu.Lock()
		delete(b.reg.reserved, a.id)
		b.reg.free(a.id)
		b.reg.mu.Unlock()
		return false, nil
	default:
		if b.clustered() {
			b.releaseUnused(ctx, a.id, a.instance)
		}
		b.reg.mu.Lock()
		delete(b.reg.reserved, a.id)
		b.reg.free(a.id)
		b.reg.mu.Unlock()
	}
	if err := b.closeTasksOf(ctx, a.instance, a.session); err != nil {
		b.log.Error("deregistered agent's tasks not all closed", "agentId", a.id, "error", err.Message)
		return true, wire.ErrInternal.Withf("the agent is deregistered, but closing its tasks failed: %s", err.Message)
	}
	return true, failed
}

func (b *Broker) listAgents(ctx context.Context, from transport.Caller, req *wire.Request) (any, *wire.Error) {
	var p wire.ListAgentsParams
	if b.clustered() {
		// The list is the cluster's as of the call: the registry catches
		// up with the registrations stored before it, before the caller
		// is held (a catch-up may revoke the caller's own copy, which
		// waits for its holds).
		b.catchUp()
	}
	return b.heldCaller(from, req, &p, &p.Token, func(self *agent) (any, *wire.Error) {
		size, err := pageSize(p.PageParams)
		if err != nil {
			return nil, err
		}
		if p.AgentID != "" {
			return b.agentPage(self, p.AgentID), nil
		}
		return b.agentsPage(self, p.PageToken, size), nil
	})
}

// agentPage encodes the page of a2a.agents.list narrowed to one agentId:
// that agent's card, read from the index, when the list would show it to
// self (live, not self, not hidden); else no card. It costs one card,
// whatever the number of agents.
func (b *Broker) agentPage(self *agent, id string) json.RawMessage {
	b.reg.mu.RLock()
	var card json.RawMessage
	if a := b.reg.byID[id]; a != nil && a != self && !a.hidden {
		card = a.card
	}
	out := make([]byte, 0, len(card)+64)
	out = append(out, `{"agents":[`...)
	out = append(out, card...)
	b.reg.mu.RUnlock()
	return append(out, `],"nextPageToken":""}`...)
}

// agentsPage encodes one page of the live agents after the agentId
// after, in agentId order, without self, as a2a.agents.list and
// a2a.admin.agents answer: {agents, nextPageToken}. A page holds at most
// size cards and stays within the page budget. The registry keeps the
// agents sorted, so a page costs its own cards, not the host's.
func (b *Broker) agentsPage(self *agent, after string, size int) json.RawMessage {
	out := make([]byte, 0, 1024)
	out = append(out, `{"agents":[`...)
	next := ""
	b.reg.mu.RLock()
	i, found := slices.BinarySearchFunc(b.reg.sorted, after, byAgentID)
	if found {
		i++
	}
	n, last := 0, ""
	for ; i < len(b.reg.sorted); i++ {
		a := b.reg.sorted[i]
		if a == self || (self != nil && a.hidden) {
			continue
		}
		if n == size || (n > 0 && len(out)+len(a.card) > b.limits.Page()) {
			next = last // the page is full: the next starts after its last
			break
		}
		if n > 0 {
			out = append(out, ',')
		}
		out = append(out, a.card...)
		n, last = n+1, a.id
	}
	b.reg.mu.RUnlock()
	out = append(out, `],"nextPageToken":`...)
	tok, _ := json.Marshal(next)
	out = append(out, tok...)
	return append(out, '}')
}

// pageSize checks a list's paging params and returns the page size.
func pageSize(p wire.PageParams) (int, *wire.Error) {
	switch {
	case p.PageSize < 0:
		return 0, wire.ErrInvalidParams.Withf("pageSize: must not be negative")
	case p.PageSize > wire.MaxPageSize:
		return 0, wire.ErrInvalidParams.Withf("pageSize: at most %d (got %d)", wire.MaxPageSize, p.PageSize)
	case len(p.PageToken) > wire.MaxIDBytes:
		return 0, wire.ErrInvalidParams.Withf("pageToken: not a token this broker gave")
	case p.PageSize == 0:
		return wire.DefaultPageSize, nil
	}
	return p.PageSize, nil
}
