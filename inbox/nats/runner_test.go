package inboxnats_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	inboxnats "github.com/sqloutbox/outbox/inbox/nats"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

func TestNewRunnerRejectsBadConfig(t *testing.T) {
	t.Parallel()
	in, err := inbox.New(inbox.Config{Dialect: driver.Postgres, Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	nc := connect(t)
	ok := inboxnats.Config{Conn: nc, Stream: "S", Durable: "d", Inbox: in, DB: &sql.DB{}, Logger: ledgertest.QuietLogger(),
		Handler: func(context.Context, *sql.Tx, inbox.Message) error { return nil }}
	for name, mod := range map[string]func(*inboxnats.Config){
		"NoConn":        func(c *inboxnats.Config) { c.Conn = nil },
		"NoStream":      func(c *inboxnats.Config) { c.Stream = "" },
		"NoDurable":     func(c *inboxnats.Config) { c.Durable = "" },
		"StreamName":    func(c *inboxnats.Config) { c.Stream = "a.b" },
		"DurableName":   func(c *inboxnats.Config) { c.Durable = "d*" },
		"Bucket":        func(c *inboxnats.Config) { c.LeaseBucket = "a.b" },
		"Filter":        func(c *inboxnats.Config) { c.FilterSubject = "a b" },
		"NoInbox":       func(c *inboxnats.Config) { c.Inbox = nil },
		"NoDB":          func(c *inboxnats.Config) { c.DB = nil },
		"NoHandler":     func(c *inboxnats.Config) { c.Handler = nil },
		"NegativeTries": func(c *inboxnats.Config) { c.MaxAttempts = -1 },
		"Policy":        func(c *inboxnats.Config) { c.OnFailure = 7 },
		"BatchSize":     func(c *inboxnats.Config) { c.BatchSize = inbox.MaxBatch + 1 },
		"BatchLinger":   func(c *inboxnats.Config) { c.BatchLinger = -time.Millisecond },
		"Workers":       func(c *inboxnats.Config) { c.Workers = -1 },
		"MaxAckPending": func(c *inboxnats.Config) { c.MaxAckPending = -1 },
		"AckWait":       func(c *inboxnats.Config) { c.AckWait = -time.Second },
		"FetchMaxWait":  func(c *inboxnats.Config) { c.FetchMaxWait = time.Millisecond },
		"LeaseTTL":      func(c *inboxnats.Config) { c.LeaseTTL = 10 * time.Millisecond },
	} {
		cfg := ok
		mod(&cfg)
		if _, err := inboxnats.NewRunner(cfg); !errors.Is(err, inboxnats.ErrInvalidConfig) {
			t.Errorf("%s: err %v, want ErrInvalidConfig", name, err)
		}
	}
	r, err := inboxnats.NewRunner(ok)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); !errors.Is(err, inboxnats.ErrStarted) {
		t.Fatalf("second Run: %v, want ErrStarted", err)
	}
}

// TestRunRefusesWithoutTheSchema: Run checks the inbox table first and
// returns ErrSchemaMissing at once, without touching the broker.
func TestRunRefusesWithoutTheSchema(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	c := ledgertest.NewDB(t, pgx)
	in, err := inbox.New(inbox.Config{Dialect: c.Env.Target.Dialect, Table: c.Env.Q("not_migrated"), Consumer: "c", Logger: ledgertest.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	r := newRunner(t, s, c, func(cfg *inboxnats.Config) { cfg.Inbox = in })
	if err := r.Run(testCtx(t, 30*time.Second)); !errors.Is(err, inbox.ErrSchemaMissing) {
		t.Fatalf("Run = %v, want ErrSchemaMissing", err)
	}
	if _, err := s.js.KeyValue(testCtx(t, 10*time.Second), s.Bucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("lease bucket after a refused Run: %v, want none", err)
	}
}

// TestRunRefusesAnInterestStream: recreating the durable consumer at a
// handover would let an interest stream drop unacknowledged messages, so
// Run refuses one.
func TestRunRefusesAnInterestStream(t *testing.T) {
	t.Parallel()
	s := newSpace(t, func(c *jetstream.StreamConfig) { c.Retention = jetstream.InterestPolicy })
	c := ledgertest.NewDB(t, pgx)
	r := newRunner(t, s, c, nil)
	if err := r.Run(testCtx(t, 60*time.Second)); !errors.Is(err, inboxnats.ErrUnsupportedStream) {
		t.Fatalf("Run = %v, want ErrUnsupportedStream", err)
	}
}

// TestRunRefusesAShortLivedLeaseBucket: a bucket whose TTL is below
// LeaseTTL would expire a live holder's lease.
func TestRunRefusesAShortLivedLeaseBucket(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	if _, err := s.js.CreateKeyValue(testCtx(t, 10*time.Second), jetstream.KeyValueConfig{Bucket: s.Bucket, TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	c := ledgertest.NewDB(t, pgx)
	r := newRunner(t, s, c, nil)
	if err := r.Run(testCtx(t, 60*time.Second)); !errors.Is(err, inboxnats.ErrLeaseBucket) {
		t.Fatalf("Run = %v, want ErrLeaseBucket", err)
	}
}

// TestRunnerAppliesInOrderPerAggregate: every message applied once, each
// aggregate's in order, with the workers running aggregates in parallel;
// every message acknowledged (the consumer's ack floor at the stream's
// end).
func TestRunnerAppliesInOrderPerAggregate(t *testing.T) {
	t.Parallel()
	forBatchSizes(t, testRunnerAppliesInOrderPerAggregate)
}

func testRunnerAppliesInOrderPerAggregate(t *testing.T, batch int) {
	const aggregates, steps = 12, 25
	s := newSpace(t)
	c := ledgertest.NewDB(t, pgx)
	want := s.publish(t, aggregates, 1, steps)
	var rec recorder
	var inFlight, maxInFlight atomic.Int64
	inner := ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger)
	r := newRunner(t, s, c, func(cfg *inboxnats.Config) {
		cfg.BatchSize = batch
		cfg.Observer = &rec
		cfg.Handler = func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			for {
				old := maxInFlight.Load()
				if n <= old || maxInFlight.CompareAndSwap(old, n) {
					break
				}
			}
			return inner(ctx, tx, m)
		}
	})
	runRunner(t, r)
	ctx := testCtx(t, 90*time.Second)
	total := aggregates * steps
	testdb.Eventually(t, ctx, "every message applied and acknowledged", func() bool {
		st := r.Stats()
		return st.Applied == int64(total) && st.Acks == int64(total)
	})
	if probs := ledgertest.Check(ledgertest.Read(t, c.DB, c.Ledger), want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
	st := r.Stats()
	if st.Sessions != 1 || !st.Leading || st.Duplicates != 0 || st.Parked != 0 || st.Restarts != 0 {
		t.Errorf("stats %+v, want one session, no duplicates, parks or restarts", st)
	}
	if batch > 0 && st.Batches == 0 {
		t.Errorf("stats %+v: no batch with BatchSize %d", st, batch)
	}
	results, _ := rec.snapshot()
	seqs := map[uint64]bool{}
	for _, res := range results {
		if res.Stream != s.Stream || res.Delivered != 1 || res.Outcome != inbox.Applied || !strings.HasPrefix(res.Subject, s.Prefix+".outbox.event.account.") {
			t.Fatalf("result %+v", res)
		}
		seqs[res.Sequence] = true
	}
	if len(seqs) != total {
		t.Fatalf("%d distinct sequences observed, want %d", len(seqs), total)
	}
	testdb.Eventually(t, ctx, "ack floor at the stream's end", func() bool {
		info := s.consumerInfo(t, r.ConsumerName())
		return info.AckFloor.Stream == uint64(total) && info.NumAckPending == 0
	})
	t.Logf("batch %d: %d messages, up to %d handlers at once, stats %+v", batch, total, maxInFlight.Load(), st)
}

// TestRunnerRetriesThenParksThenHolds: a failing message is retried up
// to MaxAttempts, parked, and its aggregate's later messages are held
// (stored, acknowledged, not applied) while the other aggregates go on;
// Retry then applies the parked and held messages in order.
func TestRunnerRetriesThenParksThenHolds(t *testing.T) {
	t.Parallel()
	forBatchSizes(t, testRunnerRetriesThenParksThenHolds)
}

func testRunnerRetriesThenParksThenHolds(t *testing.T, batch int) {
	s := newSpace(t)
	c := ledgertest.NewDB(t, pgx)
	want := s.publish(t, 3, 1, 5)
	var rec recorder
	var fixed atomic.Bool
	var badSeq atomic.Uint64
	inner := ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger)
	handler := func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
		if m.AggregateID == "agg-001" && strings.Contains(string(m.Payload), `"seq":2}`) && !fixed.Load() {
			badSeq.Store(uint64(m.Offset))
			return errors.New("the account service is confused")
		}
		return inner(ctx, tx, m)
	}
	r := newRunner(t, s, c, func(cfg *inboxnats.Config) {
		cfg.BatchSize = batch
		cfg.Observer = &rec
		cfg.MaxAttempts = 3
		cfg.Handler = handler
	})
	runRunner(t, r)
	ctx := testCtx(t, 90*time.Second)
	testdb.Eventually(t, ctx, "every message stored and acknowledged", func() bool {
		st := r.Stats()
		return st.Applied+st.Parked+st.Held == 15 && st.Acks == 15
	})
	st := r.Stats()
	if st.Parked != 1 || st.Held != 3 || st.Applied != 11 || st.HandlerErrors != 3 {
		t.Fatalf("stats %+v, want 1 parked, 3 held, 11 applied, 3 handler errors", st)
	}
	_, failures := rec.snapshot()
	if failures[badSeq.Load()] != 3 || len(failures) != 1 {
		t.Fatalf("failed attempts %v, want 3 of sequence %d", failures, badSeq.Load())
	}
	rows := ledgertest.Read(t, c.DB, c.Ledger)
	partial := map[string]int{"agg-000": 5, "agg-001": 1, "agg-002": 5}
	if probs := ledgertest.Check(rows, partial); len(probs) > 0 {
		t.Fatalf("ledger before Retry: %v", probs)
	}
	fixed.Store(true)
	n, err := r.Retry(ctx, inbox.ParkedFilter{AggregateType: "account", AggregateID: "agg-001"})
	if err != nil || n != 4 {
		t.Fatalf("Retry = %d, %v; want 4 applied", n, err)
	}
	if probs := ledgertest.Check(ledgertest.Read(t, c.DB, c.Ledger), want); len(probs) > 0 {
		t.Fatalf("ledger after Retry: %v", probs)
	}
}

// TestRunnerSkipAfterParkDoesNotHold: with SkipAfterPark a message failing
// with ErrPermanent is parked after one attempt and skipped; its
// aggregate's later messages are applied.
func TestRunnerSkipAfterParkDoesNotHold(t *testing.T) {
	t.Parallel()
	forBatchSizes(t, testRunnerSkipAfterParkDoesNotHold)
}

func testRunnerSkipAfterParkDoesNotHold(t *testing.T, batch int) {
	s := newSpace(t)
	c := ledgertest.NewDB(t, pgx)
	s.publish(t, 3, 1, 5)
	var rec recorder
	inner := ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger)
	r := newRunner(t, s, c, func(cfg *inboxnats.Config) {
		cfg.BatchSize = batch
		cfg.Observer = &rec
		cfg.OnFailure = inboxnats.SkipAfterPark
		cfg.Handler = func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
			if m.AggregateID == "agg-001" && strings.Contains(string(m.Payload), `"seq":2}`) {
				return fmt.Errorf("%w: not an account step", inboxnats.ErrPermanent)
			}
			return inner(ctx, tx, m)
		}
	})
	runRunner(t, r)
	ctx := testCtx(t, 90*time.Second)
	testdb.Eventually(t, ctx, "every message stored and acknowledged", func() bool {
		st := r.Stats()
		return st.Applied+st.Parked == 15 && st.Acks == 15
	})
	if st := r.Stats(); st.Parked != 1 || st.Held != 0 || st.HandlerErrors != 1 {
		t.Fatalf("stats %+v, want 1 parked after 1 attempt, none held", st)
	}
	var got []int
	for _, row := range ledgertest.Read(t, c.DB, c.Ledger) {
		if row.Agg == "agg-001" {
			got = append(got, row.Seq)
		}
	}
	if !slices.Equal(got, []int{1, 3, 4, 5}) {
		t.Fatalf("agg-001 applied %v, want [1 3 4 5]", got)
	}
}

