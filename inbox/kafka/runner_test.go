package inboxkafka_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	inboxkafka "github.com/sqloutbox/outbox/inbox/kafka"
	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

var pgx = testdb.Target{Name: "pgx", Dialect: driver.Postgres}

// newRunner builds a runner on c for topic with quick test settings; mod
// adjusts the config.
func newRunner(t testing.TB, brokers []string, group, topic string, c *ledgertest.DB, mod func(*inboxkafka.Config)) *inboxkafka.Runner {
	t.Helper()
	cfg := inboxkafka.Config{Brokers: brokers, Group: group, Topics: []string{topic}, Inbox: c.Inbox, DB: c.DB,
		Handler: ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger), Backoff: fastRetry, Logger: ledgertest.QuietLogger(),
		CommitInterval: 20 * time.Millisecond, Kgo: groupSettings()}
	if mod != nil {
		mod(&cfg)
	}
	r, err := inboxkafka.NewRunner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	groupOf.Store(r, group)
	return r
}

func TestNewRunnerRejectsBadConfig(t *testing.T) {
	t.Parallel()
	in, err := inbox.New(inbox.Config{Dialect: driver.Postgres, Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	db := &sql.DB{}
	ok := inboxkafka.Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}, Inbox: in, DB: db,
		Handler: func(context.Context, *sql.Tx, inbox.Message) error { return nil }}
	for name, mod := range map[string]func(*inboxkafka.Config){
		"NoBrokers":      func(c *inboxkafka.Config) { c.Brokers = nil },
		"NoGroup":        func(c *inboxkafka.Config) { c.Group = "" },
		"NoTopics":       func(c *inboxkafka.Config) { c.Topics = nil },
		"EmptyTopic":     func(c *inboxkafka.Config) { c.Topics = []string{""} },
		"NoInbox":        func(c *inboxkafka.Config) { c.Inbox = nil },
		"NoDB":           func(c *inboxkafka.Config) { c.DB = nil },
		"NoHandler":      func(c *inboxkafka.Config) { c.Handler = nil },
		"NegativeTries":  func(c *inboxkafka.Config) { c.MaxAttempts = -1 },
		"CommitInterval": func(c *inboxkafka.Config) { c.CommitInterval = time.Nanosecond },
		"Buffered":       func(c *inboxkafka.Config) { c.MaxBufferedRecords = -1 },
		"Policy":         func(c *inboxkafka.Config) { c.OnFailure = 7 },
		"BatchSize":      func(c *inboxkafka.Config) { c.BatchSize = inbox.MaxBatch + 1 },
		"BatchLinger":    func(c *inboxkafka.Config) { c.BatchLinger = -time.Millisecond },
	} {
		cfg := ok
		mod(&cfg)
		if _, err := inboxkafka.NewRunner(cfg); !errors.Is(err, inboxkafka.ErrInvalidConfig) {
			t.Errorf("%s: err %v, want ErrInvalidConfig", name, err)
		}
	}
	r, err := inboxkafka.NewRunner(ok)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); !errors.Is(err, inboxkafka.ErrStarted) {
		t.Fatalf("second Run: %v, want ErrStarted", err)
	}
}

