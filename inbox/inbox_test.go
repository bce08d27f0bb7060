package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// targets are the database targets the suite runs on: lib/pq, pgx,
// MariaDB/MySQL and SQLite.
var targets = testdb.All

// bundle is one test's database, business table and inbox.
type bundle struct {
	ctx     context.Context
	e       *testdb.Env
	db      *sql.DB // outbox-wrapped: handlers may Emit
	in      *inbox.Inbox
	effects string // business table: (id, n)
}

func forEach(t *testing.T, fn func(t *testing.T, tg testdb.Target)) {
	t.Helper()
	for _, tg := range targets {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, tg)
		})
	}
}

func setup(t *testing.T, tg testdb.Target, mod ...func(*inbox.Config)) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	e := testdb.New(t, tg, driver.Config{})
	b := &bundle{ctx: ctx, e: e, db: e.DB, effects: e.Q("effects")}
	b.in = b.inbox(t, "shipping", mod...)
	if err := b.in.Migrate(ctx, e.DB); err != nil {
		t.Fatal(err)
	}
	if _, err := e.DB.ExecContext(ctx, "CREATE TABLE "+b.effects+" (id VARCHAR(100) NOT NULL, consumer VARCHAR(100) NOT NULL, seq INTEGER NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (id, consumer))"); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *bundle) inbox(t *testing.T, consumer string, mod ...func(*inbox.Config)) *inbox.Inbox {
	t.Helper()
	cfg := inbox.Config{Dialect: b.e.Target.Dialect, Table: b.e.Q("inbox_message"), Consumer: consumer}
	for _, m := range mod {
		m(&cfg)
	}
	in, err := inbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func (b *bundle) ph(n int) string { return b.e.Placeholder(n) }

var seqMu sync.Mutex
var seqN int

// apply returns a handler that records the effect of message id for
// consumer: an upsert-free INSERT, so a second effect fails the test's
// count (or the primary key).
func (b *bundle) apply(consumer, id string) func(ctx context.Context, tx *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		seqMu.Lock()
		seqN++
		s := seqN
		seqMu.Unlock()
		_, err := tx.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (id, consumer, seq, n) VALUES (%s, %s, %s, 1)", b.effects, b.ph(1), b.ph(2), b.ph(3)), id, consumer, s)
		return err
	}
}

// applyMsg is apply for the message Retry gives.
func (b *bundle) applyMsg(consumer string) func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
	return func(ctx context.Context, tx *sql.Tx, m inbox.Message) error { return b.apply(consumer, m.ID)(ctx, tx) }
}

func (b *bundle) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := b.e.DB.QueryRowContext(b.ctx, q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (b *bundle) effectCount(t *testing.T, consumer, id string) int {
	t.Helper()
	return b.count(t, fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE id = %s AND consumer = %s", b.effects, b.ph(1), b.ph(2)), id, consumer)
}

func (b *bundle) inboxCount(t *testing.T, where string, args ...any) int {
	t.Helper()
	q := "SELECT COUNT(*) FROM " + b.e.Q("inbox_message")
	if where != "" {
		q += " WHERE " + where
	}
	return b.count(t, q, args...)
}

func msg(id string) inbox.Message {
	return inbox.Message{ID: id, Topic: "outbox.event.order", Partition: 3, Offset: 42}
}

func must(t *testing.T, out inbox.Outcome, err error, want inbox.Outcome) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if out != want {
		t.Fatalf("outcome %v, want %v", out, want)
	}
}

// TestHandleAppliesOnce: a message is applied once; its redelivery is a
// Duplicate without running the handler; a second consumer on the same
// table applies it once too.
func TestHandleAppliesOnce(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		b := setup(t, tg)
		billing := b.inbox(t, "billing")
		for _, tc := range []struct {
			name     string
			in       *inbox.Inbox
			consumer string
			want     inbox.Outcome
		}{
			{"FirstDelivery", b.in, "shipping", inbox.Applied},
			{"Redelivery", b.in, "shipping", inbox.Duplicate},
			{"OtherConsumer", billing, "billing", inbox.Applied},
			{"OtherConsumerRedelivery", billing, "billing", inbox.Duplicate},
		} {
			ran := false
			out, err := tc.in.Handle(b.ctx, b.db, msg("m-1"), func(ctx context.Context, tx *sql.Tx) error {
				ran = true
				return b.apply(tc.consumer, "m-1")(ctx, tx)
			})
			must(t, out, err, tc.want)
			if ran != (tc.want == inbox.Applied) {
				t.Fatalf("%s: handler ran = %v", tc.name, ran)
			}
		}
		for _, c := range []string{"shipping", "billing"} {
			if n := b.effectCount(t, c, "m-1"); n != 1 {
				t.Fatalf("%s: %d effects, want 1", c, n)
			}
		}
		if n := b.inboxCount(t, ""); n != 2 {
			t.Fatalf("%d inbox rows, want 2", n)
		}
		// IDs differing only in case are different messages (MySQL's
		// columns compare bytes, not a _ci collation).
		out, err := b.in.Handle(b.ctx, b.db, msg("M-1"), b.apply("shipping", "upper-M-1"))
		must(t, out, err, inbox.Applied)
		st := b.in.Stats()
		if st.Applied != 2 || st.Duplicates != 1 {
			t.Fatalf("stats %+v", st)
		}
	})
}