// TestRunnerRedeliversUnacknowledgedAsDuplicate: a consumer stores a
// message's outcome and loses its connection before the acknowledgement
// (Run then returns nats.ErrConnectionClosed, and the lease is left to
// expire); the next runner recreates the consumer from its ack floor,
// gets the message again and the inbox recognises it as a duplicate: it
// is applied once.
func TestRunnerRedeliversUnacknowledgedAsDuplicate(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	c := ledgertest.NewDB(t, pgx)
	want := s.publish(t, 4, 1, 10)
	inner := ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger)
	cfgA := testConfig(t, s, c)
	var target atomic.Uint64
	cfgA.Handler = func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
		if err := inner(ctx, tx, m); err != nil {
			return err
		}
		if m.AggregateID == "agg-002" && strings.Contains(string(m.Payload), `"seq":5}`) && target.CompareAndSwap(0, uint64(m.Offset)) {
			// The transaction commits after this; the acknowledgement
			// cannot be sent.
			cfgA.Conn.Close()
		}
		return nil
	}
	a, err := inboxnats.NewRunner(cfgA)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 90*time.Second)
	if err := a.Run(ctx); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Fatalf("Run after the connection closed = %v, want nats.ErrConnectionClosed", err)
	}
	if a.Stats().Applied == 0 || target.Load() == 0 {
		t.Fatalf("first runner: stats %+v, target %d", a.Stats(), target.Load())
	}
	var rec recorder
	b := newRunner(t, s, c, func(cfg *inboxnats.Config) { cfg.Observer = &rec })
	runRunner(t, b)
	testdb.Eventually(t, ctx, "every message applied", func() bool { return ledgertest.Count(t, c.DB, c.Ledger) == 40 })
	testdb.Eventually(t, ctx, "the unacknowledged message delivered again", func() bool { return len(rec.outcomesOf(target.Load())) > 0 })
	if got := rec.outcomesOf(target.Load()); !slices.Equal(got, []inbox.Outcome{inbox.Duplicate}) {
		t.Fatalf("outcomes of sequence %d on the second runner: %v, want [Duplicate]", target.Load(), got)
	}
	if probs := ledgertest.Check(ledgertest.Read(t, c.DB, c.Ledger), want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
	t.Logf("first runner %+v; second runner %+v", a.Stats(), b.Stats())
}