// TestRunRefusesWithoutTheSchema: Run checks the inbox table first and
// returns ErrSchemaMissing at once, instead of retrying every record
// against a table that is not there.
func TestRunRefusesWithoutTheSchema(t *testing.T) {
	t.Parallel()
	b, topic := startBroker(t, 1)
	c := ledgertest.NewDB(t, pgx)
	in, err := inbox.New(inbox.Config{Dialect: c.Env.Target.Dialect, Table: c.Env.Q("not_migrated"), Consumer: "c", Logger: ledgertest.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	r := newRunner(t, b.Addrs(), randomName("g-"), topic, c, func(cfg *inboxkafka.Config) { cfg.Inbox = in })
	err = r.Run(testCtx(t, 30*time.Second))
	if !errors.Is(err, inbox.ErrSchemaMissing) {
		t.Fatalf("Run = %v, want ErrSchemaMissing", err)
	}
}

// TestRunnerAppliesInOrderPerPartition: every record applied once, each
// partition's offsets handled strictly in order, each aggregate's seqs in
// order, and the offsets committed up to the end.
func TestRunnerAppliesInOrderPerPartition(t *testing.T) {
	t.Parallel()
	forBatchSizes(t, testRunnerAppliesInOrderPerPartition)
}

// forBatchSizes runs a test with one record per transaction and with
// batches (Config.BatchSize 8).
func forBatchSizes(t *testing.T, f func(t *testing.T, batch int)) {
	for _, n := range []int{0, 8} {
		t.Run(fmt.Sprintf("batch%d", n), func(t *testing.T) {
			t.Parallel()
			f(t, n)
		})
	}
}

func testRunnerAppliesInOrderPerPartition(t *testing.T, batch int) {
	b, topic := startBroker(t, 4)
	c := ledgertest.NewDB(t, pgx)
	want := produce(t, b.Addrs(), topic, 12, 25)
	var mu sync.Mutex
	lastOffset := map[int32]int64{}
	var outOfOrder []string
	inner := ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger)
	r := newRunner(t, b.Addrs(), randomName("g-"), topic, c, func(cfg *inboxkafka.Config) {
		cfg.BatchSize = batch
		cfg.Handler = func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
			mu.Lock()
			if last, ok := lastOffset[m.Partition]; ok && m.Offset != last+1 {
				outOfOrder = append(outOfOrder, fmt.Sprintf("p%d: %d after %d", m.Partition, m.Offset, last))
			}
			lastOffset[m.Partition] = m.Offset
			mu.Unlock()
			return inner(ctx, tx, m)
		}
	})
	runRunner(t, r)
	ctx := testCtx(t, 60*time.Second)
	testdb.Eventually(t, ctx, "every record applied", func() bool { return ledgertest.Count(t, c.DB, c.Ledger) >= 12*25 })
	if probs := ledgertest.Check(ledgertest.Read(t, c.DB, c.Ledger), want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
	mu.Lock()
	if len(outOfOrder) > 0 {
		t.Fatalf("out of order: %v", outOfOrder)
	}
	mu.Unlock()
	testdb.Eventually(t, ctx, "offsets committed to the end", func() bool {
		return committedTotal(t, ctx, b.Addrs(), r, topic) == 12*25
	})
	st := r.Stats()
	if st.Applied != 12*25 || st.Duplicates != 0 || st.HandlerErrors != 0 {
		t.Fatalf("stats %+v", st)
	}
	// Batched: fewer transactions than records (the records were all
	// produced before the runner started).
	if batch > 0 && (st.Batches == 0 || st.Batches >= st.Applied) || batch == 0 && st.Batches != 0 {
		t.Fatalf("stats %+v: batches for BatchSize %d", st, batch)
	}
	t.Logf("%d records in %d batches", st.Applied, st.Batches)
}

var groupOf sync.Map // *Runner -> group, for committedTotal

// committedTotal sums the group's committed offsets of topic.
func committedTotal(t testing.TB, ctx context.Context, brokers []string, r *inboxkafka.Runner, topic string) int64 {
	t.Helper()
	g, _ := groupOf.Load(r)
	group, _ := g.(string)
	if group == "" {
		t.Fatal("runner's group unknown: create it with newRunner")
	}
	return committed(t, ctx, brokers, group, topic)
}

func committed(t testing.TB, ctx context.Context, brokers []string, group, topic string) int64 {
	t.Helper()
	adm, err := kadm.NewOptClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	offs, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return -1
	}
	var n int64
	for _, ps := range offs {
		for _, o := range ps {
			if o.Topic == topic && o.At > 0 {
				n += o.At
			}
		}
	}
	return n
}

