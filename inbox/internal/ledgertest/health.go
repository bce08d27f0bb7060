package ledgertest

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
)

// LogRecorder is a slog.Handler keeping every record, for tests that
// count a runner's log lines (slog.New(&LogRecorder{})). Safe for
// concurrent use.
type LogRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

// Enabled implements slog.Handler: every level.
func (h *LogRecorder) Enabled(context.Context, slog.Level) bool { return true }

// Handle implements slog.Handler.
func (h *LogRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r)
	return nil
}

// WithAttrs implements slog.Handler; the attributes are not kept.
func (h *LogRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }

// WithGroup implements slog.Handler; the group is not kept.
func (h *LogRecorder) WithGroup(string) slog.Handler { return h }

// Count returns how many records of level have a message containing msg
// ("" counts every record of level).
func (h *LogRecorder) Count(level slog.Level, msg string) int {
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

// Probe serves one GET /readyz from h (a runner's HealthHandler) and
// returns the status code and the body.
func Probe(h http.Handler) (int, string) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	b, _ := io.ReadAll(rec.Body)
	return rec.Code, string(b)
}