// TestTwoRunnersOneConsumes: two runners on one durable; only the lease
// holder consumes. When it stops mid-stream, the other takes over (the
// consumer recreated from the ack floor) and every message is applied
// once, each aggregate's in order.
func TestTwoRunnersOneConsumes(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	c := ledgertest.NewDB(t, pgx)
	want := s.publish(t, 10, 1, 30)
	const total = 300
	inner := ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger)
	// Each runner's handlers, counted; a little slow, so that the handover
	// falls in the middle of the stream.
	var handled [2]atomic.Int64
	runners := make([]*inboxnats.Runner, 2)
	stops := make([]func(), 2)
	for i := range runners {
		runners[i] = newRunner(t, s, c, func(cfg *inboxnats.Config) {
			cfg.Workers = 4
			cfg.Handler = func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
				handled[i].Add(1)
				if _, err := tx.ExecContext(ctx, "SELECT pg_sleep(0.01)"); err != nil {
					return err
				}
				return inner(ctx, tx, m)
			}
		})
		stops[i] = runRunner(t, runners[i])
	}
	ctx := testCtx(t, 120*time.Second)
	testdb.Eventually(t, ctx, "a third applied", func() bool { return ledgertest.Count(t, c.DB, c.Ledger) >= total/3 })
	first := -1
	for i, r := range runners {
		if st := r.Stats(); st.Leading {
			if first >= 0 {
				t.Fatalf("both runners lead: %+v, %+v", runners[0].Stats(), runners[1].Stats())
			}
			first = i
		}
	}
	if first < 0 {
		t.Fatalf("no runner leads: %+v, %+v", runners[0].Stats(), runners[1].Stats())
	}
	other := 1 - first
	if n := handled[other].Load(); n != 0 {
		t.Fatalf("the runner without the lease ran %d handlers", n)
	}
	stops[first]()
	testdb.Eventually(t, ctx, "every message applied", func() bool { return ledgertest.Count(t, c.DB, c.Ledger) == total })
	if probs := ledgertest.Check(ledgertest.Read(t, c.DB, c.Ledger), want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
	a, b := runners[first].Stats(), runners[other].Stats()
	if a.Sessions != 1 || b.Sessions != 1 || !b.Leading || a.Leading || handled[other].Load() == 0 {
		t.Fatalf("stats: first %+v, other %+v", a, b)
	}
	testdb.Eventually(t, ctx, "ack floor at the stream's end", func() bool {
		return s.consumerInfo(t, runners[other].ConsumerName()).AckFloor.Stream == total
	})
	t.Logf("first holder %+v; second holder %+v", a, b)
}

