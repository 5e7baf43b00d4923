package pebblestore

import (
	"bytes"
	"sync"

	"github.com/a2a-bus/a2a-bus/store"
)

// The store keeps the tasks it last decoded for a read, with the bytes
// they were decoded from: the broker reads a task (Get) right before it
// updates it, and the update then finds the record it is to change
// here, by the same bytes, instead of decoding them a second time. A
// record is found only for the very bytes the store holds now, so a
// kept one is never stale; it is shared and never changed (callers get
// copies).
const (
	decodedKept     = 32       // records kept
	decodedMaxBytes = 16 << 10 // larger records are not kept
)

type decodedCache struct {
	mu   sync.Mutex
	kept [decodedKept]decodedTask
	next int // the slot the next record takes
}

type decodedTask struct {
	id   string
	data []byte
	rec  *store.Record
}

// find returns the kept record decoded from data for id, or nil. The
// caller must not change it.
func (c *decodedCache) find(id string, data []byte) *store.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.kept {
		if k := &c.kept[i]; k.rec != nil && k.id == id && bytes.Equal(k.data, data) {
			return k.rec
		}
	}
	return nil
}

// keep keeps rec, decoded from data for id, in place of the oldest
// kept one. Neither rec nor data may change from then on.
func (c *decodedCache) keep(id string, data []byte, rec *store.Record) {
	if len(data) > decodedMaxBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.kept {
		if c.kept[i].id == id {
			c.kept[i] = decodedTask{id, data, rec} // the task's older bytes
			return
		}
	}
	c.kept[c.next] = decodedTask{id, data, rec}
	c.next = (c.next + 1) % decodedKept
}

// decode returns the record stored as data for id, shared: kept, or
// decoded and kept. The caller must not change it.
func (s *Store) decode(id string, data []byte) (*store.Record, error) {
	if rec := s.decoded.find(id, data); rec != nil {
		return rec, nil
	}
	rec, err := decodeRecord(id, data)
	if err != nil {
		return nil, err
	}
	s.decoded.keep(id, data, rec)
	return rec, nil
}
