package jsstore

import (
	"cmp"
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/a2a-bus/a2a-bus/store"
)

// keys calls fn with every key of b that filter (a key pattern, with
// wildcards) matches, as the stream leader lists them: the keys whose
// latest message is a removal marker younger than markerTTL included.
// It holds one answer of the server at a time (at most
// maxSubjectsPerAnswer keys), not the whole list.
func (b *bucket) keys(ctx context.Context, filter string, fn func(key string) error) error {
	type infoResponse struct {
		Error  *jetstream.APIError `json:"error"`
		Total  int                 `json:"total"`
		Offset int                 `json:"offset"`
		Limit  int                 `json:"limit"`
		State  struct {
			Subjects map[string]uint64 `json:"subjects"`
		} `json:"state"`
	}
	subj := "$JS.API.STREAM.INFO." + b.stream
	for offset := 0; ; {
		req, _ := json.Marshal(map[string]any{"subjects_filter": b.pre + filter, "offset": offset})
		var resp infoResponse
		err := b.st.retry(ctx, "list "+b.name+" "+filter, func(ctx context.Context) error {
			m, err := b.st.nc.RequestWithContext(ctx, subj, req)
			if err != nil {
				return err
			}
			resp = infoResponse{}
			if err := json.Unmarshal(m.Data, &resp); err != nil {
				return fmt.Errorf("jsstore: a stream info does not decode: %w", err)
			}
			if resp.Error != nil {
				return resp.Error
			}
			return nil
		})
		if err != nil {
			return err
		}
		for s := range resp.State.Subjects {
			if err := fn(strings.TrimPrefix(s, b.pre)); err != nil {
				return err
			}
		}
		offset += len(resp.State.Subjects)
		if len(resp.State.Subjects) == 0 || offset >= resp.Total {
			return nil
		}
	}
}

