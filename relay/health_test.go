package relay_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

var sqliteTarget = testdb.Target{Name: "sqlite", Dialect: driver.SQLite}

// healthPublisher is an outboxtest.Publisher that is a relay.HealthChecker
// whose answer the test sets, and whose Publish can be made to hang,
// ignoring its context, until released.
type healthPublisher struct {
	*outboxtest.Publisher
	unhealthy atomic.Pointer[error]
	checks    atomic.Int64 // Healthy calls
	hang      atomic.Pointer[chan struct{}]
	hanging   chan struct{} // receives when a Publish starts hanging
}

func newHealthPublisher() *healthPublisher {
	return &healthPublisher{Publisher: outboxtest.NewPublisher(), hanging: make(chan struct{}, 1)}
}

func (p *healthPublisher) Healthy(context.Context) error {
	p.checks.Add(1)
	if e := p.unhealthy.Load(); e != nil {
		return *e
	}
	return nil
}

func (p *healthPublisher) setHealthy(err error) {
	if err == nil {
		p.unhealthy.Store(nil)
		return
	}
	p.unhealthy.Store(&err)
}

func (p *healthPublisher) Publish(ctx context.Context, msgs []relay.Message) error {
	if h := p.hang.Load(); h != nil {
		select {
		case p.hanging <- struct{}{}:
		default:
		}
		<-*h // a publisher that ignores ctx: the loop is stuck
	}
	return p.Publisher.Publish(ctx, msgs)
}

// readinessLog is a relay.Observer and relay.ReadinessObserver recording
// readiness changes.
type readinessLog struct {
	nopObserver
	mu      sync.Mutex
	changes []error
}

func (o *readinessLog) Readiness(err error) {
	o.mu.Lock()
	o.changes = append(o.changes, err)
	o.mu.Unlock()
}

// last returns how many changes were heard and the latest.
func (o *readinessLog) last() (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.changes) == 0 {
		return 0, nil
	}
	return len(o.changes), o.changes[len(o.changes)-1]
}

type nopObserver struct{}

func (nopObserver) Claimed(int, time.Duration)                    {}
func (nopObserver) Published(relay.Message, time.Duration)        {}
func (nopObserver) Failed(relay.Message, relay.ErrorClass, error) {}
func (nopObserver) Retried(relay.Message, int, time.Duration)     {}
func (nopObserver) DeadLettered(relay.Message, error)             {}
func (nopObserver) Leases(int)                                    {}
func (nopObserver) Up(bool)                                       {}

// TestReadinessFollowsPublisherHealth: a broker (HealthChecker) failing
// for longer than UnhealthyAfter makes Ready fail with ErrUnhealthy, and
// not before; Live stays nil; readiness returns once the broker answers,
// and the ReadinessObserver hears both changes.
func TestReadinessFollowsPublisherHealth(t *testing.T) {
	t.Parallel()
	const grace = 300 * time.Millisecond
	pub := newHealthPublisher()
	obs := &readinessLog{}
	b := setup(t, sqliteTarget, func(c *relay.Config) {
		c.Publisher = pub
		c.Observer = obs
		c.HealthInterval = 20 * time.Millisecond
		c.UnhealthyAfter = grace
	})
	eventually(t, b.ctx, "ready", func() bool { return b.r.Ready() == nil })

	down := errors.New("broker unreachable (test)")
	cut := time.Now()
	pub.setHealthy(down)
	eventually(t, b.ctx, "not ready", func() bool { return b.r.Ready() != nil })
	if took := time.Since(cut); took < grace {
		t.Errorf("not ready after %v, before the grace period %v", took, grace)
	}
	err := b.r.Ready()
	if !errors.Is(err, relay.ErrUnhealthy) || !errors.Is(err, down) || !strings.Contains(err.Error(), "the broker failing for") {
		t.Errorf("Ready: %v; want ErrUnhealthy wrapping the broker's error", err)
	}
	if err := b.r.Live(); err != nil {
		t.Errorf("Live while the broker is down: %v", err)
	}
	eventually(t, b.ctx, "observer told not ready", func() bool { _, e := obs.last(); return e != nil })

	pub.setHealthy(nil)
	eventually(t, b.ctx, "ready again", func() bool { return b.r.Ready() == nil })
	eventually(t, b.ctx, "observer told ready", func() bool { n, e := obs.last(); return e == nil && n >= 3 })

	// Still relaying.
	b.emit(t, event("h", 1))
	if _, err := pub.WaitForCount(b.ctx, 1); err != nil {
		t.Fatal(err)
	}
}

