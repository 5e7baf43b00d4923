package jsstore

import "sync"

// The store remembers what it last read or wrote of a few tasks and
// session counts, with their revisions, so that the next change of one
// can be sent at once as a compare-and-set on that revision instead of
// reading the key first: the broker reads a task (Get) right before it
// changes it (Update), and creates in one session one after another. A
// guess is never an answer: reads always go to the stream leader. A
// stale guess fails its compare-and-set and is read again, and an
// update's fn that refuses a guessed task is judged again on the task
// read from the leader, so that a refusal is never based on a change
// someone else has overtaken.
const guessesKept = 1024

type guesses[V any] struct {
	mu   sync.Mutex
	m    map[string]guessed[V]
	ring [guessesKept]string // keys in the order kept: the oldest goes
	next int
}

type guessed[V any] struct {
	rev uint64
	v   V
}

// find returns the guess for key.
func (g *guesses[V]) find(key string) (V, uint64, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e, ok := g.m[key]
	return e.v, e.rev, ok
}

// keep remembers v at rev for key (rev 0: the key absent).
func (g *guesses[V]) keep(key string, v V, rev uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m == nil {
		g.m = map[string]guessed[V]{}
	}
	if _, ok := g.m[key]; !ok {
		if old := g.ring[g.next]; old != "" {
			delete(g.m, old)
		}
		g.ring[g.next] = key
		g.next = (g.next + 1) % guessesKept
	}
	g.m[key] = guessed[V]{rev, v}
}

// forget drops the guess for key. Its slot in the ring stays until it
// comes round, and may then forget a guess kept again meanwhile early.
func (g *guesses[V]) forget(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.m, key)
}