// TestHandlerErrorRollsBack: the handler's error rolls back its effect and
// the inbox row; it is returned wrapped (ErrHandler and the handler's own
// error); the redelivery applies.
func TestHandlerErrorRollsBack(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		b := setup(t, tg)
		boom := errors.New("boom")
		out, err := b.in.Handle(b.ctx, b.db, msg("m-1"), func(ctx context.Context, tx *sql.Tx) error {
			if err := b.apply("shipping", "m-1")(ctx, tx); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) || !errors.Is(err, inbox.ErrHandler) || out != 0 {
			t.Fatalf("Handle = %v, %v; want 0 and an error wrapping boom and ErrHandler", out, err)
		}
		if n := b.effectCount(t, "shipping", "m-1"); n != 0 {
			t.Fatalf("%d effects after the failure, want 0", n)
		}
		if n := b.inboxCount(t, ""); n != 0 {
			t.Fatalf("%d inbox rows after the failure, want 0", n)
		}
		out, err = b.in.Handle(b.ctx, b.db, msg("m-1"), b.apply("shipping", "m-1"))
		must(t, out, err, inbox.Applied)
		if n := b.effectCount(t, "shipping", "m-1"); n != 1 {
			t.Fatalf("%d effects, want 1", n)
		}
		if st := b.in.Stats(); st.HandlerErrors != 1 || st.Applied != 1 {
			t.Fatalf("stats %+v", st)
		}
	})
}

// TestConcurrentDeliveryAppliesOnce: the same message delivered from two
// goroutines at once is applied once; the other delivery is a Duplicate
// (it waited on the unique key).
func TestConcurrentDeliveryAppliesOnce(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		b := setup(t, tg)
		const messages = 20
		for i := 0; i < messages; i++ {
			id := fmt.Sprintf("m-%d", i)
			start := make(chan struct{})
			var wg sync.WaitGroup
			outs := make([]inbox.Outcome, 2)
			errs := make([]error, 2)
			for g := 0; g < 2; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					m := msg(id)
					if i%2 == 1 { // with an aggregate: the hold probe runs first
						m.AggregateType, m.AggregateID = "order", id
					}
					outs[g], errs[g] = b.in.Handle(b.ctx, b.db, m, b.apply("shipping", id))
				}()
			}
			close(start)
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			if !(outs[0] == inbox.Applied && outs[1] == inbox.Duplicate || outs[0] == inbox.Duplicate && outs[1] == inbox.Applied) {
				t.Fatalf("%s: outcomes %v, want one applied and one duplicate", id, outs)
			}
			if n := b.effectCount(t, "shipping", id); n != 1 {
				t.Fatalf("%s: %d effects", id, n)
			}
		}
	})
}