type ctxKey struct{}

// TestContextForReachesTheHandler: the context ContextFor derives from a
// message is the handler's (its values; with the attempt's deadline), in
// both modes.
func TestContextForReachesTheHandler(t *testing.T) {
	t.Parallel()
	forBatchSizes(t, func(t *testing.T, batch int) {
		s := newSpace(t)
		c := ledgertest.NewDB(t, pgx)
		s.publish(t, 3, 1, 4)
		inner := ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger)
		var mu sync.Mutex
		var bad []string
		r := newRunner(t, s, c, func(cfg *inboxnats.Config) {
			cfg.BatchSize = batch
			cfg.ContextFor = func(ctx context.Context, msg jetstream.Msg) context.Context {
				return context.WithValue(ctx, ctxKey{}, msg.Subject()+" "+msg.Headers().Get("outbox-message-id"))
			}
			cfg.Handler = func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
				got, _ := ctx.Value(ctxKey{}).(string)
				_, hasDeadline := ctx.Deadline()
				if got != m.Topic+" "+m.ID || !hasDeadline {
					mu.Lock()
					bad = append(bad, fmt.Sprintf("%s: context value %q, deadline %v", m.ID, got, hasDeadline))
					mu.Unlock()
				}
				return inner(ctx, tx, m)
			}
		})
		runRunner(t, r)
		testdb.Eventually(t, testCtx(t, 60*time.Second), "every message applied", func() bool { return r.Stats().Applied == 12 })
		mu.Lock()
		defer mu.Unlock()
		if len(bad) > 0 {
			t.Fatalf("handler contexts: %v", bad)
		}
	})
}

