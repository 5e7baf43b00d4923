package logsummary_test

import (
	"bytes"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/internal/logsummary"
)

// out is a text handler's output.
type out struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *out) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *out) lines() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := strings.TrimSpace(o.b.String())
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func newLogger(every time.Duration) (*logsummary.Logger, *out) {
	o := &out{}
	return logsummary.New(slog.New(slog.NewTextHandler(o, nil)), every), o
}

func TestARepeatIsCountedNotLogged(t *testing.T) {
	l, o := newLogger(time.Hour)
	for i := range 1000 {
		l.Warn("full", "the disk is full", "try", i)
	}
	require.Len(t, o.lines(), 1, "the first is logged at once, the rest counted")
	assert.Contains(t, o.lines()[0], "try=0")
	l.Close()
	lines := o.lines()
	require.Len(t, lines, 2, "Close logs the count")
	assert.Contains(t, lines[1], "repeats=999 ")
	assert.Contains(t, lines[1], "try=999", "with the latest one's args")
	assert.Contains(t, lines[1], "level=WARN")
	l.Warn("full", "the disk is full")
	l.Warn("other", "another")
	assert.Len(t, o.lines(), 3, "after Close, repeats are dropped and new kinds logged")
}

func TestKindsAreSummarizedApart(t *testing.T) {
	l, o := newLogger(time.Hour)
	defer l.Close()
	for range 10 {
		l.Error("a", "first kind")
		l.Error("b", "second kind")
	}
	assert.Len(t, o.lines(), 2)
}

// TestACountComesEveryInterval: a kind that goes on repeating has its
// count logged once an interval; one that stops has its summary end,
// and its next message is logged at once.
func TestACountComesEveryInterval(t *testing.T) {
	l, o := newLogger(20 * time.Millisecond)
	defer l.Close()
	l.Info("k", "message", "n", 0)
	l.Info("k", "message", "n", 1)
	l.Info("k", "message", "n", 2)
	require.Eventually(t, func() bool { return len(o.lines()) == 2 }, 10*time.Second, time.Millisecond)
	assert.Contains(t, o.lines()[1], "repeats=2 ")
	assert.Contains(t, o.lines()[1], "n=2")
	// An interval with no repeat ends the summary; then the message is
	// new again, and logged at once, in full. (Polled more slowly than
	// the interval, so that the polls leave quiet intervals.)
	n := 3
	require.Eventually(t, func() bool {
		n++
		l.Info("k", "message", "n", n)
		lines := o.lines()
		last := lines[len(lines)-1]
		return strings.Contains(last, "n="+strconv.Itoa(n)) && !strings.Contains(last, "repeats=")
	}, 10*time.Second, 100*time.Millisecond)
}

func TestKeyIgnoresNumbers(t *testing.T) {
	for _, tc := range []struct{ a, b string }{
		{"write /d/tasks/000123.sst: no space", "write /d/tasks/000124.sst: no space"},
		{"[JOB 7] flush error", "[JOB 12] flush error"},
	} {
		assert.Equal(t, logsummary.Key("op", tc.a), logsummary.Key("op", tc.b))
	}
	assert.NotEqual(t, logsummary.Key("create task", "x"), logsummary.Key("update task", "x"))
	assert.NotEqual(t, logsummary.Key("a", "bc"), logsummary.Key("ab", "c"), "parts stay apart")
}
