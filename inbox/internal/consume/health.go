package consume

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"github.com/sqloutbox/outbox/inbox"
)

// Health is a runner's readiness, shared by the four runners: what Ready
// returns and the HTTP handler serves, and the log of its problems, one
// WARN per distinct problem (not one per retry) and one INFO when it is
// over.
type Health struct {
	log *slog.Logger

	mu      sync.Mutex
	err     error  // nil: ready
	problem string // the key of the problem last logged, "" none
}

// NewHealth returns a Health that is not ready ("not started").
func NewHealth(log *slog.Logger) *Health {
	return &Health{log: log, err: fmt.Errorf("%w: Run has not started consuming", inbox.ErrNotReady)}
}

// Ready returns nil while the runner is ready, else an error wrapping
// inbox.ErrNotReady (and the cause).
func (h *Health) Ready() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// OK marks the runner ready; if a problem was logged, it logs at INFO
// that it is over (msg, args).
func (h *Health) OK(msg string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.err = nil
	if h.problem != "" {
		h.log.Info(msg, append(args, "after", h.problem)...)
		h.problem = ""
	}
}

// Problem marks the runner not ready because of err, and logs err at WARN
// with msg unless the last problem logged has the same key (a retry of
// the same problem): one line per distinct problem. It returns whether
// it logged.
func (h *Health) Problem(key string, err error, msg string, args ...any) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.err = fmt.Errorf("%w: %w", inbox.ErrNotReady, err)
	if h.problem == key {
		return false
	}
	h.problem = key
	h.log.Warn(msg, append(args, "err", err)...)
	return true
}

// Stopped marks the runner not ready because Run returned (err, if not
// nil, is why).
func (h *Health) Stopped(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		h.err = fmt.Errorf("%w: Run returned: %w", inbox.ErrNotReady, err)
		return
	}
	h.err = fmt.Errorf("%w: Run returned", inbox.ErrNotReady)
}

// Handler returns an http.Handler serving ready (e.g. Ready of a
// runner): 200 "ready" while it returns nil, else 503 "not ready: " and
// the error on one line, whatever the path and method.
func Handler(ready func() error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, "not ready: "+oneLine(err.Error()), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = fmt.Fprintln(w, "ready")
	})
}

// oneLine folds line breaks into spaces.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
