package consume

import (
	"bytes"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sqloutbox/outbox/inbox"
)

// TestHealth: not ready until OK; one WARN per distinct problem however
// often it repeats, one INFO when it is over; the handler answers 503 with
// the reason on one line, then 200 "ready".
func TestHealth(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	h := NewHealth(slog.New(slog.NewTextHandler(&buf, nil)))
	serve := func() (int, string) {
		rec := httptest.NewRecorder()
		Handler(h.Ready).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code, rec.Body.String()
	}
	if err := h.Ready(); !errors.Is(err, inbox.ErrNotReady) {
		t.Fatalf("Ready before OK = %v", err)
	}
	h.OK("consuming")
	if err := h.Ready(); err != nil {
		t.Fatalf("Ready after OK = %v", err)
	}
	missing := errors.New("stream X does not exist:\ncreate it")
	for range 5 {
		h.Problem("missing", missing, "the stream does not exist")
	}
	if err := h.Ready(); !errors.Is(err, inbox.ErrNotReady) || !errors.Is(err, missing) {
		t.Fatalf("Ready during the problem = %v", err)
	}
	if code, body := serve(); code != http.StatusServiceUnavailable || body != "not ready: inbox: runner not ready: stream X does not exist: create it\n" {
		t.Fatalf("handler: %d %q", code, body)
	}
	h.Problem("other", errors.New("other"), "another problem")
	h.OK("consuming again")
	h.OK("consuming again")
	if code, body := serve(); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("handler: %d %q", code, body)
	}
	out := buf.String()
	if n := strings.Count(out, "level=WARN"); n != 2 {
		t.Fatalf("%d WARN lines, want 2 (one per distinct problem):\n%s", n, out)
	}
	if n := strings.Count(out, "consuming again"); n != 1 {
		t.Fatalf("%d INFO lines for the recovery, want 1:\n%s", n, out)
	}
	h.Stopped(nil)
	if err := h.Ready(); !errors.Is(err, inbox.ErrNotReady) {
		t.Fatalf("Ready after Stopped = %v", err)
	}
}
