package tests

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

// TestHeldCommitDoesNotStallRelay holds one writer's COMMIT in the fault
// proxy after its outbox rows were INSERTed (a slow flush, a network
// stall, a paused client: the transaction stays open on the server with
// its row locks) while 200 other transactions commit. Every one of them
// must be published and recorded (marked sent, or deleted with
// DeleteOnPublish) while the commit is still held, without duplicates:
// no relay statement may wait on the lock of a row outside its batch.
// In "backlog", retention then archives and deletes them, also while the
// commit is held. Then the commit is released and its event follows.
//
// "backlog" commits the 200 before the relay starts, so one mark-sent
// carries all 200 ids: on MariaDB 10.11 that statement used to scan the
// whole PRIMARY index under REPEATABLE READ and wait on the held row's
// lock. "live" commits them while the relay runs, the scenario of issue 11.
//
// SQLite is skipped: it has one writer at a time, so a held commit holds
// the database's write lock and every other writer, the relay's mark-sent
// included, waits for it (README, Limitations).
func TestHeldCommitDoesNotStallRelay(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name            string
		backlog         bool
		deleteOnPublish bool
	}{
		{"live", false, false},
		{"backlog", true, false},
		{"backlog_delete", true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			forEachTarget(t, func(t *testing.T, tg testdb.Target) {
				if tg.Dialect == driver.SQLite {
					t.Skip("SKIP: SQLite has one writer at a time: a held commit holds the write lock and every writer waits for it")
				}
				const others = 200
				e := testdb.New(t, tg, driver.Config{})
				db, proxy, pattern := openThroughProxy(t, e)
				pub := outboxtest.NewPublisher()
				ctx := testCtx(t, 3*time.Minute)
				// A statement waiting on the held row must not be rescued
				// by its own timeout within the test: a blocked mark-sent
				// then shows as rows never recorded, not as re-sends.
				mod := func(cfg *relay.Config) {
					cfg.QueryTimeout = 10 * time.Minute
					cfg.DeleteOnPublish = c.deleteOnPublish
				}
				if !c.backlog {
					startRelay(t, e, pub, mod)
				}

				proxy.Arm(pattern, faultproxy.HoldBefore)
				sctx := outbox.NewContext(ctx)
				tx, err := db.BeginTx(sctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := outbox.Emit(sctx, ev("held", 1)); err != nil {
					t.Fatal(err)
				}
				committed := make(chan error, 1)
				go func() { committed <- tx.Commit() }()
				eventually(t, ctx, "the proxy holding COMMIT", func() bool { return proxy.Tripped.Load() == 1 })
				// The hook's INSERT has run: the held row exists, uncommitted, with
				// a lower id than every row below.

				var wg sync.WaitGroup
				errs := make(chan error, 4)
				for w := 0; w < 4; w++ {
					wg.Add(1)
					go func(w int) {
						defer wg.Done()
						for i := w; i < others; i += 4 {
							if err := inTx(ctx, e.DB, func(ctx context.Context, _ *sql.Tx) error {
								return outbox.Emit(ctx, ev(fmt.Sprintf("other-%03d", i), i))
							}); err != nil {
								errs <- err
								return
							}
						}
					}(w)
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatal(err)
				}
				if c.backlog {
					startRelay(t, e, pub, mod)
				}

				if _, err := pub.WaitForCount(ctx, others); err != nil {
					t.Fatal(err)
				}
				recorded := func() bool {
					if c.deleteOnPublish {
						return rowCount(t, e, "") == 0
					}
					return rowCount(t, e, e.IsSent()) == others
				}
				eventually(t, ctx, fmt.Sprintf("all %d published rows recorded while a commit is held", others), recorded)
				if got := len(pub.Messages()); got != others {
					t.Fatalf("%d messages published while the commit was held, want %d (no duplicates)", got, others)
				}
				if c.backlog && !c.deleteOnPublish {
					// Retention (archive, then delete) of the sent rows must
					// not wait on the held row either.
					ret, err := relay.NewRetention(e.Outbox, e.RelayDB, relay.RetentionConfig{
						After: time.Microsecond, Archive: true, Logger: quietLogger()})
					if err != nil {
						t.Fatal(err)
					}
					octx, cancel := context.WithTimeout(ctx, 20*time.Second) // milliseconds of work; a lock wait is 50 s
					n, err := ret.RunOnce(octx)
					cancel()
					if err != nil || n != others {
						t.Fatalf("retention with a commit held removed %d rows, %v; want %d at once", n, err, others)
					}
				}
				select {
				case err := <-committed:
					t.Fatalf("the held commit returned (%v) before it was released", err)
				default:
				}

				proxy.Release()
				if err := <-committed; err != nil {
					t.Fatalf("held commit, released: %v", err)
				}
				msgs, err := pub.Wait(ctx, func(m []relay.Message) bool { return len(m) > others })
				if err != nil {
					t.Fatal(err)
				}
				if last := msgs[len(msgs)-1]; last.AggregateID != "held" || len(msgs) != others+1 {
					t.Fatalf("after release got %d messages, last %s, want %d ending with the held one", len(msgs), last.AggregateID, others+1)
				}
			})
		})
	}
}

