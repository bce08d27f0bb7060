package inbox_test

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

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// lockWaiters counts the sessions waiting on a row lock of table (the
// inbox's unique key), asked on the relay's pool, not the pool under test:
// -1 where the test cannot see them (SQLite has one connection; its
// deliveries queue on the pool instead).
func lockWaiters(t *testing.T, b *bundle, table string) int {
	t.Helper()
	count := func(q string, args ...any) int {
		var n int
		if err := b.e.RelayDB.QueryRowContext(b.ctx, q, args...).Scan(&n); err != nil {
			t.Error(err)
		}
		return n
	}
	name := table[strings.LastIndexAny(table, ".`\"")+1:]
	name = strings.Trim(name, "`\"")
	switch b.e.Target.Dialect {
	case driver.Postgres:
		return count("SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE "+b.ph(1), "%"+name+"%")
	case driver.MySQL:
		return count("SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE ?", "%"+name+"%")
	}
	return -1
}

// TestConcurrentDeliveriesAfterAFailure: seven deliveries of one message
// at once, the first handler failing once at least two others wait on the
// inbox's unique key (the rest may still queue for a connection under
// load): exactly one applies, the others are Duplicate, and
// none sees an error. On MariaDB the waiters released by the rollback
// deadlock each other (InnoDB 1213) and Handle retries the loser; before
// that retry they got "Error 1213 Deadlock".
func TestConcurrentDeliveriesAfterAFailure(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		b := setup(t, tg)
		const deliveries = 7
		if max := b.db.Stats().MaxOpenConnections; max != 1 && max < deliveries {
			t.Fatalf("the pool holds %d connections, fewer than %d deliveries", max, deliveries)
		}
		for round := 0; round < 3; round++ {
			id := fmt.Sprintf("m-%d", round)
			var calls atomic.Int32
			var wg sync.WaitGroup
			outs := make([]inbox.Outcome, deliveries)
			errs := make([]error, deliveries)
			for g := 0; g < deliveries; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					m := msg(id)
					if round%2 == 1 {
						m.AggregateType, m.AggregateID = "order", id
					}
					outs[g], errs[g] = b.in.Handle(b.ctx, b.db, m, func(ctx context.Context, tx *sql.Tx) error {
						if calls.Add(1) == 1 {
							// The first holds the key until the others wait
							// on it, then fails and rolls back.
							// At most 20 s: below InnoDB's lock wait timeout
							// (50 s), after which the waiters would fail with
							// 1205 instead of waiting for the rollback.
							if lockWaiters(t, b, b.e.Q("inbox_message")) >= 0 {
								wctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
								defer cancel()
								for lockWaiters(t, b, b.e.Q("inbox_message")) < 2 {
									select {
									case <-wctx.Done():
										t.Logf("%s: fewer than two deliveries seen waiting on the key after 20 s; failing anyway", id)
										return errors.New("first handler fails")
									case <-time.After(5 * time.Millisecond):
									}
								}
							}
							return errors.New("first handler fails")
						}
						return b.apply("shipping", id)(ctx, tx)
					})
				}()
			}
			wg.Wait()
			applied, dups, failed := 0, 0, 0
			for g := range outs {
				switch {
				case errors.Is(errs[g], inbox.ErrHandler):
					failed++
				case errs[g] != nil:
					t.Fatalf("%s: delivery %d: %v", id, g, errs[g])
				case outs[g] == inbox.Applied:
					applied++
				case outs[g] == inbox.Duplicate:
					dups++
				}
			}
			if failed != 1 || applied != 1 || dups != deliveries-2 {
				t.Fatalf("%s: %d failed, %d applied, %d duplicates; want 1, 1, %d", id, failed, applied, dups, deliveries-2)
			}
			if n := b.effectCount(t, "shipping", id); n != 1 {
				t.Fatalf("%s: %d effects", id, n)
			}
		}
		t.Logf("deadlocks retried: %d", b.in.Stats().Deadlocks)
	})
}