// candidates returns the ids of the keys filter matches, after after,
// at most n of them, the lowest first, and whether more ids follow them.
// It holds n ids, whatever the number of keys.
func (b *bucket) candidates(ctx context.Context, filter, after string, n int) ([]string, bool, error) {
	h := &maxHeap{}
	seen := map[string]bool{}
	more := false
	err := b.keys(ctx, filter, func(key string) error {
		id, err := lastToken(key)
		if err != nil {
			return err
		}
		if id <= after || seen[id] {
			return nil
		}
		if h.Len() == n {
			if id > (*h)[0] {
				more = true
				return nil
			}
			more = true
			delete(seen, heap.Pop(h).(string))
		}
		seen[id] = true
		heap.Push(h, id)
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	ids := []string(*h)
	slices.Sort(ids)
	return ids, more, nil
}

// maxHeap keeps the lowest ids seen: its root is the highest of them.
type maxHeap []string

func (h maxHeap) Len() int           { return len(h) }
func (h maxHeap) Less(i, j int) bool { return h[i] > h[j] }
func (h maxHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *maxHeap) Push(x any)        { *h = append(*h, x.(string)) }
func (h *maxHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// OpenMembers returns the instances that are members of an open task,
// each once, as the open index's key names tell them: no task is read.
// A task closed within the last markerTTL may still count.
func (s *Store) OpenMembers(ctx context.Context) ([]string, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	seen := map[string]bool{}
	var out []string
	err := s.tasks.keys(ctx, "o.*.*.*", func(key string) error {
		tok := strings.Split(key, ".")
		if len(tok) != 4 {
			return fmt.Errorf("%w: an open index key %q", ErrCorrupt, key)
		}
		inst, err := dec(tok[1])
		if err != nil {
			return err
		}
		if !seen[inst] {
			seen[inst] = true
			out = append(out, inst)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(out)
	return out, nil
}

// List page sizes: the ids taken from the index per round, and the
// tasks read at once.
const (
	listRound   = 256
	listReaders = 8
)

// indexFilter picks the index a query reads: the open index for open
// tasks, the member index for a member's, the terminal index for a
// terminal state, every task else. Each key ends with the task id.
func indexFilter(q store.Query) string {
	role := "*"
	switch q.Role {
	case store.Requester:
		role = "r"
	case store.Assignee:
		role = "a"
	}
	open := q.OpenOnly || q.State.Open()
	switch {
	case q.Instance != "" && open:
		return "o." + enc(q.Instance) + "." + role + ".*"
	case q.Instance != "":
		return "m." + enc(q.Instance) + "." + role + ".*"
	case open:
		return "o.*.r.*" // every open task has one requester
	case q.State.Terminal():
		return "e.*.*"
	}
	return "t.*"
}

// List implements store.Tasks. It reads the names of the keys of one
// index (the tasks of q.Instance, open or all; or every open, terminal
// or stored task), keeps the lowest listRound ids after q.After, and
// reads those tasks in order until the page is full, again from the
// last id read while the page is not full and ids remain. Memory is
// bounded by the page, listRound ids and one answer of the server; the
// reads, by the index's keys per round and the tasks read.
func (s *Store) List(ctx context.Context, q store.Query) ([]*store.Record, bool, error) {
	if err := s.enter(); err != nil {
		return nil, false, err
	}
	defer s.leave()
	filter := indexFilter(q)
	out := []*store.Record{}
	var page store.Pager
	after := q.After
	for {
		ids, more, err := s.tasks.candidates(ctx, filter, after, listRound)
		if err != nil {
			return nil, false, err
		}
		for start := 0; start < len(ids); start += listReaders {
			batch := ids[start:min(start+listReaders, len(ids))]
			recs, sizes, err := s.readTasks(ctx, batch)
			if err != nil {
				return nil, false, err
			}
			for i, rec := range recs {
				if rec == nil || !q.Matches(rec) {
					continue
				}
				if !page.Take(q, sizes[i]) {
					return out, true, nil
				}
				out = append(out, rec)
			}
		}
		if !more || len(ids) == 0 {
			return out, false, nil
		}
		after = ids[len(ids)-1]
	}
}

// readTasks reads the tasks with these ids at once: a nil record for
// one that is not there (its index key outlived it for a moment).
func (s *Store) readTasks(ctx context.Context, ids []string) ([]*store.Record, []int, error) {
	recs := make([]*store.Record, len(ids))
	sizes := make([]int, len(ids))
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			e, err := s.tasks.get(ctx, taskKey(id))
			if err != nil || !e.live() {
				errs[i] = err
				return
			}
			recs[i], errs[i] = decodeRecord(id, e.data)
			sizes[i] = len(e.data)
		})
	}
	wg.Wait()
	return recs, sizes, errors.Join(errs...)
}

// OpenCount implements store.Tasks: the sum of the sessions' counts, one
// read per session with open tasks.
func (s *Store) OpenCount(ctx context.Context) (int, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.leave()
	var keys []string
	err := s.tasks.keys(ctx, "c.*", func(key string) error {
		keys = append(keys, key)
		return nil
	})
	if err != nil {
		return 0, err
	}
	total := 0
	for start := 0; start < len(keys); start += listReaders {
		batch := keys[start:min(start+listReaders, len(keys))]
		counts := make([]int, len(batch))
		errs := make([]error, len(batch))
		var wg sync.WaitGroup
		for i, key := range batch {
			wg.Go(func() {
				session, err := lastToken(key)
				if err == nil {
					counts[i], _, err = s.readCount(ctx, session)
				}
				errs[i] = err
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return 0, err
		}
		for _, n := range counts {
			total += n
		}
	}
	return total, nil
}

// Prune implements store.Tasks: it reads the terminal index (the keys'
// names hold each terminal task's updatedAt and id), picks the oldest
// beyond the retention, and deletes each, with its index entries, in an
// atomic batch whose compare-and-set requires the task unchanged since
// it was read: a task another broker changed or pruned meanwhile is
// skipped, and counted by none but the broker that deleted it.
func (s *Store) Prune(ctx context.Context, r store.Retention, now time.Time) (int, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.leave()
	if r == (store.Retention{}) {
		return 0, nil
	}
	var ended []endedEntry
	err := s.tasks.keys(ctx, "e.*.*", func(key string) error {
		e, err := parseEnded(key)
		if err == nil {
			ended = append(ended, e)
		}
		return err
	})
	if err != nil {
		return 0, err
	}
	slices.SortFunc(ended, func(a, b endedEntry) int {
		return cmp.Or(cmp.Compare(a.ns, b.ns), cmp.Compare(a.id, b.id))
	})
	n := 0
	if r.MaxAge > 0 {
		cutoff := nanos(now.Add(-r.MaxAge))
		for n < len(ended) && ended[n].ns < cutoff {
			n++
		}
	}
	if r.MaxTerminal > 0 && len(ended)-n > r.MaxTerminal {
		n = len(ended) - r.MaxTerminal
	}
	deleted := 0
	for _, e := range ended[:n] {
		ok, err := s.pruneOne(ctx, e)
		if err != nil {
			return deleted, err
		}
		if ok {
			deleted++
		}
	}
	return deleted, nil
}

// pruneOne deletes the task of a terminal index entry, if it is still
// that entry's: terminal, with that updatedAt.
func (s *Store) pruneOne(ctx context.Context, e endedEntry) (bool, error) {
	for try := 0; ; try++ {
		rec, rev, err := s.getTask(ctx, e.id)
		if errors.Is(err, store.ErrNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if !rec.Task.Status.State.Terminal() || nanos(rec.Task.UpdatedAt.Time) != e.ns {
			return false, nil // changed since the index was read
		}
		ops := []op{
			remove(taskKey(e.id), int64(rev)),
			remove(memberKey(rec.RequesterInstance, true, e.id), anyRev),
			remove(memberKey(rec.AssigneeInstance, false, e.id), anyRev),
			remove(endedKey(rec.Task.UpdatedAt.Time, e.id), anyRev),
		}
		if rec.SendKey != "" {
			ops = append(ops, remove(sendKey(rec.RequesterInstance, rec.SendKey), anyRev))
		}
		_, err = s.tasks.write(ctx, ops...)
		s.taskGuesses.forget(e.id)
		if err == nil {
			return true, nil
		}
		if !conflict(err) {
			return false, err
		}
		if err := backoff(ctx, try, "prune task "+e.id); err != nil {
			return false, err
		}
	}
}
