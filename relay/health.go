package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Health defaults (see Config).
const (
	// DefaultHealthInterval is how often a running relay probes its
	// database (a ping) and, if the Publisher is a HealthChecker, its
	// broker.
	DefaultHealthInterval = 2 * time.Second
	// DefaultUnhealthyAfter is the readiness grace period: Ready fails
	// once the database, the broker or the relay's cycles have been
	// failing without a single success for longer than this. One failed
	// batch or probe does not make a relay unready.
	DefaultUnhealthyAfter = 10 * time.Second
	// DefaultStallTimeout is how long one relay cycle (claim, publish,
	// record outcomes) may run before Live reports the loop stuck. A
	// cycle is normally bounded by PublishTimeout plus a few
	// QueryTimeouts (about 1 minute at the defaults), so only a loop that
	// no longer makes progress at all exceeds it.
	DefaultStallTimeout = 3 * time.Minute
	// DefaultProgressInterval is how often a relay with work logs a
	// progress line (published since the last line, backlog, oldest
	// pending age).
	DefaultProgressInterval = 10 * time.Second
)

var (
	// ErrUnhealthy is wrapped by Ready while the database, the broker (a
	// HealthChecker Publisher) or the relay's cycles have been failing
	// for longer than Config.UnhealthyAfter.
	ErrUnhealthy = errors.New("outbox: relay unhealthy")
	// ErrStalled is wrapped by Live when the relay's loop has been inside
	// one cycle for longer than Config.StallTimeout.
	ErrStalled = errors.New("outbox: relay loop stalled")
)

// HealthChecker is an optional interface of a Publisher: when the
// Publisher given to New implements it, the running relay calls Healthy
// every Config.HealthInterval (with a deadline of Config.QueryTimeout) and
// counts an error as the broker failing. Healthy must honour ctx, must be
// safe for concurrent use with Publish, and should be cheap (a metadata
// round trip, not a produce). relay/kafka's Publisher implements it.
type HealthChecker interface {
	Healthy(ctx context.Context) error
}

// ReadinessObserver is an optional interface of an Observer (package
// metrics' RelayMetrics implements it to drive outbox_relay_up). The
// running relay calls Readiness with the result of Ready whenever it
// turns from nil to an error or back, at most once per
// Config.HealthInterval, and never after Observer.Up(false). Like
// Observer's methods it must not block.
type ReadinessObserver interface {
	Readiness(err error)
}

// streak is one health source's current run of failures.
type streak struct {
	since time.Time // first failure of the current run; zero while healthy
	last  error
}

func (s *streak) record(now time.Time, err error) (recovered bool) {
	if err == nil {
		recovered = !s.since.IsZero()
		s.since, s.last = time.Time{}, nil
		return recovered
	}
	if s.since.IsZero() {
		s.since = now
	}
	s.last = err
	return false
}

// health is what Ready, Live and the progress line read.
type health struct {
	mu                 sync.Mutex
	db, broker, cycles streak

	cycleStart atomic.Int64 // UnixNano of the running cycle's start; 0 between cycles
	claimed    atomic.Int64 // rows claimed since the last progress line
	published  atomic.Int64 // rows published since the last progress line
	busy       atomic.Int64 // nanoseconds from claim to publish of the batches counted in published

	reportMu sync.Mutex // serializes readiness reports with Observer.Up(false)
	reported *error     // last readiness told to the observer; nil before the first
	down     bool       // Observer.Up(false) was called: report nothing more
}

// record notes a result of source (nil: success); it returns true when a
// failure run of the database or the broker just ended.
func (h *health) record(s *streak, err error) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return s.record(time.Now(), err)
}

// failingFor returns how long s has been failing without a success (0
// while healthy).
func (h *health) failingFor(s *streak, now time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.since.IsZero() {
		return 0
	}
	return now.Sub(s.since)
}

// verdict returns an error wrapping ErrUnhealthy, and the last error of
// the source failing longest, if a source has been failing for longer
// than grace, or at all with an error wrapping ErrUnavailable (a missing
// topic, stream or exchange, refused authorization, a full stream: no
// retry fixes that, so the relay is unready from the first failure, not
// after the grace period).
func (h *health) verdict(now time.Time, grace time.Duration) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var worst *streak
	what := ""
	for _, s := range []struct {
		what string
		s    *streak
	}{{"the database", &h.db}, {"the broker", &h.broker}, {"relay cycles", &h.cycles}} {
		if s.s.since.IsZero() {
			continue
		}
		if errors.Is(s.s.last, ErrUnavailable) {
			return fmt.Errorf("%w: %s: %w", ErrUnhealthy, s.what, s.s.last)
		}
		if now.Sub(s.s.since) > grace && (worst == nil || s.s.since.Before(worst.since)) {
			worst, what = s.s, s.what
		}
	}
	if worst == nil {
		return nil
	}
	return fmt.Errorf("%w: %s failing for %s (more than %s): %w", ErrUnhealthy, what,
		now.Sub(worst.since).Round(time.Millisecond), grace, worst.last)
}