// TestRunnerCommitsOnlyAfterTheTransaction: inside each handler, before
// its transaction commits, the group's committed offset of the partition
// is never past the record (commits every millisecond to give a premature
// commit every chance).
func TestRunnerCommitsOnlyAfterTheTransaction(t *testing.T) {
	t.Parallel()
	b, topic := startBroker(t, 2)
	c := ledgertest.NewDB(t, pgx)
	produce(t, b.Addrs(), topic, 4, 10)
	group := randomName("g-")
	adm, err := kadm.NewOptClient(kgo.SeedBrokers(b.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	var early atomic.Int64
	inner := ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger)
	r := newRunner(t, b.Addrs(), group, topic, c, func(cfg *inboxkafka.Config) {
		cfg.CommitInterval = time.Millisecond
		cfg.Handler = func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
			if err := inner(ctx, tx, m); err != nil {
				return err
			}
			// Give the committer time to run while this transaction is open.
			deadline := time.Now().Add(5 * time.Millisecond)
			for time.Now().Before(deadline) {
				offs, err := adm.FetchOffsets(ctx, group)
				if err != nil {
					return err
				}
				if o, ok := offs.Lookup(m.Topic, m.Partition); ok && o.At > m.Offset {
					early.Add(1)
				}
			}
			return nil
		}
	})
	runRunner(t, r)
	ctx := testCtx(t, 60*time.Second)
	testdb.Eventually(t, ctx, "offsets committed to the end", func() bool { return committedTotal(t, ctx, b.Addrs(), r, topic) == 40 })
	if n := early.Load(); n != 0 {
		t.Fatalf("%d times an offset was committed past a record whose transaction was open", n)
	}
	if n := ledgertest.Count(t, c.DB, c.Ledger); n != 40 {
		t.Fatalf("%d ledger rows, want 40", n)
	}
}

// TestRunnerRetriesThenParksThenHolds: a handler failing for one message
// is tried MaxAttempts times, then the message is parked; its aggregate's
// later records are held, not applied; other aggregates go on; a handler
// error wrapping ErrPermanent parks at the first attempt; a panic is an
// error.
func TestRunnerRetriesThenParksThenHolds(t *testing.T) {
	t.Parallel()
	forBatchSizes(t, testRunnerRetriesThenParksThenHolds)
}

