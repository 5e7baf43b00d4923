package admission

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// The errors of Queue.Submit.
var (
	// ErrBusy: the key has its bound of requests (or bytes) waiting.
	ErrBusy = errors.New("admission: too many requests waiting")
	// ErrClosed: the queue is closed.
	ErrClosed = errors.New("admission: closed")
)

// Limits are a Queue's bounds.
type Limits struct {
	Total    int        // requests running at once, all keys together
	PerKey   int        // requests of one key running at once
	MaxWait  int        // requests of one key waiting; past it, ErrBusy
	MaxBytes int        // their bytes
	Rate     rate.Limit // requests of one key started per second (rate.Inf: no bound)
	Burst    int        // of which this many at once
}

// Queue runs requests so that one session's flood queues behind itself
// and not in front of everyone: at most Total requests run at once, at
// most PerKey of one key (a session), no more than Rate a second of one
// key; a key's waiting requests are bounded (beyond, Submit refuses).
// When a request ends, the next to run is taken round-robin over the
// keys that have one waiting and may start one: a busy session gets its
// turn like any other, never all of them.
//
// Submit never blocks: the subscription that feeds it must never fall
// behind. A reader that wants to stop taking a key's requests while the
// key has enough waiting calls Wait.
type Queue struct {
	lim Limits

	mu      sync.Mutex
	roomy   *sync.Cond // broadcast when a key's waiting requests drop
	closed  bool
	running int
	keys    map[string]*queueKey
	sweepAt int         // a new key sweeps the idle ones when there are this many
	turn    []*queueKey // keys with waiting requests, in round-robin order
	timer   *time.Timer // starts what a rate held back
	unlimit map[string]bool
	wg      sync.WaitGroup // the workers
	// work hands a job to an idle worker; quit ends the idle ones.
	work       chan workItem
	quit       chan struct{}
	quitClosed bool
}

// workItem is a job to run for a key.
type workItem struct {
	k   *queueKey
	job request
}

// workerIdle is how long a worker waits for its next job before it ends.
const workerIdle = time.Second

type queueKey struct {
	key     string
	running int
	waiting []request
	bytes   int
	inTurn  bool
	rate    *rate.Limiter
	perKey  int // the key's bound on running: lim.PerKey, or Total if unlimited
	// busySince and busyAnswers count the A2A_BUSY answers of the
	// current second.
	busySince   time.Time
	busyAnswers int
}

// request is one request: run(true) serves it, run(false) answers it
// unserved (the queue closed while it waited).
type request struct {
	run  func(serve bool)
	size int
}

// NewQueue returns a queue; the keys in unlimited (the host's) have
// neither a rate nor a PerKey bound: only Total bounds what they run,
// and their waiting is bounded like any key's.
func NewQueue(lim Limits, unlimited ...string) *Queue {
	q := &Queue{lim: lim, keys: map[string]*queueKey{}, sweepAt: minSweep, unlimit: map[string]bool{}, work: make(chan workItem), quit: make(chan struct{})}
	for _, k := range unlimited {
		q.unlimit[k] = true
	}
	q.roomy = sync.NewCond(&q.mu)
	return q
}

// full reports whether k has as many requests waiting as it may have, or
// nearly: its reader should stop taking more. q.mu is held.
func (q *Queue) full(k *queueKey) bool {
	return k != nil && (len(k.waiting) >= q.lim.MaxWait*3/4 || k.bytes >= q.lim.MaxBytes*3/4)
}

// Wait blocks while key's queue is (nearly) full, until the queue closes
// or stop is set (and Wake called). A reader that calls it before each
// read of a key's requests stops reading while the key has enough
// waiting: what the key sends then waits in the NATS server, whose buffer
// per connection fills and slows down the key's own producers, and no
// one else's.
func (q *Queue) Wait(key string, stop *atomic.Bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for !q.closed && !stop.Load() && q.full(q.keys[key]) {
		q.roomy.Wait()
	}
}

// Wake wakes the readers blocked in Wait, to look at their stop again.
func (q *Queue) Wake() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.roomy.Broadcast()
}