// TestReadinessGraceIgnoresShortFailures: failed checks (three in a row
// each time) shorter than UnhealthyAfter never make the relay unready.
func TestReadinessGraceIgnoresShortFailures(t *testing.T) {
	t.Parallel()
	pub := newHealthPublisher()
	obs := &readinessLog{}
	b := setup(t, sqliteTarget, func(c *relay.Config) {
		c.Publisher = pub
		c.Observer = obs
		c.HealthInterval = 10 * time.Millisecond
		c.UnhealthyAfter = time.Hour
	})
	// Ready reported: the first report may be ErrNotRunning (the health
	// loop can probe before Run has marked the relay running; under load
	// it often does), the next one nil.
	eventually(t, b.ctx, "readiness reported", func() bool { n, e := obs.last(); return n >= 1 && e == nil })
	for i := range 5 {
		n, _ := obs.last()
		pub.setHealthy(fmt.Errorf("blip %d", i))
		seen := pub.checks.Load()
		eventually(t, b.ctx, "three failed checks", func() bool { return pub.checks.Load() >= seen+3 })
		pub.setHealthy(nil)
		if err := b.r.Ready(); err != nil {
			t.Fatalf("blip %d made the relay unready: %v", i, err)
		}
		if m, e := obs.last(); e != nil || m != n {
			t.Fatalf("observer heard %v", e)
		}
	}
}

// TestLiveFailsWhenTheLoopIsStuck: a Publish that ignores its deadline
// keeps the loop inside one cycle; after StallTimeout Live (and Ready)
// fail with ErrStalled, and recover once the cycle ends.
func TestLiveFailsWhenTheLoopIsStuck(t *testing.T) {
	t.Parallel()
	const stall = 300 * time.Millisecond
	pub := newHealthPublisher()
	release := make(chan struct{})
	pub.hang.Store(&release)
	b := setup(t, sqliteTarget, func(c *relay.Config) {
		c.Publisher = pub
		c.PublishTimeout = 50 * time.Millisecond
		c.StallTimeout = stall
		c.HealthInterval = 20 * time.Millisecond
	})
	eventually(t, b.ctx, "ready", func() bool { return b.r.Ready() == nil })
	hung := time.Now() // before the cycle starts
	b.emit(t, event("s", 1))
	select {
	case <-pub.hanging:
	case <-b.ctx.Done():
		t.Fatal("publish never started")
	}
	if err := b.r.Live(); err != nil {
		t.Errorf("Live at once: %v", err)
	}
	eventually(t, b.ctx, "not live", func() bool { return b.r.Live() != nil })
	// The cycle that claims the event may have started just before hung
	// (a poll cycle, at most one PollInterval, 20 ms, apart, whose claim
	// ran after the emit's commit): Live counts from the cycle's start.
	// CI saw 298 ms against 300 under load.
	if took := time.Since(hung); took < stall-20*time.Millisecond {
		t.Errorf("not live after %v, before StallTimeout %v", took, stall)
	}
	if err := b.r.Live(); !errors.Is(err, relay.ErrStalled) {
		t.Errorf("Live: %v, want ErrStalled", err)
	}
	if err := b.r.Ready(); !errors.Is(err, relay.ErrStalled) {
		t.Errorf("Ready while stuck: %v, want ErrStalled", err)
	}
	pub.hang.Store(nil)
	close(release)
	eventually(t, b.ctx, "live again", func() bool { return b.r.Live() == nil })
	if _, err := pub.WaitForCount(b.ctx, 1); err != nil {
		t.Fatal(err)
	}
}

// syncLog collects JSON log lines.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) lines() []map[string]any {
	l.mu.Lock()
	text := l.b.String()
	l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// durationKeys are the log attributes that hold a duration.
var durationKeys = []string{"retry_in", "poll_interval", "lease_ttl", "interval", "oldest_pending_age",
	"drain_timeout", "retention", "timeout", "unhealthy_after", "stall_timeout"}

