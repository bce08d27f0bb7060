package relay_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

// TestStopAfterPoolClosedLogsOnce: a relay whose pool was closed before
// it stopped (the wrong shutdown order) cannot release its partition
// leases or its membership; it says so in one WARN line naming the
// partitions, not one line per partition (33 lines before, with 32
// partitions and the membership).
func TestStopAfterPoolClosedLogsOnce(t *testing.T) {
	t.Parallel()
	e := testdb.New(t, testdb.All[0], driver.Config{})
	ob, db := e.OpenWriter(t, driver.Config{})
	var log syncLog
	r, err := relay.New(ob, db, relay.Config{Publisher: outboxtest.NewPublisher(), PollInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	run := make(chan error, 1)
	go func() { run <- r.Run(context.Background()) }()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(logText(&log), "partition leases acquired") {
		if time.Now().After(deadline) {
			t.Fatalf("no leases acquired within 30 s:\n%s", logText(&log))
		}
		time.Sleep(10 * time.Millisecond) // polling a condition with a deadline
	}
	if err := db.Close(); err != nil { // the pool first: the wrong order
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if err := runError(t, run); err != nil {
		t.Fatalf("run: %v", err)
	}
	var leaseLines []map[string]any
	for _, l := range log.lines() {
		msg, _ := l["msg"].(string)
		if l["level"] == "WARN" && (strings.Contains(msg, "lease") || strings.Contains(msg, "relay group")) {
			leaseLines = append(leaseLines, l)
		}
	}
	if len(leaseLines) != 1 {
		t.Fatalf("%d WARN lines about leases at stop, want 1:\n%s", len(leaseLines), logText(&log))
	}
	if ps, _ := leaseLines[0]["partitions"].([]any); len(ps) == 0 {
		t.Errorf("the line does not name the partitions left to expire: %v", leaseLines[0])
	}
}

func logText(l *syncLog) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestProbeHandlers: ReadyHandler answers 503 "not ready: ..." before Run,
// 200 "ready" while the relay runs and 503 again after it stopped;
// LiveHandler answers 200 "ok" while the loop is not stuck.
func TestProbeHandlers(t *testing.T) {
	t.Parallel()
	e := testdb.New(t, testdb.All[3], driver.Config{})
	r, err := relay.New(e.Outbox, e.RelayDB, relay.Config{Publisher: outboxtest.NewPublisher(), Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	get := func(h http.Handler) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get(r.ReadyHandler()); code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "not ready: ") || !strings.Contains(body, relay.ErrNotRunning.Error()) {
		t.Errorf("before Run: %d %q, want 503 not ready: %v", code, body, relay.ErrNotRunning)
	}
	run := make(chan error, 1)
	go func() { run <- r.Run(context.Background()) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := get(r.ReadyHandler())
		if code == http.StatusOK {
			if body != "ready\n" {
				t.Errorf("running: body %q, want %q", body, "ready\n")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready within 30 s: %d %q", code, body)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition with a deadline
	}
	if code, body := get(r.LiveHandler()); code != http.StatusOK || body != "ok\n" {
		t.Errorf("live: %d %q, want 200 ok", code, body)
	}
	stopRelay(t, r, run)
	if code, _ := get(r.ReadyHandler()); code != http.StatusServiceUnavailable {
		t.Errorf("after Stop: %d, want 503", code)
	}
}
