package testdb

import (
	"context"
	"database/sql"
	"testing"

	"github.com/sqloutbox/outbox/driver"
)

// Explain returns the plan of q with args, one map per row of column name
// to value: PostgreSQL's EXPLAIN (column "QUERY PLAN"; with analyze,
// EXPLAIN ANALYZE, which runs q), MySQL/MariaDB's EXPLAIN (id, table,
// type, key, rows, Extra, ...) and SQLite's EXPLAIN QUERY PLAN (id,
// parent, notused, detail). It fails t on a database error.
func Explain(t testing.TB, ctx context.Context, db *sql.DB, d driver.Dialect, analyze bool, q string, args ...any) []map[string]string {
	t.Helper()
	prefix := "EXPLAIN "
	switch {
	case d == driver.SQLite:
		prefix = "EXPLAIN QUERY PLAN "
	case d == driver.Postgres && analyze:
		prefix = "EXPLAIN ANALYZE "
	}
	rows, err := db.QueryContext(ctx, prefix+q, args...)
	if err != nil {
		t.Fatalf("%s%s: %v", prefix, q, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		row := make(map[string]string, len(cols))
		for i, c := range cols {
			row[c] = vals[i].String
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