// checkDurations fails t for a duration attribute that is not a string in
// time.Duration.String's form.
func checkDurations(t *testing.T, lines []map[string]any) (seen int) {
	t.Helper()
	for _, m := range lines {
		for _, k := range durationKeys {
			v, ok := m[k]
			if !ok {
				continue
			}
			seen++
			s, isString := v.(string)
			d, err := time.ParseDuration(s)
			if !isString || err != nil || d.String() != s {
				t.Errorf("%q: %v (%T) is not a duration string: %v", k, v, v, m)
			}
		}
	}
	return seen
}

// TestProgressAndDurationsInLogs: a relay with work logs "relay progress"
// lines (published, backlog, oldest pending age); every duration in its
// JSON log, including retry delays and the progress line's, is a
// time.Duration string ("1s", "80.681412ms"), never integer nanoseconds.
func TestProgressAndDurationsInLogs(t *testing.T) {
	t.Parallel()
	var logs syncLog
	pub := outboxtest.NewPublisher()
	var failed atomic.Bool
	pub.FailWith(func(m relay.Message) error {
		if m.AggregateID == "flaky" && !failed.Swap(true) {
			return errors.New("refused once (test)")
		}
		return nil
	})
	b := setup(t, sqliteTarget, func(c *relay.Config) {
		c.Publisher = pub
		c.ProgressInterval = 50 * time.Millisecond
		c.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) // no ReplaceAttr: the relay's own attributes
	})
	b.emit(t, event("flaky", 1), event("a", 1), event("a", 2))
	if _, err := pub.WaitForCount(b.ctx, 3); err != nil {
		t.Fatal(err)
	}
	var progress map[string]any
	eventually(t, b.ctx, "a progress line", func() bool {
		for _, m := range logs.lines() {
			if m["msg"] == "relay progress" {
				progress = m
				return true
			}
		}
		return false
	})
	for _, k := range []string{"published", "backlog", "oldest_pending_age", "interval", "publishing", "rate_per_second"} {
		if _, ok := progress[k]; !ok {
			t.Fatalf("progress line lacks %s: %v", k, progress)
		}
	}
	// The rate is over the time spent publishing, not over the interval.
	// (Not bounded by the interval's rate: under load a batch claimed
	// before the interval began can make the publishing time the longer.)
	published, rate := progress["published"].(float64), progress["rate_per_second"].(float64)
	busy, err := time.ParseDuration(progress["publishing"].(string))
	if err != nil || rate <= 0 {
		t.Errorf("rate_per_second %v for %v published in %v (%v): want the rate over the publishing time", rate, published, busy, err)
	}
	if busy >= 10*time.Millisecond { // rounded to the millisecond: compare where that is precise
		if want := published / busy.Seconds(); rate < 0.9*want || rate > 1.1*want {
			t.Errorf("rate_per_second %v, want about %v (%v in %v)", rate, want, published, busy)
		}
	}
	lines := logs.lines()
	if n := checkDurations(t, lines); n < 3 {
		t.Errorf("only %d duration attributes in the log (want relay started, retry_in, progress):\n%v", n, lines)
	}
	retried := false
	for _, m := range lines {
		if _, ok := m["retry_in"]; ok {
			retried = true
		}
	}
	if !retried {
		t.Errorf("no retry_in in the log: %v", lines)
	}
}

// TestProgressSilentWhenIdle: an idle relay logs no progress line. (An
// absence can only be shown over a window: five progress intervals.)
func TestProgressSilentWhenIdle(t *testing.T) {
	t.Parallel()
	var logs syncLog
	b := setup(t, sqliteTarget, func(c *relay.Config) {
		c.ProgressInterval = 20 * time.Millisecond
		c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	})
	eventually(t, b.ctx, "ready", func() bool { return b.r.Ready() == nil })
	select {
	case <-time.After(100 * time.Millisecond):
	case err := <-b.run:
		t.Fatalf("relay ended: %v", err)
	}
	for _, m := range logs.lines() {
		if m["msg"] == "relay progress" {
			t.Errorf("idle relay logged progress: %v", m)
		}
	}
}