// Live reports whether the relay's loop makes progress: nil unless the
// loop has been inside one cycle for longer than Config.StallTimeout, then
// an error wrapping ErrStalled. It never fails because the database or the
// broker is down (those make cycles fail and back off, not hang), nor
// before Run started or after it returned: a liveness probe (the outbox
// command's /livez) serves it, and an orchestrator restarting a relay
// because its broker is down would only add restarts to the outage.
func (r *Relay) Live() error {
	start := r.health.cycleStart.Load()
	if start == 0 {
		return nil
	}
	if d := time.Since(time.Unix(0, start)); d > r.cfg.StallTimeout {
		return fmt.Errorf("%w: one cycle has been running for %s (more than %s)", ErrStalled, d.Round(time.Millisecond), r.cfg.StallTimeout)
	}
	return nil
}

// runCycle runs one cycle, recording its start for Live and its outcome
// for Ready.
func (r *Relay) runCycle(ctx context.Context) (int, error) {
	r.health.cycleStart.Store(time.Now().UnixNano())
	n, err := r.cycle(ctx)
	r.health.cycleStart.Store(0)
	r.health.record(&r.health.cycles, err)
	if n > 0 {
		r.health.claimed.Add(int64(n))
	}
	return n, err
}

// runHealth probes the database and the broker every HealthInterval until
// ctx ends, and tells a ReadinessObserver when readiness changes.
func (r *Relay) runHealth(ctx context.Context) {
	t := time.NewTicker(r.cfg.HealthInterval)
	defer t.Stop()
	for {
		r.probe(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *Relay) probe(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	err := r.db.PingContext(pctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		err = fmt.Errorf("pinging the database: %w", err)
	}
	recovered := r.health.record(&r.health.db, err)
	if hc, ok := r.cfg.Publisher.(HealthChecker); ok {
		pctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
		err := hc.Healthy(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			err = fmt.Errorf("broker health check: %w", err)
		}
		if r.health.record(&r.health.broker, err) {
			recovered = true
		}
	}
	if recovered {
		// A loop backing off after an outage retries now.
		select {
		case r.recovered <- struct{}{}:
		default:
		}
	}
	r.reportReadiness()
}

// reportReadiness tells the observer and the log when Ready changes
// between nil and an error.
func (r *Relay) reportReadiness() {
	r.health.reportMu.Lock()
	defer r.health.reportMu.Unlock()
	if r.health.down {
		return
	}
	err := r.Ready()
	prev := r.health.reported
	if prev != nil && (*prev == nil) == (err == nil) {
		return
	}
	r.health.reported = &err
	if err != nil {
		r.log.Warn("relay not ready", "error", err)
	} else if prev != nil {
		r.log.Info("relay ready again")
	}
	if ro, ok := r.cfg.Observer.(ReadinessObserver); ok {
		ro.Readiness(err)
	}
}

// runProgress logs a progress line every ProgressInterval while the relay
// has work (it claimed rows since the last line), and nothing while idle.
func (r *Relay) runProgress(ctx context.Context) {
	if r.cfg.ProgressInterval < 0 {
		return
	}
	t := time.NewTicker(r.cfg.ProgressInterval)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		claimed := r.health.claimed.Swap(0)
		published := r.health.published.Swap(0)
		busy := time.Duration(r.health.busy.Swap(0))
		now := time.Now()
		since := now.Sub(last)
		last = now
		if claimed == 0 && published == 0 {
			continue // idle: silent
		}
		qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
		backlog, oldest, err := r.backlog(qctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		// The rate over the time spent claiming and publishing, not over
		// the interval: 100 events published in 50 ms are 2,000/s, not
		// 10/s averaged over an idle 10 s.
		rate := 0.0
		if busy > 0 {
			rate = float64(int(float64(published)/busy.Seconds()*10)) / 10
		}
		attrs := []any{"published", published, "interval", since.Round(time.Millisecond).String(),
			"publishing", busy.Round(time.Millisecond).String(), "rate_per_second", rate}
		if err != nil {
			attrs = append(attrs, "backlog_error", err)
		} else {
			attrs = append(attrs, "backlog", backlog, "oldest_pending_age", oldest.Round(time.Millisecond).String())
		}
		r.log.Info("relay progress", attrs...)
	}
}

// backlog returns the table's pending rows and the age of the oldest, by
// the database clock (one query reading every pending row once, like a
// stats scrape).
func (r *Relay) backlog(ctx context.Context) (int64, time.Duration, error) {
	rows, err := r.db.QueryContext(ctx, r.d.Query("stats_pending"))
	if err != nil {
		return 0, 0, fmt.Errorf("reading the backlog: %w", err)
	}
	defer rows.Close()
	var total, oldest int64
	for rows.Next() {
		var p int
		var n, ageMicros int64
		if err := rows.Scan(&p, &n, &ageMicros); err != nil {
			return 0, 0, fmt.Errorf("reading the backlog: %w", err)
		}
		total += n
		oldest = max(oldest, ageMicros)
	}
	if err := rows.Err(); err != nil {
		return 0, 0, fmt.Errorf("reading the backlog: %w", err)
	}
	return total, time.Duration(oldest) * time.Microsecond, nil
}
