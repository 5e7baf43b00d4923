package pebblestore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// A log cannot tell a torn tail (a commit never acknowledged, cut short
// by a crash) from a damaged or truncated one (commits acknowledged, then
// lost): Pebble drops either silently when it opens the store. So every
// commit also writes its number into the store (key commitKey), and once
// its log sync is done, and so the commit acknowledged, the number goes
// to a marker file beside the store (MarkerName), synced in the
// background: the marker never runs ahead of the log (and, written at
// most every markEvery, it does not crowd the log's syncs). A store that opens
// with a number below the marker's has lost acknowledged commits, and is
// refused (ErrDataLoss) unless Options.AcceptDataLoss. The marker also
// says that the data dir held a store: a tasks folder that is gone while
// the marker is there is a loss, not a new store. What it cannot see: the
// commits acknowledged after its last write (at most markEvery and one
// sync before a crash), if the log loses exactly those; and a marker lost
// with the log.

// MarkerName is the marker file in the data dir.
const MarkerName = "tasks.commit"

// commitKey holds the number of the last commit (8 bytes, big-endian).
var commitKey = key(pMeta, "commit")

// The marker file is two slots, written in turn, each the number (8
// bytes) and its CRC-32C (4 bytes): a write torn by a crash leaves the
// other slot whole. Its number is the greater of the whole slots.
const (
	slotSize  = 16
	markerLen = 2 * slotSize
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// marker is the open marker file.
type marker struct {
	mu   sync.Mutex
	f    vfs.File
	next int    // the slot written next
	n    uint64 // the number last written
}

// readMarker reads the marker at path: its number, the slot to write
// next, and whether it is there. A marker with no whole slot is an
// error.
func readMarker(fs vfs.FS, path string) (n uint64, next int, exists bool, err error) {
	f, err := fs.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, 0, false, nil
	}
	if err != nil {
		return 0, 0, false, err
	}
	defer f.Close()
	buf := make([]byte, markerLen)
	if _, err := io.ReadFull(f, buf); err != nil {
		return 0, 0, true, fmt.Errorf("the marker %s is short: %v", path, err)
	}
	n, slot, ok := bestSlot(buf)
	if !ok {
		return 0, 0, true, fmt.Errorf("the marker %s is damaged", path)
	}
	return n, 1 - slot, true, nil
}

// bestSlot returns the greater whole slot's number and index.
func bestSlot(buf []byte) (n uint64, slot int, ok bool) {
	for i := range 2 {
		s := buf[i*slotSize : (i+1)*slotSize]
		v := binary.BigEndian.Uint64(s)
		if crc32.Checksum(s[:8], crcTable) == binary.BigEndian.Uint32(s[8:12]) && (!ok || v > n) {
			n, slot, ok = v, i, true
		}
	}
	return n, slot, ok
}

// openMarker opens the marker at path, which holds n and is written
// next in slot next (readMarker). With reset (a new store, an old one
// without a marker, or one whose loss was accepted) it is first written
// anew, n in both slots, the file and its folder synced.
func openMarker(fs vfs.FS, path string, n uint64, next int, reset bool) (*marker, error) {
	if reset {
		// A fresh file, renamed into place: the whole of it or nothing.
		tmp := path + ".new"
		f, err := fs.Create(tmp, vfs.WriteCategoryUnspecified)
		if err != nil {
			return nil, fmt.Errorf("the marker: %w", err)
		}
		buf := make([]byte, markerLen)
		putSlot(buf[:slotSize], n)
		putSlot(buf[slotSize:], n)
		_, err = f.Write(buf)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = fs.Rename(tmp, path)
		}
		if err == nil {
			err = syncFolder(fs, filepath.Dir(path))
		}
		if err != nil {
			_ = fs.Remove(tmp) // nothing of it is used; a start makes it anew
			return nil, fmt.Errorf("the marker: %w", err)
		}
	}
	f, err := fs.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return nil, fmt.Errorf("the marker: %w", err)
	}
	return &marker{f: f, next: next, n: n}, nil
}

func putSlot(s []byte, n uint64) {
	binary.BigEndian.PutUint64(s[:8], n)
	binary.BigEndian.PutUint32(s[8:12], crc32.Checksum(s[:8], crcTable))
	clear(s[12:])
}

// write records n, if it is greater than what the marker holds, and
// syncs it.
func (m *marker) write(n uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.f == nil || n <= m.n {
		return nil
	}
	var s [slotSize]byte
	putSlot(s[:], n)
	if _, err := m.f.WriteAt(s[:], int64(m.next*slotSize)); err != nil {
		return err
	}
	if err := m.f.Sync(); err != nil {
		return err
	}
	m.n, m.next = n, 1-m.next
	return nil
}

// close closes the file. Idempotent.
func (m *marker) close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.f == nil {
		return nil
	}
	err := m.f.Close()
	m.f = nil
	return err
}
