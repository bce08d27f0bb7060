package tests

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
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
		if tg.Dialect == driver.SQLite {
			// Statistics gathered while every row is pending (as after a
			// backlog, or PRAGMA optimize): they made SQLite prefer a
			// rowid-order table scan, which walks all sent history on
			// every claim. The claim pins its index.
			if _, err := e.RelayDB.ExecContext(ctx, "ANALYZE"); err != nil {
				t.Fatal(err)
			}
		}
		future := map[driver.Dialect]string{
			driver.Postgres: "clock_timestamp() + interval '1 hour'",
			driver.MySQL:    "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR",
			driver.SQLite:   "CAST(unixepoch('subsec') * 1000 AS INTEGER) + 3600000",
		}[tg.Dialect]
		// Sent history, as retention would leave it: the claim must not
		// visit it either. 200,000 rows (40,000 on SQLite, whose insert
		// under -race took 34 s for 200,000): either way several times the
		// 50*batch visits allowed below, so a plan that walks the history
		// fails; more rows only made the suite slower (1,000,000 before).
		history := map[driver.Dialect]string{
			driver.Postgres: "INSERT INTO " + e.Table + " (message_id, aggregate_type, aggregate_id, event_type, partition_key, content_type, payload, status, attempts, created_at, updated_at, sent_at) " +
				"SELECT 'h-' || g, 'order', 'agg-' || (g % 10), 't', 0, 'application/json', '{}', 1, 1, clock_timestamp(), clock_timestamp(), clock_timestamp() FROM generate_series(1, 200000) g",
			driver.MySQL: "INSERT INTO " + e.Table + " (message_id, aggregate_type, aggregate_id, event_type, partition_key, content_type, payload, status, attempts, created_at, updated_at, sent_at) " +
				"SELECT CONCAT('h-', seq), 'order', CONCAT('agg-', seq % 10), 't', 0, 'application/json', '{}', 1, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) FROM seq_1_to_200000",
			driver.SQLite: "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 40000) " +
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
		claimed := runClaim(t, ctx, e, d, nil, nil, batch)
		for _, c := range claimed {
			if strings.Contains(held, "'"+c.aggregateID+"'") {
				t.Fatalf("claim returned row %d of held aggregate %s", c.id, c.aggregateID)
			}
		}
		got := len(claimed)
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
		// The claim is a function: its Function Scan node counts the
		// pages every statement inside it read, but not their rows. A
		// page holds a few dozen of these rows, so pages bound visits
		// from above as well as rows would.
		return pgClaimBuffers(t, context.Background(), e.RelayDB, d, 0, batch, nil)
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
		// The pending set in rowid order (SCAN p: it holds only pending
		// rows), each outbox row by rowid, each hold probe on held_idx;
		// never a scan of the outbox table.
		if !strings.Contains(text, "SCAN p") || !strings.Contains(text, "SEARCH o USING INTEGER PRIMARY KEY (rowid=?)") ||
			!strings.Contains(text, "held_idx (aggregate_type=? AND aggregate_id=? AND next_retry_at>?)") || strings.Contains(text, "SCAN o") {
			return 1 << 30
		}
		return batch
	}
}