// TestChainedEmit: the handler changes state and emits the next event
// through the outbox-wrapped pool in the inbox's transaction; the outbox
// row exists if and only if the effect committed.
func TestChainedEmit(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		b := setup(t, tg)
		for _, tc := range []struct {
			name string
			fail bool
		}{{"Committed", false}, {"RolledBack", true}} {
			id := "m-" + tc.name
			out, err := b.in.Handle(b.ctx, b.db, msg(id), func(ctx context.Context, tx *sql.Tx) error {
				if err := b.apply("shipping", id)(ctx, tx); err != nil {
					return err
				}
				if err := outbox.Emit(ctx, outbox.Event{AggregateType: "shipment", AggregateID: id, Type: "shipment.created", Payload: []byte(`{}`)}); err != nil {
					return err
				}
				if tc.fail {
					return errors.New("refused after emitting")
				}
				return nil
			})
			if tc.fail != (err != nil) {
				t.Fatalf("%s: Handle = %v, %v", tc.name, out, err)
			}
			effects := b.effectCount(t, "shipping", id)
			rows := b.count(t, fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE aggregate_id = %s", b.e.Table, b.ph(1)), id)
			want := 1
			if tc.fail {
				want = 0
			}
			if effects != want || rows != want {
				t.Fatalf("%s: %d effects and %d outbox rows, want %d of each", tc.name, effects, rows, want)
			}
		}
	})
}

// TestStateMachine: the seed's third method inside an inbox handler: an
// order already paid ignores a second "paid" event that carries a
// different message ID (the inbox cannot know it is the same fact).
func TestStateMachine(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		b := setup(t, tg)
		orders := b.e.Q("orders")
		if _, err := b.db.ExecContext(b.ctx, "CREATE TABLE "+orders+" (id VARCHAR(50) PRIMARY KEY, status VARCHAR(20) NOT NULL, paid_count INTEGER NOT NULL)"); err != nil {
			t.Fatal(err)
		}
		if _, err := b.db.ExecContext(b.ctx, "INSERT INTO "+orders+" (id, status, paid_count) VALUES ('o-1', 'created', 0)"); err != nil {
			t.Fatal(err)
		}
		pay := func(ctx context.Context, tx *sql.Tx) error {
			res, err := tx.ExecContext(ctx, fmt.Sprintf("UPDATE %s SET status = 'paid', paid_count = paid_count + 1 WHERE id = %s AND status = 'created'", orders, b.ph(1)), "o-1")
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n == 0 {
				return nil // already paid: ignore
			}
			return nil
		}
		for _, id := range []string{"pay-1", "pay-2-retried-by-producer", "pay-1"} {
			if _, err := b.in.Handle(b.ctx, b.db, msg(id), pay); err != nil {
				t.Fatal(err)
			}
		}
		if n := b.count(t, "SELECT paid_count FROM "+orders); n != 1 {
			t.Fatalf("paid %d times, want 1", n)
		}
		if st := b.in.Stats(); st.Applied != 2 || st.Duplicates != 1 {
			t.Fatalf("stats %+v: want 2 applied (one a no-op) and 1 duplicate", st)
		}
	})
}

