package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
)

// spStep is one step of a savepoint scenario: a statement (with the error
// it must return, nil for success) or, with emit set, a business row and
// an event of that name in the same step, so that the business rows that
// survive and the events that are written can be compared.
type spStep struct {
	sql  string
	emit string
	err  error
}

func stmt(q string) spStep                       { return spStep{sql: q} }
func emitted(name string) spStep                 { return spStep{emit: name} }
func refused(q string, e error) spStep           { return spStep{sql: q, err: e} }
func only(ds ...driver.Dialect) []driver.Dialect { return ds }

type spCase struct {
	name     string
	dialects []driver.Dialect // nil: every dialect
	steps    []spStep
	want     []string // events (and business rows) that commit, in order
}

var (
	pg    = driver.Postgres
	my    = driver.MySQL
	lite  = driver.SQLite
	notMy = only(pg, lite)
)

var savepointCases = []spCase{
	{name: "RollbackToDropsLaterEvents", steps: []spStep{
		emitted("before"), stmt("SAVEPOINT sp1"), emitted("inner"), stmt("ROLLBACK TO SAVEPOINT sp1"), emitted("after"),
	}, want: []string{"before", "after"}},
	{name: "ReleaseKeepsEvents", steps: []spStep{
		emitted("outer"), stmt("SAVEPOINT sp1"), emitted("inner"), stmt("RELEASE SAVEPOINT sp1"),
	}, want: []string{"outer", "inner"}},
	{name: "RollbackToKeepsTheSavepointOpen", steps: []spStep{
		stmt("SAVEPOINT a"), emitted("x"), stmt("ROLLBACK TO SAVEPOINT a"), emitted("y"),
		stmt("ROLLBACK TO SAVEPOINT a"), emitted("z"), stmt("RELEASE SAVEPOINT a"),
	}, want: []string{"z"}},
	{name: "RollbackToOuterDropsInnerSavepoints", steps: []spStep{
		stmt("SAVEPOINT a"), emitted("1"), stmt("SAVEPOINT b"), emitted("2"), stmt("ROLLBACK TO SAVEPOINT a"),
		refused("ROLLBACK TO SAVEPOINT b", driver.ErrUncertainStatement), emitted("3"),
	}, want: []string{"3"}},
	{name: "MiddleOfThreeRolledBack", steps: []spStep{
		emitted("0"), stmt("SAVEPOINT a"), emitted("1"), stmt("SAVEPOINT b"), emitted("2"), stmt("SAVEPOINT c"), emitted("3"),
		stmt("RELEASE SAVEPOINT c"), stmt("ROLLBACK TO SAVEPOINT b"), emitted("4"), stmt("RELEASE SAVEPOINT a"),
	}, want: []string{"0", "1", "4"}},
	{name: "ReusedNameShadows", dialects: notMy, steps: []spStep{
		stmt("SAVEPOINT a"), emitted("1"), stmt("SAVEPOINT a"), emitted("2"),
		stmt("RELEASE SAVEPOINT a"), stmt("ROLLBACK TO SAVEPOINT a"), emitted("3"),
	}, want: []string{"3"}},
	{name: "ReusedNameReplaces", dialects: only(my), steps: []spStep{
		// MySQL deletes the older savepoint of the same name.
		stmt("SAVEPOINT a"), emitted("1"), stmt("SAVEPOINT a"), emitted("2"),
		stmt("RELEASE SAVEPOINT a"), refused("ROLLBACK TO SAVEPOINT a", driver.ErrUncertainStatement), emitted("3"),
	}, want: []string{"1", "2", "3"}},
	{name: "OptionalKeywords", steps: []spStep{
		emitted("0"), stmt("SAVEPOINT a"), emitted("1"), stmt("ROLLBACK TO a"), emitted("2"), stmt("RELEASE SAVEPOINT a"),
	}, want: []string{"0", "2"}},
	{name: "WorkKeyword", dialects: only(pg, my), steps: []spStep{
		stmt("SAVEPOINT a"), emitted("1"), stmt("ROLLBACK WORK TO SAVEPOINT a"), emitted("2"),
	}, want: []string{"2"}},
	{name: "TransactionKeyword", dialects: notMy, steps: []spStep{
		stmt("SAVEPOINT a"), emitted("1"), stmt("ROLLBACK TRANSACTION TO SAVEPOINT a"), emitted("2"), stmt("RELEASE a"),
	}, want: []string{"2"}},
	{name: "CaseCommentsWhitespace", steps: []spStep{
		stmt("  /* ORM: nested */ -- depth 1\n\tsavepoint Sp_1"), emitted("1"),
		stmt("\n-- undo\n  Rollback   To   SavePoint   SP_1  ;  "), emitted("2"),
	}, want: []string{"2"}},
	{name: "QuotedNamePostgres", dialects: only(pg), steps: []spStep{
		// PostgreSQL folds unquoted names only: "Sp" and sp differ.
		stmt(`SAVEPOINT "Sp"`), emitted("1"), refused("ROLLBACK TO SAVEPOINT sp", driver.ErrUncertainStatement),
		stmt(`SAVEPOINT sp`), emitted("2"), stmt(`ROLLBACK TO SAVEPOINT "sp"`), emitted("3"), stmt(`ROLLBACK TO SAVEPOINT "Sp"`), emitted("4"),
	}, want: []string{"4"}},
	{name: "QuotedNameMySQL", dialects: only(my), steps: []spStep{
		stmt("SAVEPOINT `Sp 1`"), emitted("1"), stmt("ROLLBACK TO SAVEPOINT `sp 1`"), emitted("2"),
	}, want: []string{"2"}},
	{name: "QuotedNameSQLite", dialects: only(lite), steps: []spStep{
		stmt(`SAVEPOINT "Sp 1"`), emitted("1"), stmt("ROLLBACK TO [sp 1]"), emitted("2"), stmt("RELEASE `SP 1`"),
	}, want: []string{"2"}},
	{name: "TransactionControlRefused", steps: []spStep{
		emitted("before"),
		refused("COMMIT", driver.ErrTransactionControl),
		refused("rollback", driver.ErrTransactionControl),
		refused("ROLLBACK WORK", driver.ErrTransactionControl),
		refused("/* x */ BEGIN", driver.ErrTransactionControl),
		emitted("after"),
	}, want: []string{"before", "after"}},
	{name: "EndAndStartRefused", dialects: only(pg), steps: []spStep{
		refused("END", driver.ErrTransactionControl), refused("START TRANSACTION", driver.ErrTransactionControl),
		refused("ABORT", driver.ErrTransactionControl), emitted("1"),
	}, want: []string{"1"}},
	{name: "ImplicitCommitRefused", dialects: only(my), steps: []spStep{
		emitted("1"),
		refused("START TRANSACTION", driver.ErrTransactionControl),
		refused("SET autocommit = 1", driver.ErrTransactionControl),
		refused("CREATE TABLE implicit_commit (id INT)", driver.ErrTransactionControl),
		refused("LOCK TABLES orders WRITE", driver.ErrTransactionControl),
		stmt("CREATE TEMPORARY TABLE tmp_ok (id INT)"),
		stmt("DROP TEMPORARY TABLE tmp_ok"),
		emitted("2"),
	}, want: []string{"1", "2"}},
	{name: "TransactionalDDLAllowed", dialects: notMy, steps: []spStep{
		stmt("SAVEPOINT a"), stmt("CREATE TABLE ddl_in_tx (id INT)"), emitted("1"), stmt("ROLLBACK TO SAVEPOINT a"), emitted("2"),
	}, want: []string{"2"}},
	{name: "SeveralStatementsWithASavepointRefused", steps: []spStep{
		emitted("1"),
		refused("SELECT 1; SAVEPOINT x", driver.ErrUncertainStatement),
		refused("SAVEPOINT x; SELECT 1", driver.ErrUncertainStatement),
		emitted("2"),
	}, want: []string{"1", "2"}},
	{name: "SemicolonInsideLiteralsIsOneStatement", steps: []spStep{
		stmt("SAVEPOINT a"), emitted("1"), stmt("SELECT 'x; ROLLBACK TO SAVEPOINT a' AS s"), emitted("2"),
	}, want: []string{"1", "2"}},
	{name: "ProcedureCallRefused", dialects: only(my), steps: []spStep{
		emitted("1"), refused("CALL no_such_procedure()", driver.ErrUncertainStatement), emitted("2"),
	}, want: []string{"1", "2"}},
	{name: "UnknownSavepointRefused", steps: []spStep{
		emitted("1"), refused("ROLLBACK TO SAVEPOINT never_set", driver.ErrUncertainStatement),
		refused("RELEASE SAVEPOINT never_set", driver.ErrUncertainStatement), emitted("2"),
	}, want: []string{"1", "2"}},
}

