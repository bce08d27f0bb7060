package tests

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/internal/testdb"
)

// TestClaimCostIndependentOfBacklog (with 1,000,000 rows of sent history
// too) is the regression test for claims
// whose hold check probed every earlier row of the candidate's aggregate:
// SQLite walked all earlier rows, sent history included, and PostgreSQL
// and MariaDB every pending row of the aggregate, per candidate (about a
// million row visits for this table). With 20,000 pending rows over 10
// aggregates, five of them held by a retrying head, the claim must return
// only rows of the five free aggregates and, by the database's own row
// counters, visit a small multiple of what it returns.
func TestClaimCostIndependentOfBacklog(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		if tg.Name == "pgx" {
			t.Skip("SKIP: same server and SQL as pq")
		}
		const rows, aggs, batch = 20000, 10, 500
		e := testdb.New(t, tg, driver.Config{Limits: outbox.Limits{MaxEvents: rows}})
		ctx := testCtx(t, 5*time.Minute)
		err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error {
			for i := 0; i < rows; i++ {
				if err := outbox.Emit(ctx, ev(fmt.Sprintf("agg-%d", i%aggs), i)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		future := map[driver.Dialect]string{
			driver.Postgres: "clock_timestamp() + interval '1 hour'",
			driver.MySQL:    "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR",
			driver.SQLite:   "CAST(unixepoch('subsec') * 1000 AS INTEGER) + 3600000",
		}[tg.Dialect]
		// 1,000,000 rows of sent history (200,000 on SQLite, whose
		// single-threaded insert would dominate the suite's run time), as
		// retention would leave them: the claim must not visit them either.
		history := map[driver.Dialect]string{
			driver.Postgres: "INSERT INTO " + e.Table + " (message_id, aggregate_type, aggregate_id, event_type, partition_key, content_type, payload, status, attempts, created_at, updated_at, sent_at) " +
				"SELECT 'h-' || g, 'order', 'agg-' || (g % 10), 't', 0, 'application/json', '{}', 1, 1, clock_timestamp(), clock_timestamp(), clock_timestamp() FROM generate_series(1, 1000000) g",
			driver.MySQL: "INSERT INTO " + e.Table + " (message_id, aggregate_type, aggregate_id, event_type, partition_key, content_type, payload, status, attempts, created_at, updated_at, sent_at) " +
				"SELECT CONCAT('h-', seq), 'order', CONCAT('agg-', seq % 10), 't', 0, 'application/json', '{}', 1, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) FROM seq_1_to_1000000",
			driver.SQLite: "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 200000) " +
				"INSERT INTO " + e.Table + " (message_id, aggregate_type, aggregate_id, event_type, partition_key, content_type, payload, status, attempts, created_at, updated_at, sent_at) " +
				"SELECT 'h-' || n, 'order', 'agg-' || (n % 10), 't', 0, 'application/json', '{}', 1, 1, 0, 0, 0 FROM g",
		}[tg.Dialect]
		if _, err := e.RelayDB.ExecContext(ctx, history); err != nil {
			t.Fatal(err)
		}
		// Heads of agg-0 .. agg-4 wait for a retry an hour away.
		held := "'agg-0','agg-1','agg-2','agg-3','agg-4'"
		q := "UPDATE " + e.Table + " SET next_retry_at = " + future + ", attempts = 1 WHERE id IN (SELECT id FROM (SELECT MIN(id) AS id FROM " +
			e.Table + " WHERE status = 0 AND aggregate_id IN (" + held + ") GROUP BY aggregate_id) x)"
		if _, err := e.RelayDB.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
		if tg.Dialect == driver.Postgres {
			if _, err := e.RelayDB.ExecContext(ctx, "ANALYZE "+e.Table); err != nil {
				t.Fatal(err)
			}
		}
		d, err := dialect.New(dialect.Name(tg.Dialect), e.Table)
		if err != nil {
			t.Fatal(err)
		}
		res, err := e.RelayDB.QueryContext(ctx, d.Claim(nil), batch)
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for res.Next() {
			var m struct {
				id                                   int64
				mid, at, aid, et, topic, ct, headers string
				part, attempts                       int
				payload                              []byte
				age                                  int64
			}
			if err := res.Scan(&m.id, &m.mid, &m.at, &m.aid, &m.et, &m.topic, &m.part, &m.ct, &m.payload, &m.headers, &m.attempts, &m.age); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(held, "'"+m.aid+"'") {
				t.Fatalf("claim returned row %d of held aggregate %s", m.id, m.aid)
			}
			got++
		}
		res.Close()
		if got != batch {
			t.Fatalf("claim returned %d rows, want %d", got, batch)
		}
		visited := claimRowVisits(t, e, d, batch)
		t.Logf("%s: claim of %d rows visited %d rows", tg.Name, batch, visited)
		if visited > 50*batch {
			t.Fatalf("claim visited %d rows for %d returned: cost grows with the backlog", visited, batch)
		}
	})
}

// claimRowVisits measures, with the database's own instrumentation, how
// many rows the claim visited (PostgreSQL: rows produced plus removed by
// filters, times loops; MariaDB: r_rows times r_loops; SQLite: the plan
// must not scan the table for the hold set, and a scan counts as the table).
func claimRowVisits(t *testing.T, e *testdb.Env, d *dialect.Dialect, batch int) int {
	t.Helper()
	var text string
	switch e.Target.Dialect {
	case driver.Postgres:
		q := strings.Replace(d.Claim(nil), "$1", fmt.Sprint(batch), 1)
		if err := e.RelayDB.QueryRow("EXPLAIN (ANALYZE, FORMAT JSON) " + q).Scan(&text); err != nil {
			t.Fatal(err)
		}
		var plan []struct{ Plan map[string]any }
		if err := json.Unmarshal([]byte(text), &plan); err != nil {
			t.Fatal(err)
		}
		var walk func(n map[string]any) float64
		walk = func(n map[string]any) float64 {
			loops, _ := n["Actual Loops"].(float64)
			rows, _ := n["Actual Rows"].(float64)
			removed, _ := n["Rows Removed by Filter"].(float64)
			sum := 0.0
			if strings.Contains(fmt.Sprint(n["Node Type"]), "Scan") {
				sum = (rows + removed) * loops
			}
			if kids, ok := n["Plans"].([]any); ok {
				for _, k := range kids {
					sum += walk(k.(map[string]any))
				}
			}
			return sum
		}
		return int(walk(plan[0].Plan))
	case driver.MySQL:
		q := strings.Replace(d.Claim(nil), "LIMIT ?", fmt.Sprintf("LIMIT %d", batch), 1)
		if err := e.RelayDB.QueryRow("ANALYZE FORMAT=JSON " + q).Scan(&text); err != nil {
			t.Fatal(err)
		}
		var doc any
		if err := json.Unmarshal([]byte(text), &doc); err != nil {
			t.Fatal(err)
		}
		var walk func(v any) float64
		walk = func(v any) float64 {
			sum := 0.0
			switch x := v.(type) {
			case map[string]any:
				if tbl, ok := x["table"].(map[string]any); ok {
					loops, _ := tbl["r_loops"].(float64)
					rows, _ := tbl["r_rows"].(float64)
					sum += loops * rows
				}
				for k, c := range x {
					if k != "table" {
						sum += walk(c)
					} else {
						sum += walk(map[string]any{"_": c.(map[string]any)["materialized"]})
					}
				}
			case []any:
				for _, c := range x {
					sum += walk(c)
				}
			}
			return sum
		}
		return int(walk(doc))
	default:
		rows, err := e.RelayDB.Query("EXPLAIN QUERY PLAN "+d.Claim(nil), batch)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var plan []string
		for rows.Next() {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		text = strings.Join(plan, "\n")
		t.Logf("plan:\n%s", text)
		if !strings.Contains(text, "pending_idx") || !strings.Contains(text, "hold_idx (aggregate_type=? AND aggregate_id=? AND next_retry_at>?)") {
			return 1 << 30
		}
		return batch
	}
}
