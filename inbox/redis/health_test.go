package inboxredis_test

import (
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	inboxredis "github.com/sqloutbox/outbox/inbox/redis"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// TestMissingStreamKeyFailsFast: with FailFast, Run on a stream key that
// does not exist returns ErrStreamNotFound naming it, and creates nothing.
func TestMissingStreamKeyFailsFast(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	r := f.runner(t, func(c *inboxredis.Config) { c.FailFast = true })
	if err := r.Ready(); !errors.Is(err, inboxredis.ErrNotReady) {
		t.Fatalf("Ready before Run = %v, want ErrNotReady", err)
	}
	ctx := ledgertest.Context(t, 30*time.Second)
	err := r.Run(ctx)
	if !errors.Is(err, inboxredis.ErrStreamNotFound) || !errors.Is(err, inbox.ErrSourceMissing) || !strings.Contains(err.Error(), f.streams[0]) {
		t.Fatalf("Run = %v, want ErrStreamNotFound naming %s", err, f.streams[0])
	}
	if n, err := f.c.Exists(ctx, f.streams[0]).Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS %s = %d, %v after a refused Run, want 0", f.streams[0], n, err)
	}
	if code, body := ledgertest.Probe(r.HealthHandler()); code != http.StatusServiceUnavailable || !strings.Contains(body, f.streams[0]) {
		t.Fatalf("health handler: %d %q", code, body)
	}
}

// TestMissingStreamKeyWarnsOnceAndIsReady: without FailFast the runner
// creates a missing key (as before) and says so in one WARN; it is ready
// while it consumes, and not after Run returned.
func TestMissingStreamKeyWarnsOnceAndIsReady(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	logs := &ledgertest.LogRecorder{}
	r := f.runner(t, func(c *inboxredis.Config) { c.Logger = slog.New(logs) })
	stop := ledgertest.Serve(t, r.Run)
	ctx := ledgertest.Context(t, 60*time.Second)
	testdb.Eventually(t, ctx, "the WARN about the created key", func() bool { return logs.Count(slog.LevelWarn, "did not exist") > 0 })
	ids := f.publish(t, f.streams[0], []string{"a"}, 1, 3)
	testdb.Eventually(t, ctx, "every entry applied", func() bool { return f.applied(t) == len(ids) })
	if err := r.Ready(); err != nil {
		t.Fatalf("Ready while consuming = %v", err)
	}
	if code, body := ledgertest.Probe(r.HealthHandler()); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("health handler: %d %q", code, body)
	}
	if n := logs.Count(slog.LevelWarn, "did not exist"); n != 1 {
		t.Fatalf("%d WARN lines about the created key, want 1", n)
	}
	stop()
	if err := r.Ready(); !errors.Is(err, inboxredis.ErrNotReady) {
		t.Fatalf("Ready after Run = %v, want ErrNotReady", err)
	}
}