// TestInvalidInput: bad configs and messages are refused with matchable
// errors before anything is written.
func TestInvalidInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  inbox.Config
	}{
		{"NoConsumer", inbox.Config{Dialect: driver.Postgres}},
		{"UnknownDialect", inbox.Config{Dialect: "oracle", Consumer: "c"}},
		{"NoDialect", inbox.Config{Consumer: "c"}},
		{"BadTable", inbox.Config{Dialect: driver.Postgres, Consumer: "c", Table: "inbox; DROP TABLE x"}},
		{"ThreeParts", inbox.Config{Dialect: driver.Postgres, Consumer: "c", Table: "a.b.c"}},
		{"LongTable", inbox.Config{Dialect: driver.Postgres, Consumer: "c", Table: strings.Repeat("t", 41)}},
		{"ConsumerNUL", inbox.Config{Dialect: driver.Postgres, Consumer: "c\x00"}},
		{"ConsumerTooLong", inbox.Config{Dialect: driver.Postgres, Consumer: strings.Repeat("c", 129)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := inbox.New(tc.cfg); !errors.Is(err, inbox.ErrInvalidConfig) {
				t.Fatalf("New = %v, want ErrInvalidConfig", err)
			}
		})
	}
	t.Run("Messages", func(t *testing.T) {
		forEach(t, func(t *testing.T, tg testdb.Target) {
			b := setup(t, tg)
			for name, m := range map[string]inbox.Message{
				"NoID":          {},
				"IDNUL":         {ID: "a\x00b"},
				"IDInvalidUTF8": {ID: "a\xffb"},
				"IDTooLong":     {ID: strings.Repeat("i", 256)},
				"AggregateLong": {ID: "x", AggregateID: strings.Repeat("a", 256)},
				"TopicNUL":      {ID: "x", Topic: "t\x00"},
			} {
				ran := false
				_, err := b.in.Handle(b.ctx, b.db, m, func(context.Context, *sql.Tx) error { ran = true; return nil })
				if !errors.Is(err, inbox.ErrInvalidMessage) || ran {
					t.Fatalf("%s: Handle = %v (ran %v), want ErrInvalidMessage", name, err, ran)
				}
				if err := b.in.Park(b.ctx, b.db, m, errors.New("x")); !errors.Is(err, inbox.ErrInvalidMessage) {
					t.Fatalf("%s: Park = %v, want ErrInvalidMessage", name, err)
				}
			}
			if n := b.inboxCount(t, ""); n != 0 {
				t.Fatalf("%d rows written", n)
			}
			// The longest valid values fit every column.
			long := inbox.Message{ID: strings.Repeat("i", 255), AggregateType: strings.Repeat("t", 255), AggregateID: strings.Repeat("é", 127), Topic: strings.Repeat("p", 255)}
			out, err := b.in.Handle(b.ctx, b.db, long, func(context.Context, *sql.Tx) error { return nil })
			must(t, out, err, inbox.Applied)
			out, err = b.in.Handle(b.ctx, b.db, long, func(context.Context, *sql.Tx) error { return nil })
			must(t, out, err, inbox.Duplicate)
		})
	})
}

