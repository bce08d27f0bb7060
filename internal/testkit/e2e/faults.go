package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

// The fault matrix (issue 21): broker faults hit a running relay while
// writers commit, and what the consumer received is judged on first
// deliveries. Defaults of the [FaultConfig] sizes and the relay's publish
// deadline.
const (
	// DefaultFaultEvents is the fewest events a fault case commits.
	DefaultFaultEvents = 150
	// DefaultFaultWriters writers commit concurrently, each at most one
	// transaction per DefaultFaultPace: 100 events a second in all.
	DefaultFaultWriters = 4
	DefaultFaultPace    = 40 * time.Millisecond
	// DefaultFaultAggregates aggregates share the events (several
	// messages of one aggregate in most batches).
	DefaultFaultAggregates = 8
	// DefaultPublishTimeout is the relay's Config.PublishTimeout in a
	// fault case: the deadline stalls are measured against.
	DefaultPublishTimeout = time.Second
)

// FaultCase is one broker fault of a matrix run by [RunFaults]: its name
// and how to set it up on one database target.
type FaultCase[R any] struct {
	// Name names the subtest.
	Name string
	// Targets are the databases the case runs on; nil: testdb.All.
	Targets []testdb.Target
	// Setup returns the case's configuration for one run: its own
	// publisher, proxy, consumer and fault (cleaned up when t ends).
	Setup func(t *testing.T) FaultConfig[R]
}

// FaultConfig is one run of a fault case. Publisher, Fault, WaitForAll
// and Check are required.
type FaultConfig[R any] struct {
	// Publisher is the publisher under test, connected to its broker
	// through what Fault acts on (a faultproxy.Proxy, a private server).
	Publisher relay.Publisher
	// Fault injects the fault. [RunFault] calls it on the test's
	// goroutine once the relay has published a fifth of Events, while the
	// writers go on committing, and takes its return as the end of the
	// fault. It may fail t. The [Probe] reports the relay's publishes to
	// wait on; [ResetMidPublish], [Unreachable], [Stall] and [Revoked]
	// are the faults of the matrix.
	Fault func(ctx context.Context, t *testing.T, p *Probe)
	// WaitForAll returns the records once one of every id arrived, or
	// ctx's error (a kit Consumer's WaitForMessageIDs).
	WaitForAll func(ctx context.Context, ids ...string) ([]R, error)
	// Check is the kit's Check: the committed rows joined with the
	// records, in the order a consumer of one aggregate sees them.
	Check func(rows []outboxtest.Row, recs []R) outboxtest.Ledger
	// Dedupes says the broker keeps one copy of a message sent again with
	// the same message ID (JetStream's Nats-Msg-Id within the stream's
	// duplicate window): then no duplicate is allowed at all.
	Dedupes bool

	// Events is the fewest events committed (DefaultFaultEvents if 0);
	// the writers go on while the fault lasts, then commit at least a
	// quarter of Events more. Writers (DefaultFaultWriters), each
	// committing at most one transaction per Pace (DefaultFaultPace),
	// share Aggregates aggregates (DefaultFaultAggregates).
	Events, Writers, Aggregates int
	Pace                        time.Duration
	// PublishTimeout is the relay's (DefaultPublishTimeout if 0).
	PublishTimeout time.Duration
	// Source is how the relay learns of committed events: the table
	// claim (the zero value), or PostgreSQL's log (SourceWAL,
	// SourceWALLogOnly: PostgreSQL targets only). [RunFaults] sets it.
	Source Source
}

// Source is how a fault run's relay learns of committed events.
type Source int

const (
	// SourceClaim: the relay claims from the table (the default relay).
	SourceClaim Source = iota
	// SourceWAL: the relay reads the table's inserts from a replication
	// slot of the run's own (relay.SourceWAL, table mode).
	SourceWAL
	// SourceWALLogOnly: SourceWAL with log-only writers
	// (driver.Config.LogOnly): the events are in no table, and the
	// committed ones are read from the writers' sequence table.
	SourceWALLogOnly
)