// BusyAnswer reports whether one more A2A_BUSY answer to key fits this
// second's budget (perSecond); past it, the overflow goes unanswered.
func (q *Queue) BusyAnswer(key string, perSecond int, now time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	k := q.keys[key]
	if k == nil {
		return true
	}
	if now.Sub(k.busySince) >= time.Second {
		k.busySince, k.busyAnswers = now, 0
	}
	k.busyAnswers++
	return k.busyAnswers <= perSecond
}

// Forget drops what the queue remembers of an idle key (its rate): a
// session that is closed.
func (q *Queue) Forget(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if k := q.keys[key]; k != nil && k.running == 0 && len(k.waiting) == 0 {
		delete(q.keys, key)
	}
}

// Submit runs run now, or queues it behind key's earlier requests. It
// returns a *BusyError (ErrBusy), running nothing, when key already has its bound of
// waiting requests (or bytes), and ErrClosed after Close.
func (q *Queue) Submit(key string, size int, run func(serve bool)) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return ErrClosed
	}
	k := q.keys[key]
	if k == nil {
		if len(q.keys) >= q.sweepAt {
			q.sweep(time.Now())
		}
		k = &queueKey{key: key, rate: rate.NewLimiter(q.lim.Rate, q.lim.Burst), perKey: q.lim.PerKey}
		if q.unlimit[key] {
			k.rate, k.perKey = rate.NewLimiter(rate.Inf, 0), q.lim.Total
		}
		q.keys[key] = k
	}
	job := request{run: run, size: size}
	if len(k.waiting) == 0 && q.mayStart(k) && k.rate.AllowN(time.Now(), 1) {
		q.start(k, job)
		return nil
	}
	if len(k.waiting) >= q.lim.MaxWait || (len(k.waiting) > 0 && k.bytes+size > q.lim.MaxBytes) {
		return &BusyError{Bytes: len(k.waiting) < q.lim.MaxWait, Waiting: len(k.waiting), WaitingBytes: k.bytes, Size: size,
			Running: k.running, MaxWait: q.lim.MaxWait, MaxBytes: q.lim.MaxBytes}
	}
	k.waiting = append(k.waiting, job)
	k.bytes += size
	q.enter(k)
	q.pump()
	return nil
}

// BusyError is Submit's ErrBusy (errors.Is), with the bound the request
// met and the key's figures when it did.
type BusyError struct {
	// Bytes: the bound on the bytes waiting, which the request would have
	// passed; else the bound on the requests waiting, which was full.
	Bytes bool
	// Waiting and WaitingBytes are what waited; Size is the request's
	// own; Running is how many of the key's requests were in service.
	Waiting, WaitingBytes, Size, Running int
	MaxWait, MaxBytes                    int
}

func (e *BusyError) Error() string {
	if e.Bytes {
		return fmt.Sprintf("admission: %d bytes waiting and %d more would pass the bound of %d", e.WaitingBytes, e.Size, e.MaxBytes)
	}
	return fmt.Sprintf("admission: %d requests waiting, the bound", e.Waiting)
}

// Is makes a BusyError ErrBusy.
func (e *BusyError) Is(target error) bool { return target == ErrBusy }

// mayStart reports whether k may start one more request, rate aside.
// q.mu is held.
func (q *Queue) mayStart(k *queueKey) bool {
	return k.running < k.perKey && q.running < q.lim.Total
}

// enter puts k in the turn, if it has a request waiting. q.mu is held.
func (q *Queue) enter(k *queueKey) {
	if len(k.waiting) > 0 && !k.inTurn {
		k.inTurn = true
		q.turn = append(q.turn, k)
	}
}

// requeue puts keys back in the turn, in order. q.mu is held.
func (q *Queue) requeue(keys []*queueKey) {
	for _, k := range keys {
		k.inTurn = false
		q.enter(k)
	}
}

