package relay

import (
	"fmt"
	"net/http"
	"strings"
)

// ReadyHandler returns an http.Handler serving Ready as a readiness probe,
// as the outbox command's /readyz does: status 200 and the body "ready\n"
// while Ready returns nil; otherwise 503 and "not ready: " followed by
// Ready's error on one line (text/plain). Mount it in the application's
// own server (mux.Handle("/readyz", r.ReadyHandler())) for an in-process
// relay. It answers any method and path it is mounted at, and is safe
// for concurrent use; the error carries no DSN or password.
func (r *Relay) ReadyHandler() http.Handler {
	return probeHandler("ready", r.Ready)
}

// LiveHandler returns an http.Handler serving Live as a liveness probe,
// as the outbox command's /livez does: 200 and "ok\n" while Live returns
// nil; otherwise 503 and "not live: " followed by Live's error on one line.
func (r *Relay) LiveHandler() http.Handler {
	return probeHandler("live", r.Live)
}

// probeHandler serves check: 200 with ok ("ready" or "ok") or 503 with
// "not <what>: <error>".
func probeHandler(what string, check func() error) http.Handler {
	ok := "ok"
	if what == "ready" {
		ok = "ready"
	}
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if err := check(); err != nil {
			http.Error(w, "not "+what+": "+strings.Join(strings.Fields(err.Error()), " "), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = fmt.Fprintln(w, ok)
	})
}
