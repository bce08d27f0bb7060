package inboxredis_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/redis/go-redis/v9"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	inboxredis "github.com/sqloutbox/outbox/inbox/redis"
	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/relay"
	redispub "github.com/sqloutbox/outbox/relay/redis"
)

var pgx = testdb.Target{Name: "pgx", Dialect: driver.Postgres}

// fixture is one test's Redis names (under its own key prefix, deleted at
// cleanup) and consumer database (an inbox and a ledger).
type fixture struct {
	c       *redis.Client
	streams []string
	group   string
	lease   string
	db      *ledgertest.DB
	pub     *redispub.Publisher
	nextID  atomic.Int64
}

func newFixture(t testing.TB, streams int) *fixture {
	t.Helper()
	c := client(t, redisAddr())
	p := prefix(t, c)
	f := &fixture{c: c, group: testdb.RandomName("g_"), lease: p + "lease", db: ledgertest.NewDB(t, pgx)}
	for i := range streams {
		f.streams = append(f.streams, fmt.Sprintf("%sstream-%d", p, i))
	}
	pub, err := redispub.NewPublisher(redispub.Config{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	f.pub = pub
	return f
}

// config is a runner's config on f with quick test settings; mod adjusts it.
func (f *fixture) config(mod func(*inboxredis.Config)) inboxredis.Config {
	cfg := inboxredis.Config{Client: f.c, Streams: f.streams, Group: f.group, LeaseKey: f.lease,
		Inbox: f.db.Inbox, DB: f.db.DB, Handler: ledgertest.LedgerHandler(pgx.Dialect, f.db.Ledger),
		Backoff: fastRetry, Logger: ledgertest.QuietLogger(), LeaseTTL: 2 * time.Second, Block: 200 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	return cfg
}

func (f *fixture) runner(t testing.TB, mod func(*inboxredis.Config)) *inboxredis.Runner {
	t.Helper()
	r, err := inboxredis.NewRunner(f.config(mod))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// publish adds seqs from..to of every aggregate to stream, through the
// relay's publisher, the aggregates interleaved; it returns the message
// IDs in order.
func (f *fixture) publish(t testing.TB, stream string, aggs []string, from, to int) []string {
	t.Helper()
	var msgs []relay.Message
	var ids []string
	for seq := from; seq <= to; seq++ {
		for _, a := range aggs {
			n := f.nextID.Add(1)
			id := fmt.Sprintf("%s/%s/%d", stream, a, seq)
			msgs = append(msgs, relay.Message{ID: n, MessageID: id, AggregateType: "account", AggregateID: a,
				EventType: "account.step", Topic: stream, ContentType: "application/json",
				Payload: []byte(fmt.Sprintf(`{"seq":%d}`, seq))})
			ids = append(ids, id)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.pub.Publish(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	return ids
}

// applied is the number of ledger rows.
func (f *fixture) applied(t testing.TB) int { return ledgertest.Count(t, f.db.DB, f.db.Ledger) }

// pending is the number of the group's unacknowledged entries on every
// stream.
func (f *fixture) pending(t testing.TB) int64 {
	t.Helper()
	var n int64
	for _, s := range f.streams {
		p, err := f.c.XPending(context.Background(), s, f.group).Result()
		if err != nil {
			t.Fatal(err)
		}
		n += p.Count
	}
	return n
}

// checkLedger fails t unless the ledger has every seq of want applied
// once, in order per aggregate.
func (f *fixture) checkLedger(t testing.TB, want map[string]int) {
	t.Helper()
	rows := ledgertest.Read(t, f.db.DB, f.db.Ledger)
	if probs := ledgertest.Check(rows, want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
	total := 0
	for _, n := range want {
		total += n
	}
	if len(rows) != total {
		t.Fatalf("%d ledger rows, want %d", len(rows), total)
	}
}

func aggregates(prefix string, n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("%s%02d", prefix, i))
	}
	return out
}

// fastRetry is a 1 ms constant backoff.
func fastRetry() backoff.BackOff { return backoff.NewConstantBackOff(time.Millisecond) }

func testCtx(t testing.TB, d time.Duration) context.Context { return ledgertest.Context(t, d) }

// run runs r until the test ends (or stop is called); stop waits for Run
// to return nil.
func run(t testing.TB, r *inboxredis.Runner) (stop func()) { return ledgertest.Serve(t, r.Run) }

// recorder is an Observer keeping every result.
type recorder struct {
	mu      sync.Mutex
	results []inboxredis.Result
	failed  map[string]int // message entry ID -> failed attempts
}

func (o *recorder) Processed(r inboxredis.Result) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.results = append(o.results, r)
}

func (o *recorder) AttemptFailed(stream, id string, attempt int, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.failed == nil {
		o.failed = map[string]int{}
	}
	o.failed[stream+"/"+id]++
}

func (o *recorder) all() []inboxredis.Result {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]inboxredis.Result(nil), o.results...)
}

func (o *recorder) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.results)
}

// forBatchSizes runs a test with one entry per transaction and with
// batches (Config.BatchSize 8).
func forBatchSizes(t *testing.T, f func(t *testing.T, batch int)) {
	for _, n := range []int{0, 8} {
		t.Run(fmt.Sprintf("batch%d", n), func(t *testing.T) {
			t.Parallel()
			f(t, n)
		})
	}
}

func TestNewRunnerRejectsBadConfig(t *testing.T) {
	t.Parallel()
	in, err := inbox.New(inbox.Config{Dialect: driver.Postgres, Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	ok := inboxredis.Config{Client: c, Streams: []string{"s"}, Group: "g", Inbox: in, DB: &sql.DB{},
		Handler: func(context.Context, *sql.Tx, inbox.Message) error { return nil }, Logger: ledgertest.QuietLogger()}
	for name, mod := range map[string]func(*inboxredis.Config){
		"NoClient":       func(c *inboxredis.Config) { c.Client = nil },
		"NoStreams":      func(c *inboxredis.Config) { c.Streams = nil },
		"EmptyStream":    func(c *inboxredis.Config) { c.Streams = []string{""} },
		"RepeatedStream": func(c *inboxredis.Config) { c.Streams = []string{"s", "s"} },
		"NoGroup":        func(c *inboxredis.Config) { c.Group = "" },
		"NoInbox":        func(c *inboxredis.Config) { c.Inbox = nil },
		"NoDB":           func(c *inboxredis.Config) { c.DB = nil },
		"NoHandler":      func(c *inboxredis.Config) { c.Handler = nil },
		"NegativeTries":  func(c *inboxredis.Config) { c.MaxAttempts = -1 },
		"Policy":         func(c *inboxredis.Config) { c.OnFailure = 7 },
		"BatchSize":      func(c *inboxredis.Config) { c.BatchSize = inbox.MaxBatch + 1 },
		"BatchLinger":    func(c *inboxredis.Config) { c.BatchLinger = -time.Millisecond },
		"Workers":        func(c *inboxredis.Config) { c.Workers = -1 },
		"Count":          func(c *inboxredis.Config) { c.Count = -1 },
		"Block":          func(c *inboxredis.Config) { c.Block = -time.Second },
		"ShortBlock":     func(c *inboxredis.Config) { c.Block = time.Microsecond },
		"StartID":        func(c *inboxredis.Config) { c.StartID = "latest" },
		"LeaseTTL":       func(c *inboxredis.Config) { c.LeaseTTL = time.Millisecond },
	} {
		cfg := ok
		mod(&cfg)
		if _, err := inboxredis.NewRunner(cfg); !errors.Is(err, inboxredis.ErrInvalidConfig) {
			t.Errorf("%s: err %v, want ErrInvalidConfig", name, err)
		}
	}
	for _, id := range []string{"0", "$", "1700000000000-0", "1700000000000"} {
		cfg := ok
		cfg.StartID = id
		if _, err := inboxredis.NewRunner(cfg); err != nil {
			t.Errorf("StartID %q: %v", id, err)
		}
	}
	r, err := inboxredis.NewRunner(ok)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.Consumer(), "-") {
		t.Errorf("default consumer name %q, want host-pid-random", r.Consumer())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); !errors.Is(err, inboxredis.ErrStarted) {
		t.Fatalf("second Run: %v, want ErrStarted", err)
	}
}

// TestRunRefusesWithoutTheSchema: Run checks the inbox table first and
// returns ErrSchemaMissing at once, instead of retrying every entry
// against a table that is not there.
func TestRunRefusesWithoutTheSchema(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	in, err := inbox.New(inbox.Config{Dialect: pgx.Dialect, Table: f.db.Env.Q("not_migrated"), Consumer: "c", Logger: ledgertest.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	r := f.runner(t, func(c *inboxredis.Config) { c.Inbox = in })
	if err := r.Run(testCtx(t, 30*time.Second)); !errors.Is(err, inbox.ErrSchemaMissing) {
		t.Fatalf("Run = %v, want ErrSchemaMissing", err)
	}
	if n, err := f.c.Exists(context.Background(), f.lease).Result(); err != nil || n != 0 {
		t.Fatalf("lease key exists (%d, %v): Run should not have started", n, err)
	}
}

// TestRunnerAppliesInOrder: entries of many aggregates on two streams,
// some added before the runner starts and some while it runs, are each
// applied once, in order per aggregate, and acknowledged.
func TestRunnerAppliesInOrder(t *testing.T) {
	t.Parallel()
	forBatchSizes(t, testRunnerAppliesInOrder)
}

func testRunnerAppliesInOrder(t *testing.T, batch int) {
	ctx := testCtx(t, 60*time.Second)
	f := newFixture(t, 2)
	aggs := [][]string{aggregates("a-", 6), aggregates("b-", 6)}
	f.publish(t, f.streams[0], aggs[0], 1, 15)
	f.publish(t, f.streams[1], aggs[1], 1, 15)
	obs := &recorder{}
	var mu sync.Mutex
	last := map[string]int{}
	var outOfOrder []string
	inner := ledgertest.LedgerHandler(pgx.Dialect, f.db.Ledger)
	r := f.runner(t, func(c *inboxredis.Config) {
		c.BatchSize = batch
		c.Observer = obs
		c.Count = 7 // several reads per stream
		c.Handler = func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
			var seq int
			_, _ = fmt.Sscanf(string(m.Payload), `{"seq":%d}`, &seq)
			mu.Lock()
			if seq != last[m.AggregateID]+1 {
				outOfOrder = append(outOfOrder, fmt.Sprintf("%s %d after %d", m.AggregateID, seq, last[m.AggregateID]))
			}
			last[m.AggregateID] = seq
			mu.Unlock()
			return inner(ctx, tx, m)
		}
	})
	run(t, r)
	testdb.Eventually(t, ctx, "the first entries applied", func() bool { return f.applied(t) >= 180 })
	f.publish(t, f.streams[0], aggs[0], 16, 25)
	f.publish(t, f.streams[1], aggs[1], 16, 25)
	testdb.Eventually(t, ctx, "every entry applied", func() bool { return f.applied(t) >= 300 })
	testdb.Eventually(t, ctx, "every entry acknowledged", func() bool { return f.pending(t) == 0 })
	want := map[string]int{}
	for _, a := range append(aggs[0], aggs[1]...) {
		want[a] = 25
	}
	f.checkLedger(t, want)
	mu.Lock()
	if len(outOfOrder) > 0 {
		t.Errorf("handler saw entries out of order: %v", outOfOrder)
	}
	mu.Unlock()
	st := r.Stats()
	if st.Applied != 300 || st.Sessions != 1 || st.Claimed != 0 || st.Parked != 0 {
		t.Errorf("stats %+v, want 300 applied in one session, nothing claimed or parked", st)
	}
	if batch > 0 && st.Batches == 0 {
		t.Errorf("stats %+v: no batch with BatchSize %d", st, batch)
	}
	for _, res := range obs.all() {
		if res.Outcome != inbox.Applied || res.Claimed || res.Attempts != 1 || !strings.HasPrefix(res.Stream, "inboxtest:") || res.ID == "" {
			t.Fatalf("result %+v, want applied at the first attempt, not claimed", res)
		}
	}
}

// TestRunnerRetriesThenParksThenHolds: an entry whose handler keeps
// failing is tried MaxAttempts times, then parked; its aggregate's later
// entries are held, other aggregates go on, and every entry is
// acknowledged once its outcome is stored.
func TestRunnerRetriesThenParksThenHolds(t *testing.T) {
	t.Parallel()
	forBatchSizes(t, func(t *testing.T, batch int) { testRunnerFailurePolicy(t, batch, inboxredis.ParkAndHold) })
}

// TestRunnerSkipAfterPark: with SkipAfterPark the failing entry is parked
// and skipped, and its aggregate's later entries are applied.
func TestRunnerSkipAfterPark(t *testing.T) {
	t.Parallel()
	forBatchSizes(t, func(t *testing.T, batch int) { testRunnerFailurePolicy(t, batch, inboxredis.SkipAfterPark) })
}

func testRunnerFailurePolicy(t *testing.T, batch int, policy inboxredis.FailurePolicy) {
	ctx := testCtx(t, 60*time.Second)
	f := newFixture(t, 1)
	st := f.streams[0]
	f.publish(t, st, []string{"bad", "good-1", "good-2"}, 1, 4)
	bad := st + "/bad/2"
	obs := &recorder{}
	inner := ledgertest.LedgerHandler(pgx.Dialect, f.db.Ledger)
	var tries atomic.Int32
	r := f.runner(t, func(c *inboxredis.Config) {
		c.BatchSize = batch
		c.Observer = obs
		c.MaxAttempts = 3
		c.OnFailure = policy
		c.Handler = func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
			if m.ID == bad {
				if tries.Add(1) == 2 {
					panic("boom") // a panic is a handler error like any other
				}
				return errors.New("refused")
			}
			return inner(ctx, tx, m)
		}
	})
	run(t, r)
	testdb.Eventually(t, ctx, "every entry's outcome stored", func() bool { return obs.count() >= 12 })
	testdb.Eventually(t, ctx, "every entry acknowledged", func() bool { return f.pending(t) == 0 })
	want := map[string]int{"bad": 1, "good-1": 4, "good-2": 4}
	wantHeld := int64(2)
	if policy == inboxredis.SkipAfterPark {
		wantHeld = 0
	}
	if tries.Load() != 3 {
		t.Errorf("the failing handler ran %d times, want MaxAttempts 3", tries.Load())
	}
	s := r.Stats()
	if s.Parked != 1 || s.Held != wantHeld || s.HandlerErrors != 3 {
		t.Errorf("stats %+v, want 1 parked, %d held, 3 handler errors", s, wantHeld)
	}
	var parked int
	for _, res := range obs.all() {
		if res.Parked {
			parked++
			if res.Attempts != 3 {
				t.Errorf("parked result %+v, want 3 attempts", res)
			}
		}
	}
	obs.mu.Lock()
	failed := len(obs.failed)
	obs.mu.Unlock()
	if parked != 1 || failed != 1 {
		t.Errorf("%d parked results, %d entries with failed attempts; want 1 and 1", parked, failed)
	}
	rows := ledgertest.Read(t, f.db.DB, f.db.Ledger)
	got := map[string][]int{}
	for _, row := range rows {
		got[row.Agg] = append(got[row.Agg], row.Seq)
	}
	if policy == inboxredis.SkipAfterPark {
		if fmt.Sprint(got["bad"]) != "[1 3 4]" {
			t.Errorf("aggregate bad applied %v, want [1 3 4] (2 skipped)", got["bad"])
		}
		delete(want, "bad")
	} else if fmt.Sprint(got["bad"]) != "[1]" {
		t.Errorf("aggregate bad applied %v, want [1] (2 parked, 3 and 4 held)", got["bad"])
	}
	for a, n := range want {
		if len(got[a]) != n {
			t.Errorf("aggregate %s applied %v, want %d entries", a, got[a], n)
		}
	}
	if policy == inboxredis.ParkAndHold {
		// Retry applies the parked entry and the held ones behind it.
		n, err := r.Retry(ctx, inbox.ParkedFilter{AggregateType: "account", AggregateID: "bad"})
		if err == nil || n != 0 {
			t.Errorf("Retry with the failing handler = %d, %v; want an error", n, err)
		}
	}
}

// TestRunnerTakesOverADeadConsumersEntries: a consumer read entries,
// stored the outcome of some and died before acknowledging them, its
// lease still set. The runner waits for the lease to expire, claims the
// dead consumer's pending entries, gets the stored ones as Duplicates and
// applies the others, in order, before newer entries; an entry deleted
// from the stream meanwhile is counted and acknowledged.
func TestRunnerTakesOverADeadConsumersEntries(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	f := newFixture(t, 1)
	st := f.streams[0]
	aggs := aggregates("agg-", 4)
	f.publish(t, st, aggs, 1, 5)
	gone := f.publish(t, st, []string{"gone"}, 1, 1)
	if err := f.c.XGroupCreateMkStream(ctx, st, f.group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	// The dead consumer's lease, and its read of every entry.
	if err := f.c.Set(ctx, f.lease, "dead-holder", 1500*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	xs, err := f.c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: f.group, Consumer: "dead", Streams: []string{st, ">"}, Count: 100}).Result()
	if err != nil || len(xs) != 1 || len(xs[0].Messages) != 21 {
		t.Fatalf("XREADGROUP = %v, %v", xs, err)
	}
	// It stored the outcomes of the first 8 (seqs 1 and 2 of each
	// aggregate) and acknowledged none.
	handler := ledgertest.LedgerHandler(pgx.Dialect, f.db.Ledger)
	stored := map[string]bool{}
	for _, m := range xs[0].Messages[:8] {
		msg := inboxredis.Message(st, m)
		if _, err := f.db.Inbox.Handle(ctx, f.db.DB, msg, func(ctx context.Context, tx *sql.Tx) error { return handler(ctx, tx, msg) }); err != nil {
			t.Fatal(err)
		}
		stored[m.ID] = true
	}
	// The last entry (aggregate gone's) is deleted before anyone handled it.
	if err := f.c.XDel(ctx, st, xs[0].Messages[20].ID).Err(); err != nil || xs[0].Messages[20].Values["outbox-message-id"] != gone[0] {
		t.Fatalf("XDEL: %v", err)
	}

	obs := &recorder{}
	r := f.runner(t, func(c *inboxredis.Config) { c.Observer = obs; c.Consumer = "alive" })
	start := time.Now()
	run(t, r)
	testdb.Eventually(t, ctx, "the dead consumer's entries handled", func() bool { return obs.count() >= 20 })
	if time.Since(start) < time.Second {
		t.Errorf("the runner consumed %s after starting, before the dead holder's lease (1.5 s) expired", time.Since(start))
	}
	f.publish(t, st, aggs, 6, 7)
	testdb.Eventually(t, ctx, "the newer entries applied", func() bool { return obs.count() >= 28 })
	testdb.Eventually(t, ctx, "every entry acknowledged", func() bool { return f.pending(t) == 0 })
	want := map[string]int{}
	for _, a := range aggs {
		want[a] = 7
	}
	f.checkLedger(t, want)
	for i, res := range obs.all() {
		switch {
		case i < 20 && stored[res.ID]:
			if res.Outcome != inbox.Duplicate || !res.Claimed {
				t.Errorf("result %d %+v: stored by the dead consumer, want a claimed Duplicate", i, res)
			}
		case i < 20:
			if res.Outcome != inbox.Applied || !res.Claimed {
				t.Errorf("result %d %+v: want a claimed Applied", i, res)
			}
		default:
			if res.Outcome != inbox.Applied || res.Claimed {
				t.Errorf("result %d %+v: a newer entry, want Applied, not claimed", i, res)
			}
		}
	}
	s := r.Stats()
	if s.Claimed != 20 || s.Duplicates != 8 || s.Applied != 20 || s.Deleted != 1 || s.Sessions != 1 {
		t.Errorf("stats %+v, want 20 claimed (and 1 deleted), 8 duplicates, 20 applied, 1 session", s)
	}
	cs, err := f.c.XInfoConsumers(ctx, st, f.group).Result()
	if err != nil || len(cs) != 1 || cs[0].Name != "alive" {
		t.Errorf("consumers %+v, %v: want the dead one removed", cs, err)
	}
}

// TestTwoRunnersOneConsumes: of two runners of one group only the lease
// holder consumes; when it stops, the other takes over, and every
// aggregate is applied once in order across the handover.
func TestTwoRunnersOneConsumes(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	f := newFixture(t, 1)
	st := f.streams[0]
	aggs := aggregates("agg-", 5)
	obs := []*recorder{{}, {}}
	rs := make([]*inboxredis.Runner, 2)
	stops := make([]func(), 2)
	for i := range rs {
		rs[i] = f.runner(t, func(c *inboxredis.Config) {
			c.Observer = obs[i]
			c.Consumer = fmt.Sprintf("runner-%d", i)
		})
		stops[i] = run(t, rs[i])
	}
	f.publish(t, st, aggs, 1, 20)
	testdb.Eventually(t, ctx, "the first half applied", func() bool {
		return f.applied(t) >= 100 && obs[0].count()+obs[1].count() >= 100
	})
	holder := 0
	if obs[1].count() > 0 {
		holder = 1
	}
	other := 1 - holder
	if obs[other].count() != 0 || obs[holder].count() != 100 {
		t.Fatalf("runner %d handled %d entries and runner %d %d: want one runner to handle all", holder, obs[holder].count(), other, obs[other].count())
	}
	// Part of the second half goes out while the holder still consumes.
	f.publish(t, st, aggs, 21, 25)
	stops[holder]()
	f.publish(t, st, aggs, 26, 40)
	testdb.Eventually(t, ctx, "the second half applied", func() bool { return f.applied(t) >= 200 })
	testdb.Eventually(t, ctx, "every entry acknowledged", func() bool { return f.pending(t) == 0 })
	want := map[string]int{}
	for _, a := range aggs {
		want[a] = 40
	}
	f.checkLedger(t, want)
	if rs[other].Stats().Sessions != 1 || rs[holder].Stats().Sessions != 1 {
		t.Errorf("sessions %d and %d, want 1 each", rs[holder].Stats().Sessions, rs[other].Stats().Sessions)
	}
	if n := obs[holder].count() + obs[other].count(); n < 200 {
		t.Errorf("%d results for 200 entries", n)
	}
	for _, res := range obs[other].all() {
		if res.Outcome != inbox.Applied && res.Outcome != inbox.Duplicate {
			t.Errorf("result %+v", res)
		}
	}
}

// TestLostLeaseFencesTheReads: when the lease passes to another holder
// (here an intruder overwrites it, as if it had expired and been taken),
// the runner takes no further entry: its reads are refused by Redis, not
// only stopped by its own clock. Once the lease is free again it resumes.
func TestLostLeaseFencesTheReads(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	f := newFixture(t, 1)
	st := f.streams[0]
	logs := &testdb.SyncBuffer{}
	obs := &recorder{}
	r := f.runner(t, func(c *inboxredis.Config) {
		c.Observer = obs
		c.LeaseTTL = 15 * time.Second // the first renewal after 5 s: the fence acts first
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	run(t, r)
	f.publish(t, st, []string{"a"}, 1, 3)
	testdb.Eventually(t, ctx, "the first entries applied", func() bool { return f.applied(t) >= 3 })
	if err := f.c.Set(ctx, f.lease, "intruder", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	f.publish(t, st, []string{"a"}, 4, 6)
	testdb.Eventually(t, ctx, "the runner stopped consuming", func() bool {
		return strings.Contains(logs.String(), "consumer lease lost")
	})
	if n := f.applied(t); n != 3 {
		t.Fatalf("%d entries applied while another holder had the lease, want 3", n)
	}
	gs, err := f.c.XInfoGroups(ctx, st).Result()
	if err != nil || len(gs) != 1 || gs[0].Pending != 0 || gs[0].Lag != 3 {
		t.Fatalf("group %+v, %v: want the 3 newer entries undelivered", gs, err)
	}
	if !strings.Contains(logs.String(), "held by another session") {
		t.Errorf("the runner's read was not refused by the fence; logs:\n%s", logs.String())
	}
	if err := f.c.Del(ctx, f.lease).Err(); err != nil {
		t.Fatal(err)
	}
	testdb.Eventually(t, ctx, "the runner resumed", func() bool { return f.applied(t) >= 6 })
	f.checkLedger(t, map[string]int{"a": 6})
	if s := r.Stats(); s.Sessions != 2 {
		t.Errorf("stats %+v, want 2 sessions", s)
	}
}

// TestContextForReachesTheHandler: each handler gets the context
// Config.ContextFor derived from its own entry, also in a batch.
func TestContextForReachesTheHandler(t *testing.T) {
	t.Parallel()
	forBatchSizes(t, testContextForReachesTheHandler)
}

type entryKey struct{}

func testContextForReachesTheHandler(t *testing.T, batch int) {
	ctx := testCtx(t, 60*time.Second)
	f := newFixture(t, 1)
	st := f.streams[0]
	var mu sync.Mutex
	var wrong []string
	seen := 0
	r := f.runner(t, func(c *inboxredis.Config) {
		c.BatchSize = batch
		c.BatchLinger = 50 * time.Millisecond
		c.ContextFor = func(ctx context.Context, stream string, e redis.XMessage) context.Context {
			return context.WithValue(ctx, entryKey{}, e.Values[emit.HeaderMessageID])
		}
		c.Handler = func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
			mu.Lock()
			defer mu.Unlock()
			seen++
			if got := ctx.Value(entryKey{}); got != m.ID {
				wrong = append(wrong, fmt.Sprintf("%v for %s", got, m.ID))
			}
			return nil
		}
	})
	f.publish(t, st, aggregates("agg-", 3), 1, 4)
	run(t, r)
	testdb.Eventually(t, ctx, "every entry handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seen >= 12
	})
	mu.Lock()
	defer mu.Unlock()
	if len(wrong) > 0 {
		t.Fatalf("handlers got another entry's context: %v", wrong)
	}
}

// TestStopFinishesTheHandlerInProgress: a stop waits for the handler in
// progress, acknowledges its entry, and Run returns nil.
func TestStopFinishesTheHandlerInProgress(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	f := newFixture(t, 1)
	st := f.streams[0]
	entered := make(chan struct{})
	release := make(chan struct{})
	inner := ledgertest.LedgerHandler(pgx.Dialect, f.db.Ledger)
	var once sync.Once
	r := f.runner(t, func(c *inboxredis.Config) {
		c.Handler = func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
			once.Do(func() {
				close(entered)
				<-release
			})
			return inner(ctx, tx, m)
		}
	})
	f.publish(t, st, []string{"a"}, 1, 3)
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("the handler never ran")
	}
	cancel()
	close(release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Run did not return")
	}
	rows := ledgertest.Read(t, f.db.DB, f.db.Ledger)
	if len(rows) < 1 || rows[0].Seq != 1 {
		t.Fatalf("ledger %v: the handler in progress at the stop should have committed", rows)
	}
	xs, err := f.c.XRange(ctx, st, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	p, err := f.c.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: st, Group: f.group, Start: "-", End: "+", Count: 10}).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range p {
		if e.ID == xs[0].ID {
			t.Fatalf("the entry stored before the stop is still pending: %+v", p)
		}
	}
	if n, err := f.c.Exists(ctx, f.lease).Result(); err != nil || n != 0 {
		t.Errorf("lease key still set (%d, %v) after Run returned: want it released", n, err)
	}
}

