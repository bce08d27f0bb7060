package admin

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"
)

// endpointTimeout bounds each request to a relay's HTTP endpoint.
const endpointTimeout = 2 * time.Second

// endpointStatus is what a relay's own HTTP server says: its readiness
// (/readyz: 200 "ready", else 503 with the reason) and its broker (the
// broker label of outbox_relay_up in /metrics).
type endpointStatus struct {
	URL, Broker string
	Ready       bool
	Reason      string
}

var brokerLabel = regexp.MustCompile(`^outbox_relay_up\{[^}]*broker="([^"\\]*)"`)

// readEndpoints asks every Config.RelayEndpoints at once, each bounded by
// endpointTimeout.
func (h *Handler) readEndpoints(ctx context.Context) []endpointStatus {
	out := make([]endpointStatus, len(h.cfg.RelayEndpoints))
	var wg sync.WaitGroup
	for i, u := range h.cfg.RelayEndpoints {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = h.readEndpoint(ctx, u, h.endpointNames[i])
		}()
	}
	wg.Wait()
	return out
}

// readEndpoint asks base; name is base with its password redacted, what
// the page shows (an error's text is redacted too).
func (h *Handler) readEndpoint(ctx context.Context, base, name string) endpointStatus {
	st := endpointStatus{URL: name}
	ctx, cancel := context.WithTimeout(ctx, endpointTimeout)
	defer cancel()
	code, body, err := h.fetch(ctx, base+"/readyz", 4<<10)
	switch {
	case err != nil:
		st.Reason = "unreachable: " + strings.ReplaceAll(err.Error(), base, name)
		return st
	case code == http.StatusOK:
		st.Ready = true
	default:
		st.Reason = strings.TrimSpace(body)
		if st.Reason == "" {
			st.Reason = fmt.Sprintf("HTTP %d", code)
		}
	}
	if code, body, err := h.fetch(ctx, base+"/metrics", 4<<20); err == nil && code == http.StatusOK {
		sc := bufio.NewScanner(strings.NewReader(body))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if m := brokerLabel.FindStringSubmatch(sc.Text()); m != nil {
				st.Broker = m[1]
				break
			}
		}
	}
	return st
}

// fetch GETs u and returns its status and at most limit bytes of its body.
func (h *Handler) fetch(ctx context.Context, u string, limit int64) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, "", err
	}
	res, err := h.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, limit))
	return res.StatusCode, string(b), err
}
