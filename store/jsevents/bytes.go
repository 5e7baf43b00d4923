package jsevents

import (
	"context"
)

// The bytes bound (Config.MaxBytes). JetStream limits bytes per stream,
// not per subject, and a stream-wide limit could drop a session's last
// message; so each Log counts the bytes of the notifications it appended
// to a session itself, with their stream sequences, and when they pass
// MaxBytes it purges the session's notifications below the oldest of its
// own it can keep. The purge takes every older notification of the
// session, whichever Log appended it, and never the session's last
// message, which is at or after the Log's own last append (the marker
// subject is never purged).
//
// The counts are kept in tallies: runs of consecutive appends, each run a
// stream sequence (its first append's) and a sum of bytes. An append
// joins the newest run while the run stays within MaxBytes/tallyGrain, so
// a purge drops whole runs: it keeps at least MaxBytes minus one run, a
// thirty-second of the bound, and is needed once per run appended, not
// once per append. Two neighbouring runs always hold more than
// MaxBytes/tallyGrain between them, so a session within the bound has at
// most 2*tallyGrain runs; maxTallies caps them whatever happens (when
// purges fail, the two oldest runs are merged).
const (
	tallyGrain = 32
	maxTallies = 2*tallyGrain + 2
)

// tally is a run of a session's appends by one Log.
type tally struct {
	sseq  uint64 // the stream sequence of the run's first notification
	bytes int    // the run's body bytes
}

// count records that the Log stored a notification of n body bytes at
// stream sequence sseq on subject (the session's <prefix>.<T>.e), and
// purges the session's oldest notifications when those the Log appended
// and still counts pass Config.MaxBytes. The caller holds s.mu, and sseq
// is above every stream sequence s counts. A failed purge is counted in
// Stats and tried again on the session's next Append: the notification is
// stored whatever happens here.
func (l *Log) count(ctx context.Context, s *session, subject string, sseq uint64, n int) {
	limit := l.cfg.MaxBytes
	if limit == 0 {
		return
	}
	s.bytes += n
	if k := len(s.tallies); k > 0 && s.tallies[k-1].bytes+n <= limit/tallyGrain {
		s.tallies[k-1].bytes += n
	} else {
		s.tallies = append(s.tallies, tally{sseq: sseq, bytes: n})
	}
	defer func() {
		if len(s.tallies) > maxTallies {
			s.tallies[1].sseq = s.tallies[0].sseq
			s.tallies[1].bytes += s.tallies[0].bytes
			s.tallies = s.tallies[:copy(s.tallies, s.tallies[1:])]
		}
	}()
	if s.bytes <= limit {
		return
	}
	// The oldest runs whose going brings the count within the bound,
	// never the newest.
	cut, rest := 0, s.bytes
	for cut < len(s.tallies)-1 && rest > limit {
		rest -= s.tallies[cut].bytes
		cut++
	}
	if cut == 0 {
		// The newest notification alone is over the bound: it is kept,
		// as the newest is on one host.
		return
	}
	if err := l.purgeBefore(ctx, subject, s.tallies[cut].sseq); err != nil {
		l.stats.purgeErrors.Add(1)
		return
	}
	l.stats.purges.Add(1)
	s.tallies = s.tallies[:copy(s.tallies, s.tallies[cut:])]
	s.bytes = rest
}

// purgeBefore drops the messages on subject below stream sequence before,
// retrying for at most one attempt's time.
func (l *Log) purgeBefore(ctx context.Context, subject string, before uint64) error {
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	_, err := l.purge(ctx, subject, before)
	return err
}

// uncount forgets what s counted: its notifications are gone (Forget).
func (s *session) uncount() {
	s.tallies, s.bytes = nil, 0
}