func testRunnerRetriesThenParksThenHolds(t *testing.T, batch int) {
	b, topic := startBroker(t, 2)
	c := ledgertest.NewDB(t, pgx)
	want := produce(t, b.Addrs(), topic, 4, 5)
	inner := ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger)
	var attempts sync.Map
	var failures atomic.Int64
	reg := prometheus.NewRegistry()
	m, err := inboxkafka.NewMetrics(reg, "g")
	if err != nil {
		t.Fatal(err)
	}
	r := newRunner(t, b.Addrs(), randomName("g-"), topic, c, func(cfg *inboxkafka.Config) {
		cfg.MaxAttempts = 3
		cfg.BatchSize = batch
		cfg.Observer = m
		cfg.Inbox = c.Observed(t, m)
		cfg.Handler = func(ctx context.Context, tx *sql.Tx, msg inbox.Message) error {
			n, _ := attempts.LoadOrStore(msg.ID, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			switch {
			case msg.AggregateID == "agg-000" && strings.Contains(string(msg.Payload), `"seq":2`):
				failures.Add(1)
				return errors.New("agg-000 seq 2 always fails")
			case msg.AggregateID == "agg-001" && strings.Contains(string(msg.Payload), `"seq":3`):
				failures.Add(1)
				return fmt.Errorf("bad: %w", inboxkafka.ErrPermanent)
			case msg.AggregateID == "agg-002" && strings.Contains(string(msg.Payload), `"seq":4`):
				failures.Add(1)
				panic("agg-002 seq 4 panics")
			}
			return inner(ctx, tx, msg)
		}
	})
	runRunner(t, r)
	ctx := testCtx(t, 60*time.Second)
	// agg-000 applies seq 1, agg-001 seqs 1-2, agg-002 seqs 1-3, agg-003 all 5.
	testdb.Eventually(t, ctx, "3 parked, the rest applied or held", func() bool {
		st := r.Stats()
		return st.Parked == 3 && st.Applied+st.Held == 20-3
	})
	st := r.Stats()
	// 3 + 1 + 3 failed attempts; held: agg-000 3, agg-001 2, agg-002 1.
	if st.HandlerErrors != 7 || failures.Load() != 7 || st.Held != 6 || st.Applied != 11 {
		t.Fatalf("stats %+v, handler failures %d", st, failures.Load())
	}
	rows := ledgertest.Read(t, c.DB, c.Ledger)
	want["agg-000"], want["agg-001"], want["agg-002"] = 1, 2, 3
	if probs := ledgertest.Check(rows, want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
	for name, v := range map[string]float64{
		inboxkafka.MetricParked: 3, inboxkafka.MetricHeld: 6, inboxkafka.MetricProcessed: 11, inboxkafka.MetricHandlerErrors: 7,
	} {
		if got := counterValue(t, reg, name); got != v {
			t.Errorf("%s = %v, want %v", name, got, v)
		}
	}
}

func counterValue(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var v float64
			for _, m := range mf.Metric {
				v += m.GetCounter().GetValue()
			}
			return v
		}
	}
	t.Fatalf("metric %s not gathered", name)
	return 0
}

// TestMetricsLagAndDuration: the lag gauge of a partition reaches 0 when
// its records are done, the duration histogram counts every stored
// outcome, a second registration errors, an empty group is refused.
func TestMetricsLagAndDuration(t *testing.T) {
	t.Parallel()
	b, topic := startBroker(t, 2)
	c := ledgertest.NewDB(t, pgx)
	produce(t, b.Addrs(), topic, 16, 2)
	reg := prometheus.NewRegistry()
	m, err := inboxkafka.NewMetrics(reg, "g")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inboxkafka.NewMetrics(reg, "g"); err == nil {
		t.Fatal("a second registration of group g succeeded")
	}
	if _, err := inboxkafka.NewMetrics(reg, ""); !errors.Is(err, inboxkafka.ErrInvalidConfig) {
		t.Fatalf("empty group: %v", err)
	}
	r := newRunner(t, b.Addrs(), randomName("g-"), topic, c, func(cfg *inboxkafka.Config) {
		cfg.Observer = m
		cfg.Inbox = c.Observed(t, m)
	})
	runRunner(t, r)
	ctx := testCtx(t, 60*time.Second)
	testdb.Eventually(t, ctx, "32 processed", func() bool { return r.Stats().Applied == 32 })
	// A worker reports a partition's lag after its record's outcome is
	// counted, so the last report may follow Applied == 32 (seen beside a
	// CI run: lag 1 read in between): wait for every series to read 0.
	testdb.Eventually(t, ctx, "lag 0 on every partition", func() bool {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		lagSeries := 0
		for _, mf := range mfs {
			if mf.GetName() != inboxkafka.MetricLag {
				continue
			}
			for _, s := range mf.Metric {
				lagSeries++
				if s.GetGauge().GetValue() != 0 {
					return false
				}
			}
		}
		return lagSeries == 2 // one per partition
	})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case inboxkafka.MetricHandlerDuration:
			if n := mf.Metric[0].GetHistogram().GetSampleCount(); n != 32 {
				t.Errorf("duration samples %d, want 32", n)
			}
		}
	}
}