// TestClaimBuffersIndependentOfPendingBacklog is the regression test for a
// hold index that held every unsent row: with a large pending backlog and
// nothing held, PostgreSQL's planner chose to scan that whole index once
// per claim (the scan's index condition was on its third column, so no
// row counter showed it; the claim of 500 read about 1,000 buffers per
// 1,000,000 pending rows, 4 ms of a 1M-row drain's claim). The hold index
// now holds only rows that can hold (retrying or dead), so a claim reads
// the same few pages whatever the backlog. Then, with the statistics still
// from the backlog, 300,000 rows are sent: the claim must stay on the
// pending index (SQLite, in the same state, scanned the table through the
// sent rows; its claim now says INDEXED BY; PostgreSQL's claim function
// plans without sequential scans, bitmap scans or sorts). Buffers are
// counted by EXPLAIN (ANALYZE, BUFFERS).
func TestClaimBuffersIndependentOfPendingBacklog(t *testing.T) {
	t.Parallel()
	tg := testdb.All[0] // pq: the plan is the server's, not the driver's
	const backlog, batch = 400000, 500
	e := testdb.New(t, tg, driver.Config{})
	ctx := testCtx(t, 5*time.Minute)
	q := "INSERT INTO " + e.Table + " (message_id, aggregate_type, aggregate_id, event_type, partition_key, content_type, payload, created_at, updated_at) " +
		"SELECT 'p-' || g, 'order', 'agg-' || (g % 1000), 't', 0, 'application/json', '{}', clock_timestamp(), clock_timestamp() FROM generate_series(1, " + fmt.Sprint(backlog) + ") g"
	if _, err := e.RelayDB.ExecContext(ctx, q); err != nil {
		t.Fatal(err)
	}
	if _, err := e.RelayDB.ExecContext(ctx, "ANALYZE "+e.Table); err != nil {
		t.Fatal(err)
	}
	d, err := dialect.New(dialect.Postgres, e.Table)
	if err != nil {
		t.Fatal(err)
	}
	claimBuffers := func() int { return pgClaimBuffers(t, ctx, e.RelayDB, d, 0, batch, nil) }
	buffers := claimBuffers()
	t.Logf("claim of %d rows with %d pending read %d buffers", batch, backlog, buffers)
	// Per claimed row (schema version 9): its entry in the pending set's
	// primary key (a few hundred per page) and its outbox row by primary
	// key: three index pages (root, inner, leaf) and its heap page, four
	// page reads per row (most of them hits on the same few pages), 2,000
	// for 500 rows; the hold index 1-3 more. 100 more leaves room for
	// planner variation; a scan of a 400,000-entry index would read
	// about 1,000 more.
	perRow := 4 * batch
	if buffers > perRow+100 {
		t.Fatalf("claim read %d buffers with %d pending rows: its cost grows with the backlog", buffers, backlog)
	}
	// One aggregate's head waits for a retry an hour away: now every
	// claimed row probes the hold index once (root and leaf: two pages),
	// whatever the backlog.
	if _, err := e.RelayDB.ExecContext(ctx, "UPDATE "+e.Table+" SET next_retry_at = clock_timestamp() + interval '1 hour', attempts = 1 WHERE message_id = 'p-7'"); err != nil {
		t.Fatal(err)
	}
	held := claimBuffers()
	t.Logf("with one aggregate held: %d buffers", held)
	if held > perRow+2*batch+100 {
		t.Fatalf("claim read %d buffers with one aggregate held: more than one probe per row", held)
	}
	// The statistics above were taken with every row pending. Send 300,000
	// of them (no new ANALYZE) and VACUUM: the claim must keep to the
	// pending index rather than walk the primary key or the table through
	// the sent rows (the trap SQLite fell into).
	if _, err := e.RelayDB.ExecContext(ctx, "UPDATE "+e.Table+" SET status = 1, next_retry_at = NULL WHERE id IN (SELECT id FROM "+e.Table+" WHERE message_id <> 'p-7' ORDER BY id LIMIT 300000)"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.RelayDB.ExecContext(ctx, "VACUUM "+e.Table+", "+testdb.PendingTable(e.Table)); err != nil {
		t.Fatal(err)
	}
	// From the floor a relay proves (the lowest pending id), so that the
	// dead index entries VACUUM could not remove (other tests' snapshots on
	// the shared server) are not walked; the held head sent, nothing held.
	if _, err := e.RelayDB.ExecContext(ctx, "UPDATE "+e.Table+" SET status = 1, next_retry_at = NULL WHERE message_id = 'p-7'"); err != nil {
		t.Fatal(err)
	}
	var floor int64
	if err := e.RelayDB.QueryRowContext(ctx, "SELECT MIN(id) FROM "+testdb.PendingTable(e.Table)).Scan(&floor); err != nil {
		t.Fatal(err)
	}
	if buffers := pgClaimBuffers(t, ctx, e.RelayDB, d, floor, batch, nil); buffers > perRow+100 {
		t.Fatalf("after 300,000 rows were sent, with statistics from the backlog, the claim read %d buffers", buffers)
	}
}

// pgClaimBuffers is testdb.PostgresClaimBuffers over all 32 partitions.
func pgClaimBuffers(t *testing.T, ctx context.Context, db *sql.DB, d *dialect.Dialect, floor int64, batch int, skip []int64) int {
	t.Helper()
	return testdb.PostgresClaimBuffers(t, ctx, db, d, floor, batch, allPartitions(), skip)
}

// TestClaimSkipsInFlightRows: the claim leaves out, in the database, the
// rows of a batch whose mark-sent is still running, and still returns a
// full batch after them.
func TestClaimSkipsInFlightRows(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{})
		ctx := testCtx(t, time.Minute)
		if err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error {
			for i := 0; i < 10; i++ {
				if err := outbox.Emit(ctx, ev(fmt.Sprintf("agg-%d", i%3), i)); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		var ids []int64
		rows, err := e.RelayDB.QueryContext(ctx, "SELECT id FROM "+e.Table+" ORDER BY id")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		rows.Close()
		d, err := dialect.New(dialect.Name(tg.Dialect), e.Table)
		if err != nil {
			t.Fatal(err)
		}
		for _, skip := range [][]int64{nil, ids[:3], {ids[0], ids[4]}} {
			var got []int64
			for _, c := range runClaim(t, ctx, e, d, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31}, skip, 5) {
				got = append(got, c.id)
			}
			var want []int64
			for _, id := range ids {
				if len(want) < 5 && !slices.Contains(skip, id) {
					want = append(want, id)
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("skipping %v: claimed %v, want %v", skip, got, want)
			}
		}
	})
}

