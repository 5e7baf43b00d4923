package pebblestore_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/store/pebblestore"
	"github.com/a2a-bus/a2a-bus/store/storetest"
	"github.com/a2a-bus/a2a-bus/wire"
)

// Power loss, simulated: the store runs on Pebble's crashable file system
// in memory, and a crash clone of it (vfs.MemFS.CrashClone) is what a
// power cut at that moment leaves on the disk: what was synced, and, at
// a percent above 0, a random share of what was not (data blocks and
// folder entries). A store opened on a clone must open, hold every
// change acknowledged before the clone was taken, exactly, hold no change
// half made (every index agrees with the task records: Consistent), and
// take new changes.
//
// The normal run takes a few hundred crash points; A2A_BUS_SOAK=1 takes
// thousands. The seed is logged; A2A_BUS_CRASH_SEED=<seed> replays its
// choices (the changes, where the crash points fall, which unsynced data
// a clone keeps), though not the goroutines' interleaving.

// crashRounds and crashPointsPerRound size the run: every round is a
// new store, so that the file system (which each clone copies) stays
// small.
func crashRounds() (rounds, points int) {
	if os.Getenv("A2A_BUS_SOAK") == "1" {
		return 100, 40
	}
	return 10, 30
}

// crashSeed is the run's seed, logged.
func crashSeed(t *testing.T) uint64 {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("A2A_BUS_CRASH_SEED"); v != "" {
		var err error
		seed, err = strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "A2A_BUS_CRASH_SEED")
	}
	t.Logf("seed %d: A2A_BUS_CRASH_SEED=%d replays it", seed, seed)
	return seed
}

// memDataDir makes a data dir whose store lives on fs, a crashable file
// system in memory, under the same path: the data dir itself (the lock
// file, and the empty store folder that tells Open a store is there) is
// a real one. The store's database is made on fs as Open makes a lost
// one (AcceptDataLoss), and the folders down to it are synced, as Open
// syncs the folder it makes on a real disk: the clones start from a
// durable, empty store.
func memDataDir(t *testing.T) (string, *vfs.MemFS) {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, pebblestore.DirName), 0o700))
	fs := vfs.NewCrashableMem()
	require.NoError(t, fs.MkdirAll(dir, 0o700))
	s, err := pebblestore.Open(dir, pebblestore.WithFS(pebblestore.Options{AcceptDataLoss: true, OnDataLoss: func(string) {}}, fs))
	require.NoError(t, err)
	require.NoError(t, s.Close())
	syncMemDirs(t, fs, filepath.Join(dir, pebblestore.DirName))
	return dir, fs
}

// syncMemDirs syncs every folder from the root down to dir.
func syncMemDirs(t *testing.T, fs vfs.FS, dir string) {
	t.Helper()
	for d := dir; ; d = filepath.Dir(d) {
		f, err := fs.OpenDir(d)
		require.NoError(t, err)
		require.NoError(t, f.Sync())
		require.NoError(t, f.Close())
		if d == filepath.Dir(d) {
			return
		}
	}
}

// version is one value of a task or a registration, as a change wrote
// it; nil data for none (a registration deleted). start and acked are
// the model's event numbers of the call's start and of its
// acknowledgement (0: not acknowledged).
type version struct {
	data         []byte
	terminal     bool
	at           int64 // UpdatedAt, ms
	start, acked int64
}

// prune is a Prune call: its cutoff (ms: terminal tasks updated before
// it go) and its events.
type prune struct {
	cutoff       int64
	start, acked int64
}

// crashPoint is a clone and the event it was taken at.
type crashPoint struct {
	at      int64
	percent int
	fs      *vfs.MemFS
}

// crashModel records the changes made, and takes the clones.
type crashModel struct {
	mu     sync.Mutex
	events int64
	tasks  map[string][]*version // id -> versions, in order
	regs   map[string][]*version // instance -> versions, in order
	prunes []*prune
	points []*crashPoint

	fs      *vfs.MemFS
	rng     *rand.Rand // where crash points fall, and their percent
	every   int        // acknowledgements between crash points
	since   int
	want    int // crash points to take
	enough  atomic.Bool
	cloneID uint64
	seed    uint64
}

// started records a version about to be written.
func (m *crashModel) started(hist map[string][]*version, id string, v *version) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.events++
	v.start = m.events
	hist[id] = append(hist[id], v)
}