// String names the source in a subtest's name.
func (s Source) String() string {
	switch s {
	case SourceWAL:
		return "wal"
	case SourceWALLogOnly:
		return "wal-log-only"
	}
	return "claim"
}

// FaultReport is what [RunFault] saw: the ledger of the consumer's
// records against the committed rows, and the relay's own counts.
type FaultReport struct {
	// Ledger is Check(committed rows, records).
	Ledger outboxtest.Ledger
	// Dedupes is FaultConfig.Dedupes.
	Dedupes bool
	// Publishes, Failed, Unavailable and TimedOut count the relay's
	// Publish calls: all, those that returned an error, those whose
	// error (or an entry of it) wraps relay.ErrUnavailable, and those
	// whose error wraps context.DeadlineExceeded.
	Publishes, Failed, Unavailable, TimedOut int
	// Unresolved counts the messages of failed Publish calls that were
	// not reported acknowledged (a whole batch for a batch error): the
	// messages the relay sends again, so the most duplicates a correct
	// publisher can cause. A message re-sent twice counts twice.
	Unresolved int
	// OrderViolations counts the relay's reports of an acknowledged
	// message behind a failed one of its aggregate (relay.OrderObserver);
	// DeadLettered the messages it dead-lettered.
	OrderViolations, DeadLettered int
	// Premise lists writer rows whose outbox ids do not follow their
	// aggregate's seq (the writers did not serialize): no order to judge.
	Premise []string
}

// ErrDuplicates, ErrRelayOrder, ErrDeadLettered and ErrPremise are matched
// by a [FaultReport.Err] (errors.Is) beside outboxtest's ErrLost,
// ErrGhost and ErrOrder.
var (
	// ErrDuplicates: more duplicates than the failed publishes left
	// unresolved (or any, for a broker that dedupes).
	ErrDuplicates = errors.New("e2e: more duplicates than the failed publishes explain")
	// ErrRelayOrder: the relay reported order violations.
	ErrRelayOrder = errors.New("e2e: the relay reported order violations")
	// ErrDeadLettered: a message was dead-lettered by a fault that is no
	// message's fault.
	ErrDeadLettered = errors.New("e2e: messages dead-lettered")
	// ErrPremise: the writers' rows are not in seq order per aggregate.
	ErrPremise = errors.New("e2e: committed rows out of seq order (writers not serialized)")
)

// Err returns nil if the run kept the outbox's invariants through the
// fault, else an error matching each broken one: a lost event, a ghost,
// a first delivery out of order (the ledger's errors), more duplicates
// than Unresolved (any, with Dedupes), an order violation the relay
// reported, a dead letter, the writers' premise broken.
func (r FaultReport) Err() error {
	errs := []error{r.Ledger.Err()}
	if r.Ledger.Duplicates > r.Unresolved || (r.Dedupes && r.Ledger.Duplicates > 0) {
		limit := r.Unresolved
		if r.Dedupes {
			limit = 0
		}
		errs = append(errs, fmt.Errorf("%w: %d, at most %d", ErrDuplicates, r.Ledger.Duplicates, limit))
	}
	if r.OrderViolations > 0 {
		errs = append(errs, fmt.Errorf("%w: %d", ErrRelayOrder, r.OrderViolations))
	}
	if r.DeadLettered > 0 {
		errs = append(errs, fmt.Errorf("%w: %d", ErrDeadLettered, r.DeadLettered))
	}
	if len(r.Premise) > 0 {
		errs = append(errs, fmt.Errorf("%w: %s", ErrPremise, strings.Join(r.Premise, "; ")))
	}
	return errors.Join(errs...)
}

