// Package logsummary logs a message that repeats once, then counts its
// repeats and logs the count once an interval, so that a failure met
// many times a second (every retry on a full disk, every request while
// the task store cannot take changes) makes a few lines, not one a
// retry.
package logsummary

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode"
)

// DefaultEvery is the interval of Logger's counts when New is given 0.
const DefaultEvery = time.Minute

// Logger writes to a slog.Logger, summarizing repeats. It is safe for
// concurrent use. Its timers are its own: Close stops them.
type Logger struct {
	log   *slog.Logger
	every time.Duration

	mu     sync.Mutex
	kinds  map[string]*kind
	closed bool
}

// kind is a message logged within the last interval, and its repeats
// since.
type kind struct {
	level   slog.Level
	msg     string
	args    []any // the latest repeat's
	repeats int
	last    time.Time // of the kind's last line
	timer   *time.Timer
}

// New returns a Logger on log whose counts come every interval (0 means
// DefaultEvery).
func New(log *slog.Logger, every time.Duration) *Logger {
	if every <= 0 {
		every = DefaultEvery
	}
	return &Logger{log: log, every: every, kinds: map[string]*kind{}}
}

// Log logs msg with args at level, unless a message of the same key was
// logged within the interval: then it only counts it. At the end of an
// interval with repeats, one line says how many there were ("repeats")
// since the last line ("over"), with the latest one's args; an interval
// without repeats ends the kind's summary, and the next message of that
// key is logged at once. After Close, repeats are dropped.
func (l *Logger) Log(level slog.Level, key, msg string, args ...any) {
	l.mu.Lock()
	if k, ok := l.kinds[key]; ok {
		k.repeats++
		k.args = args
		l.mu.Unlock()
		return
	}
	k := &kind{level: level, msg: msg, last: time.Now()}
	l.kinds[key] = k
	if !l.closed {
		k.timer = time.AfterFunc(l.every, func() { l.tick(key) })
	}
	l.mu.Unlock()
	l.log.Log(context.Background(), level, msg, args...)
}

// Warn logs at slog.LevelWarn.
func (l *Logger) Warn(key, msg string, args ...any) { l.Log(slog.LevelWarn, key, msg, args...) }

// Error logs at slog.LevelError.
func (l *Logger) Error(key, msg string, args ...any) { l.Log(slog.LevelError, key, msg, args...) }

// Info logs at slog.LevelInfo.
func (l *Logger) Info(key, msg string, args ...any) { l.Log(slog.LevelInfo, key, msg, args...) }

// tick ends an interval of key's.
func (l *Logger) tick(key string) {
	l.mu.Lock()
	k, ok := l.kinds[key]
	if !ok || l.closed {
		l.mu.Unlock()
		return
	}
	if k.repeats == 0 {
		delete(l.kinds, key)
		l.mu.Unlock()
		return
	}
	n, args, since := k.repeats, k.args, k.last
	k.repeats, k.last = 0, time.Now()
	k.timer.Reset(l.every)
	l.mu.Unlock()
	l.summarize(k, n, args, since)
}

// summarize logs k's n repeats since its last line, with the latest
// one's args.
func (l *Logger) summarize(k *kind, n int, args []any, since time.Time) {
	over := time.Since(since).Round(time.Millisecond)
	l.log.Log(context.Background(), k.level, k.msg, append(args[:len(args):len(args)], "repeats", n, "over", over)...)
}

// Close logs the counts not yet logged and stops the timers.
// Idempotent.
func (l *Logger) Close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	type pending struct {
		k     *kind
		n     int
		args  []any
		since time.Time
	}
	var out []pending
	for _, k := range l.kinds {
		if k.timer != nil {
			k.timer.Stop()
		}
		if k.repeats > 0 {
			out = append(out, pending{k, k.repeats, k.args, k.last})
			k.repeats = 0
		}
	}
	l.mu.Unlock()
	for _, p := range out {
		l.summarize(p.k, p.n, p.args, p.since)
	}
}

// Key joins parts into a key in which every run of digits is one '#':
// messages that differ only in numbers (a file's, a job's, a count) are
// of one kind.
func Key(parts ...string) string {
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			b.WriteByte(0)
		}
		digits := false
		for _, r := range p {
			if unicode.IsDigit(r) {
				if !digits {
					b.WriteByte('#')
				}
				digits = true
				continue
			}
			digits = false
			b.WriteRune(r)
		}
	}
	return b.String()
}