// claimedRow is what the tests read back of a claimed row.
type claimedRow struct {
	id          int64
	aggregateID string
}

// runClaim runs the dialect's claim (partitions nil: all) of up to limit
// rows, leaving out skip, and returns the rows in claim order.
func runClaim(t *testing.T, ctx context.Context, e *testdb.Env, d *dialect.Dialect, partitions []int, skip []int64, limit int) []claimedRow {
	t.Helper()
	var res *sql.Rows
	var err error
	if d.HasClaimFloor() {
		if partitions == nil {
			partitions = allPartitions()
		}
		res, err = e.RelayDB.QueryContext(ctx, testdb.PostgresClaimSQL(d, 0, limit, partitions, skip))
	} else {
		q, extra := d.ClaimSkipping(partitions, skip)
		res, err = e.RelayDB.QueryContext(ctx, q, append([]any{limit}, extra...)...)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer res.Close()
	var out []claimedRow
	for res.Next() {
		var m struct {
			kind                                 int
			id                                   int64
			mid, at, aid, et, topic, ct, headers string
			part, attempts                       int
			payload                              []byte
			age                                  int64
			epoch, pmin, last, xid               int64
			resolved                             bool
		}
		dest := []any{&m.id, &m.mid, &m.at, &m.aid, &m.et, &m.topic, &m.part, &m.ct, &m.payload, &m.headers, &m.attempts, &m.age}
		if d.HasClaimFloor() {
			dest = append(append([]any{&m.kind}, dest...), &m.epoch, &m.resolved, &m.pmin, &m.last, &m.xid)
		} else {
			m.kind = 1
		}
		if err := res.Scan(dest...); err != nil {
			t.Fatal(err)
		}
		if m.kind == 1 {
			out = append(out, claimedRow{m.id, m.aid})
		}
	}
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRelayWritesReadOnlyTheirRows is the regression test for relay writes
// that MariaDB ran as scans: mark-sent with a few hundred ids (fewer in a
// small table) read the whole PRIMARY index (type=index) and, under
// REPEATABLE READ, locked every row it read, so it waited on any writer's
// uncommitted row and stalled the relay (TestHeldCommitDoesNotStallRelay
// shows the stall); retention's DELETE scanned the table (type=ALL) and its
// INSERT ... SELECT every sent row (type=ref on the status index), and an
// IN list of 1,000 ids became a join with a derived table. Each statement
// is executed by ANALYZE (in a transaction rolled back) with statistics
// fresh and stale (gathered while the table held 10 rows, auto-recalc off)
// over 4,000 rows; the outbox table must be read by primary key only
// (range/eq_ref/const on PRIMARY), and by the server's own row counters
// (r_rows x r_loops) read no more rows than the statement names.
func TestRelayWritesReadOnlyTheirRows(t *testing.T) {
	t.Parallel()
	tg := testdb.All[2]
	if tg.Dialect != driver.MySQL {
		t.Fatalf("testdb.All[2] is %s, want the MySQL target", tg.Name)
	}
	for _, stale := range []bool{false, true} {
		t.Run(map[bool]string{false: "fresh_statistics", true: "stale_statistics"}[stale], func(t *testing.T) {
			t.Parallel()
			const rows, sent, owner = 4000, 1000, "plan-owner"
			e := testdb.New(t, tg, driver.Config{Limits: outbox.Limits{MaxEvents: rows}})
			ctx := testCtx(t, 3*time.Minute)
			d, err := dialect.New(dialect.MySQL, e.Table)
			if err != nil {
				t.Fatal(err)
			}
			exec := func(q string, args ...any) {
				t.Helper()
				if _, err := e.RelayDB.ExecContext(ctx, q, args...); err != nil {
					t.Fatal(err)
				}
			}
			emit := func(from, to int) {
				t.Helper()
				err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error {
					for i := from; i < to; i++ {
						if err := outbox.Emit(ctx, ev(fmt.Sprintf("agg-%d", i%50), i)); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			if stale {
				exec("ALTER TABLE " + e.Table + " STATS_AUTO_RECALC = 0")
				emit(0, 10)
				exec("ANALYZE TABLE " + e.Table)
				emit(10, rows)
			} else {
				emit(0, rows)
			}
			exec("UPDATE "+e.Table+" SET status = 1, sent_at = UTC_TIMESTAMP(6) - INTERVAL 8 DAY WHERE id <= ?", sent)
			if !stale {
				exec("ANALYZE TABLE " + e.Table + ", " + testdb.PendingTable(e.Table))
			}
			exec(d.LeaseInit(32), func() []any {
				a := make([]any, 32)
				for i := range a {
					a[i] = i
				}
				return a
			}()...)
			exec("UPDATE "+d.LeaseTable()+" SET owner = ?, epoch = 1, expires_at = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR", owner)

			ids := func(from, n int) []int64 {
				out := make([]int64, n)
				for i := range out {
					out[i] = int64(from + i)
				}
				return out
			}
			anys := func(v []int64) []any {
				out := make([]any, len(v))
				for i := range v {
					out[i] = v[i]
				}
				return out
			}
			type stmt struct {
				name string
				q    string
				args []any
				n    int // rows it names
			}
			var stmts []stmt
			for _, n := range []int{2, 200, d.MaxIDs("mark_sent")} {
				q, args := d.MarkSent(ids(sent+1, n), owner)
				stmts = append(stmts, stmt{fmt.Sprintf("mark_sent/%d", n), q, args, n})
			}
			for _, n := range []int{2, 200, 2000} {
				q, args := d.MarkRetriedSent(ids(sent+1, n), owner)
				stmts = append(stmts, stmt{fmt.Sprintf("mark_sent_retried/%d", n), q, args, n})
			}
			for _, n := range []int{2, 200, d.MaxIDs("delete_sent")} {
				q, args := d.DeleteSent(ids(sent+1, n), owner)
				stmts = append(stmts, stmt{fmt.Sprintf("delete_sent/%d", n), q, args, n})
			}
			for _, name := range []string{"retention_archive", "retention_delete"} {
				for _, n := range []int{2, 200, d.MaxIDs(name)} {
					stmts = append(stmts, stmt{fmt.Sprintf("%s/%d", name, n), d.WithIDs(name, n), anys(ids(1, n)), n})
				}
			}
			stmts = append(stmts,
				stmt{"mark_retry", d.Fenced("mark_retry", true), []any{1000, "x", sent + 7, owner}, 1},
				stmt{"mark_dead", d.Fenced("mark_dead", true), []any{"x", sent + 7, owner}, 1})
			for _, s := range stmts {
				t.Run(s.name, func(t *testing.T) {
					tables := analyzeWrite(t, ctx, e, s.q, s.args)
					for _, tb := range tables {
						switch {
						case strings.HasPrefix(tb.name, "<"):
							t.Errorf("reads %s (access %s): the id list became a derived table", tb.name, tb.access)
						case tb.name == "o" || tb.name == "outbox_message" || tb.name == "outbox_message_pending":
							if tb.key != "PRIMARY" || !slices.Contains([]string{"range", "eq_ref", "const"}, tb.access) {
								t.Errorf("reads the outbox table by %s on %q, want range/eq_ref/const on PRIMARY", tb.access, tb.key)
							}
							if tb.read > float64(s.n) {
								t.Errorf("read %.0f outbox rows for %d ids", tb.read, s.n)
							}
						}
					}
					t.Logf("plan: %+v", tables)
				})
			}
		})
	}
}

// analyzedTable is one table access of an ANALYZE FORMAT=JSON plan.
type analyzedTable struct {
	name, access, key string
	read              float64 // r_rows x r_loops
}

// analyzeWrite executes q (with args inlined: ANALYZE is not prepared) by
// ANALYZE FORMAT=JSON in a transaction it rolls back, and returns its
// table accesses.
func analyzeWrite(t *testing.T, ctx context.Context, e *testdb.Env, q string, args []any) []analyzedTable {
	t.Helper()
	var b strings.Builder
	i := 0
	for _, r := range q {
		if r != '?' {
			b.WriteRune(r)
			continue
		}
		switch v := args[i].(type) {
		case string:
			b.WriteString("'" + strings.ReplaceAll(v, "'", "''") + "'")
		default:
			fmt.Fprint(&b, v)
		}
		i++
	}
	if i != len(args) {
		t.Fatalf("%d placeholders for %d arguments", i, len(args))
	}
	tx, err := e.RelayDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // the point: nothing is kept
	var text string
	if err := tx.QueryRowContext(ctx, "ANALYZE FORMAT=JSON "+b.String()).Scan(&text); err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal([]byte(text), &doc); err != nil {
		t.Fatal(err)
	}
	var out []analyzedTable
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if tb, ok := x["table"].(map[string]any); ok {
				name, _ := tb["table_name"].(string)
				access, _ := tb["access_type"].(string)
				key, _ := tb["key"].(string)
				loops, ok := tb["r_loops"].(float64)
				if !ok {
					loops = 1 // the single-table UPDATE/DELETE target: read once
				}
				rows, _ := tb["r_rows"].(float64)
				out = append(out, analyzedTable{name, access, key, loops * rows})
			}
			for _, c := range x {
				walk(c)
			}
		case []any:
			for _, c := range x {
				walk(c)
			}
		}
	}
	walk(doc)
	if len(out) == 0 {
		t.Fatalf("no table in plan %s", text)
	}
	return out
}
