package boltstore

// Syncs reports whether the store fsyncs its commits (bbolt's NoSync off).
func (s *Store) Syncs() bool { return !s.db.NoSync }

// Queued counts the changes waiting for the committer.
func Queued(s *Store) int { return len(s.ops) }
