package pebblestore

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strconv"
)

// Consistent checks the store's keys against its task records, as a
// crash must leave them: every index entry (member, send, open, count,
// ended) is the one its task's record asks for, no entry is without its
// task and no task without its entries, the counts in memory are the
// counts on disk, and the schema version is there. It returns the first
// disagreement it finds.
func Consistent(s *Store) error {
	return s.view(func(r reader) error {
		want, got := map[string]string{}, map[string]string{}
		opens := map[string]uint64{}
		schema := false
		last := "" // the greatest task id
		it, err := r.NewIter(nil)
		if err != nil {
			return err
		}
		for it.First(); it.Valid(); it.Next() {
			k, v := string(it.Key()), string(it.Value())
			switch k[0] {
			case pMeta:
				if k == string(key(pMeta, "schema")) && v == strconv.Itoa(SchemaVersion) {
					schema = true
					continue
				}
				if k == string(commitKey) && len(v) == 8 {
					continue // the last commit's number (marker.go)
				}
				it.Close()
				return fmt.Errorf("a meta key %q = %q", k, v)
			case pReg:
				continue // Registrations decodes them
			case pTask:
				id := k[1:]
				last = id
				rec, err := decodeRecord(id, []byte(v))
				if err != nil {
					it.Close()
					return err
				}
				if rec.Task.ID != id {
					it.Close()
					return fmt.Errorf("task key %q holds task %q", id, rec.Task.ID)
				}
				state := string(rec.Task.Status.State)
				want[string(memberKey(rec.RequesterInstance, roleRequester, id))] = state
				want[string(memberKey(rec.AssigneeInstance, roleAssignee, id))] = state
				if rec.SendKey != "" {
					want[string(memberKey(rec.RequesterInstance, roleSend, rec.SendKey))] = id
				}
				if rec.Task.Status.State.Open() {
					want[string(key(pOpen, id))] = rec.Task.ContextID
					opens[rec.Task.ContextID]++
				} else {
					want[string(endedKey(rec))] = ""
				}
			case pMember, pOpen, pCount, pEnded:
				got[k] = v
			default:
				it.Close()
				return fmt.Errorf("a key of no known prefix: %q", k)
			}
		}
		if err := it.Close(); err != nil {
			return err
		}
		if !schema {
			return fmt.Errorf("no schema version")
		}
		for session, n := range opens {
			want[string(key(pCount, session))] = string(binary.BigEndian.AppendUint64(nil, n))
		}
		for _, k := range slices.Sorted(maps.Keys(got)) {
			if w, ok := want[k]; !ok {
				return fmt.Errorf("index entry %q = %q, which no task asks for", k, got[k])
			} else if w != got[k] {
				return fmt.Errorf("index entry %q = %q, its task says %q", k, got[k], w)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(want)) {
			if _, ok := got[k]; !ok {
				return fmt.Errorf("index entry %q = %q missing", k, want[k])
			}
		}
		s.cmu.Lock()
		defer s.cmu.Unlock()
		if !maps.Equal(s.counts, opens) {
			return fmt.Errorf("open-task counts in memory %v, on disk %v", s.counts, opens)
		}
		if last > s.maxID {
			return fmt.Errorf("greatest task id %q past the store's bound %q", last, s.maxID)
		}
		return nil
	})
}
