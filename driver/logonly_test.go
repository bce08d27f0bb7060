package driver_test

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/logmsg"
	"github.com/sqloutbox/outbox/internal/sqlerr"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// TestLogOnlyCommit: the log-only mode's commit (one query: the logical
// decoding message, then COMMIT) on lib/pq, pgx and pgx in simple
// protocol, over one connection, so that each outcome must leave it
// clean for the next: a commit writes the business row and exactly one
// message; a message that fails (in a transaction an earlier statement
// left aborted, its error ignored: COMMIT is then never run) rolls back
// and returns ErrWriteEvents; a COMMIT that fails
// (a deferred unique constraint) returns the server's error, not
// ErrWriteEvents, and writes neither the row nor a message.
func TestLogOnlyCommit(t *testing.T) {
	t.Parallel()
	for _, tg := range []testdb.Target{testdb.All[0], testdb.All[1], testdb.PgxSimple} {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			e := testdb.New(t, tg, driver.Config{LogOnly: true})
			testdb.RequireLogicalWAL(t, e.RelayDB)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			slot := logSlots(t, ctx, e)
			biz := e.Schema + ".biz"
			if _, err := e.RelayDB.ExecContext(ctx, "CREATE TABLE "+biz+" (id int PRIMARY KEY, v int UNIQUE DEFERRABLE INITIALLY DEFERRED)"); err != nil {
				t.Fatal(err)
			}
			e.DB.SetMaxOpenConns(1)
			run := func(id int, v int, extra string) error {
				tctx := outbox.NewContext(ctx)
				tx, err := e.DB.BeginTx(tctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tx.ExecContext(tctx, "INSERT INTO "+biz+" VALUES ($1, $2)", id, v); err != nil {
					t.Fatal(err)
				}
				if extra != "" {
					_, _ = tx.ExecContext(tctx, extra) // fails: the transaction is left aborted
				}
				if err := outbox.Emit(tctx, outbox.Event{ID: "E-" + string(rune('0'+id)), AggregateType: "order", AggregateID: "o", Type: "t", Payload: []byte("{}")}); err != nil {
					t.Fatal(err)
				}
				return tx.Commit()
			}
			if err := run(1, 1, ""); err != nil {
				t.Fatalf("commit: %v", err)
			}
			err := run(2, 2, "INSERT INTO "+biz+" VALUES (1, 9)")
			if !errors.Is(err, driver.ErrWriteEvents) {
				t.Errorf("message refused: %v, want ErrWriteEvents", err)
			}
			err = run(3, 1, "")
			if err == nil || errors.Is(err, driver.ErrWriteEvents) || sqlerr.PostgresCode(err) != "23505" {
				t.Errorf("deferred constraint at COMMIT: %v, want the server's unique violation, not ErrWriteEvents", err)
			}
			if err := run(4, 4, ""); err != nil {
				t.Fatalf("commit on the same connection afterwards: %v", err)
			}
			var ids string
			if err := e.RelayDB.QueryRowContext(ctx, "SELECT string_agg(id::text, ',' ORDER BY id) FROM "+biz).Scan(&ids); err != nil {
				t.Fatal(err)
			}
			if ids != "1,4" {
				t.Errorf("business rows %s, want 1,4", ids)
			}
			if messages := logMessages(t, ctx, e, slot); messages != 2 {
				t.Errorf("%d messages decoded, want 2 (the two commits)", messages)
			}
			var n int
			if err := e.DB.QueryRowContext(ctx, "SELECT count(*) FROM "+e.Table).Scan(&n); err != nil || n != 0 {
				t.Errorf("%d rows in the outbox table (%v), want none", n, err)
			}
		})
	}
}

// logSlots creates a test_decoding slot (returned: its changes show the
// messages) and a pgoutput one (so that a log-only commit finds a slot),
// dropped at cleanup.
func logSlots(t *testing.T, ctx context.Context, e *testdb.Env) string {
	t.Helper()
	slot := strings.ToLower(testdb.RandomName("outbox_logcommit_"))
	for _, s := range [][2]string{{slot, "test_decoding"}, {slot + "_p", "pgoutput"}} {
		if _, err := e.RelayDB.ExecContext(ctx, "SELECT pg_create_logical_replication_slot($1, $2)", s[0], s[1]); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if _, err := e.RelayDB.Exec("SELECT pg_drop_replication_slot($1)", s[0]); err != nil {
				t.Errorf("dropping slot %s: %v", s[0], err)
			}
		})
	}
	return slot
}

// logMessages counts the log-only messages of e's table in slot's
// changes so far.
func logMessages(t *testing.T, ctx context.Context, e *testdb.Env, slot string) int {
	t.Helper()
	var n int
	prefix := "prefix: " + logmsg.Prefix(e.Table) + ","
	if err := e.RelayDB.QueryRowContext(ctx, "SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL) WHERE position(convert_to($2, 'UTF8') IN data) > 0", slot, prefix).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// skipNoArgs is pgx's connection declining every statement without
// arguments from ExecContext (driver.ErrSkip), as a driver may.
type skipNoArgs struct{ *stdlib.Conn }

func (c skipNoArgs) ExecContext(ctx context.Context, q string, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	if len(args) == 0 {
		return nil, sqldriver.ErrSkip
	}
	return c.Conn.ExecContext(ctx, q, args)
}

type skipNoArgsDriver struct{}

func (skipNoArgsDriver) Open(dsn string) (sqldriver.Conn, error) {
	c, err := stdlib.GetDefaultDriver().Open(dsn)
	if err != nil {
		return nil, err
	}
	return skipNoArgs{c.(*stdlib.Conn)}, nil
}

// TestLogOnlyCommitDriverDeclines: a driver whose ExecerContext declines
// the one-query commit (driver.ErrSkip: nothing sent) gets the message
// and COMMIT as two statements; the commit succeeds with one message.
func TestLogOnlyCommitDriverDeclines(t *testing.T) {
	t.Parallel()
	e := testdb.New(t, testdb.All[1], driver.Config{LogOnly: true})
	testdb.RequireLogicalWAL(t, e.RelayDB)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	slot := logSlots(t, ctx, e)
	ob, err := driver.New(driver.Config{Dialect: driver.Postgres, Table: e.Table, LogOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(dsnConnector{ob.Wrap(skipNoArgsDriver{}), e.DSN})
	defer db.Close()
	for i := range 2 {
		tctx := outbox.NewContext(ctx)
		tx, err := db.BeginTx(tctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := outbox.Emit(tctx, outbox.Event{ID: fmt.Sprint("S-", i), AggregateType: "order", AggregateID: "o", Type: "t", Payload: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatalf("commit %d: %v", i, err)
		}
	}
	if n := logMessages(t, ctx, e, slot); n != 2 {
		t.Errorf("%d messages decoded, want 2", n)
	}
}
