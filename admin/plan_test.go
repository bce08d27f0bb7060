package admin_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/admin"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// Rows of the plan tests' table: mostly sent history, a few dead letters
// (as many as one confirmation lists, the MariaDB IN-list trap) and a few
// pending rows.
const (
	planRows    = 20_000
	planDead    = 300
	planPending = 50
)

// TestPlans checks with EXPLAIN that no statement of the page reads the
// outbox table whole, on the three dialects, in both states a table can
// be in: fresh, without statistics (autovacuum is off on the test server,
// and InnoDB and SQLite keep none until ANALYZE), and after ANALYZE.
func TestPlans(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := testCtx(t)
		e := testdb.New(t, tg, driver.Config{})
		for b := 0; b < planRows/1000; b++ {
			cx := outbox.NewContext(ctx)
			tx, err := e.DB.BeginTx(cx, nil)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 1000; i++ {
				n := b*1000 + i
				if err := outbox.Emit(cx, outbox.Event{ID: fmt.Sprintf("m-%d", n), AggregateType: "acct", AggregateID: fmt.Sprintf("a%d", n%997),
					Type: "acct.changed", ContentType: "text/plain", Payload: []byte("x")}); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		far := map[driver.Dialect]string{driver.Postgres: "'infinity'", driver.MySQL: "'9999-12-31 00:00:00'", driver.SQLite: "253402214400000"}[tg.Dialect]
		var lo int64
		if err := e.RelayDB.QueryRowContext(ctx, "SELECT MIN(id) FROM "+e.Table).Scan(&lo); err != nil {
			t.Fatal(err)
		}
		deadFrom, pendingFrom := lo+planRows-planDead-planPending, lo+planRows-planPending
		for _, q := range []string{
			fmt.Sprintf("UPDATE %s SET status = 1, sent_at = created_at WHERE id < %d", e.Table, deadFrom),
			fmt.Sprintf("UPDATE %s SET status = 2, next_retry_at = %s, last_error = 'broker refuses' WHERE id >= %d AND id < %d", e.Table, far, deadFrom, pendingFrom),
		} {
			if _, err := e.RelayDB.ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		h, err := admin.New(admin.Config{Outbox: e.Outbox, DB: e.RelayDB, Token: token})
		if err != nil {
			t.Fatal(err)
		}
		ids := make([]int64, planDead)
		for i := range ids {
			ids[i] = deadFrom + int64(i)
		}
		stmts := h.Statements(ids, "acct", "a5", "m-12345")
		d, err := dialect.New(dialect.Name(tg.Dialect), e.Table)
		if err != nil {
			t.Fatal(err)
		}
		check := func(state string, withAggregateLookup bool) {
			for _, s := range stmts {
				if s.Name == "lookup by aggregate" && !withAggregateLookup {
					continue
				}
				plan, scans := explain(t, ctx, e.RelayDB, tg.Dialect, e.Table, s.SQL, s.Args)
				if os.Getenv("OUTBOX_SHOW_PLANS") != "" { // to read the plans: OUTBOX_SHOW_PLANS=1 go test -v -run TestPlans
					t.Logf("%s, %s:\n%s", state, s.Name, plan)
				}
				if scans != "" {
					t.Errorf("%s, %s: reads the whole table (%s); plan:\n%s", state, s.Name, scans, plan)
				}
			}
		}
		check("without statistics", tg.Dialect == driver.MySQL)
		if tg.Dialect != driver.MySQL {
			if _, err := e.RelayDB.ExecContext(ctx, d.Query("admin_aggregate_index_ddl")); err != nil {
				t.Fatal(err)
			}
		}
		analyze := map[driver.Dialect]string{driver.Postgres: "ANALYZE " + e.Table, driver.MySQL: "ANALYZE TABLE " + e.Table, driver.SQLite: "ANALYZE"}[tg.Dialect]
		if _, err := e.RelayDB.ExecContext(ctx, analyze); err != nil {
			t.Fatal(err)
		}
		check("with statistics", true)
	})
}

// explain returns a statement's plan and, if the plan reads the outbox
// table whole (PostgreSQL: a Seq Scan of it; MySQL/MariaDB: access type
// ALL, or a full index scan; SQLite: SCAN without an index), what does.
func explain(t *testing.T, ctx context.Context, db *sql.DB, d driver.Dialect, table, q string, args []any) (plan, scans string) {
	t.Helper()
	base := table[strings.LastIndex(table, ".")+1:]
	seq := regexp.MustCompile(`Seq Scan on ` + regexp.QuoteMeta(base) + `\b`)
	scan := regexp.MustCompile(`^SCAN ` + regexp.QuoteMeta(base) + `$`)
	var b strings.Builder
	for _, row := range testdb.Explain(t, ctx, db, d, false, q, args...) {
		switch d {
		case driver.Postgres:
			line := row["QUERY PLAN"]
			b.WriteString(line + "\n")
			if m := seq.FindString(line); m != "" {
				scans = m
			}
		case driver.SQLite:
			b.WriteString(row["detail"] + "\n")
			if scan.MatchString(row["detail"]) {
				scans = row["detail"]
			}
		default:
			fmt.Fprintf(&b, "%v\n", row)
			if row["table"] == base && (row["type"] == "ALL" || row["type"] == "index") {
				scans = "type " + row["type"] + ", key " + row["key"] + ", rows " + row["rows"]
			}
		}
	}
	return b.String(), scans
}