// TestRunnerAckWaitRedeliveryIsADuplicate: a message whose handler runs
// past AckWait is delivered again within the session; the copy is queued
// behind the first delivery on its aggregate's worker, so it is handled
// after the first one's outcome is stored, as a duplicate: nothing is
// applied twice or out of order, and the consumer is not recreated.
func TestRunnerAckWaitRedeliveryIsADuplicate(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	c := ledgertest.NewDB(t, pgx)
	want := s.publish(t, 3, 1, 3)
	inner := ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger)
	var rec recorder
	var r atomic.Pointer[inboxnats.Runner]
	var target atomic.Uint64
	// copies counts, per stream sequence, the deliveries the runner took
	// from JetStream (ContextFor runs as a message arrives, before it is
	// queued). The target's handler waits for a copy of its own message:
	// the runner's Redelivered count is not enough, as under load another
	// message's AckWait can run out first, and the target, released then,
	// was acknowledged before its own AckWait ran out (a CI run waited 60 s
	// for a copy that never came).
	var copiesMu sync.Mutex
	copies := map[uint64]int{}
	deliveries := func(seq uint64) int {
		copiesMu.Lock()
		defer copiesMu.Unlock()
		return copies[seq]
	}
	r.Store(newRunner(t, s, c, func(cfg *inboxnats.Config) {
		cfg.AckWait = time.Second
		cfg.Observer = &rec
		cfg.ContextFor = func(ctx context.Context, msg jetstream.Msg) context.Context {
			if meta, err := msg.Metadata(); err == nil {
				copiesMu.Lock()
				copies[meta.Sequence.Stream]++
				copiesMu.Unlock()
			}
			return ctx
		}
		cfg.Handler = func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
			if m.AggregateID == "agg-000" && target.CompareAndSwap(0, uint64(m.Offset)) {
				// Hold the first delivery until JetStream delivered it again.
				tick := time.NewTicker(5 * time.Millisecond)
				defer tick.Stop()
				for deliveries(uint64(m.Offset)) < 2 {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-tick.C:
					}
				}
			}
			return inner(ctx, tx, m)
		}
	}))
	runRunner(t, r.Load())
	ctx := testCtx(t, 60*time.Second)
	testdb.Eventually(t, ctx, "every message applied", func() bool { return ledgertest.Count(t, c.DB, c.Ledger) == 9 })
	// At least one copy: under load the 1 s AckWait can run out more than
	// once before the first delivery is acknowledged, and JetStream sends
	// another copy each time (a CI run saw three outcomes, and the wait
	// for exactly two never ended). Each copy must be a duplicate.
	testdb.Eventually(t, ctx, "the copy handled", func() bool { return len(rec.outcomesOf(target.Load())) >= 2 })
	got := rec.outcomesOf(target.Load())
	if got[0] != inbox.Applied {
		t.Fatalf("outcomes of sequence %d: %v, want Applied, then Duplicate for each copy", target.Load(), got)
	}
	for _, o := range got[1:] {
		if o != inbox.Duplicate {
			t.Fatalf("outcomes of sequence %d: %v, want Applied, then Duplicate for each copy", target.Load(), got)
		}
	}
	if probs := ledgertest.Check(ledgertest.Read(t, c.DB, c.Ledger), want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
	if st := r.Load().Stats(); st.Restarts != 0 || st.Sessions != 1 {
		t.Fatalf("stats %+v, want no restart", st)
	}
}