// String summarizes the report in one line.
func (r FaultReport) String() string {
	return fmt.Sprintf("committed %d, delivered %d, lost %d, ghosts %d, order violations %d (relay: %d), duplicates %d (unresolved %d, dedupes %v), publishes %d (failed %d: unavailable %d, timed out %d), dead-lettered %d",
		r.Ledger.Committed, r.Ledger.Delivered, len(r.Ledger.Lost), len(r.Ledger.Ghosts)+r.Ledger.NoMessageID, len(r.Ledger.OrderViolations),
		r.OrderViolations, r.Ledger.Duplicates, r.Unresolved, r.Dedupes, r.Publishes, r.Failed, r.Unavailable, r.TimedOut, r.DeadLettered)
}

// RunFaults runs every case on each of its targets, each run a parallel
// subtest "case/target" of its own (its own tables, publisher, proxy and
// consumer), and fails a run whose [FaultReport.Err] is not nil. On pgx
// (when among the targets) each case runs twice more with the relay
// reading PostgreSQL's log, "case/pgx-wal" ([SourceWAL]) and
// "case/pgx-wal-log-only" ([SourceWALLogOnly]). Each run is bounded by 3
// minutes.
func RunFaults[R any](t *testing.T, cases ...FaultCase[R]) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			targets := c.Targets
			if targets == nil {
				targets = testdb.All
			}
			type run struct {
				name string
				tg   testdb.Target
				src  Source
			}
			var runs []run
			for _, tg := range targets {
				runs = append(runs, run{tg.Name, tg, SourceClaim})
				if tg.Name == "pgx" {
					runs = append(runs, run{tg.Name + "-" + SourceWAL.String(), tg, SourceWAL},
						run{tg.Name + "-" + SourceWALLogOnly.String(), tg, SourceWALLogOnly})
				}
			}
			for _, rn := range runs {
				tg := rn.tg
				t.Run(rn.name, func(t *testing.T) {
					t.Parallel()
					ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
					defer cancel()
					cfg := c.Setup(t)
					cfg.Source = rn.src
					rep := RunFault(ctx, t, tg, cfg)
					t.Log(rep)
					if err := rep.Err(); err != nil {
						t.Error(err)
					}
				})
			}
		})
	}
}