// TestMessageFromEntry: an entry of the relay publisher converts to the
// inbox message; one from another producer gets an ID naming the entry.
func TestMessageFromEntry(t *testing.T) {
	t.Parallel()
	if inboxredis.PayloadField != redispub.PayloadField {
		t.Fatalf("PayloadField %q, the publisher's %q", inboxredis.PayloadField, redispub.PayloadField)
	}
	m := inboxredis.Message("s", redis.XMessage{ID: "5-1", Values: map[string]any{
		redispub.PayloadField: `{"a":1}`, emit.HeaderMessageID: "m-1", emit.HeaderAggregateType: "order",
		emit.HeaderAggregateID: "o-1", "traceparent": "00-x"}})
	if m.ID != "m-1" || m.AggregateType != "order" || m.AggregateID != "o-1" || m.Topic != "s" ||
		string(m.Payload) != `{"a":1}` || m.Headers["traceparent"] != "00-x" || len(m.Headers) != 4 {
		t.Fatalf("message %+v", m)
	}
	m = inboxredis.Message("s", redis.XMessage{ID: "5-1", Values: map[string]any{"k": "v"}})
	if m.ID != "s/5-1" || m.AggregateType != "s" || m.Headers["k"] != "v" || m.Payload != nil {
		t.Fatalf("foreign entry's message %+v", m)
	}
}