// acked records the acknowledgement of the change that wrote v (or
// prune p), and takes a clone if a crash point falls here.
func (m *crashModel) acked(v *version, p *prune) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.events++
	if v != nil {
		v.acked = m.events
	} else {
		p.acked = m.events
	}
	m.since++
	if m.since < m.every || m.enough.Load() {
		return
	}
	m.since, m.every = 0, 1+m.rng.IntN(16)
	percent := 0
	if m.rng.IntN(2) == 1 {
		percent = 1 + m.rng.IntN(100)
	}
	m.cloneID++
	m.events++
	cfg := vfs.CrashCloneCfg{UnsyncedDataPercent: percent}
	if percent > 0 {
		cfg.RNG = rand.New(rand.NewPCG(m.seed, m.cloneID))
	}
	// Every change whose acknowledgement is recorded came back before
	// this: the clone must hold it.
	m.points = append(m.points, &crashPoint{at: m.events, percent: percent, fs: m.fs.CrashClone(cfg)})
	if len(m.points) >= m.want {
		m.enough.Store(true)
	}
}

// crashBase is the model's time 0: UpdatedAt is base plus a logical
// clock, so that a prune's cutoff is known exactly.
var crashBase = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// pruneAge is the retention of the workload's prunes, in clock ticks.
const pruneAge = 200

