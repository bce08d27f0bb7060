package inboxrabbitmq_test

import (
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	inboxrabbitmq "github.com/sqloutbox/outbox/inbox/rabbitmq"
	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// TestMissingQueue: with FailFast, Run on a queue that does not exist
// returns ErrQueue and ErrNotFound naming it, and declares nothing;
// without it, the runner declares the queue and, with no Bindings, says
// in one WARN that nothing arrives; it is ready while it consumes. A
// binding to a missing exchange is ErrNotFound too.
func TestMissingQueue(t *testing.T) {
	t.Parallel()
	c := ledgertest.NewDB(t, pgx)
	ctx := testCtx(t, 60*time.Second)

	t.Run("FailFast", func(t *testing.T) {
		s := newSpace(t)
		r := newRunner(t, s, c, func(cfg *inboxrabbitmq.Config) { cfg.FailFast = true; cfg.Bindings = nil })
		if err := r.Ready(); !errors.Is(err, inboxrabbitmq.ErrNotReady) {
			t.Fatalf("Ready before Run = %v, want ErrNotReady", err)
		}
		err := r.Run(ctx)
		if !errors.Is(err, inboxrabbitmq.ErrQueue) || !errors.Is(err, inboxrabbitmq.ErrNotFound) || !errors.Is(err, inbox.ErrSourceMissing) ||
			!strings.Contains(err.Error(), s.queue) {
			t.Fatalf("Run = %v, want ErrQueue and ErrNotFound naming %s", err, s.queue)
		}
		if _, err := s.ch.QueueDeclarePassive(s.queue, true, false, false, false, nil); err == nil {
			t.Fatalf("the queue was declared by a refused Run")
		}
		if code, body := ledgertest.Probe(r.HealthHandler()); code != http.StatusServiceUnavailable || !strings.Contains(body, s.queue) {
			t.Fatalf("health handler: %d %q", code, body)
		}
	})
	t.Run("MissingExchange", func(t *testing.T) {
		s := newSpace(t)
		r := newRunner(t, s, c, func(cfg *inboxrabbitmq.Config) {
			cfg.Bindings = []inboxrabbitmq.Binding{{Exchange: s.exchange + ".missing", Key: "#"}}
		})
		if err := r.Run(ctx); !errors.Is(err, inboxrabbitmq.ErrNotFound) || !strings.Contains(err.Error(), "outbox rabbitmq declare --exchange") {
			t.Fatalf("Run = %v, want ErrNotFound naming the command", err)
		}
		if err := r.Ready(); !errors.Is(err, inboxrabbitmq.ErrNotReady) || !errors.Is(err, inboxrabbitmq.ErrNotFound) {
			t.Fatalf("Ready after Run = %v, want ErrNotReady and ErrNotFound", err)
		}
	})
	t.Run("DeclaredUnbound", func(t *testing.T) {
		s := newSpace(t)
		logs := &ledgertest.LogRecorder{}
		r := newRunner(t, s, c, func(cfg *inboxrabbitmq.Config) { cfg.Bindings = nil; cfg.Logger = slog.New(logs) })
		stop := run(t, r)
		testdb.Eventually(t, ctx, "consuming", func() bool { return r.Ready() == nil })
		if code, body := ledgertest.Probe(r.HealthHandler()); code != http.StatusOK || body != "ready\n" {
			t.Fatalf("health handler: %d %q", code, body)
		}
		if n := logs.Count(slog.LevelWarn, "did not exist"); n != 1 {
			t.Fatalf("%d WARN lines about the declared queue, want 1", n)
		}
		stop()
		if err := r.Ready(); !errors.Is(err, inboxrabbitmq.ErrNotReady) {
			t.Fatalf("Ready after Run = %v, want ErrNotReady", err)
		}
	})
}

// TestResumesSoonAfterAConnectionCut: connections refused for 4 s (the
// issue's cut); the runner is not ready meanwhile, with one WARN for the
// repeated error, and consumes again soon after the broker is back. It
// logs how long after (with the former 5 s backoff cap: over 2 s).
func TestResumesSoonAfterAConnectionCut(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	c := ledgertest.NewDB(t, pgx)
	u, err := url.Parse(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	u.Host = p.Addr()
	logs := &ledgertest.LogRecorder{}
	r := newRunner(t, s, c, func(cfg *inboxrabbitmq.Config) { cfg.URL = u.String(); cfg.Logger = slog.New(logs) })
	run(t, r)
	ctx := testCtx(t, 60*time.Second)
	testdb.Eventually(t, ctx, "consuming", func() bool { return r.Ready() == nil })
	p.Refuse(true)
	testdb.Eventually(t, ctx, "not ready during the cut", func() bool { return errors.Is(r.Ready(), inboxrabbitmq.ErrNotReady) })
	time.Sleep(4 * time.Second) // the outage itself, not a synchronisation
	p.Refuse(false)
	back := time.Now()
	testdb.Eventually(t, ctx, "consuming again", func() bool { return r.Ready() == nil })
	t.Logf("consuming again %s after the broker came back (4 s cut; ReconnectMax %s)", time.Since(back).Round(time.Millisecond), inboxrabbitmq.DefaultReconnectMax)
	if n := logs.Count(slog.LevelWarn, "connection lost"); n > 2 {
		t.Errorf("%d WARN lines for one cut, want at most 2 (the cut, the refused reconnection)", n)
	}
}
