package jsevents

import "hash/maphash"

// IdlePerShard is how many sessions a shard remembers while no call uses
// them.
const IdlePerShard = maxIdle / numShards

// ShardOf returns the shard that keeps session's state in l.
func (l *Log) ShardOf(session string) int {
	return int(maphash.String(l.seed, session) % numShards)
}

// Remembers reports whether l keeps state (last seq, bytes counted) for
// session, and how many sessions its shard keeps.
func (l *Log) Remembers(session string) (kept bool, inShard int) {
	sh := l.shard(session)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	_, kept = sh.m[session]
	return kept, len(sh.m)
}
