package inboxkafka_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	inboxkafka "github.com/sqloutbox/outbox/inbox/kafka"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// logRecorder is a slog.Handler keeping every record's level and message.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r)
	return nil
}
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logRecorder) WithGroup(string) slog.Handler      { return h }

func (h *logRecorder) count(level slog.Level, msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.recs {
		if r.Level == level && strings.Contains(r.Message, msg) {
			n++
		}
	}
	return n
}

func probe(r *inboxkafka.Runner) (int, string) {
	rec := httptest.NewRecorder()
	r.HealthHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	b, _ := io.ReadAll(rec.Body)
	return rec.Code, string(b)
}

// TestMissingTopicFailsFast: with FailFast, Run on a topic that does not
// exist returns ErrTopicNotFound naming it; Ready says the same.
func TestMissingTopicFailsFast(t *testing.T) {
	t.Parallel()
	b, _ := startBroker(t, 1)
	c := ledgertest.NewDB(t, pgx)
	missing := randomName("nowhere.")
	r := newRunner(t, b.Addrs(), randomName("g-"), missing, c, func(cfg *inboxkafka.Config) { cfg.FailFast = true })
	if err := r.Ready(); !errors.Is(err, inboxkafka.ErrNotReady) {
		t.Fatalf("Ready before Run = %v, want ErrNotReady", err)
	}
	err := r.Run(testCtx(t, 60*time.Second))
	if !errors.Is(err, inboxkafka.ErrTopicNotFound) || !errors.Is(err, inbox.ErrSourceMissing) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("Run = %v, want ErrTopicNotFound naming %s", err, missing)
	}
	if code, body := probe(r); code != http.StatusServiceUnavailable || !strings.Contains(body, missing) {
		t.Fatalf("health handler: %d %q", code, body)
	}
}

// TestMissingTopicWarnsOnceThenConsumes: without FailFast, a runner on a
// topic that does not exist logs one WARN naming it and is not ready
// (ErrTopicNotFound); once the topic is created it consumes and is ready.
func TestMissingTopicWarnsOnceThenConsumes(t *testing.T) {
	t.Parallel()
	b, _ := startBroker(t, 1)
	c := ledgertest.NewDB(t, pgx)
	missing := randomName("nowhere.")
	logs := &logRecorder{}
	r := newRunner(t, b.Addrs(), randomName("g-"), missing, c, func(cfg *inboxkafka.Config) { cfg.Logger = slog.New(logs) })
	runRunner(t, r)
	ctx := testCtx(t, 120*time.Second)
	testdb.Eventually(t, ctx, "the missing topic reported", func() bool { return errors.Is(r.Ready(), inboxkafka.ErrTopicNotFound) })
	if code, body := probe(r); code != http.StatusServiceUnavailable || !strings.Contains(body, missing) {
		t.Fatalf("health handler: %d %q", code, body)
	}

	adm, err := kadm.NewOptClient(kgo.SeedBrokers(b.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, missing); err != nil {
		t.Fatal(err)
	}
	want := produce(t, b.Addrs(), missing, 2, 5)
	testdb.Eventually(t, ctx, "every record applied and the runner ready", func() bool {
		return r.Stats().Applied == 10 && r.Ready() == nil
	})
	if code, body := probe(r); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("health handler: %d %q", code, body)
	}
	if n := logs.count(slog.LevelWarn, "does not exist"); n != 1 {
		t.Fatalf("%d WARN lines about the missing topic, want 1", n)
	}
	if probs := ledgertest.Check(ledgertest.Read(t, c.DB, c.Ledger), want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
}
