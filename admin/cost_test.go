package admin_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"testing"

	"github.com/sqloutbox/outbox/admin"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testdb"
)

// TestReadingCostFlatOnPostgres proves with page counts that the page's
// statements do not read the sent history: each one's buffers (shared
// hit + read, EXPLAIN (ANALYZE, BUFFERS)) with 200,000 more sent rows in
// the table, and no VACUUM since (autovacuum is off on the test server),
// stay within a few pages of what they were with 2,000 (a statement that
// lists row ids: within a page per id).
func TestReadingCostFlatOnPostgres(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	e := testdb.New(t, testdb.Target{Name: "pgx", Dialect: driver.Postgres}, driver.Config{})
	batch := 0
	insert := func(n, status int, idExpr string) {
		batch++
		q := fmt.Sprintf(`INSERT INTO %s (%smessage_id, aggregate_type, aggregate_id, event_type, partition_key, content_type, payload, status, next_retry_at, last_error, sent_at)
			SELECT %s'm-%d-' || g, 'acct', 'a' || (g %% 997), 'acct.changed', g %% 32, 'text/plain', '\x78', %d,
			       CASE WHEN %d = 2 THEN 'infinity'::timestamptz END, CASE WHEN %d = 2 THEN 'broker refuses' END,
			       CASE WHEN %d = 1 THEN clock_timestamp() END
			FROM generate_series(1, %d) g`, e.Table, map[bool]string{true: "id, "}[idExpr != ""], idExpr, batch, status, status, status, status, n)
		if _, err := e.RelayDB.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	insert(2_000, 1, "")
	insert(planDead, 2, "")
	insert(planPending, 0, "")
	h, err := admin.New(admin.Config{Outbox: e.Outbox, DB: e.RelayDB, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for _, v := range testdb.Column(t, ctx, e.RelayDB, "SELECT id FROM "+e.Table+" WHERE status = 2 ORDER BY id") {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	buffers := func() map[string]int {
		out := map[string]int{}
		for _, s := range h.Statements(ids, "acct", "a5", "m-1-17") {
			if s.Name == "lookup by aggregate" || s.Name == "outbox dead list, an aggregate" || s.Name == "outbox dead retry, an aggregate" ||
				s.Name == "dead list by aggregate" || s.Name == "dead list, every filter" || s.Name == "confirmation of an aggregate" ||
				s.Name == "apply: retry by primary key" || s.Name == "apply: skip by primary key" {
				continue // without the optional aggregate index they read the aggregate's dead rows; writes are not run
			}
			var plan []struct {
				Plan struct {
					Hit  int `json:"Shared Hit Blocks"`
					Read int `json:"Shared Read Blocks"`
				} `json:"Plan"`
			}
			var raw string
			if err := e.RelayDB.QueryRowContext(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+s.SQL, s.Args...).Scan(&raw); err != nil {
				t.Fatalf("%s: %v", s.Name, err)
			}
			if err := json.Unmarshal([]byte(raw), &plan); err != nil || len(plan) != 1 {
				t.Fatalf("%s: plan %s: %v", s.Name, raw, err)
			}
			out[s.Name] = plan[0].Plan.Hit + plan[0].Plan.Read
		}
		return out
	}
	before := buffers()
	// The history goes below the dead and pending rows (ids -1 to
	// -200,000), where a walk of the primary key in id order meets it
	// first.
	insert(200_000, 1, "-g, ")
	after := buffers()
	for name, b := range before {
		t.Logf("%-40s %4d pages with 2,000 sent rows, %4d with 202,000", name, b, after[name])
		bound := b + 8
		if name == "confirmation of a selection" || name == "apply: the ids still dead" {
			// The planner may probe the primary key once per listed id
			// instead of walking dead_idx: a page or so per id, whatever
			// the history.
			bound = max(bound, len(ids)+16)
		}
		if after[name] > bound {
			t.Errorf("%s: %d pages with 202,000 sent rows, %d with 2,000: it reads the history", name, after[name], b)
		}
	}
}