// TestRunnerSkipAfterParkDoesNotHold: with SkipAfterPark a failing
// message is parked and skipped at once; its aggregate's later records
// are applied, and the skipped message stays a dead letter no more (a
// redelivery would be a Duplicate).
func TestRunnerSkipAfterParkDoesNotHold(t *testing.T) {
	t.Parallel()
	b, topic := startBroker(t, 1)
	c := ledgertest.NewDB(t, pgx)
	produce(t, b.Addrs(), topic, 2, 4)
	inner := ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger)
	r := newRunner(t, b.Addrs(), randomName("g-"), topic, c, func(cfg *inboxkafka.Config) {
		cfg.OnFailure = inboxkafka.SkipAfterPark
		cfg.MaxAttempts = 2
		cfg.Handler = func(ctx context.Context, tx *sql.Tx, msg inbox.Message) error {
			if msg.AggregateID == "agg-000" && strings.Contains(string(msg.Payload), `"seq":2`) {
				return errors.New("agg-000 seq 2 fails")
			}
			return inner(ctx, tx, msg)
		}
	})
	runRunner(t, r)
	ctx := testCtx(t, 60*time.Second)
	testdb.Eventually(t, ctx, "7 applied, 1 parked", func() bool { st := r.Stats(); return st.Applied == 7 && st.Parked == 1 })
	if st := r.Stats(); st.Held != 0 || st.HandlerErrors != 2 {
		t.Fatalf("stats %+v", st)
	}
	parked, err := c.Inbox.ListParked(ctx, c.DB, inbox.ParkedFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) != 0 {
		t.Fatalf("still parked or held after SkipAfterPark: %+v", parked)
	}
}

// TestRunnerParkedThenRetried: a message parks its aggregate; the later
// records are held as they arrive (their offsets committed); Runner.Retry,
// with a handler that now works, applies the parked and held messages in
// order; nothing is left parked.
func TestRunnerParkedThenRetried(t *testing.T) {
	t.Parallel()
	b, topic := startBroker(t, 1)
	c := ledgertest.NewDB(t, pgx)
	want := produce(t, b.Addrs(), topic, 2, 5)
	inner := ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger)
	var broken atomic.Bool
	broken.Store(true)
	group := randomName("g-")
	r := newRunner(t, b.Addrs(), group, topic, c, func(cfg *inboxkafka.Config) {
		cfg.MaxAttempts = 2
		cfg.Handler = func(ctx context.Context, tx *sql.Tx, msg inbox.Message) error {
			if broken.Load() && msg.AggregateID == "agg-001" && strings.Contains(string(msg.Payload), `"seq":3`) {
				return errors.New("agg-001 seq 3 fails")
			}
			return inner(ctx, tx, msg)
		}
	})
	runRunner(t, r)
	ctx := testCtx(t, 60*time.Second)
	testdb.Eventually(t, ctx, "offsets committed past the held records", func() bool { return committed(t, ctx, b.Addrs(), group, topic) == 10 })
	if st := r.Stats(); st.Parked != 1 || st.Held != 2 || st.Applied != 7 {
		t.Fatalf("stats %+v", st)
	}
	parked, err := c.Inbox.ListParked(ctx, c.DB, inbox.ParkedFilter{AggregateType: "order", AggregateID: "agg-001"})
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) != 3 || parked[0].Held || !parked[1].Held || parked[0].Attempts != 2 {
		t.Fatalf("parked %+v", parked)
	}
	broken.Store(false)
	n, err := r.Retry(ctx, inbox.ParkedFilter{AggregateType: "order", AggregateID: "agg-001"})
	if err != nil || n != 3 {
		t.Fatalf("Retry: %d, %v", n, err)
	}
	if probs := ledgertest.Check(ledgertest.Read(t, c.DB, c.Ledger), want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
	if left, err := c.Inbox.ListParked(ctx, c.DB, inbox.ParkedFilter{}); err != nil || len(left) != 0 {
		t.Fatalf("after Retry: %+v, %v", left, err)
	}
}

