package relay

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestCauseOf(t *testing.T) {
	t.Parallel()
	leaf := errors.New("nats: no responders available for request")
	for _, c := range []struct {
		err  error
		want string
	}{
		{leaf, leaf.Error()},
		{fmt.Errorf("message a#1: subject %q: %w", "x.a", fmt.Errorf("%w: no stream: %w", ErrUnavailable, leaf)), leaf.Error()},
		{fmt.Errorf("publishing 3 messages: %w", &BatchError{Err: fmt.Errorf("dial: %w", leaf)}), leaf.Error()},
		{errors.Join(errors.New("first"), leaf), leaf.Error()},
	} {
		if got := causeOf(c.err); got != c.want {
			t.Errorf("causeOf(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

// TestRepeatLog: the first failure of a cause is logged; repeats of it
// within repeatLogInterval are only counted; the next line after the
// interval carries the count; a new cause is logged at once; the end of
// the failures is one line with their number.
func TestRepeatLog(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := newRepeatLog(slog.New(slog.NewTextHandler(&buf, nil)), slog.LevelWarn, "cycle failed")
	l.now = func() time.Time { return now }
	refused := errors.New("connection refused")
	lines := func() []string { return strings.Split(strings.TrimSpace(buf.String()), "\n") }
	for i := 0; i < 10; i++ {
		l.failed(fmt.Errorf("message m%d: %w", i, refused))
		now = now.Add(time.Second)
	}
	if n := len(lines()); n != 1 {
		t.Fatalf("%d lines for 10 failures of one cause within a minute, want 1:\n%s", n, buf.String())
	}
	now = now.Add(repeatLogInterval)
	l.failed(refused)
	if got := lines(); len(got) != 2 || !strings.Contains(got[1], "same cause again") || !strings.Contains(got[1], "repeats=10") {
		t.Fatalf("after the interval: %q, want a second line counting 10 repeats", got)
	}
	l.failed(errors.New("timeout"))
	if got := lines(); len(got) != 3 || !strings.Contains(got[2], "error=timeout") {
		t.Fatalf("a new cause: %q, want it logged at once", got)
	}
	l.failed(errors.New("timeout"))
	l.ok()
	l.ok()
	if got := lines(); len(got) != 4 || !strings.Contains(got[3], "no longer failing") || !strings.Contains(got[3], "failures=2") {
		t.Fatalf("after recovery: %q, want one line with 2 failures", got)
	}
}
