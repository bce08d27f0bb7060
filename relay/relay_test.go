package relay_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

type bundle struct {
	e   *testdb.Env
	pub *outboxtest.Publisher
	r   *relay.Relay
	run chan error
	ctx context.Context
}

// setup starts a relay on a private table of target tg; the test fails
// if the relay reports an order violation (outboxtest.WatchOrder).
func setup(t *testing.T, tg testdb.Target, mod func(*relay.Config), beforeRun ...func(*relay.Relay)) *bundle {
	t.Helper()
	return setupOn(t, testdb.New(t, tg, driver.Config{}), mod, beforeRun...)
}

// setupOn is setup on an existing table: e's.
func setupOn(t *testing.T, e *testdb.Env, mod func(*relay.Config), beforeRun ...func(*relay.Relay)) *bundle {
	t.Helper()
	pub := outboxtest.NewPublisher()
	cfg := relay.Config{Publisher: pub,
		PollInterval: 20 * time.Millisecond, RetryInitial: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond, Logger: quiet()}
	if mod != nil {
		mod(&cfg)
	}
	// Every relay here runs under an order watch (checked at cleanup,
	// after the stop below), except for a test that observes order
	// violations itself (its Observer is a relay.OrderObserver).
	if _, own := cfg.Observer.(relay.OrderObserver); !own {
		cfg.Observer = outboxtest.WatchOrder(t, cfg.Observer)
	}
	r, err := relay.New(e.Outbox, e.RelayDB, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	b := &bundle{e: e, pub: pub, r: r, run: make(chan error, 1), ctx: ctx}
	for _, fn := range beforeRun {
		fn(r)
	}
	go func() { b.run <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		sctx, c := context.WithTimeout(context.Background(), 10*time.Second)
		defer c()
		if err := r.Stop(sctx); err != nil {
			t.Errorf("stop: %v", err)
		}
		if err := <-b.run; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	return b
}

func (b *bundle) emit(t *testing.T, evs ...outbox.Event) {
	t.Helper()
	ctx := outbox.NewContext(b.ctx)
	tx, err := b.e.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if err := outbox.Emit(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

func event(agg string, n int) outbox.Event {
	return outbox.Event{ID: fmt.Sprintf("%s-%d", agg, n), AggregateType: "acct", AggregateID: agg, Type: "t", Payload: []byte(fmt.Sprintf("%d", n))}
}

// status returns the row's state (0 pending: in the pending set, 1 sent,
// 2 dead) and its count of failed attempts.
func (b *bundle) status(t *testing.T, id string) (status, attempts int) {
	t.Helper()
	q := "SELECT CASE WHEN status = 2 THEN 2 WHEN " + b.e.IsPending() + " THEN 0 ELSE 1 END, attempts FROM " + b.e.Table +
		" WHERE message_id = " + b.e.Placeholder(1)
	if err := b.e.RelayDB.QueryRow(q, id).Scan(&status, &attempts); err != nil {
		t.Fatal(err)
	}
	return status, attempts
}

func eventually(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	testdb.Eventually(t, ctx, what, cond)
}

// order returns the published message IDs of one aggregate, in order.
func order(msgs []relay.Message, agg string) []string {
	var out []string
	for _, m := range msgs {
		if m.AggregateID == agg {
			out = append(out, m.MessageID)
		}
	}
	return out
}

type testdbTarget = testdb.Target

// forEach runs fn on every target and on pgx's simple protocol, where the
// claim function's array arguments and the floor proof travel as text.
func forEach(t *testing.T, fn func(t *testing.T, tg testdb.Target)) {
	for _, tg := range append(slices.Clone(testdb.All), testdb.PgxSimple) {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, tg)
		})
	}
}

// TestRetryKeepsAggregateOrder: A's first event fails twice; A's later
// events wait for it, B flows meanwhile, and A is delivered in order.
func TestRetryKeepsAggregateOrder(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		var fails atomic.Int64
		b := setup(t, tg, nil)
		b.pub.FailWith(func(m relay.Message) error {
			if m.MessageID == "A-1" && fails.Add(1) <= 2 {
				return errors.New("transient")
			}
			return nil
		})
		b.emit(t, event("A", 1), event("A", 2), event("B", 1))
		b.emit(t, event("A", 3), event("B", 2))
		msgs, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "A")) == 3 && len(order(m, "B")) == 2 })
		if err != nil {
			t.Fatal(err)
		}
		if got := order(msgs, "A"); fmt.Sprint(got) != "[A-1 A-2 A-3]" {
			t.Errorf("A delivered as %v", got)
		}
		if got := order(msgs, "B"); fmt.Sprint(got) != "[B-1 B-2]" {
			t.Errorf("B delivered as %v", got)
		}
		eventually(t, b.ctx, "A-1 marked sent", func() bool { s, _ := b.status(t, "A-1"); return s == 1 })
		if _, attempts := b.status(t, "A-1"); attempts != 2 {
			t.Errorf("A-1 attempts = %d, want 2 (the failed ones)", attempts)
		}
		if _, attempts := b.status(t, "A-2"); attempts != 0 {
			t.Errorf("A-2 attempts = %d, want 0 (held, never failed itself)", attempts)
		}
	})
}

