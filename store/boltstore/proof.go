package boltstore

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"io"
	"os"
)

// A bbolt file begins with two meta pages, written in turn: each commit
// writes its data pages, syncs, then writes one meta page (the older of
// the two) and syncs again, and only then is the change acknowledged. At
// open, bbolt takes the newer meta page that is valid; if the newer one
// is damaged it silently takes the older, rolling back the last commit.
// That is right for a meta page torn by a power cut during a commit that
// was never acknowledged, and wrong for one damaged later: the store
// cannot tell them apart, so it does not guess.

// The layout of a meta page: a 16-byte page header, then magic, version,
// page size, flags (4 bytes each), the root bucket (16), the freelist
// page, the high-water page, the txid (8 each), and an FNV-64a checksum
// of everything before it.
const (
	pageHeaderSize = 16
	metaSize       = 64
	metaMagic      = 0xED0CDAED
	metaVersion    = 2
)

// dataProblem reports what keeps the file at path from showing that it
// holds every acknowledged change: it is empty, or one of its meta pages
// is damaged. "" means nothing (a missing file is a new store); a file
// both of whose meta pages are damaged is left to bbolt, which refuses
// it.
func dataProblem(path string) (string, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return "", err
	}
	if info.Size() == 0 {
		return "it is empty (zero bytes): the tasks it held are gone", nil
	}
	first := make([]byte, pageHeaderSize+metaSize)
	if _, err := io.ReadFull(f, first); err != nil {
		return "it is too short to hold its two commit records", nil
	}
	size0, ok0 := validMeta(first[pageHeaderSize:])
	var ok1 bool
	if ok0 {
		ok1 = metaAt(f, int64(size0))
	} else {
		// Where meta page 1 is depends on the page size that meta page 0
		// would have told: look where bbolt looks, at every page size it
		// knows (files move between machines of 4, 16 and 64 KiB pages).
		for size := int64(1 << 10); size <= 1<<24 && !ok1; size <<= 1 {
			ok1 = metaAt(f, size)
		}
	}
	switch {
	case ok0 && ok1, !ok0 && !ok1:
		return "", nil
	case !ok0:
		return "its first commit record (meta page 0) is damaged: the last acknowledged changes may be lost", nil
	}
	return "its second commit record (meta page 1) is damaged: the last acknowledged changes may be lost", nil
}

// metaAt reports whether a sound meta page of page size pageSize is at
// that offset (meta page 1's place for that size).
func metaAt(f *os.File, pageSize int64) bool {
	page := make([]byte, pageHeaderSize+metaSize)
	if _, err := f.ReadAt(page, pageSize); err != nil {
		return false
	}
	size, ok := validMeta(page[pageHeaderSize:])
	return ok && int64(size) == pageSize
}

// validMeta reports whether m is a sound meta page of this format, and
// its page size.
func validMeta(m []byte) (pageSize uint32, ok bool) {
	le := binary.LittleEndian
	if le.Uint32(m[0:]) != metaMagic || le.Uint32(m[4:]) != metaVersion {
		return 0, false
	}
	h := fnv.New64a()
	h.Write(m[:metaSize-8])
	if h.Sum64() != le.Uint64(m[metaSize-8:]) {
		return 0, false
	}
	return le.Uint32(m[8:]), true
}

// errDataLoss describes a file that dataProblem refuses.
func errDataLoss(path, problem string) error {
	return fmt.Errorf("%w: %s: %s; start with --accept-data-loss to open it anyway with what it holds", ErrDataLoss, path, problem)
}
