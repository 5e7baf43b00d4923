package pebblestore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cockroachdb/pebble/v2"

	"github.com/a2a-bus/a2a-bus/store"
	"github.com/a2a-bus/a2a-bus/store/boltstore"
)

// MigratedSuffix is added to the name of the bbolt file (boltstore's
// tasks.db) once its tasks are in the new store: it is kept, and never
// read again.
const MigratedSuffix = ".migrated"

// migrate moves the tasks of an earlier version's store (boltstore's
// tasks.db) into a new store, once: when the data dir has that file and
// no store folder yet. The bbolt file is opened with all its checks (a
// damaged one stops the start as it did before), the new store is built
// whole under another name and renamed into place, and only then is the
// old file renamed aside. A migration cut short is done again.
func migrate(dir string, opts Options) error {
	old := filepath.Join(dir, boltstore.FileName)
	path := filepath.Join(dir, DirName)
	_, err := os.Lstat(old)
	oldThere := !errors.Is(err, os.ErrNotExist)
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		if oldThere {
			// A migration cut short after the new store was in place, or
			// a file an earlier version wrote since: which, the store
			// cannot tell, so it leaves the file be and says so.
			opts.Logger.Warn("an earlier version's task file is beside the task store and is not read", "file", old, "store", path)
		}
		return nil
	}
	if !oldThere {
		return nil
	}
	src, err := boltstore.Open(dir, boltstore.Options{LockTimeout: opts.LockTimeout, AcceptDataLoss: opts.AcceptDataLoss, OnDataLoss: opts.OnDataLoss})
	if err != nil {
		return fmt.Errorf("pebblestore: migrate %s: %w", old, err)
	}
	defer src.Close()
	n := 0
	err = createIfMissing(path, opts, func(db *pebble.DB) error {
		var err error
		n, err = copyTasks(src, db)
		return err
	})
	if err != nil {
		return fmt.Errorf("pebblestore: migrate %s: %w", old, err)
	}
	if err := src.Close(); err != nil {
		return fmt.Errorf("pebblestore: migrate %s: %w", old, err)
	}
	if err := os.Rename(old, old+MigratedSuffix); err != nil {
		return fmt.Errorf("pebblestore: migrate %s: %w", old, err)
	}
	opts.Logger.Info("task store migrated from bbolt", "tasks", n, "from", old, "to", path)
	return syncDir(dir)
}

// copyTasks writes every task of src, with its indexes, into db, in
// synced batches of bounded size.
func copyTasks(src *boltstore.Store, db *pebble.DB) (int, error) {
	const batchBytes = 32 << 20
	counts := map[string]uint64{}
	t := &tx{Batch: db.NewIndexedBatch(), counts: counts, pending: map[string]uint64{}}
	n, size := 0, 0
	flush := func() error {
		if err := fatalAsError(func() error { return t.Commit(pebble.Sync) }); err != nil {
			return err
		}
		t.Close()
		for k, v := range t.pending {
			counts[k] = v
		}
		t = &tx{Batch: db.NewIndexedBatch(), counts: counts, pending: map[string]uint64{}}
		size = 0
		return nil
	}
	defer func() { t.Close() }()
	err := src.ForEach(func(rec *store.Record) error {
		data, err := rec.Encode()
		if err != nil {
			return err
		}
		if err := put(t, rec, data, nil); err != nil {
			return err
		}
		n++
		if size += len(data); size >= batchBytes {
			return flush()
		}
		return nil
	})
	if err != nil {
		return n, err
	}
	return n, flush()
}
