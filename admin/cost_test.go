package admin_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/sqloutbox/outbox/admin"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
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
		if name == "backlog" {
			// The oldest pending row of each relay partition is read by
			// primary key (32 lookups): the history adds a level to that
			// B-tree, one page per lookup, not a page per sent row.
			bound += 32
		}
		if after[name] > bound {
			t.Errorf("%s: %d pages with 202,000 sent rows, %d with 2,000: it reads the history", name, after[name], b)
		}
	}
}

// TestOverviewIndexOnlyOnPostgres proves with page counts that the
// overview's readings do not read the heap when the dead letters are
// spread through the sent history (issue 36: 200,000 sent rows with
// 20,000 dead among them, one in ten; the counts read 8,271 pages and
// the held dead letters per partition 4,129, the whole heap): after
// VACUUM (the visibility map set; no statistics, as on a table never
// analyzed) and again after ANALYZE, each statement is an index-only
// scan with no heap fetch, and reads fewer pages than a tenth of the
// heap's.
func TestOverviewIndexOnlyOnPostgres(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	// A database of its own: VACUUM sets the visibility map only for rows
	// no open transaction of the database may still need, and the shared
	// database's other tests hold such transactions (CI: "Index Only Scan,
	// 1 heap fetches" and bitmap heap scans after VACUUM).
	e := testdb.NewOn(t, testdb.Target{Name: "pgx", Dialect: driver.Postgres}, testdb.PrivatePostgresDatabase(t), driver.Config{})
	q := fmt.Sprintf(`INSERT INTO %s (message_id, aggregate_type, aggregate_id, event_type, partition_key, content_type, payload, status, next_retry_at, last_error, sent_at)
		SELECT 'm-' || g, 'acct', 'a' || (g %% 997), 'acct.changed', g %% 32, 'text/plain', convert_to(repeat('x', 200), 'UTF8'),
		       CASE WHEN g %% 10 = 0 THEN 2 WHEN g > 199900 THEN 0 ELSE 1 END,
		       CASE WHEN g %% 10 = 0 THEN 'infinity'::timestamptz END, CASE WHEN g %% 10 = 0 THEN 'broker refuses' END,
		       CASE WHEN g %% 10 <> 0 AND g <= 199900 THEN clock_timestamp() END
		FROM generate_series(1, 200000) g`, e.Table)
	if _, err := e.RelayDB.ExecContext(ctx, q); err != nil {
		t.Fatal(err)
	}
	var heap int
	if err := e.RelayDB.QueryRowContext(ctx, "SELECT pg_relation_size($1::regclass) / current_setting('block_size')::int", e.Table).Scan(&heap); err != nil {
		t.Fatal(err)
	}
	h, err := admin.New(admin.Config{Outbox: e.Outbox, DB: e.RelayDB, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	overview := map[string]bool{"counts": true, "backlog": true, "held partitions": true}
	for _, state := range []string{"VACUUM", "ANALYZE"} {
		if _, err := e.RelayDB.ExecContext(ctx, state+" "+e.Table); err != nil {
			t.Fatal(err)
		}
		if state == "VACUUM" {
			// A private database is not enough: a logical replication
			// slot being created anywhere on the server (another test's
			// relay) holds the horizon of every database back until its
			// snapshot is built, and VACUUM then leaves pages not
			// all-visible. Vacuum again until the visibility map covers
			// the heap.
			testdb.Eventually(t, ctx, "VACUUM sets the whole heap all-visible", func() bool {
				var visible, pages int
				if err := e.RelayDB.QueryRowContext(ctx, "SELECT relallvisible, relpages FROM pg_class WHERE oid = $1::regclass", e.Table).Scan(&visible, &pages); err != nil {
					t.Fatal(err)
				}
				if visible >= pages {
					return true
				}
				if _, err := e.RelayDB.ExecContext(ctx, "VACUUM "+e.Table); err != nil {
					t.Fatal(err)
				}
				return false
			})
		}
		for _, s := range h.Statements([]int64{1}, "acct", "a5", "m-1") {
			if !overview[s.Name] {
				continue
			}
			var raw string
			if err := e.RelayDB.QueryRowContext(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+s.SQL, s.Args...).Scan(&raw); err != nil {
				t.Fatalf("%s: %v", s.Name, err)
			}
			buffers, scans := planScans(t, raw, e.Table)
			t.Logf("after %s: %-16s %5d pages (heap: %d pages); outbox table scans: %v", state, s.Name, buffers, heap, scans)
			if buffers > heap/10 {
				t.Errorf("after %s: %s reads %d pages, the heap has %d: it reads the heap", state, s.Name, buffers, heap)
			}
			for _, sc := range scans {
				if sc != "Index Only Scan, 0 heap fetches" && sc != "Index Scan by primary key" {
					t.Errorf("after %s: %s scans the outbox table by %s", state, s.Name, sc)
				}
			}
		}
	}
}

// planScans returns a plan's pages (shared hit + read) and how each node
// that reads the outbox table reads it.
func planScans(t *testing.T, raw, table string) (int, []string) {
	t.Helper()
	var plan []struct {
		Plan map[string]any `json:"Plan"`
	}
	if err := json.Unmarshal([]byte(raw), &plan); err != nil || len(plan) != 1 {
		t.Fatalf("plan %s: %v", raw, err)
	}
	num := func(v any) int { f, _ := v.(float64); return int(f) }
	var scans []string
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if rel, _ := n["Relation Name"].(string); rel == table[strings.LastIndex(table, ".")+1:] {
			switch typ, _ := n["Node Type"].(string); {
			case typ == "Index Only Scan":
				scans = append(scans, fmt.Sprintf("Index Only Scan, %d heap fetches", num(n["Heap Fetches"])))
			case typ == "Index Scan" && strings.HasSuffix(fmt.Sprint(n["Index Name"]), "_pkey"):
				scans = append(scans, "Index Scan by primary key")
			default:
				scans = append(scans, fmt.Sprintf("%s (%v)", typ, n["Index Name"]))
			}
		}
		if ps, ok := n["Plans"].([]any); ok {
			for _, p := range ps {
				if m, ok := p.(map[string]any); ok {
					walk(m)
				}
			}
		}
	}
	walk(plan[0].Plan)
	return num(plan[0].Plan["Shared Hit Blocks"]) + num(plan[0].Plan["Shared Read Blocks"]), scans
}