// TestRunnerOutlivesARedisOutage: Redis unreachable for longer than the
// lease: the holder stops consuming when it cannot renew, and consumes
// again, in order and exactly once, when Redis is back.
func TestRunnerOutlivesARedisOutage(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	f := newFixture(t, 1)
	st := f.streams[0]
	px, err := faultproxy.Start(redisAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	viaProxy := client(t, px.Addr())
	logs := &testdb.SyncBuffer{}
	r := f.runner(t, func(c *inboxredis.Config) {
		c.Client = viaProxy
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	run(t, r)
	aggs := aggregates("agg-", 3)
	f.publish(t, st, aggs, 1, 5)
	testdb.Eventually(t, ctx, "the first entries applied", func() bool { return f.applied(t) >= 15 })
	px.Refuse(true)
	px.CutAll()
	f.publish(t, st, aggs, 6, 10) // directly
	testdb.Eventually(t, ctx, "the holder stopped", func() bool { return strings.Contains(logs.String(), "consumer lease lost") })
	px.Refuse(false)
	testdb.Eventually(t, ctx, "every entry applied", func() bool { return f.applied(t) >= 30 })
	testdb.Eventually(t, ctx, "every entry acknowledged", func() bool { return f.pending(t) == 0 })
	want := map[string]int{}
	for _, a := range aggs {
		want[a] = 10
	}
	f.checkLedger(t, want)
	if s := r.Stats(); s.Sessions < 2 {
		t.Errorf("stats %+v, want a second session after the outage", s)
	}
}

// TestRunnerRecreatesADeletedGroup: a group destroyed while the runner
// consumes ends the session; the next one creates it again at StartID
// ("0") and reads the stream again, which the inbox recognises.
func TestRunnerRecreatesADeletedGroup(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	f := newFixture(t, 1)
	st := f.streams[0]
	r := f.runner(t, nil)
	run(t, r)
	f.publish(t, st, []string{"a", "b"}, 1, 5)
	testdb.Eventually(t, ctx, "the first entries applied", func() bool { return f.applied(t) >= 10 })
	testdb.Eventually(t, ctx, "the first entries acknowledged", func() bool { return f.pending(t) == 0 })
	if err := f.c.XGroupDestroy(ctx, st, f.group).Err(); err != nil {
		t.Fatal(err)
	}
	f.publish(t, st, []string{"a", "b"}, 6, 8)
	testdb.Eventually(t, ctx, "every entry applied", func() bool { return f.applied(t) >= 16 })
	testdb.Eventually(t, ctx, "the old entries recognised", func() bool { return r.Stats().Duplicates >= 10 })
	f.checkLedger(t, map[string]int{"a": 8, "b": 8})
	if s := r.Stats(); s.Sessions != 2 || s.Applied != 16 {
		t.Errorf("stats %+v, want 2 sessions and 16 applied", s)
	}
}
