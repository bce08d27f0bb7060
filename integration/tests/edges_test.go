package tests

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// TestReusedIDAcrossTransactions: an Event.ID already committed by an
// earlier transaction fails the second commit with an error matching both
// ErrWriteEvents and ErrDuplicateID, naming the reused ID, and nothing of
// the second transaction commits.
func TestReusedIDAcrossTransactions(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{})
		createOrders(t, e)
		ctx := testCtx(t, time.Minute)
		withID := func(id, agg string) outbox.Event {
			x := ev(agg, 1)
			x.ID = id
			return x
		}
		if err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error {
			return outbox.Emit(ctx, withID("order-42-paid", "42"))
		}); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name   string
			events []outbox.Event
		}{
			{"alone", []outbox.Event{withID("order-42-paid", "42")}},
			{"third of four", []outbox.Event{ev("43", 1), withID("fresh-1", "43"), withID("order-42-paid", "42"), ev("43", 2)}},
		} {
			t.Run(c.name, func(t *testing.T) {
				err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error {
					if _, err := tx.ExecContext(ctx, "INSERT INTO "+e.Q("orders")+" (id, seq) VALUES ('"+c.name+"', 1)"); err != nil {
						return err
					}
					for _, x := range c.events {
						if err := outbox.Emit(ctx, x); err != nil {
							return err
						}
					}
					return nil
				})
				if !errors.Is(err, outbox.ErrDuplicateID) || !errors.Is(err, driver.ErrWriteEvents) {
					t.Fatalf("commit = %v, want ErrDuplicateID and ErrWriteEvents", err)
				}
				var de *driver.DuplicateIDError
				if !errors.As(err, &de) || de.ID != "order-42-paid" {
					t.Fatalf("DuplicateIDError = %+v, want ID order-42-paid", de)
				}
				if !strings.Contains(err.Error(), `"order-42-paid"`) {
					t.Errorf("message does not name the ID: %v", err)
				}
				var n int
				if err := e.RelayDB.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+e.Q("orders")+" WHERE id = '"+c.name+"'").Scan(&n); err != nil || n != 0 {
					t.Errorf("business row committed (%d, %v): the transaction must roll back", n, err)
				}
			})
		}
		if n := rowCount(t, e, ""); n != 1 {
			t.Errorf("%d outbox rows, want 1", n)
		}
	})
}

// TestNoTransactionErrorsNameTheFix: the two ways to get no transaction in
// the scope say what happened and what to write instead.
func TestNoTransactionErrorsNameTheFix(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{})
		ctx := testCtx(t, time.Minute)
		check := func(what string, err error, wants ...string) {
			t.Helper()
			if !errors.Is(err, outbox.ErrNoTransaction) {
				t.Fatalf("%s: %v, want ErrNoTransaction", what, err)
			}
			for _, w := range wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s: %q does not say %q", what, err, w)
				}
			}
		}
		// Begun without the scope's context.
		sctx := outbox.NewContext(ctx)
		tx, err := e.DB.Begin()
		if err != nil {
			t.Fatal(err)
		}
		check("db.Begin()", outbox.Emit(sctx, ev("a", 1)), "db.BeginTx(ctx, nil)", "not db.Begin()", "outbox.NewContext", "not opened through the outbox driver")
		_ = tx.Rollback()
		// A pool opened without the wrapper (on SQLite RelayDB is the
		// wrapped pool itself, so open a plain one).
		plain := e.RelayDB
		if tg.Dialect == driver.SQLite {
			if plain, err = sql.Open("sqlite", e.DSN); err != nil {
				t.Fatal(err)
			}
			defer plain.Close()
		}
		sctx = outbox.NewContext(ctx)
		tx, err = plain.BeginTx(sctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		check("unwrapped pool", outbox.Emit(sctx, ev("a", 1)), "not opened through the outbox driver", "WrapConnector")
		_ = tx.Rollback()
		// After the scope's transaction ended.
		sctx = outbox.NewContext(ctx)
		if err := inTxScoped(sctx, e.DB); err != nil {
			t.Fatal(err)
		}
		check("after commit", outbox.Emit(sctx, ev("a", 1)), "already committed or rolled back", "before tx.Commit")
	})
}

func inTxScoped(sctx context.Context, db *sql.DB) error {
	tx, err := db.BeginTx(sctx, nil)
	if err != nil {
		return err
	}
	return tx.Commit()
}