// start runs job for k on an idle worker, or a new one. Workers stay a
// while for the next job: a request then runs on a goroutine whose stack
// has already grown to what serving takes. q.mu is held.
func (q *Queue) start(k *queueKey, job request) {
	q.running++
	k.running++
	select {
	case q.work <- workItem{k, job}:
	default:
		q.wg.Go(func() { q.worker(workItem{k, job}) })
	}
}

// worker runs its job, then the jobs handed to it, until it has idled
// for workerIdle or the queue closes.
func (q *Queue) worker(it workItem) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		it.job.run(true)
		q.done(it.k)
		idle.Reset(workerIdle)
		select {
		case it = <-q.work:
		case <-idle.C:
			return
		case <-q.quit:
			return
		}
	}
}

// done ends one of k's requests and starts the next ones due.
func (q *Queue) done(k *queueKey) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.running--
	k.running--
	q.enter(k)
	q.pump()
}

// minSweep is the fewest keys at which a new key sweeps the idle ones.
const minSweep = 64

// sweep forgets the idle keys whose rate has nothing to remember (a full
// bucket: such a key that comes back starts afresh all the same; one that
// idles between bursts does not get a new burst each time), and sets the
// next sweep at twice the keys left: the keys of sessions come and gone
// are bounded, and a key in use is not made anew for each request.
// q.mu is held.
func (q *Queue) sweep(now time.Time) {
	for key, k := range q.keys {
		if k.running == 0 && len(k.waiting) == 0 && k.rate.TokensAt(now) >= float64(k.rate.Burst()) {
			delete(q.keys, key)
		}
	}
	q.sweepAt = max(minSweep, 2*len(q.keys))
}

// pump starts waiting requests while slots are free, one per key per
// round, round-robin over the keys in turn. A key at its perKey bound
// leaves the turn (its done puts it back); one held back by its rate
// stays, and if nothing else can start, a timer pumps again when the
// soonest may. q.mu is held.
func (q *Queue) pump() {
	defer q.roomy.Broadcast()
	var soonest time.Duration
	for started := true; started && !q.closed; {
		started = false
		round := q.turn
		q.turn = nil
		var went []*queueKey // the keys that started one: back of the line
		for i, k := range round {
			k.inTurn = false
			if q.running >= q.lim.Total {
				q.requeue(round[i:]) // in order, for the next done
				q.requeue(went)
				return
			}
			if len(k.waiting) == 0 || k.running >= k.perKey {
				continue
			}
			if now := time.Now(); !k.rate.AllowN(now, 1) {
				if d := untilToken(k.rate, now); soonest == 0 || d < soonest {
					soonest = d
				}
				q.enter(k) // it keeps its place
				continue
			}
			job := k.waiting[0]
			k.waiting[0] = request{}
			k.waiting = k.waiting[1:]
			k.bytes -= job.size
			q.start(k, job)
			went = append(went, k)
			started = true
		}
		q.requeue(went)
	}
	if soonest > 0 && q.timer == nil && !q.closed {
		q.timer = time.AfterFunc(soonest, func() {
			q.mu.Lock()
			defer q.mu.Unlock()
			q.timer = nil
			q.pump()
		})
	}
}

// untilToken is how long until lim has a token, as seen at now; at least
// a millisecond, so that a key held back always has a timer to come back.
func untilToken(lim *rate.Limiter, now time.Time) time.Duration {
	missing := 1 - lim.TokensAt(now)
	return max(time.Duration(missing/float64(lim.Limit())*float64(time.Second)), time.Millisecond)
}

// Close stops starting requests, answers those still waiting unserved,
// and waits for the running ones. Idempotent.
func (q *Queue) Close() {
	q.mu.Lock()
	q.closed = true
	if q.timer != nil {
		q.timer.Stop()
		q.timer = nil
	}
	q.roomy.Broadcast()
	var left []request
	for _, k := range q.keys {
		left = append(left, k.waiting...)
		k.waiting, k.bytes = nil, 0
	}
	q.turn = nil
	if !q.quitClosed {
		q.quitClosed = true
		close(q.quit)
	}
	q.mu.Unlock()
	for _, j := range left {
		j.run(false)
	}
	q.wg.Wait()
}