// TestMigrate: Migrate is idempotent and safe from several goroutines at
// once; Check tells a missing, current and too new schema apart; DDL
// names the table.
func TestMigrate(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		b := setup(t, tg)
		other := b.inbox(t, "x", func(c *inbox.Config) { c.Table = b.e.Q("inbox_other") })
		if err := other.Check(b.ctx, b.db); !errors.Is(err, inbox.ErrSchemaMissing) {
			t.Fatalf("Check before Migrate = %v, want ErrSchemaMissing", err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = other.Migrate(b.ctx, b.db)
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := b.in.Migrate(b.ctx, b.db); err != nil {
			t.Fatal(err)
		}
		if err := other.Check(b.ctx, b.db); err != nil {
			t.Fatalf("Check after Migrate = %v", err)
		}
		if _, err := b.db.ExecContext(b.ctx, "INSERT INTO "+b.e.Q("inbox_other_migrations")+" (version, applied_at) VALUES (99, "+map[driver.Dialect]string{driver.Postgres: "now()", driver.MySQL: "UTC_TIMESTAMP(6)", driver.SQLite: "0"}[tg.Dialect]+")"); err != nil {
			t.Fatal(err)
		}
		if err := other.Check(b.ctx, b.db); !errors.Is(err, inbox.ErrSchemaTooNew) {
			t.Fatalf("Check of version 99 = %v, want ErrSchemaTooNew", err)
		}
		if err := other.Migrate(b.ctx, b.db); !errors.Is(err, inbox.ErrSchemaTooNew) {
			t.Fatalf("Migrate of version 99 = %v, want ErrSchemaTooNew", err)
		}
		if ddl := other.DDL(); !strings.Contains(ddl, "inbox_other") || !strings.Contains(ddl, "hold_idx") {
			t.Fatalf("DDL:\n%s", ddl)
		}
		// The DDL applied by a migration tool, then Migrate over it (it
		// only records the version), then the inbox works.
		byTool := b.inbox(t, "x", func(c *inbox.Config) { c.Table = b.e.Q("inbox_tool") })
		for _, st := range strings.Split(byTool.DDL(), ";\n") {
			if st = strings.TrimSpace(st); st != "" {
				if _, err := b.db.ExecContext(b.ctx, st); err != nil {
					t.Fatalf("DDL statement %q: %v", st, err)
				}
			}
		}
		if err := byTool.Check(b.ctx, b.db); !errors.Is(err, inbox.ErrSchemaMissing) {
			t.Fatalf("Check after the DDL alone = %v, want ErrSchemaMissing (no version recorded)", err)
		}
		if err := byTool.Migrate(b.ctx, b.db); err != nil {
			t.Fatal(err)
		}
		if err := byTool.Check(b.ctx, b.db); err != nil {
			t.Fatal(err)
		}
		out, err := byTool.Handle(b.ctx, b.db, msg("m"), func(context.Context, *sql.Tx) error { return nil })
		must(t, out, err, inbox.Applied)
		out, err = other.Handle(b.ctx, b.db, msg("m"), func(context.Context, *sql.Tx) error { return nil })
		must(t, out, err, inbox.Applied)
	})
}

// recorder is an Observer that records the calls.
type recorder struct {
	inbox.NopObserver
	mu    sync.Mutex
	calls []string
}

func (r *recorder) add(s string) { r.mu.Lock(); r.calls = append(r.calls, s); r.mu.Unlock() }

func (r *recorder) Applied(m inbox.Message, took time.Duration) {
	if took <= 0 {
		r.add("applied-without-time " + m.ID)
		return
	}
	r.add("applied " + m.ID)
}
func (r *recorder) Duplicate(m inbox.Message)                { r.add("duplicate " + m.ID) }
func (r *recorder) Held(m inbox.Message)                     { r.add("held " + m.ID) }
func (r *recorder) HandlerFailed(m inbox.Message, err error) { r.add("failed " + m.ID) }
func (r *recorder) Parked(m inbox.Message, cause error) {
	r.add("parked " + m.ID + ": " + cause.Error())
}

// TestObserver: the Observer hears every outcome, after the fact.
func TestObserver(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		rec := &recorder{}
		b := setup(t, tg, func(c *inbox.Config) { c.Observer = rec })
		nop := func(context.Context, *sql.Tx) error { return nil }
		_, _ = b.in.Handle(b.ctx, b.db, msg("a"), nop)
		_, _ = b.in.Handle(b.ctx, b.db, msg("a"), nop)
		_, _ = b.in.Handle(b.ctx, b.db, msg("b"), func(context.Context, *sql.Tx) error { return errors.New("no") })
		_ = b.in.Park(b.ctx, b.db, orderMsg("c", "o", 1), errors.New("gave up"))
		_, _ = b.in.Handle(b.ctx, b.db, orderMsg("d", "o", 2), nop)
		if _, err := b.in.Retry(b.ctx, b.db, inbox.ParkedFilter{AggregateType: "order", AggregateID: "o"}, func(context.Context, *sql.Tx, inbox.Message) error { return nil }); err != nil {
			t.Fatal(err)
		}
		want := []string{"applied a", "duplicate a", "failed b", "parked c: gave up", "held d", "applied c", "applied d"}
		if strings.Join(rec.calls, "|") != strings.Join(want, "|") {
			t.Fatalf("observed %q\nwant     %q", rec.calls, want)
		}
	})
}