// crashWorkload runs workers goroutines of changes on s until m has its
// crash points.
func crashWorkload(t *testing.T, s *pebblestore.Store, m *crashModel, workers int) {
	ctx := context.Background()
	var clock, ids atomic.Int64
	tick := func() (time.Time, int64) {
		ms := clock.Add(1)
		return crashBase.Add(time.Duration(ms) * time.Millisecond), crashBase.UnixMilli() + ms
	}
	var wg sync.WaitGroup
	for w := range workers {
		rng := rand.New(rand.NewPCG(m.seed, uint64(1000+w)))
		wg.Go(func() {
			var open []*store.Record // this worker's open tasks, as last written
			var sent []*store.Record // its tasks made with a send key
			for !m.enough.Load() && !t.Failed() {
				switch n := rng.IntN(100); {
				case n < 35 || len(open) == 0:
					id := fmt.Sprintf("t%08d", ids.Add(1))
					rec := storetest.NewRecord(id, fmt.Sprint("s", rng.IntN(4)), fmt.Sprintf("w%d-r%d", w, rng.IntN(3)), fmt.Sprint("agent-", rng.IntN(5)), 0)
					at, ms := tick()
					rec.Task.CreatedAt, rec.Task.UpdatedAt, rec.Task.Status.Timestamp = wire.NewTime(at), wire.NewTime(at), wire.NewTime(at)
					if rng.IntN(2) == 0 {
						rec.SendKey, rec.SendDigest = "send-"+id, "digest-"+id
					}
					data, err := rec.Encode()
					if err != nil {
						t.Error(err)
						return
					}
					v := &version{data: data, at: ms}
					m.started(m.tasks, id, v)
					if err := s.Create(ctx, rec, 0); err != nil {
						t.Errorf("create %s: %v", id, err)
						return
					}
					m.acked(v, nil)
					open = append(open, rec)
					if rec.SendKey != "" {
						sent = append(sent, rec)
					}
				case n < 70:
					i := rng.IntN(len(open))
					old := open[i]
					state := []wire.State{wire.StateWorking, wire.StateInputRequired, wire.StateCompleted, wire.StateFailed, wire.StateCanceled}[rng.IntN(5)]
					at, ms := tick()
					text := fmt.Sprint("step ", ms)
					change := func(r *store.Record) error {
						r.Task.Status = wire.TaskStatus{State: state, Timestamp: wire.NewTime(at)}
						r.Task.UpdatedAt = wire.NewTime(at)
						r.Task.Artifacts = append(r.Task.Artifacts, wire.Artifact{ArtifactID: text, Parts: []wire.Part{{Kind: wire.KindText, Text: &text}}})
						r.Apply("agent", text, "d")
						return nil
					}
					next := old.Clone()
					_ = change(next)
					data, err := next.Encode()
					if err != nil {
						t.Error(err)
						return
					}
					v := &version{data: data, at: ms, terminal: !state.Open()}
					m.started(m.tasks, old.Task.ID, v)
					got, err := s.Update(ctx, old.Task.ID, change)
					if err != nil {
						t.Errorf("update %s: %v", old.Task.ID, err)
						return
					}
					m.acked(v, nil)
					if enc, _ := got.Encode(); !bytes.Equal(enc, data) {
						t.Errorf("update %s stored %s, want %s", old.Task.ID, enc, data)
						return
					}
					if state.Open() {
						open[i] = next
					} else {
						open = slices.Delete(open, i, i+1)
					}
				case n < 75:
					now, ms := tick()
					p := &prune{cutoff: ms - pruneAge}
					m.mu.Lock()
					m.events++
					p.start = m.events
					m.prunes = append(m.prunes, p)
					m.mu.Unlock()
					if _, err := s.Prune(ctx, store.Retention{MaxAge: pruneAge * time.Millisecond}, now); err != nil {
						t.Errorf("prune: %v", err)
						return
					}
					m.acked(nil, p)
				case n < 90:
					j := rng.IntN(3)
					instance := fmt.Sprintf("w%d-agent%d", w, j)
					_, ms := tick()
					reg := store.Registration{Instance: instance, Session: fmt.Sprint("s", rng.IntN(4)), AgentID: fmt.Sprintf("agent-%d-%d-%d", w, j, ms), Name: fmt.Sprintf("agent-%d-%d", w, j)}
					data, err := json.Marshal(reg)
					if err != nil {
						t.Error(err)
						return
					}
					v := &version{data: data}
					m.started(m.regs, instance, v)
					if err := s.PutRegistration(ctx, reg); err != nil {
						t.Errorf("put registration %s: %v", instance, err)
						return
					}
					m.acked(v, nil)
				case n < 95:
					instance := fmt.Sprintf("w%d-agent%d", w, rng.IntN(3))
					v := &version{}
					m.started(m.regs, instance, v)
					if err := s.DeleteRegistration(ctx, instance); err != nil {
						t.Errorf("delete registration %s: %v", instance, err)
						return
					}
					m.acked(v, nil)
				default:
					if len(sent) == 0 {
						continue
					}
					rec := sent[rng.IntN(len(sent))]
					got, err := s.FindSend(ctx, rec.RequesterInstance, rec.SendKey)
					switch {
					case errors.Is(err, store.ErrNotFound): // pruned
					case err != nil:
						t.Errorf("find send %s: %v", rec.SendKey, err)
						return
					case got.Task.ID != rec.Task.ID:
						t.Errorf("find send %s: task %s, want %s", rec.SendKey, got.Task.ID, rec.Task.ID)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

// candidates returns the versions a clone taken at event at may hold:
// the last one acknowledged before it, and every one started after
// that and before it; and whether one was acknowledged before it.
func candidates(vs []*version, at int64) ([]*version, bool) {
	from, acked := 0, false
	for i, v := range vs {
		if v.acked != 0 && v.acked < at {
			from, acked = i, true
		}
	}
	var out []*version
	for _, v := range vs[from:] {
		if v.start < at {
			out = append(out, v)
		}
	}
	return out, acked
}

// checkClone opens the store on the clone of p and checks it against
// the model, then makes a few changes on it and closes it.
func checkClone(t *testing.T, dir string, m *crashModel, p *crashPoint) error {
	ctx := context.Background()
	s, err := pebblestore.Open(dir, pebblestore.WithFS(pebblestore.Options{}, p.fs))
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	defer s.Close()
	if err := pebblestore.Consistent(s); err != nil {
		return fmt.Errorf("indexes: %w", err)
	}
	recs, more, err := s.List(ctx, store.Query{})
	if err != nil || more {
		return fmt.Errorf("list: %v (more %v)", err, more)
	}
	held := map[string][]byte{}
	opens := 0
	for _, rec := range recs {
		if held[rec.Task.ID], err = rec.Encode(); err != nil {
			return err
		}
		if rec.Task.Status.State.Open() {
			opens++
		}
		if rec.SendKey != "" {
			got, err := s.FindSend(ctx, rec.RequesterInstance, rec.SendKey)
			if err != nil || got.Task.ID != rec.Task.ID {
				return fmt.Errorf("find send %s of task %s: %v, %v", rec.SendKey, rec.Task.ID, got, err)
			}
		}
	}
	if n, err := s.OpenCount(ctx); err != nil || n != opens {
		return fmt.Errorf("open count %d (%v), %d open tasks held", n, err, opens)
	}
	var cutoff int64 // the greatest cutoff of a prune started before the clone
	for _, pr := range m.prunes {
		if pr.start < p.at {
			cutoff = max(cutoff, pr.cutoff)
		}
	}
	for id, vs := range m.tasks {
		cands, acked := candidates(vs, p.at)
		data, ok := held[id]
		delete(held, id)
		if !ok {
			prunable := slices.ContainsFunc(cands, func(v *version) bool { return v.terminal && v.at < cutoff })
			if acked && !prunable {
				return fmt.Errorf("task %s, acknowledged, is lost", id)
			}
			continue
		}
		if !slices.ContainsFunc(cands, func(v *version) bool { return bytes.Equal(v.data, data) }) {
			return fmt.Errorf("task %s holds %s, which no change acknowledged before the crash or under way then wrote", id, data)
		}
		for _, pr := range m.prunes {
			if pr.acked == 0 || pr.acked >= p.at {
				continue
			}
			for _, v := range vs {
				if v.terminal && v.acked != 0 && v.acked < pr.start && v.at < pr.cutoff {
					return fmt.Errorf("task %s is held, though a prune acknowledged before the crash deleted it", id)
				}
			}
		}
	}
	if len(held) > 0 {
		return fmt.Errorf("tasks no change wrote: %v", slices.Sorted(maps.Keys(held)))
	}
	regs, err := s.Registrations(ctx)
	if err != nil {
		return fmt.Errorf("registrations: %w", err)
	}
	heldRegs := map[string][]byte{}
	for _, reg := range regs {
		if heldRegs[reg.Instance], err = json.Marshal(reg); err != nil {
			return err
		}
	}
	for instance, vs := range m.regs {
		cands, acked := candidates(vs, p.at)
		data := heldRegs[instance]
		delete(heldRegs, instance)
		if !acked && data == nil {
			continue
		}
		if !slices.ContainsFunc(cands, func(v *version) bool { return bytes.Equal(v.data, data) }) {
			return fmt.Errorf("registration of %s is %s, which no change acknowledged before the crash or under way then wrote", instance, data)
		}
	}
	if len(heldRegs) > 0 {
		return fmt.Errorf("registrations no change wrote: %d", len(heldRegs))
	}
	// The store takes new changes, and closes.
	rec := storetest.NewRecord("z-after", "s-after", "r-after", "a-after", 0)
	rec.SendKey = "send-after"
	if err := s.Create(ctx, rec, 0); err != nil {
		return fmt.Errorf("create after the crash: %w", err)
	}
	if _, err := s.Update(ctx, rec.Task.ID, func(r *store.Record) error { r.Task.Status.State = wire.StateCompleted; return nil }); err != nil {
		return fmt.Errorf("update after the crash: %w", err)
	}
	if err := s.PutRegistration(ctx, store.Registration{Instance: "i-after", Session: "s-after", AgentID: "after", Name: "after"}); err != nil {
		return fmt.Errorf("register after the crash: %w", err)
	}
	if _, err := s.Prune(ctx, store.Retention{MaxTerminal: 1}, time.Now()); err != nil {
		return fmt.Errorf("prune after the crash: %w", err)
	}
	if err := pebblestore.Consistent(s); err != nil {
		return fmt.Errorf("indexes after new changes: %w", err)
	}
	return s.Close()
}

// TestCrashKeepsEveryAcknowledgedChange: power loss at a few hundred
// points of a busy store (see the top of this file).
func TestCrashKeepsEveryAcknowledgedChange(t *testing.T) {
	seed := crashSeed(t)
	rounds, per := crashRounds()
	rng := rand.New(rand.NewPCG(seed, 0))
	points, lost := 0, 0
	for round := range rounds {
		dir, fs := memDataDir(t)
		m := &crashModel{
			tasks: map[string][]*version{}, regs: map[string][]*version{},
			fs: fs, rng: rand.New(rand.NewPCG(seed, uint64(round+1))), every: 1 + rng.IntN(16), want: per,
			seed: seed ^ uint64(round)<<32,
		}
		s, err := pebblestore.Open(dir, pebblestore.WithFS(pebblestore.Options{}, fs))
		require.NoError(t, err)
		crashWorkload(t, s, m, 8)
		require.NoError(t, s.Close())
		if t.Failed() {
			return
		}
		for i, p := range m.points {
			if err := checkClone(t, dir, m, p); err != nil {
				t.Errorf("round %d, crash point %d (at event %d, %d%% of unsynced data kept): %v", round, i, p.at, p.percent, err)
				lost++
			}
			m.points[i] = nil // its memory
		}
		points += len(m.points)
		if lost > 0 {
			return
		}
	}
	t.Logf("%d crash points checked", points)
}