// TestDeadLetterHoldsItsAggregate: an event that always fails is
// dead-lettered after MaxAttempts; its aggregate's later events stay
// pending; other aggregates are delivered.
func TestDeadLetterHoldsItsAggregate(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		var dead sync.Map
		b := setup(t, tg, func(c *relay.Config) {
			c.MaxAttempts = 3
			c.OnDeadLetter = func(m relay.Message, err error) { dead.Store(m.MessageID, err) }
		})
		b.pub.FailWith(func(m relay.Message) error {
			if m.MessageID == "P-1" {
				return errors.New("always")
			}
			return nil
		})
		b.emit(t, event("P", 1), event("P", 2), event("Q", 1))
		b.emit(t, event("Q", 2))
		eventually(t, b.ctx, "P-1 dead-lettered", func() bool { s, _ := b.status(t, "P-1"); return s == 2 })
		msgs, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "Q")) == 2 })
		if err != nil {
			t.Fatal(err)
		}
		if got := order(msgs, "P"); len(got) != 0 {
			t.Errorf("held aggregate P delivered %v", got)
		}
		if s, a := b.status(t, "P-1"); s != 2 || a != 3 {
			t.Errorf("P-1 status %d attempts %d, want 2 (failed) and 3", s, a)
		}
		if s, _ := b.status(t, "P-2"); s != 0 {
			t.Errorf("P-2 status %d, want 0 (pending, held)", s)
		}
		eventually(t, b.ctx, "OnDeadLetter for P-1", func() bool { _, ok := dead.Load("P-1"); return ok })
	})
}

// TestPermanentErrorDeadLettersAtOnce: ErrPermanent skips the retries.
func TestPermanentErrorDeadLettersAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, testdb.All[3], nil)
	b.pub.FailWith(func(m relay.Message) error {
		if m.MessageID == "X-1" {
			return fmt.Errorf("%w: broker says too large", relay.ErrPermanent)
		}
		return nil
	})
	b.emit(t, event("X", 1), event("Y", 1))
	eventually(t, b.ctx, "X-1 dead", func() bool { s, _ := b.status(t, "X-1"); return s == 2 })
	if _, a := b.status(t, "X-1"); a != 1 {
		t.Errorf("attempts %d, want 1", a)
	}
}

// flakyPublisher fails whole batches (broker unreachable) n times.
type flakyPublisher struct {
	*outboxtest.Publisher
	left atomic.Int64
}

func (f *flakyPublisher) Publish(ctx context.Context, msgs []relay.Message) error {
	if f.left.Add(-1) >= 0 {
		return errors.New("broker unreachable")
	}
	return f.Publisher.Publish(ctx, msgs)
}