// RunFault runs one fault case on target and returns its report without
// judging it (RunFaults does; a test of the matrix itself may expect it
// to fail). On its own tables (testdb.New) it starts a relay with
// cfg.Publisher (publish deadline cfg.PublishTimeout, quick retries) and
// writers that commit concurrently, each transaction locking its
// aggregate's row, incrementing the aggregate's seq and emitting an event
// carrying it, so that each aggregate's outbox ids follow its commit
// order. Once the relay has acknowledged a fifth of cfg.Events it calls
// cfg.Fault; when that returns, the writers commit until there are at
// least cfg.Events and a quarter of cfg.Events more than at the fault's
// end. It then waits until the relay marked every row sent or
// dead-lettered (or holds it behind a dead letter of its aggregate),
// reads the committed rows back, waits for every row marked sent at the
// consumer (cfg.WaitForAll), and reports: a row never sent is lost. The
// relay runs until t ends. Failing to set up, to commit, or to see the
// relay and the consumer done before ctx ends fails t (Fatal); the
// relay's log is written to t's log if t failed.
func RunFault[R any](ctx context.Context, t *testing.T, target testdb.Target, cfg FaultConfig[R]) FaultReport {
	t.Helper()
	if cfg.Publisher == nil || cfg.Fault == nil || cfg.WaitForAll == nil || cfg.Check == nil {
		t.Fatal("e2e: FaultConfig needs Publisher, Fault, WaitForAll and Check")
	}
	events := orDefault(cfg.Events, DefaultFaultEvents)
	nw := orDefault(cfg.Writers, DefaultFaultWriters)
	aggs := orDefault(cfg.Aggregates, DefaultFaultAggregates)
	pace := cfg.Pace
	if pace == 0 {
		pace = DefaultFaultPace
	}
	timeout := cfg.PublishTimeout
	if timeout == 0 {
		timeout = DefaultPublishTimeout
	}

	logOnly := cfg.Source == SourceWALLogOnly
	e := testdb.New(t, target, driver.Config{LogOnly: logOnly})
	var wal relay.WALConfig
	if cfg.Source != SourceClaim {
		wal = WALSlot(t, ctx, e)
	}
	w := newWriters(t, e, aggs)
	w.seqIDs = logOnly
	probe := &Probe{timeout: timeout}
	var logs testdb.SyncBuffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relay log:\n%s", logs.String())
		}
	})
	rcfg := relay.Config{
		Publisher: withHealth(&probed{Publisher: cfg.Publisher, p: probe}, cfg.Publisher), Observer: observer{p: probe},
		PublishTimeout: timeout, BatchSize: 16, MaxBatchSize: 64,
		RetryInitial: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond,
		PollInterval: 100 * time.Millisecond, HealthInterval: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	if cfg.Source != SourceClaim {
		// The fallback poll less often: what is published comes from the
		// stream, mostly; retries come due at the polls.
		rcfg.Source, rcfg.WAL, rcfg.PollInterval = relay.SourceWAL, wal, 250*time.Millisecond
	}
	r, err := relay.New(e.Outbox, e.RelayDB, rcfg)
	if err != nil {
		t.Fatal(err)
	}
	RunRelay(t, ctx, r)

	// The writers commit until told how far to go (stopAt, -1 until the
	// fault is over), then stop by themselves: a writer cancelled in the
	// middle of its COMMIT could commit a row after the rows are read
	// back (the outcome unknown to it), which the ledger would call a
	// ghost.
	var wg sync.WaitGroup
	werrs := make(chan error, nw)
	wctx, wstop := context.WithCancel(ctx)
	defer func() { wstop(); wg.Wait() }() // on Fatal too
	for i := range nw {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.run(wctx, i, pace); err != nil {
				werrs <- err
				wstop()
			}
		}()
	}
	warm := int64(events / 5)
	testdb.Eventually(t, ctx, fmt.Sprintf("the relay to publish %d events before the fault", warm), func() bool {
		return probe.acked.Load() >= warm || len(werrs) > 0
	})
	if len(werrs) > 0 {
		t.Fatalf("writer: %v", <-werrs)
	}
	cfg.Fault(ctx, t, probe)
	w.stopAt.Store(max(int64(events), w.committed.Load()+int64(events/4)))
	wg.Wait()
	select {
	case err := <-werrs:
		t.Fatalf("writer: %v", err)
	default:
	}
	if ctx.Err() != nil {
		t.Fatalf("the writers did not commit their events in time: %v", ctx.Err())
	}

	// Every row sent, dead-lettered or held behind a dead letter of its
	// aggregate (the relay's default policy); then every sent one at the
	// consumer (the others are lost: the ledger says so). Polled every
	// 50 ms: on SQLite the test shares the relay's one connection.
	pending := "SELECT COUNT(*) FROM " + testdb.PendingTable(e.Table)
	unheld := "SELECT COUNT(*) FROM " + testdb.PendingTable(e.Table) + " q JOIN " + e.Table + " p ON p.id = q.id WHERE NOT EXISTS (SELECT 1 FROM " + e.Table +
		" d WHERE d.status = 2 AND d.aggregate_type = p.aggregate_type AND d.aggregate_id = p.aggregate_id)"
	poll(t, ctx, 50*time.Millisecond, func() bool {
		q := pending
		if probe.deadLettered.Load() > 0 {
			q = unheld
		}
		var n int
		err := e.RelayDB.QueryRowContext(ctx, q).Scan(&n)
		return err == nil && n == 0
	}, func() string { return "the relay to publish or dead-letter every row: " + probe.String() })
	rows, premise := w.readBack(t, ctx)
	var sent []string
	if logOnly {
		// Nothing is left in the table, and nothing says what was
		// published: every event committed must arrive (one that never
		// does is lost, and fails the wait).
		for _, r := range rows {
			sent = append(sent, r.MessageID)
		}
	} else {
		sent = testdb.Column(t, ctx, e.RelayDB, "SELECT message_id FROM "+e.Table+" WHERE "+e.IsSent())
	}
	recs, err := cfg.WaitForAll(ctx, sent...)
	if err != nil {
		t.Fatalf("waiting for the %d events sent of %d committed: %v (%s)", len(sent), len(rows), err, probe.report(cfg.Check(rows, recs), cfg.Dedupes, premise))
	}
	return probe.report(cfg.Check(rows, recs), cfg.Dedupes, premise)
}

