package relay

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lib/pq"
)

// TestUnreadable: only the decoder's failures mark a slot unreadable
// (its internal errors, XX000, and pgoutput's "publication does not
// exist", 42704, in a change callback, from either driver), however they
// are wrapped; the result wraps ErrWALUnavailable once.
func TestUnreadable(t *testing.T) {
	t.Parallel()
	decoder := &pgconn.PgError{Code: "XX000", Message: `could not map filenode "base/1/2" to relation OID`}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"decoder error", decoder, true},
		{"decoder error wrapped", fmt.Errorf("%w: %w", ErrWALUnavailable, decoder), true},
		{"slot in use", &pgconn.PgError{Code: "55006"}, false},
		{"no such publication (not from the decoder)", &pgconn.PgError{Code: "42704", Message: `publication "p" does not exist`}, false},
		{"no such publication at a change, pgx", &pgconn.PgError{Code: "42704", Message: `publication "p" does not exist`,
			Where: `slot "s", output plugin "pgoutput", in the change callback, associated LSN 0/E0F0DE0`}, true},
		{"no such publication at a change, lib/pq", &pq.Error{Code: "42704", Message: `publication "p" does not exist`,
			Where: `slot "s", output plugin "pgoutput", in the change callback, associated LSN 0/E0F0DE0`}, true},
		{"not a server error", errors.New("connection reset"), false},
		{"nil", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := unreadable(tc.err)
			if errors.Is(got, ErrSlotUnreadable) != tc.want {
				t.Fatalf("unreadable(%v) = %v, ErrSlotUnreadable %v", tc.err, got, !tc.want)
			}
			if tc.want && !errors.Is(got, ErrWALUnavailable) {
				t.Fatalf("unreadable(%v) = %v, not ErrWALUnavailable", tc.err, got)
			}
			if tc.want && unreadable(got) != got {
				t.Fatalf("wrapped twice")
			}
		})
	}
}

// TestUnreadableWatch: a slot is recreated after three decoder errors at
// one position spanning the watch's time, not sooner; other failures at
// that position keep the count, and a stream that read on starts it over.
func TestUnreadableWatch(t *testing.T) {
	t.Parallel()
	bad := unreadable(&pgconn.PgError{Code: "XX000"})
	other := fmt.Errorf("%w: slot in use", ErrWALUnavailable)
	t0 := time.Unix(1000, 0)
	type step struct {
		err  error
		pos  pglogrepl.LSN
		at   time.Duration // since t0
		want bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"three failures past the time", []step{{bad, 10, 0, false}, {bad, 10, time.Second, false}, {bad, 10, 30 * time.Second, true}}},
		{"three failures too soon", []step{{bad, 10, 0, false}, {bad, 10, time.Second, false}, {bad, 10, 2 * time.Second, false}, {bad, 10, 30 * time.Second, true}}},
		{"time passed, two failures", []step{{bad, 10, 0, false}, {bad, 10, 40 * time.Second, false}, {bad, 10, 41 * time.Second, true}}},
		{"another failure between", []step{{bad, 10, 0, false}, {other, 10, time.Second, false}, {bad, 10, 2 * time.Second, false}, {bad, 10, 31 * time.Second, true}}},
		{"the stream read on", []step{{bad, 10, 0, false}, {bad, 10, time.Second, false}, {bad, 20, 30 * time.Second, false}, {bad, 20, 31 * time.Second, false}, {bad, 20, 60 * time.Second, true}}},
		{"only other failures", []step{{other, 10, 0, false}, {other, 10, time.Minute, false}, {other, 10, time.Hour, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := unreadableWatch{after: 30 * time.Second}
			for i, s := range tc.steps {
				if got := u.failed(s.err, s.pos, t0.Add(s.at)); got != s.want {
					t.Fatalf("step %d (%v at %d, +%v): recreate %v, want %v", i, s.err, s.pos, s.at, got, s.want)
				}
			}
		})
	}
}
