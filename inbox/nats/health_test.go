package inboxnats_test

import (
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	inboxnats "github.com/sqloutbox/outbox/inbox/nats"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// TestMissingStreamFailsFast: with FailFast, Run on a stream that does
// not exist returns ErrStreamNotFound at once, naming the stream and the
// command that creates it; Ready says the same.
func TestMissingStreamFailsFast(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	c := ledgertest.NewDB(t, pgx)
	missing := randomName("nowhere_")
	r := newRunner(t, s, c, func(cfg *inboxnats.Config) { cfg.Stream = missing; cfg.FailFast = true })
	if err := r.Ready(); !errors.Is(err, inboxnats.ErrNotReady) {
		t.Fatalf("Ready before Run = %v, want ErrNotReady", err)
	}
	err := r.Run(testCtx(t, 60*time.Second))
	if !errors.Is(err, inboxnats.ErrStreamNotFound) || !errors.Is(err, inbox.ErrSourceMissing) {
		t.Fatalf("Run = %v, want ErrStreamNotFound", err)
	}
	if want := "outbox nats stream create --stream " + missing; !strings.Contains(err.Error(), want) {
		t.Fatalf("Run = %v, want it to say %q", err, want)
	}
	if err := r.Ready(); !errors.Is(err, inboxnats.ErrNotReady) || !errors.Is(err, inboxnats.ErrStreamNotFound) {
		t.Fatalf("Ready after Run = %v, want ErrNotReady and ErrStreamNotFound", err)
	}
	if code, body := ledgertest.Probe(r.HealthHandler()); code != http.StatusServiceUnavailable || !strings.Contains(body, "outbox nats stream create") {
		t.Fatalf("health handler: %d %q", code, body)
	}
	if _, err := s.js.KeyValue(testCtx(t, 10*time.Second), s.Bucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("lease bucket after a refused Run: %v, want none", err)
	}
}

// TestMissingStreamWarnsOnceThenConsumes: without FailFast, a runner on a
// stream that does not exist logs one WARN naming it (not one per retry),
// is not ready (ErrStreamNotFound) and does not count restarts; once the
// stream is created it consumes and is ready.
func TestMissingStreamWarnsOnceThenConsumes(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	ctx := testCtx(t, 90*time.Second)
	st, err := s.js.Stream(ctx, s.Stream)
	if err != nil {
		t.Fatal(err)
	}
	scfg := st.CachedInfo().Config
	if err := s.js.DeleteStream(ctx, s.Stream); err != nil {
		t.Fatal(err)
	}
	c := ledgertest.NewDB(t, pgx)
	logs := &ledgertest.LogRecorder{}
	r := newRunner(t, s, c, func(cfg *inboxnats.Config) { cfg.Logger = slog.New(logs) })
	runRunner(t, r)
	testdb.Eventually(t, ctx, "three looks for the missing stream", func() bool {
		return logs.Count(slog.LevelDebug, "still does not exist") >= 3
	})
	if err := r.Ready(); !errors.Is(err, inboxnats.ErrNotReady) || !errors.Is(err, inboxnats.ErrStreamNotFound) ||
		!strings.Contains(err.Error(), "outbox nats stream create --stream "+s.Stream) {
		t.Fatalf("Ready = %v, want ErrStreamNotFound naming the command", err)
	}
	if code, _ := ledgertest.Probe(r.HealthHandler()); code != http.StatusServiceUnavailable {
		t.Fatalf("health handler: %d, want 503", code)
	}
	if n := logs.Count(slog.LevelWarn, ""); n != 1 {
		t.Fatalf("%d WARN lines while the stream is missing, want 1", n)
	}
	if st := r.Stats(); st.Restarts != 0 {
		t.Fatalf("stats %+v: restarts counted while the stream is missing", st)
	}

	if _, err := s.js.CreateStream(ctx, scfg); err != nil {
		t.Fatal(err)
	}
	want := s.publish(t, 3, 1, 5)
	testdb.Eventually(t, ctx, "every message applied once the stream exists", func() bool {
		return r.Stats().Applied == 15
	})
	if err := r.Ready(); err != nil {
		t.Fatalf("Ready while consuming = %v", err)
	}
	if code, body := ledgertest.Probe(r.HealthHandler()); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("health handler: %d %q, want 200 ready", code, body)
	}
	if probs := ledgertest.Check(ledgertest.Read(t, c.DB, c.Ledger), want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
}

// TestDefaultMaxAckPending: the session's consumer gets MaxAckPending 256
// by default (what a handover under a backlog delivers again is bounded
// by it), and 2 × Workers × BatchSize with batches.
func TestDefaultMaxAckPending(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		batch int
		want  int
	}{{"single", 0, 256}, {"batch64", 64, 1024}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSpace(t)
			c := ledgertest.NewDB(t, pgx)
			r := newRunner(t, s, c, func(cfg *inboxnats.Config) { cfg.BatchSize = tc.batch })
			runRunner(t, r)
			ctx := testCtx(t, 60*time.Second)
			testdb.Eventually(t, ctx, "consuming", func() bool { return r.Ready() == nil && r.ConsumerName() != "" })
			if got := s.consumerInfo(t, r.ConsumerName()).Config.MaxAckPending; got != tc.want {
				t.Fatalf("MaxAckPending %d, want %d", got, tc.want)
			}
		})
	}
}