// TestBatchFailureCountsNoAttempt: a batch-wide failure backs the relay
// off as a whole and burns no per-message attempts.
func TestBatchFailureCountsNoAttempt(t *testing.T) {
	t.Parallel()
	e := testdb.New(t, testdb.All[3], driver.Config{})
	fp := &flakyPublisher{Publisher: outboxtest.NewPublisher()}
	fp.left.Store(3)
	r, err := relay.New(e.Outbox, e.RelayDB, relay.Config{Publisher: fp, PollInterval: 10 * time.Millisecond, MaxAttempts: 2, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	sctx := outbox.NewContext(ctx)
	tx, _ := e.DB.BeginTx(sctx, nil)
	if err := outbox.Emit(sctx, event("Z", 1)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := fp.WaitForCount(ctx, 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "marked sent", func() bool {
		var pending, a int
		_ = e.RelayDB.QueryRow("SELECT (SELECT COUNT(*) FROM "+testdb.PendingTable(e.Table)+"), attempts FROM "+e.Table).Scan(&pending, &a)
		return pending == 0 && a == 0
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestRunRefusesMissingSchema(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("sqlite", testdb.SQLiteDSN(filepath.Join(t.TempDir(), "empty.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	r, err := relay.New(sqliteOutbox(t), db, relay.Config{Publisher: outboxtest.NewPublisher(), Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Run(ctx); !errors.Is(err, driver.ErrSchemaMissing) {
		t.Fatalf("Run = %v, want ErrSchemaMissing", err)
	}
	if err := r.Run(ctx); !errors.Is(err, relay.ErrStopped) {
		t.Fatalf("second Run = %v, want ErrStopped", err)
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	db, _ := sql.Open("sqlite", ":memory:")
	defer db.Close()
	pub := outboxtest.NewPublisher()
	ob := sqliteOutbox(t)
	for _, c := range []struct {
		name string
		ob   *driver.Outbox
		db   *sql.DB
		cfg  relay.Config
	}{
		{"no outbox", nil, db, relay.Config{Publisher: pub}},
		{"no db", ob, nil, relay.Config{Publisher: pub}},
		{"no publisher", ob, db, relay.Config{}},
		{"negative batch", ob, db, relay.Config{Publisher: pub, BatchSize: -1}},
		{"jitter 1", ob, db, relay.Config{Publisher: pub, RetryJitter: 1}},
		{"negative partition check", ob, db, relay.Config{Publisher: pub, PartitionCheckInterval: -time.Second}},
	} {
		if _, err := relay.New(c.ob, c.db, c.cfg); !errors.Is(err, relay.ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig", c.name, err)
		}
	}
}

func TestStopIsIdempotent(t *testing.T) {
	t.Parallel()
	r, err := relay.New(sqliteOutbox(t), &sql.DB{}, relay.Config{Publisher: outboxtest.NewPublisher(), Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestUnavailableCountsNoAttempt: a configuration-wide error (ErrUnavailable)
// burns no attempt and dead-letters nothing, however often it repeats; the
// relay alerts and, once the route works, delivers.
func TestUnavailableCountsNoAttempt(t *testing.T) {
	t.Parallel()
	var alerts, fails atomic.Int64
	b := setup(t, testdb.All[3], func(c *relay.Config) {
		c.MaxAttempts = 2
		c.OnUnavailable = func(error) { alerts.Add(1) }
	})
	b.pub.FailWith(func(m relay.Message) error {
		if m.AggregateID == "U" && fails.Add(1) <= 4 {
			return fmt.Errorf("%w: topic authorization failed", relay.ErrUnavailable)
		}
		return nil
	})
	b.emit(t, event("U", 1), event("U", 2), event("V", 1))
	msgs, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "U")) == 2 && len(order(m, "V")) == 1 })
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(order(msgs, "U")); got != "[U-1 U-2]" {
		t.Errorf("U delivered as %s", got)
	}
	eventually(t, b.ctx, "U-1 sent", func() bool { s, _ := b.status(t, "U-1"); return s == 1 })
	if s, a := b.status(t, "U-1"); s != 1 || a != 0 {
		t.Errorf("U-1 status %d attempts %d, want sent with no failed attempt counted", s, a)
	}
	if alerts.Load() == 0 {
		t.Error("OnUnavailable never called")
	}
}

// skewedClock is a host clock off by a fixed amount.
type skewedClock time.Duration

func (c skewedClock) Now() time.Time { return time.Now().Add(time.Duration(c)) }

// TestHostClockSkewChangesNothing: with the relay's clock 30 s ahead or
// behind, a failed message's retry is still scheduled RetryInitial after
// the failure by the database's clock, and is retried then.
func TestHostClockSkewChangesNothing(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{30 * time.Second, -30 * time.Second} {
		t.Run(skew.String(), func(t *testing.T) {
			t.Parallel()
			forEach(t, func(t *testing.T, tg testdb.Target) {
				var fails atomic.Int64
				b := setup(t, tg, func(c *relay.Config) {
					c.Clock = skewedClock(skew)
					c.RetryInitial, c.RetryMax, c.RetryJitter = 2*time.Second, 2*time.Second, 0.01
				})
				b.pub.FailWith(func(m relay.Message) error {
					if fails.Add(1) == 1 {
						return errors.New("first attempt fails")
					}
					return nil
				})
				b.emit(t, event("K", 1))
				eventually(t, b.ctx, "a scheduled retry", func() bool { _, a := b.status(t, "K-1"); return a == 1 })
				// Seconds from the database's now to the scheduled retry.
				q := map[driver.Dialect]string{
					driver.Postgres: "SELECT EXTRACT(EPOCH FROM next_retry_at - clock_timestamp()) FROM " + b.e.Table,
					driver.MySQL:    "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), next_retry_at) / 1e6 FROM " + b.e.Table,
					driver.SQLite:   "SELECT (next_retry_at - CAST(unixepoch('subsec') * 1000 AS INTEGER)) / 1000.0 FROM " + b.e.Table,
				}[tg.Dialect]
				var secs float64
				if err := b.e.RelayDB.QueryRow(q).Scan(&secs); err != nil {
					t.Fatal(err)
				}
				if secs < 1.5 || secs > 2.1 {
					t.Fatalf("retry due in %.3f s by the database clock, want about 2 s (host clock skewed %v)", secs, skew)
				}
				if _, err := b.pub.WaitForCount(b.ctx, 1); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// sqliteOutbox is an Outbox of the default SQLite table, as a process that
// only has a DSN builds one.
func sqliteOutbox(t testing.TB) *driver.Outbox {
	t.Helper()
	ob, err := driver.New(driver.Config{Dialect: driver.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	return ob
}