// TestHandlerPanicIsAnError: a panic in the handler of Handle, HandleBatch
// and Retry is recovered: the transaction rolls back, the caller gets an
// error wrapping ErrHandler and ErrHandlerPanic, and Retry stores the
// panic as the parked message's cause.
func TestHandlerPanicIsAnError(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		b := setup(t, tg, func(c *inbox.Config) { c.Logger = slog.New(slog.DiscardHandler) })
		boom := func(ctx context.Context, tx *sql.Tx) error {
			if err := b.apply("shipping", "p-1")(ctx, tx); err != nil {
				return err
			}
			panic("boom")
		}
		out, err := b.in.Handle(b.ctx, b.db, msg("p-1"), boom)
		if out != 0 || !errors.Is(err, inbox.ErrHandler) || !errors.Is(err, inbox.ErrHandlerPanic) || !strings.Contains(err.Error(), "boom") {
			t.Fatalf("Handle = %v, %v; want an error wrapping ErrHandler and ErrHandlerPanic", out, err)
		}
		if b.effectCount(t, "shipping", "p-1") != 0 || b.inboxCount(t, "") != 0 {
			t.Fatal("the panicking handler's transaction committed")
		}
		res, err := b.in.HandleBatch(b.ctx, b.db, []inbox.Message{msg("p-1"), msg("p-2")}, func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
			if m.ID == "p-1" {
				return boom(ctx, tx)
			}
			return b.applyMsg("shipping")(ctx, tx, m)
		})
		if err != nil || !errors.Is(res[0].Err, inbox.ErrHandlerPanic) || res[1].Outcome != inbox.Applied {
			t.Fatalf("HandleBatch = %+v, %v; want p-1 failed with ErrHandlerPanic and p-2 applied", res, err)
		}
		if err := b.in.Park(b.ctx, b.db, orderMsg("p-1", "p", 1), errors.New("first")); err != nil {
			t.Fatal(err)
		}
		_, err = b.in.Retry(b.ctx, b.db, inbox.ParkedFilter{ID: "p-1"}, func(ctx context.Context, tx *sql.Tx, _ inbox.Message) error { return boom(ctx, tx) })
		if !errors.Is(err, inbox.ErrHandlerPanic) {
			t.Fatalf("Retry = %v, want ErrHandlerPanic", err)
		}
		ps := mustList(t, b)
		if len(ps) != 1 || !strings.Contains(ps[0].Cause, "panicked: boom") || ps[0].Attempts != 2 {
			t.Fatalf("parked after a panicking retry: %+v", ps)
		}
	})
}

// TestMissingTableAndNilArguments: without the inbox table every
// operation returns ErrSchemaMissing (not the driver's raw error); a nil
// db or handler is ErrInvalidConfig.
func TestMissingTableAndNilArguments(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{})
		ctx := context.Background()
		in, err := inbox.New(inbox.Config{Dialect: tg.Dialect, Table: e.Q("never_migrated"), Consumer: "c"})
		if err != nil {
			t.Fatal(err)
		}
		nop := func(context.Context, *sql.Tx) error { return nil }
		nopMsg := func(context.Context, *sql.Tx, inbox.Message) error { return nil }
		for _, tc := range []struct {
			name string
			call func(db *sql.DB) error
		}{
			{"Handle", func(db *sql.DB) error { _, err := in.Handle(ctx, db, orderMsg("m", "a", 1), nop); return err }},
			{"HandleNoAggregate", func(db *sql.DB) error { _, err := in.Handle(ctx, db, msg("m"), nop); return err }},
			{"HandleBatch", func(db *sql.DB) error {
				_, err := in.HandleBatch(ctx, db, []inbox.Message{orderMsg("m", "a", 1)}, nopMsg)
				return err
			}},
			{"Park", func(db *sql.DB) error { return in.Park(ctx, db, msg("m"), errors.New("x")) }},
			{"ListParked", func(db *sql.DB) error { _, err := in.ListParked(ctx, db, inbox.ParkedFilter{}); return err }},
			{"Skip", func(db *sql.DB) error { _, err := in.Skip(ctx, db, inbox.ParkedFilter{All: true}); return err }},
			{"Retry", func(db *sql.DB) error { _, err := in.Retry(ctx, db, inbox.ParkedFilter{All: true}, nopMsg); return err }},
			{"RequestRetry", func(db *sql.DB) error {
				_, err := in.RequestRetry(ctx, db, inbox.ParkedFilter{All: true})
				return err
			}},
			{"ServeRequests", func(db *sql.DB) error { _, err := in.ServeRequests(ctx, db, nopMsg); return err }},
			{"Check", func(db *sql.DB) error { return in.Check(ctx, db) }},
		} {
			if err := tc.call(e.DB); !errors.Is(err, inbox.ErrSchemaMissing) {
				t.Errorf("%s without the table = %v, want ErrSchemaMissing", tc.name, err)
			}
			if err := tc.call(nil); !errors.Is(err, inbox.ErrInvalidConfig) {
				t.Errorf("%s with a nil db = %v, want ErrInvalidConfig", tc.name, err)
			}
		}
		if _, err := in.Handle(ctx, e.DB, msg("m"), nil); !errors.Is(err, inbox.ErrInvalidConfig) {
			t.Errorf("Handle with a nil handler = %v, want ErrInvalidConfig", err)
		}
		if _, err := in.HandleBatch(ctx, e.DB, []inbox.Message{msg("m")}, nil); !errors.Is(err, inbox.ErrInvalidConfig) {
			t.Errorf("HandleBatch with a nil handler = %v, want ErrInvalidConfig", err)
		}
	})
}