// Probe is what a fault sees of the relay it hits: counts of the relay's
// Publish calls and their outcomes, updated as they return. Safe for
// concurrent use.
type Probe struct {
	timeout time.Duration

	running, publishes, failed, unavailable, timedOut atomic.Int64
	acked, unresolved                                 atomic.Int64
	orderViolations, deadLettered                     atomic.Int64
}

// PublishTimeout is the relay's publish deadline.
func (p *Probe) PublishTimeout() time.Duration { return p.timeout }

// Running is how many Publish calls are running now (0 or 1: one relay).
func (p *Probe) Running() int { return int(p.running.Load()) }

// Acked is how many messages Publish calls reported acknowledged so far,
// duplicates included.
func (p *Probe) Acked() int { return int(p.acked.Load()) }

// Failed is how many Publish calls returned an error so far.
func (p *Probe) Failed() int { return int(p.failed.Load()) }

// Unavailable is how many Publish calls returned an error wrapping
// relay.ErrUnavailable (or with an entry that does) so far.
func (p *Probe) Unavailable() int { return int(p.unavailable.Load()) }

// TimedOut is how many Publish calls returned an error wrapping
// context.DeadlineExceeded so far.
func (p *Probe) TimedOut() int { return int(p.timedOut.Load()) }

// OrderViolations is how many order violations the relay reported so far.
func (p *Probe) OrderViolations() int { return int(p.orderViolations.Load()) }

// String reports the counts.
func (p *Probe) String() string {
	return fmt.Sprintf("Publish calls %d (running %d, failed %d: unavailable %d, timed out %d), acknowledged %d",
		p.publishes.Load(), p.Running(), p.Failed(), p.Unavailable(), p.TimedOut(), p.Acked())
}

// waitFor polls cond every 5 ms until it holds, failing t with what()
// (the state it waited for and the state it got) when ctx ends first.
func waitFor(t *testing.T, ctx context.Context, cond func() bool, what func() string) {
	t.Helper()
	poll(t, ctx, 5*time.Millisecond, cond, what)
}

// poll is waitFor polling every d.
func poll(t *testing.T, ctx context.Context, d time.Duration, cond func() bool, what func() string) {
	t.Helper()
	tick := time.NewTicker(d)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what())
		case <-tick.C:
		}
	}
}

// observer is the relay's Observer of a fault case: it counts the
// relay's order violations (relay.OrderObserver) and dead letters in p.
type observer struct {
	relay.NopObserver
	p *Probe
}

func (o observer) OrderViolation(relay.Message)      { o.p.orderViolations.Add(1) }
func (o observer) DeadLettered(relay.Message, error) { o.p.deadLettered.Add(1) }

func (p *Probe) report(l outboxtest.Ledger, dedupes bool, premise []string) FaultReport {
	return FaultReport{Ledger: l, Dedupes: dedupes,
		Publishes: int(p.publishes.Load()), Failed: p.Failed(), Unavailable: p.Unavailable(), TimedOut: p.TimedOut(),
		Unresolved: int(p.unresolved.Load()), OrderViolations: int(p.orderViolations.Load()), DeadLettered: int(p.deadLettered.Load()),
		Premise: premise}
}

// probed counts a publisher's Publish calls in a Probe.
type probed struct {
	relay.Publisher
	p *Probe
}

// Unwrap implements relay.PublisherWrapper.
func (w *probed) Unwrap() relay.Publisher { return w.Publisher }

