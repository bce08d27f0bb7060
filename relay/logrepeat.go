package relay

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// repeatLogInterval is how often a failure that keeps repeating with the
// same cause is logged again (with the count of repeats in between).
const repeatLogInterval = time.Minute

// repeatLog logs a recurring failure once per distinct cause: the first
// occurrence in full, then repeats of the same message and cause at most
// once per repeatLogInterval with their count ("repeats", "since"), and,
// when the failures stop, one line saying after how many. The cause is
// the innermost error of the chain (causeOf), so the same broker or
// database fault met by different messages counts as one. Safe for
// concurrent use.
type repeatLog struct {
	log   *slog.Logger
	level slog.Level
	msg   string
	now   func() time.Time

	mu      sync.Mutex
	cause   string    // current cause; "" while not failing
	first   time.Time // when the current cause first appeared
	logged  time.Time // when a line was last written for it
	repeats int       // occurrences since the last line
	total   int       // occurrences of the current cause
}

func newRepeatLog(log *slog.Logger, level slog.Level, msg string) *repeatLog {
	return &repeatLog{log: log, level: level, msg: msg, now: time.Now}
}

// failed records one occurrence of err and logs it if it is a new cause,
// or if repeatLogInterval passed since the last line.
func (l *repeatLog) failed(err error, attrs ...any) {
	cause := causeOf(err)
	now := l.now()
	l.mu.Lock()
	switch {
	case cause != l.cause:
		l.cause, l.first, l.logged, l.repeats, l.total = cause, now, now, 0, 1
		l.mu.Unlock()
		l.log.Log(context.Background(), l.level, l.msg, append(attrs, "error", err)...)
		return
	case now.Sub(l.logged) >= repeatLogInterval:
		repeats, since := l.repeats+1, l.first
		l.logged, l.repeats = now, 0
		l.total++
		l.mu.Unlock()
		l.log.Log(context.Background(), l.level, l.msg+" (same cause again)", append(attrs, "repeats", repeats, "since", since.UTC().Format(time.RFC3339), "error", err)...)
		return
	}
	l.repeats++
	l.total++
	l.mu.Unlock()
}

// ok records that the operation succeeded: if it had been failing, one
// line says after how many failures it stopped.
func (l *repeatLog) ok() {
	l.mu.Lock()
	if l.cause == "" {
		l.mu.Unlock()
		return
	}
	total, since := l.total, l.first
	l.cause, l.repeats, l.total = "", 0, 0
	l.mu.Unlock()
	if total > 1 {
		l.log.Info(l.msg+": no longer failing", "failures", total, "since", since.UTC().Format(time.RFC3339))
	}
}

// causeOf returns the text of err's innermost error: it follows Unwrap
// and, for an error wrapping several (fmt.Errorf with two %w), the last
// one, which by this module's convention is the specific cause after a
// class sentinel ("%w: %w", ErrUnavailable, cause).
func causeOf(err error) string {
	for i := 0; err != nil && i < 100; i++ {
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			errs := u.Unwrap()
			if len(errs) == 0 {
				return err.Error()
			}
			err = errs[len(errs)-1]
			continue
		}
		next := errors.Unwrap(err)
		if next == nil {
			return err.Error()
		}
		err = next
	}
	if err == nil {
		return ""
	}
	return err.Error()
}