// spMode is how a scenario's statements reach the driver.
type spMode struct {
	name string
	run  func(ctx context.Context, tx *sql.Tx, q string) error
}

var spModes = []spMode{
	{"Exec", func(ctx context.Context, tx *sql.Tx, q string) error {
		_, err := tx.ExecContext(ctx, q)
		return err
	}},
	{"Query", func(ctx context.Context, tx *sql.Tx, q string) error {
		return drain(tx.QueryContext(ctx, q))
	}},
	{"Prepared", func(ctx context.Context, tx *sql.Tx, q string) error {
		s, err := tx.PrepareContext(ctx, q)
		if err != nil {
			return err
		}
		defer s.Close()
		_, err = s.ExecContext(ctx)
		return err
	}},
	{"PreparedQuery", func(ctx context.Context, tx *sql.Tx, q string) error {
		s, err := tx.PrepareContext(ctx, q)
		if err != nil {
			return err
		}
		defer s.Close()
		return drain(s.QueryContext(ctx))
	}},
}

// drain reads rows to the end and closes them.
func drain(rows *sql.Rows, err error) error {
	if err != nil {
		return err
	}
	for rows.Next() {
	}
	return errors.Join(rows.Err(), rows.Close())
}

// runSavepointCase runs c in one transaction on e and returns the event
// names and business rows that committed.
func runSavepointCase(t *testing.T, e *testdb.Env, c spCase, mode spMode, prefix string) (events, rows []string) {
	t.Helper()
	ctx := testCtx(t, time.Minute)
	sctx := outbox.NewContext(ctx)
	tx, err := e.DB.BeginTx(sctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	// The statements' ctx does not carry the transaction: state is kept
	// per connection, which is what must work.
	bg := context.Background()
	for i, s := range c.steps {
		if s.emit != "" {
			id := prefix + s.emit
			if _, err := tx.ExecContext(bg, "INSERT INTO "+e.Q("orders")+" (id, seq) VALUES ("+e.Placeholder(1)+", "+e.Placeholder(2)+")", id, i); err != nil {
				t.Fatalf("step %d: business row: %v", i, err)
			}
			if err := outbox.Emit(sctx, outbox.Event{AggregateType: "order", AggregateID: id, Type: "order.step", Payload: []byte(`{}`)}); err != nil {
				t.Fatalf("step %d: Emit: %v", i, err)
			}
			continue
		}
		q := strings.ReplaceAll(s.sql, " orders ", " "+e.Q("orders")+" ")
		err := mode.run(bg, tx, q)
		switch {
		case s.err == nil && err != nil:
			t.Fatalf("step %d %q: %v", i, q, err)
		case s.err != nil && !errors.Is(err, s.err):
			t.Fatalf("step %d %q: err = %v, want %v", i, q, err, s.err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("commit: %v", err)
	}
	read := func(q string) []string {
		out := testdb.Column(t, ctx, e.RelayDB, q, prefix+"%")
		for i := range out {
			out[i] = strings.TrimPrefix(out[i], prefix)
		}
		return out
	}
	events = read("SELECT aggregate_id FROM " + e.Table + " WHERE aggregate_id LIKE " + e.Placeholder(1) + " ORDER BY id")
	rows = read("SELECT id FROM " + e.Q("orders") + " WHERE id LIKE " + e.Placeholder(1) + " ORDER BY seq")
	return events, rows
}

// TestSavepoints: events emitted after a savepoint are dropped by ROLLBACK
// TO it and kept by RELEASE, exactly as the database treats the rows
// written in the same span, for every dialect's syntax, on the Exec and
// Query paths, prepared or not (and pgx's simple protocol); transaction
// control sent as a plain statement, and what cannot be classified, are
// refused and leave the transaction usable.
func TestSavepoints(t *testing.T) {
	t.Parallel()
	for _, tg := range append(slices.Clone(testdb.All), testdb.PgxSimple) {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			e := testdb.New(t, tg, driver.Config{})
			createOrders(t, e)
			n := 0
			for _, c := range savepointCases {
				if c.dialects != nil && !slices.Contains(c.dialects, tg.Dialect) {
					continue
				}
				for _, mode := range spModes {
					t.Run(c.name+"/"+mode.name, func(t *testing.T) {
						n++
						prefix := fmt.Sprintf("c%d-", n)
						events, rows := runSavepointCase(t, e, c, mode, prefix)
						if !slices.Equal(events, c.want) {
							t.Errorf("events committed %q, want %q", events, c.want)
						}
						if !slices.Equal(rows, events) {
							t.Errorf("business rows %q but events %q: a ghost or a lost event", rows, events)
						}
					})
				}
			}
		})
	}
}

// TestSavepointRollbackIsNeverPublished: through a running relay, the
// event of a span rolled back to its savepoint is never published and the
// rest of the transaction is.
func TestSavepointRollbackIsNeverPublished(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{})
		pub := outboxtest.NewPublisher()
		startRelay(t, e, pub, nil)
		ctx := testCtx(t, time.Minute)
		err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error {
			bg := context.Background()
			if err := outbox.Emit(ctx, ev("outer", 1)); err != nil {
				return err
			}
			if _, err := tx.ExecContext(bg, "SAVEPOINT nested"); err != nil {
				return err
			}
			if err := outbox.Emit(ctx, ev("ghost", 1)); err != nil {
				return err
			}
			if _, err := tx.ExecContext(bg, "ROLLBACK TO SAVEPOINT nested"); err != nil {
				return err
			}
			return outbox.Emit(ctx, ev("outer", 2))
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error { return outbox.Emit(ctx, ev("marker", 1)) }); err != nil {
			t.Fatal(err)
		}
		got, err := pub.WaitForCount(ctx, 3)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range got {
			ids = append(ids, m.AggregateID)
		}
		if !slices.Equal(ids, []string{"outer", "outer", "marker"}) {
			t.Fatalf("published %q, want outer, outer, marker (never the rolled-back ghost)", ids)
		}
	})
}

// TestProcedureCallsAllowedByConfig: with Config.AllowProcedureCalls a
// MySQL CALL runs inside a bound transaction.
func TestProcedureCallsAllowedByConfig(t *testing.T) {
	t.Parallel()
	e := testdb.New(t, testdb.All[2], driver.Config{AllowProcedureCalls: true})
	createOrders(t, e)
	if _, err := e.RelayDB.Exec("CREATE PROCEDURE " + e.Q("add_order") + "(IN oid VARCHAR(64)) INSERT INTO " + e.Q("orders") + " (id, seq) VALUES (oid, 0)"); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, time.Minute)
	err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "CALL "+e.Q("add_order")+"('p1')"); err != nil {
			return err
		}
		return outbox.Emit(ctx, ev("p1", 1))
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := rowCount(t, e, ""); n != 1 {
		t.Errorf("%d events, want 1", n)
	}
}