func (w *probed) Publish(ctx context.Context, msgs []relay.Message) error {
	w.p.running.Add(1)
	err := w.Publisher.Publish(ctx, msgs)
	w.p.publishes.Add(1)
	var pe relay.PublishErrors
	switch {
	case err == nil:
		w.p.acked.Add(int64(len(msgs)))
	case errors.As(err, &pe) && len(pe) == len(msgs):
		unavailable := false
		for _, e := range pe {
			if e == nil {
				w.p.acked.Add(1)
				continue
			}
			w.p.unresolved.Add(1)
			unavailable = unavailable || errors.Is(e, relay.ErrUnavailable)
		}
		if unavailable {
			w.p.unavailable.Add(1)
		}
	default:
		w.p.unresolved.Add(int64(len(msgs)))
		if errors.Is(err, relay.ErrUnavailable) {
			w.p.unavailable.Add(1)
		}
	}
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			w.p.timedOut.Add(1)
		}
		w.p.failed.Add(1)
	}
	w.p.running.Add(-1)
	return err
}

// ResetMidPublish is the fault of a connection reset while publishes are
// in flight, n times: each time it arms proxy to cut the connection that
// next sends pattern (a publish request of the publisher under test),
// waits for the cut, then until the relay acknowledged more messages (it
// recovered) before the next one. The odd cuts (first, third, ...) come
// right after the request was forwarded (faultproxy.CutAfter: the broker
// acts on it, the publisher never hears back), the even ones just before
// (CutBefore: the request is lost with the connection, so a publisher
// that sent the aggregate's next message on a new connection would store
// it first). At least one of the n cuts must have failed a Publish call:
// a client may ride out a cut (nats.go re-sends what it buffered while
// reconnecting), and CutAfter's close of the client races the broker's
// reply, so not every cut need fail one.
func ResetMidPublish(proxy *faultproxy.Proxy, pattern []byte, n int) func(context.Context, *testing.T, *Probe) {
	return func(ctx context.Context, t *testing.T, p *Probe) {
		t.Helper()
		failed := p.Failed()
		for i := range n {
			tripped := proxy.Tripped.Load()
			action := faultproxy.CutAfter
			if i%2 == 1 {
				action = faultproxy.CutBefore
			}
			proxy.Arm(pattern, action)
			waitFor(t, ctx, func() bool { return proxy.Tripped.Load() > tripped }, func() string {
				return fmt.Sprintf("cut %d of %d mid-publish: %s", i+1, n, p)
			})
			acked := p.Acked()
			waitFor(t, ctx, func() bool { return p.Acked() > acked }, func() string {
				return fmt.Sprintf("the relay to publish again after cut %d of %d: %s", i+1, n, p)
			})
		}
		if p.Failed() == failed {
			t.Errorf("none of %d cuts mid-publish failed a Publish call: %s", n, p)
		}
	}
}

// Unreachable is the fault of a broker that cannot be reached: proxy
// refuses connections and cuts those open for at least d, and until the
// relay failed two Publish calls, then lets them through again.
func Unreachable(proxy *faultproxy.Proxy, d time.Duration) func(context.Context, *testing.T, *Probe) {
	return func(ctx context.Context, t *testing.T, p *Probe) {
		t.Helper()
		failed := p.Failed()
		proxy.Refuse(true)
		start := time.Now()
		testdb.Eventually(t, ctx, fmt.Sprintf("an outage of %s failing two Publish calls", d), func() bool {
			return time.Since(start) >= d && p.Failed() >= failed+2
		})
		proxy.Refuse(false)
	}
}

// Stall is the fault of a network path that stops carrying anything and
// then recovers, nothing lost (faultproxy's Pause): it pauses proxy, waits
// until a Publish call is running, and resumes d later. A stall longer
// than the relay's PublishTimeout also lasts until a Publish call failed
// with its deadline (context.DeadlineExceeded): on a loaded machine the
// relay's next Publish may start late in the stall.
func Stall(proxy *faultproxy.Proxy, d time.Duration) func(context.Context, *testing.T, *Probe) {
	return func(ctx context.Context, t *testing.T, p *Probe) {
		t.Helper()
		timedOut := p.TimedOut()
		proxy.Pause(true)
		defer proxy.Pause(false)
		testdb.Eventually(t, ctx, "a Publish running in the stall", func() bool { return p.Running() > 0 })
		start := time.Now()
		long := d > p.PublishTimeout()
		testdb.Eventually(t, ctx, fmt.Sprintf("a stall of %s", d), func() bool {
			return time.Since(start) >= d && (!long || p.TimedOut() > timedOut)
		})
	}
}