// TestRunnerRecreatesADeletedConsumer: the durable consumer deleted
// under the runner (by hand) interrupts the fetch loop; the runner
// recreates it (from the stream's start, the floor being gone with it),
// the inbox recognises everything applied as duplicates, and consuming
// goes on.
func TestRunnerRecreatesADeletedConsumer(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	c := ledgertest.NewDB(t, pgx)
	s.publish(t, 4, 1, 5)
	r := newRunner(t, s, c, nil)
	runRunner(t, r)
	ctx := testCtx(t, 90*time.Second)
	testdb.Eventually(t, ctx, "the first messages applied and acknowledged", func() bool { return r.Stats().Acks == 20 })
	if err := s.js.DeleteConsumer(ctx, s.Stream, r.ConsumerName()); err != nil {
		t.Fatal(err)
	}
	testdb.Eventually(t, ctx, "a restart", func() bool { return r.Stats().Restarts > 0 })
	want := s.publish(t, 4, 6, 10)
	testdb.Eventually(t, ctx, "every message applied", func() bool { return ledgertest.Count(t, c.DB, c.Ledger) == 40 })
	if probs := ledgertest.Check(ledgertest.Read(t, c.DB, c.Ledger), want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
	testdb.Eventually(t, ctx, "the old messages recognised", func() bool { return r.Stats().Duplicates == 20 })
	if st := r.Stats(); st.Sessions != 1 || st.Applied != 40 {
		t.Fatalf("stats %+v, want one session, 40 applied", st)
	}
}

// TestSessionsKeepTheFloor: each session consumes with a consumer of its
// own, created after its predecessors' ack floor, which it then deletes;
// a session that ends before its first acknowledgement hands the floor
// on (JetStream reports an ack floor of 0 for a consumer that acked
// nothing: taken for the stream's start, the next session redelivered
// every message).
func TestSessionsKeepTheFloor(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	c := ledgertest.NewDB(t, pgx)
	ctx := testCtx(t, 90*time.Second)
	want := s.publish(t, 4, 1, 5)
	owned := func() []string {
		var out []string
		st, err := s.js.Stream(ctx, s.Stream)
		if err != nil {
			t.Fatal(err)
		}
		names := st.ConsumerNames(ctx)
		for n := range names.Name() {
			out = append(out, n)
		}
		if err := names.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}

	first := newRunner(t, s, c, nil)
	stop := runRunner(t, first)
	testdb.Eventually(t, ctx, "the first session acknowledged everything", func() bool { return first.Stats().Acks == 20 })
	stop()
	// A session that acknowledges nothing: no new message.
	idle := newRunner(t, s, c, nil)
	stop = runRunner(t, idle)
	testdb.Eventually(t, ctx, "the second session's consumer", func() bool {
		n := idle.ConsumerName()
		return n != "" && n != first.ConsumerName()
	})
	stop()
	if got := owned(); len(got) != 1 || got[0] != idle.ConsumerName() {
		t.Fatalf("consumers %v, want only the last session's %s", got, idle.ConsumerName())
	}
	third := newRunner(t, s, c, nil)
	runRunner(t, third)
	for k, v := range s.publish(t, 4, 6, 7) {
		want[k] = v
	}
	testdb.Eventually(t, ctx, "the new messages applied", func() bool { return third.Stats().Applied == 8 })
	if st := third.Stats(); st.Duplicates != 0 || st.Applied != 8 {
		t.Errorf("third session %+v: want the 8 new messages only, no redelivery", st)
	}
	if probs := ledgertest.Check(ledgertest.Read(t, c.DB, c.Ledger), want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
	if got := owned(); len(got) != 1 || got[0] != third.ConsumerName() {
		t.Errorf("consumers %v, want only %s", got, third.ConsumerName())
	}
}