// TestNewValidatesHealthSettings: negative health settings and a
// StallTimeout not above PublishTimeout are ErrInvalidConfig.
func TestNewValidatesHealthSettings(t *testing.T) {
	t.Parallel()
	ob := sqliteOutbox(t)
	for _, c := range []relay.Config{
		{HealthInterval: -1}, {UnhealthyAfter: -1},
		{StallTimeout: time.Second, PublishTimeout: 2 * time.Second},
		{StallTimeout: -1},
	} {
		c.Publisher = outboxtest.NewPublisher()
		if _, err := relay.New(ob, new(sql.DB), c); !errors.Is(err, relay.ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig", c, err)
		}
	}
}

// TestFirstReadinessReportIsReady: a relay that starts healthy reports
// ready first, never ErrNotRunning. Run is held just after its background
// loops started until the health loop has reported once. REGRESSION: the
// health loop started before Run marked the relay running, so its first
// probe could report "not running" (a "relay not ready" warning at every
// start and outbox_relay_up 0 for a moment); under load it did.
func TestFirstReadinessReportIsReady(t *testing.T) {
	t.Parallel()
	obs := &readinessLog{}
	b := setup(t, sqliteTarget, func(c *relay.Config) {
		c.Publisher = newHealthPublisher()
		c.Observer = obs
		c.HealthInterval = time.Millisecond
	}, func(r *relay.Relay) {
		r.OnLoopsStarted(func() {
			// The health loop's first report, before Run goes on.
			deadline := time.Now().Add(time.Minute)
			for n, _ := obs.last(); n == 0 && time.Now().Before(deadline); n, _ = obs.last() {
				time.Sleep(time.Millisecond) // polling a condition with a deadline
			}
		})
	})
	eventually(t, b.ctx, "a readiness report", func() bool { n, _ := obs.last(); return n >= 1 })
	obs.mu.Lock()
	first := obs.changes[0]
	obs.mu.Unlock()
	if first != nil {
		t.Errorf("first readiness report %v, want ready (nil)", first)
	}
}

// TestUnavailableUnreadyAtOnceLoggedOnce: a publish refused as
// misconfigured (ErrUnavailable: a missing stream, topic or exchange)
// makes the relay unready from the first failed cycle, not after
// UnhealthyAfter (an hour here); the refusal is logged once however many
// cycles repeat it (they back off and retry), and its end once, with the
// count.
func TestUnavailableUnreadyAtOnceLoggedOnce(t *testing.T) {
	t.Parallel()
	logs := &syncLog{}
	pub := outboxtest.NewPublisher()
	missing := fmt.Errorf("%w: no stream stores subject outbox.event.acct (test)", relay.ErrUnavailable)
	pub.FailWith(func(m relay.Message) error { return fmt.Errorf("message %s: %w", m.MessageID, missing) })
	b := setup(t, sqliteTarget, func(c *relay.Config) {
		c.Publisher = pub
		c.UnhealthyAfter = time.Hour
		c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	})
	b.emit(t, event("A", 1), event("B", 1), event("C", 1))
	eventually(t, b.ctx, "four refused cycles", func() bool { return pub.Batches() >= 4 })
	if err := b.r.Ready(); !errors.Is(err, relay.ErrUnhealthy) || !errors.Is(err, relay.ErrUnavailable) {
		t.Fatalf("Ready after refused cycles: %v, want ErrUnhealthy wrapping ErrUnavailable at once", err)
	}
	count := func(prefix string) (n int, last map[string]any) {
		for _, l := range logs.lines() {
			if msg, _ := l["msg"].(string); strings.HasPrefix(msg, prefix) {
				n++
				last = l
			}
		}
		return n, last
	}
	if n, _ := count("the broker refuses the route"); n != 1 {
		t.Errorf("%d refusal lines for %d cycles, want 1", n, pub.Batches())
	}
	if n, _ := count("relay cycle failed"); n != 0 {
		t.Errorf("%d cycle-failure lines besides the refusal, want 0", n)
	}
	pub.FailWith(nil)
	if _, err := pub.WaitForIDs(b.ctx, "A-1", "B-1", "C-1"); err != nil {
		t.Fatal(err)
	}
	eventually(t, b.ctx, "ready again", func() bool { return b.r.Ready() == nil })
	eventually(t, b.ctx, "the end of the refusals logged", func() bool {
		n, l := count("the broker refuses the route (misconfigured, not authorized, or full); backing off without counting attempts: no longer failing")
		return n == 1 && l["failures"].(float64) >= 4
	})
}
