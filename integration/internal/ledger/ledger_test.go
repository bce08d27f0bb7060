package ledger

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"

	"github.com/sqloutbox/outbox"
)

// TestRetryable: a transaction that never began (a connection reset by a
// loaded server while it started: CI's TestBrokerFaultsExactlyOnce failed
// on one) is retried like a deadlock; a cancelled writer, a failed commit
// and an application error are not.
func TestRetryable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"begin reset", fmt.Errorf("%w: failed to connect: %w", outbox.ErrBegin, syscall.ECONNRESET), true},
		{"begin cancelled", fmt.Errorf("%w: %w", outbox.ErrBegin, context.Canceled), false},
		{"begin past deadline", fmt.Errorf("%w: %w", outbox.ErrBegin, context.DeadlineExceeded), false},
		{"commit lost", fmt.Errorf("%w: %w", outbox.ErrCommit, io.ErrUnexpectedEOF), false},
		{"deadlock", errors.New("ERROR: deadlock detected (SQLSTATE 40P01)"), true},
		{"MariaDB lock wait", errors.New("Error 1205 (HY000): Lock wait timeout exceeded"), true},
		{"SQLite busy", errors.New("database is locked (5) (SQLITE_BUSY)"), true},
		{"other", errors.New("duplicate key"), false},
	} {
		if got := Retryable(tc.err); got != tc.want {
			t.Errorf("%s: Retryable(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