// TestRunnerPassesOverInvalidRecords: a record whose message ID the inbox
// cannot store (not UTF-8) is logged, counted and passed over; the
// partition goes on.
func TestRunnerPassesOverInvalidRecords(t *testing.T) {
	t.Parallel()
	b, topic := startBroker(t, 1)
	c := ledgertest.NewDB(t, pgx)
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	bad := record("agg-1", 1)
	bad.Headers[0].Value = []byte{0xff, 0xfe}
	ctx := testCtx(t, 60*time.Second)
	if err := cl.ProduceSync(ctx, bad, record("agg-1", 1)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	r := newRunner(t, b.Addrs(), randomName("g-"), topic, c, nil)
	runRunner(t, r)
	testdb.Eventually(t, ctx, "the valid record applied", func() bool { return r.Stats().Applied == 1 })
	if st := r.Stats(); st.Invalid != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestRunnerAttemptTimeout: an attempt that outlives AttemptTimeout is a
// failed attempt; after MaxAttempts the record is parked and the
// partition goes on. The timeout is generous (the hung record costs two of
// them): at 50 ms the healthy records' own transactions timed out too on
// a loaded machine (HandlerErrors 3, StoreErrors 1), so the test counts
// the hung record's attempts itself and allows the others a retry.
func TestRunnerAttemptTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 2 * time.Second
	b, topic := startBroker(t, 1)
	c := ledgertest.NewDB(t, pgx)
	produce(t, b.Addrs(), topic, 1, 3)
	inner := ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger)
	var hung atomic.Int64 // attempts at the hung record that ended by the timeout
	r := newRunner(t, b.Addrs(), randomName("g-"), topic, c, func(cfg *inboxkafka.Config) {
		cfg.MaxAttempts = 2
		cfg.AttemptTimeout = timeout
		cfg.OnFailure = inboxkafka.SkipAfterPark
		cfg.Handler = func(ctx context.Context, tx *sql.Tx, msg inbox.Message) error {
			if strings.Contains(string(msg.Payload), `"seq":2`) {
				<-ctx.Done() // a hung dependency that honours ctx
				if errors.Is(ctx.Err(), context.DeadlineExceeded) {
					hung.Add(1)
				}
				return ctx.Err()
			}
			return inner(ctx, tx, msg)
		}
	})
	runRunner(t, r)
	ctx := testCtx(t, 60*time.Second)
	testdb.Eventually(t, ctx, "2 applied, 1 parked", func() bool { st := r.Stats(); return st.Applied == 2 && st.Parked == 1 })
	if n, st := hung.Load(), r.Stats(); n != 2 || st.HandlerErrors < 2 {
		t.Fatalf("the hung record timed out %d times, want MaxAttempts (2); stats %+v", n, st)
	}
}