// TestSkipReleasesTheAggregate: skipping a parked message records a retry
// request for its aggregate; ServeRequests (what a running runner calls)
// runs the held messages behind it in order, deletes the request, and the
// aggregate's next message applies. RequestRetry does the same for a
// parked message the operator wants retried; a handler that fails again
// leaves it parked and the request served.
func TestSkipReleasesTheAggregate(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		b := setup(t, tg)
		requests := b.e.Q("inbox_message_requests")
		if err := b.in.Park(b.ctx, b.db, orderMsg("a-1", "a", 1), errors.New("poison")); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"a-2", "a-3"} {
			out, err := b.in.Handle(b.ctx, b.db, orderMsg(id, "a", 2), b.apply("shipping", id))
			must(t, out, err, inbox.Held)
		}
		if n, err := b.in.Skip(b.ctx, b.db, inbox.ParkedFilter{ID: "a-1"}); err != nil || n != 1 {
			t.Fatalf("Skip = %d, %v", n, err)
		}
		if n := b.count(t, "SELECT COUNT(*) FROM "+requests); n != 1 {
			t.Fatalf("%d retry requests after Skip, want 1", n)
		}
		var order []string
		rec := func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
			order = append(order, m.ID)
			return b.applyMsg("shipping")(ctx, tx, m)
		}
		n, err := b.in.ServeRequests(b.ctx, b.db, rec)
		if err != nil || n != 2 || strings.Join(order, ",") != "a-2,a-3" {
			t.Fatalf("ServeRequests = %d, %v, ran %v; want a-2, a-3", n, err, order)
		}
		if n := b.count(t, "SELECT COUNT(*) FROM "+requests); n != 0 {
			t.Fatalf("%d retry requests after serving, want 0", n)
		}
		out, err := b.in.Handle(b.ctx, b.db, orderMsg("a-4", "a", 4), b.apply("shipping", "a-4"))
		must(t, out, err, inbox.Applied)

		// RequestRetry: b-1 parked, b-2 held behind it.
		if err := b.in.Park(b.ctx, b.db, orderMsg("b-1", "b", 1), errors.New("down")); err != nil {
			t.Fatal(err)
		}
		out, err = b.in.Handle(b.ctx, b.db, orderMsg("b-2", "b", 2), b.apply("shipping", "b-2"))
		must(t, out, err, inbox.Held)
		if _, err := b.in.RequestRetry(b.ctx, b.db, inbox.ParkedFilter{ID: "zzz"}); !errors.Is(err, inbox.ErrNothingMatched) {
			t.Fatalf("RequestRetry of nothing = %v, want ErrNothingMatched", err)
		}
		if n, err := b.in.RequestRetry(b.ctx, b.db, inbox.ParkedFilter{AggregateType: "order", AggregateID: "b"}); err != nil || n != 1 {
			t.Fatalf("RequestRetry = %d, %v", n, err)
		}
		fail := func(context.Context, *sql.Tx, inbox.Message) error { return errors.New("still down") }
		if n, err := b.in.ServeRequests(b.ctx, b.db, fail); n != 0 || !errors.Is(err, inbox.ErrHandler) {
			t.Fatalf("ServeRequests with a failing handler = %d, %v; want 0 and ErrHandler", n, err)
		}
		if n := b.count(t, "SELECT COUNT(*) FROM "+requests); n != 0 {
			t.Fatalf("%d retry requests after a failed retry, want 0 (served; the message is parked again)", n)
		}
		if _, err := b.in.RequestRetry(b.ctx, b.db, inbox.ParkedFilter{AggregateType: "order", AggregateID: "b"}); err != nil {
			t.Fatal(err)
		}
		order = nil
		if n, err := b.in.ServeRequests(b.ctx, b.db, rec); err != nil || n != 2 || strings.Join(order, ",") != "b-1,b-2" {
			t.Fatalf("ServeRequests = %d, %v, ran %v; want b-1, b-2", n, err, order)
		}
		if ps := mustList(t, b); len(ps) != 0 {
			t.Fatalf("still parked or held: %+v", ps)
		}
	})
}