// TestDeadLettersDoNotWaitOnHeldCommit: with most rows dead-lettered and a
// writer's COMMIT held after it INSERTed an event of a dead letter's
// aggregate, Skip (by aggregate) and Retry (all) must return at once. On
// MariaDB, updating by the selector itself scanned the whole PRIMARY index
// (type=index) or the aggregate's rows (index_merge with aggregate_idx)
// under REPEATABLE READ and waited on the held row (until
// innodb_lock_wait_timeout, 50 s by default).
func TestDeadLettersDoNotWaitOnHeldCommit(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		if tg.Dialect == driver.SQLite {
			t.Skip("SKIP: SQLite has one writer at a time: a held commit holds the write lock and every writer waits for it")
		}
		const dead = 200
		e := testdb.New(t, tg, driver.Config{})
		db, proxy, pattern := openThroughProxy(t, e)
		ctx := testCtx(t, 2*time.Minute)
		err := inTx(ctx, e.DB, func(ctx context.Context, _ *sql.Tx) error {
			for i := 0; i < dead; i++ {
				if err := outbox.Emit(ctx, ev(fmt.Sprintf("dead-%03d", i), i)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		never := map[driver.Dialect]string{driver.Postgres: "'infinity'::timestamptz", driver.MySQL: "'9999-12-31 23:59:59.999999'"}[tg.Dialect]
		if _, err := e.RelayDB.ExecContext(ctx, "UPDATE "+e.Table+" SET status = 2, attempts = 6, next_retry_at = "+never); err != nil {
			t.Fatal(err)
		}

		proxy.Arm(pattern, faultproxy.HoldBefore)
		sctx := outbox.NewContext(ctx)
		tx, err := db.BeginTx(sctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := outbox.Emit(sctx, ev("dead-007", 1)); err != nil {
			t.Fatal(err)
		}
		committed := make(chan error, 1)
		go func() { committed <- tx.Commit() }()
		eventually(t, ctx, "the proxy holding COMMIT", func() bool { return proxy.Tripped.Load() == 1 })

		dl, err := relay.NewDeadLetters(e.Outbox, e.RelayDB)
		if err != nil {
			t.Fatal(err)
		}
		// Generous for statements that take milliseconds, well below the
		// 50 s a lock wait would take.
		octx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if n, err := dl.Skip(octx, relay.Selector{AggregateType: "order", AggregateID: "dead-007"}); err != nil || n != 1 {
			t.Fatalf("Skip(aggregate) with a commit held = %d, %v; want 1 at once", n, err)
		}
		if n, err := dl.Retry(octx, relay.Selector{All: true}); err != nil || n != dead {
			t.Fatalf("Retry(all) with a commit held = %d, %v; want %d at once", n, err, dead)
		}
		proxy.Release()
		if err := <-committed; err != nil {
			t.Fatalf("held commit, released: %v", err)
		}
		if n := rowCount(t, e, e.IsPending()); n != dead+1 {
			t.Fatalf("%d pending rows after retry and release, want %d", n, dead+1)
		}
	})
}