// Revoked is the fault of the publisher's permission to publish revoked
// mid-batch and restored: once a Publish call is running it calls revoke,
// waits at least d and until two Publish calls failed, and calls restore.
// The failures must be relay.ErrUnavailable (the route's, not the
// messages' fault: the relay backs off as a whole, counts no attempt,
// dead-letters nothing). Had the publisher reported them as the
// messages' own, the relay would count attempts and, with the quick
// retries of a fault case (20 ms, doubling), dead-letter messages within
// a second: lost, which the report shows.
func Revoked(d time.Duration, revoke, restore func(t *testing.T)) func(context.Context, *testing.T, *Probe) {
	return func(ctx context.Context, t *testing.T, p *Probe) {
		t.Helper()
		testdb.Eventually(t, ctx, "a Publish running", func() bool { return p.Running() > 0 })
		failed, unavailable := p.Failed(), p.Unavailable()
		revoke(t)
		start := time.Now()
		waitFor(t, ctx, func() bool { return time.Since(start) >= d && p.Failed() >= failed+2 }, func() string {
			return fmt.Sprintf("%s without permission, failing two Publish calls: %s", d, p)
		})
		restore(t)
		if p.Unavailable() == unavailable {
			t.Errorf("no Publish call failed with relay.ErrUnavailable while the permission was revoked: %s", p)
		}
	}
}

// writers commit the events of a fault case: each transaction locks its
// aggregate's row in a table of their own, increments its seq and emits
// an event carrying it.
type writers struct {
	e        *testdb.Env
	aggs     int
	seqTable string
	// seqIDs: each event's message ID is seqID(aggregate, seq), and
	// readBack lists the events from seqTable (log-only writers write no
	// rows).
	seqIDs    bool
	committed atomic.Int64
	stopAt    atomic.Int64 // -1: not known yet
}

// faultAggregateID names aggregate n: characters brokers' names treat
// specially belong in it.
func faultAggregateID(n int) string { return fmt.Sprintf("agg %d/ü.*", n) }