// TestRunnerBackpressure: with a buffer of 3 records per partition the
// partitions are paused and resumed over and over; every record is still
// applied once, in order, and nothing stays paused.
func TestRunnerBackpressure(t *testing.T) {
	t.Parallel()
	b, topic := startBroker(t, 2)
	c := ledgertest.NewDB(t, pgx)
	want := produce(t, b.Addrs(), topic, 8, 40)
	group := randomName("g-")
	r := newRunner(t, b.Addrs(), group, topic, c, func(cfg *inboxkafka.Config) { cfg.MaxBufferedRecords = 3 })
	runRunner(t, r)
	ctx := testCtx(t, 60*time.Second)
	testdb.Eventually(t, ctx, "offsets committed to the end", func() bool { return committed(t, ctx, b.Addrs(), group, topic) == 8*40 })
	if probs := ledgertest.Check(ledgertest.Read(t, c.DB, c.Ledger), want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
}

// TestRunnerChainedEmit: a handler on an outbox-wrapped pool emits the
// next event in the inbox's transaction (consume, change state, emit):
// one outbox row per applied message, none for duplicates.
func TestRunnerChainedEmit(t *testing.T) {
	t.Parallel()
	b, topic := startBroker(t, 2)
	c := ledgertest.NewDB(t, pgx)
	produce(t, b.Addrs(), topic, 5, 4)
	inner := ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger)
	handler := func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
		if err := inner(ctx, tx, m); err != nil {
			return err
		}
		return outbox.Emit(ctx, outbox.Event{AggregateType: "invoice", AggregateID: m.AggregateID, Type: "invoice.line", Payload: m.Payload})
	}
	ctx := testCtx(t, 60*time.Second)
	for round := 0; round < 2; round++ { // the second group replays: all duplicates
		r := newRunner(t, b.Addrs(), randomName("g-"), topic, c, func(cfg *inboxkafka.Config) {
			cfg.DB = c.Env.DB // wrapped by the outbox driver
			cfg.Handler = handler
		})
		stop := runRunner(t, r)
		testdb.Eventually(t, ctx, "20 records stored", func() bool { st := r.Stats(); return st.Applied+st.Duplicates == 20 })
		stop()
	}
	if n := ledgertest.Count(t, c.DB, c.Env.Table); n != 20 {
		t.Fatalf("%d outbox rows, want one per applied message (20)", n)
	}
}

// TestRunnerWaitsOutADatabaseOutage: while the consumer's database refuses
// connections the records wait (inbox errors are retried without limit,
// never counted as attempts, never parked); once it is back each is
// applied once, in order.
func TestRunnerWaitsOutADatabaseOutage(t *testing.T) {
	t.Parallel()
	b, topic := startBroker(t, 2)
	c := ledgertest.NewDB(t, pgx)
	u, err := url.Parse(testdb.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	u.Host = p.Addr()
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	group := randomName("g-")
	r := newRunner(t, b.Addrs(), group, topic, c, func(cfg *inboxkafka.Config) { cfg.DB = db; cfg.MaxAttempts = 1 })
	runRunner(t, r)
	p.Refuse(true)
	want := produce(t, b.Addrs(), topic, 6, 5)
	ctx := testCtx(t, 60*time.Second)
	testdb.Eventually(t, ctx, "the inbox failing", func() bool { return r.Stats().StoreErrors >= 10 })
	if st := r.Stats(); st.Applied != 0 || st.Parked != 0 || st.HandlerErrors != 0 {
		t.Fatalf("during the outage: %+v", st)
	}
	p.Refuse(false)
	testdb.Eventually(t, ctx, "offsets committed to the end", func() bool { return committed(t, ctx, b.Addrs(), group, topic) == 30 })
	if st := r.Stats(); st.Applied != 30 || st.Parked != 0 {
		t.Fatalf("after the outage: %+v", st)
	}
	if probs := ledgertest.Check(ledgertest.Read(t, c.DB, c.Ledger), want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
}

// TestRunnerReadsCommittedOnly: records of an aborted Kafka transaction
// (what the relay's exactly-once mode leaves in the log when a transaction
// fails) never reach the handler; the committed transaction's do. With
// ReadUncommitted the aborted ones are applied too, which shows that they
// are in the log.
func TestRunnerReadsCommittedOnly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name            string
		readUncommitted bool
		want            []string
	}{
		{"ReadCommitted", false, []string{"committed"}},
		{"ReadUncommitted", true, []string{"aborted", "committed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, topic := startBroker(t, 1)
			ctx := testCtx(t, 60*time.Second)
			cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.DefaultProduceTopic(topic), kgo.TransactionalID(randomName("txn-")))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			for _, v := range []struct {
				agg    string
				commit kgo.TransactionEndTry
			}{{"aborted", kgo.TryAbort}, {"committed", kgo.TryCommit}} {
				if err := cl.BeginTransaction(); err != nil {
					t.Fatal(err)
				}
				if err := cl.ProduceSync(ctx, record(v.agg, 1)).FirstErr(); err != nil {
					t.Fatal(err)
				}
				if err := cl.EndTransaction(ctx, v.commit); err != nil {
					t.Fatal(err)
				}
			}
			c := ledgertest.NewDB(t, pgx)
			var mu sync.Mutex
			var got []string
			inner := ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger)
			r := newRunner(t, b.Addrs(), randomName("g-"), topic, c, func(cfg *inboxkafka.Config) {
				cfg.ReadUncommitted = tc.readUncommitted
				cfg.Handler = func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
					mu.Lock()
					got = append(got, m.AggregateID)
					mu.Unlock()
					return inner(ctx, tx, m)
				}
			})
			runRunner(t, r)
			// The committed record is the last one: once it is applied,
			// everything before it was read.
			testdb.Eventually(t, ctx, "the committed record applied", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return slices.Contains(got, "committed")
			})
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(got, tc.want) {
				t.Errorf("handled %v, want %v", got, tc.want)
			}
		})
	}
}