func newWriters(t *testing.T, e *testdb.Env, aggs int) *writers {
	t.Helper()
	w := &writers{e: e, aggs: aggs, seqTable: e.Q("fault_seq")}
	w.stopAt.Store(-1)
	if _, err := e.RelayDB.Exec("CREATE TABLE " + w.seqTable + " (id VARCHAR(64) PRIMARY KEY, seq INTEGER NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	for n := range aggs {
		if _, err := e.RelayDB.Exec("INSERT INTO "+w.seqTable+" (id, seq) VALUES ("+e.Placeholder(1)+", 0)", faultAggregateID(n)); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

// run commits one event per pace, on a random aggregate, until stopAt
// is reached or ctx ends (nil then: the caller stopped it).
func (w *writers) run(ctx context.Context, n int, pace time.Duration) error {
	rng := rand.New(rand.NewPCG(uint64(n), uint64(time.Now().UnixNano())))
	// A steady load, like a service's traffic: not a synchronisation.
	tick := time.NewTicker(pace)
	defer tick.Stop()
	lock := "SELECT seq FROM " + w.seqTable + " WHERE id = " + w.e.Placeholder(1) + w.e.ForUpdate()
	bump := "UPDATE " + w.seqTable + " SET seq = " + w.e.Placeholder(1) + " WHERE id = " + w.e.Placeholder(2)
	for {
		if s := w.stopAt.Load(); s >= 0 && w.committed.Load() >= s {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if s := w.stopAt.Load(); s >= 0 && w.committed.Load() >= s {
			return nil
		}
		agg := faultAggregateID(rng.IntN(w.aggs))
		var err error
		for try := 0; try < 10; try++ {
			if err = w.commit(ctx, agg, lock, bump); err == nil || !lockConflict(err) {
				break
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		w.committed.Add(1)
	}
}

func (w *writers) commit(ctx context.Context, agg, lock, bump string) error {
	ctx = outbox.NewContext(ctx)
	tx, err := w.e.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // after Commit: sql.ErrTxDone, ignored
	var seq int
	if err := tx.QueryRowContext(ctx, lock, agg).Scan(&seq); err != nil {
		return err
	}
	seq++
	if _, err := tx.ExecContext(ctx, bump, seq, agg); err != nil {
		return err
	}
	ev := outbox.Event{AggregateType: AggregateType, AggregateID: agg, Type: AggregateType + ".updated",
		Payload: fmt.Appendf(nil, `{"seq":%d}`, seq)}
	if w.seqIDs {
		ev.ID = seqID(agg, seq)
	}
	if err := outbox.Emit(ctx, ev); err != nil {
		return err
	}
	return tx.Commit()
}

// lockConflict reports a deadlock or lock timeout, which a writer retries.
func lockConflict(err error) bool {
	s := err.Error()
	for _, m := range []string{"Deadlock", "deadlock", "Lock wait timeout", "SQLITE_BUSY", "database is locked"} {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}

// readBack returns the committed rows in outbox id order and, as the
// premise's failures, each aggregate whose rows' seqs do not run 1, 2,
// ... in that order.
func (w *writers) readBack(t *testing.T, ctx context.Context) ([]outboxtest.Row, []string) {
	t.Helper()
	if w.seqIDs {
		return w.readSeq(t, ctx), nil
	}
	q, err := w.e.RelayDB.QueryContext(ctx, "SELECT id, message_id, aggregate_type, aggregate_id, payload FROM "+w.e.Table+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var rows []outboxtest.Row
	var premise []string
	last := map[string]int{}
	for q.Next() {
		var r outboxtest.Row
		var payload []byte
		if err := q.Scan(&r.ID, &r.MessageID, &r.AggregateType, &r.AggregateID, &payload); err != nil {
			t.Fatal(err)
		}
		var body struct{ Seq int }
		if err := json.Unmarshal(payload, &body); err != nil {
			t.Fatalf("row %d: payload %q: %v", r.ID, payload, err)
		}
		if body.Seq != last[r.AggregateID]+1 {
			premise = append(premise, fmt.Sprintf("%s: id %d has seq %d after seq %d", r.AggregateID, r.ID, body.Seq, last[r.AggregateID]))
		}
		last[r.AggregateID] = body.Seq
		rows = append(rows, r)
	}
	if err := q.Err(); err != nil {
		t.Fatal(err)
	}
	return rows, premise
}

var _ relay.OrderObserver = observer{}

// seqID is the message ID of aggregate agg's event seq when the writers'
// events are listed from their sequence table (writers.seqIDs).
func seqID(agg string, seq int) string {
	return fmt.Sprintf("%x-%d", agg, seq)
}

// readSeq lists the events the writers committed from their sequence
// table (aggregate agg at seq n committed seqs 1 to n), with the seq as
// the row's ID: order is judged per aggregate, and an aggregate's seqs
// are its commit order.
func (w *writers) readSeq(t *testing.T, ctx context.Context) []outboxtest.Row {
	t.Helper()
	q, err := w.e.RelayDB.QueryContext(ctx, "SELECT id, seq FROM "+w.seqTable+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var rows []outboxtest.Row
	for q.Next() {
		var agg string
		var n int
		if err := q.Scan(&agg, &n); err != nil {
			t.Fatal(err)
		}
		for seq := 1; seq <= n; seq++ {
			rows = append(rows, outboxtest.Row{ID: int64(seq), MessageID: seqID(agg, seq), AggregateType: AggregateType, AggregateID: agg})
		}
	}
	if err := q.Err(); err != nil {
		t.Fatal(err)
	}
	return rows
}