// TestRunnerServesSkipAndRetryRequests: what `outbox inbox parked skip`
// and `retry` do from outside (inbox.Skip, inbox.RequestRetry on another
// Inbox of the same table and consumer) the running runner serves within
// its RequestInterval with its own handler: the held messages behind a
// skipped one are applied in order, and a requested retry applies the
// parked message and what it held.
func TestRunnerServesSkipAndRetryRequests(t *testing.T) {
	t.Parallel()
	b, topic := startBroker(t, 1)
	c := ledgertest.NewDB(t, pgx)
	want := produce(t, b.Addrs(), topic, 3, 4)
	inner := ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger)
	var broken atomic.Bool
	broken.Store(true)
	group := randomName("g-")
	r := newRunner(t, b.Addrs(), group, topic, c, func(cfg *inboxkafka.Config) {
		cfg.MaxAttempts = 1
		cfg.RequestInterval = 20 * time.Millisecond
		cfg.Handler = func(ctx context.Context, tx *sql.Tx, msg inbox.Message) error {
			if broken.Load() && (msg.AggregateID == "agg-000" || msg.AggregateID == "agg-001") && strings.Contains(string(msg.Payload), `"seq":2`) {
				return errors.New("seq 2 fails")
			}
			return inner(ctx, tx, msg)
		}
	})
	runRunner(t, r)
	ctx := testCtx(t, 60*time.Second)
	testdb.Eventually(t, ctx, "two parked, four held", func() bool { st := r.Stats(); return st.Parked == 2 && st.Held == 4 })
	broken.Store(false)
	// The operator skips agg-000's seq 2 and asks for agg-001's retry.
	if n, err := c.Inbox.Skip(ctx, c.DB, inbox.ParkedFilter{AggregateType: "order", AggregateID: "agg-000"}); err != nil || n != 1 {
		t.Fatalf("Skip: %d, %v", n, err)
	}
	if n, err := c.Inbox.RequestRetry(ctx, c.DB, inbox.ParkedFilter{AggregateType: "order", AggregateID: "agg-001"}); err != nil || n != 1 {
		t.Fatalf("RequestRetry: %d, %v", n, err)
	}
	testdb.Eventually(t, ctx, "nothing parked or held", func() bool {
		left, err := c.Inbox.ListParked(ctx, c.DB, inbox.ParkedFilter{})
		return err == nil && len(left) == 0
	})
	var skipped []int
	var others []ledgertest.Row
	for _, row := range ledgertest.Read(t, c.DB, c.Ledger) {
		if row.Agg == "agg-000" {
			skipped = append(skipped, row.Seq)
		} else {
			others = append(others, row)
		}
	}
	if fmt.Sprint(skipped) != "[1 3 4]" {
		t.Fatalf("agg-000 applied seqs %v, want [1 3 4] (seq 2 skipped)", skipped)
	}
	delete(want, "agg-000")
	if probs := ledgertest.Check(others, want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
}
