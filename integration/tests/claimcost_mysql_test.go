package tests

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

// claimCost is what one execution of a claim cost MariaDB, by its own
// counters: ANALYZE FORMAT=JSON's r_engine_stats (pages the statement
// accessed in the buffer pool, over every table of the plan) and the
// session's Handler_read_* deltas around a plain execution (index
// entries handed to the server: Handler_read_next counts the rows the
// index scan returned, Handler_read_key the lookups).
type claimCost struct {
	rows          int     // rows returned
	pages         float64 // r_engine_stats.pages_accessed, all tables
	oldRows       float64 // r_engine_stats.old_rows_read: versions rebuilt from undo
	readNext      int64
	readKey       int64
	access        string // the outer table's (the pending set's) access type (index, range)
	inner         string // the outbox table's access type (eq_ref)
	derivedFromIN bool   // an IN list became a derived table
	serverMillis  float64
	planText      string
}

// measureClaim runs q (a rendered claim whose LIMIT is still ?) with
// LIMIT batch on one connection of db, plain and then by ANALYZE
// FORMAT=JSON, and returns its cost.
func measureClaim(t *testing.T, ctx context.Context, db *sql.DB, q string, batch int) claimCost {
	t.Helper()
	q = strings.Replace(q, "LIMIT ?", fmt.Sprintf("LIMIT %d", batch), 1)
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	handler := func() map[string]int64 {
		rows, err := conn.QueryContext(ctx, "SHOW SESSION STATUS LIKE 'Handler_read%'")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		m := map[string]int64{}
		for rows.Next() {
			var k string
			var v int64
			if err := rows.Scan(&k, &v); err != nil {
				t.Fatal(err)
			}
			m[k] = v
		}
		return m
	}
	var c claimCost
	before := handler()
	rows, err := conn.QueryContext(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		c.rows++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	after := handler()
	c.readNext = after["Handler_read_next"] - before["Handler_read_next"]
	c.readKey = after["Handler_read_key"] - before["Handler_read_key"]
	if err := conn.QueryRowContext(ctx, "ANALYZE FORMAT=JSON "+q).Scan(&c.planText); err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(c.planText), &doc); err != nil {
		t.Fatal(err)
	}
	if qb, ok := doc["query_block"].(map[string]any); ok {
		c.serverMillis, _ = qb["r_total_time_ms"].(float64)
	}
	derived := 0
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if tb, ok := x["table"].(map[string]any); ok {
				if es, ok := tb["r_engine_stats"].(map[string]any); ok {
					p, _ := es["pages_accessed"].(float64)
					o, _ := es["old_rows_read"].(float64)
					c.pages += p
					c.oldRows += o
				}
				name, _ := tb["table_name"].(string)
				switch name {
				case "p": // the pending set, walked in id order
					c.access, _ = tb["access_type"].(string)
				case "o": // each outbox row, by primary key
					c.inner, _ = tb["access_type"].(string)
				}
				if strings.HasPrefix(name, "<derived") {
					derived++
				}
			}
			for _, v := range x {
				walk(v)
			}
		case []any:
			for _, v := range x {
				walk(v)
			}
		}
	}
	walk(doc)
	// The hold probe is one derived table (the UNION of held rows); a
	// second one is an id list MariaDB converted into a table.
	c.derivedFromIN = derived > 1
	return c
}

func (c claimCost) String() string {
	return fmt.Sprintf("%d rows, %.0f pages (%.0f old versions), Handler_read_next %d, Handler_read_key %d, access %s then %s, server %.1f ms",
		c.rows, c.pages, c.oldRows, c.readNext, c.readKey, c.access, c.inner, c.serverMillis)
}

// checkLate measures the late-rows statement (Dialect.ClaimLate) the
// relay runs after each claim, after a claim of the first 2,000 pending
// rows with nothing committed since: it must return nothing and visit
// next to nothing (the claimed ids are cut out of its range, and it stops
// below the highest of them), by the pending set's primary key, whatever
// the statistics say.
func checkLate(t *testing.T, ctx context.Context, e *testdb.Env, d *dialect.Dialect, what string) {
	t.Helper()
	ids := runClaimQuery(t, ctx, e, d.Claim(allPartitions()), 2000)
	if len(ids) != 2000 {
		t.Fatalf("%s: claim returned %d rows, want 2000", what, len(ids))
	}
	c := measureClaim(t, ctx, e.RelayDB, d.ClaimLate(2000, allPartitions(), ids, nil, ids[len(ids)-1]), 2000)
	t.Logf("%s, late-rows statement after a claim of 2,000: %s", what, c)
	if c.rows != 0 || c.access != "range" || c.pages > 50 || c.readNext > 10 || strings.Contains(c.planText, "filesort") || c.derivedFromIN {
		t.Fatalf("%s: the late-rows statement %s; want no rows, a range on the pending set's primary key, at most 50 pages and 10 Handler_read_next, no sort:\n%s", what, c, c.planText)
	}
}

// allPartitions is every relay partition of the default count.
func allPartitions() []int {
	p := make([]int, 32)
	for i := range p {
		p[i] = i
	}
	return p
}

// mysqlPreload inserts n pending rows set-based (seq_1_to_n), spread over
// 256 aggregates and the 32 partitions.
func mysqlPreload(t *testing.T, ctx context.Context, e *testdb.Env, n int) {
	t.Helper()
	q := "INSERT INTO " + e.Table + " (message_id, aggregate_type, aggregate_id, event_type, partition_key, content_type, payload, created_at, updated_at) " +
		fmt.Sprintf("SELECT CONCAT('p-', UUID_SHORT()), 'order', CONCAT('agg-', seq %% 256), 't', seq %% 32, 'application/json', REPEAT('x', 90), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) FROM seq_1_to_%d", n)
	if _, err := e.RelayDB.ExecContext(ctx, q); err != nil {
		t.Fatal(err)
	}
}

// holdPurge opens a consistent snapshot on its own connection and keeps it
// open until cleanup (or the returned release): InnoDB's purge cannot
// remove anything changed after it, so every row marked sent meanwhile
// leaves its delete-marked entry in the status index (the history list
// grows).
func holdPurge(t *testing.T, ctx context.Context, db *sql.DB) (release func()) {
	t.Helper()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "START TRANSACTION WITH CONSISTENT SNAPSHOT"); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			_, _ = conn.ExecContext(context.Background(), "COMMIT")
			conn.Close()
		})
	}
	t.Cleanup(release)
	return release
}

func historyListLength(t *testing.T, db *sql.DB) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow("SELECT COUNT FROM information_schema.INNODB_METRICS WHERE NAME = 'trx_rseg_history_len'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// markSentAsRelay marks ids sent in chunks of 2,000 with the relay's own
// statement (unfenced) and returns the ranges a relay would remember.
func markSentAsRelay(t *testing.T, ctx context.Context, e *testdb.Env, d *dialect.Dialect, from, to int64) [][2]int64 {
	t.Helper()
	var sent [][2]int64
	for lo := from; lo <= to; lo += 2000 {
		hi := min(lo+1999, to)
		ids := make([]int64, 0, hi-lo+1)
		for id := lo; id <= hi; id++ {
			ids = append(ids, id)
		}
		q, args := d.MarkSent(ids, "")
		res, err := e.RelayDB.ExecContext(ctx, q, args...)
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := res.RowsAffected(); n != int64(len(ids)) {
			t.Fatalf("marked %d of %d rows sent", n, len(ids))
		}
		sent = dialect.IDRanges(ids, sent)
	}
	return sent
}

// TestMySQLClaimCostFlat: on MariaDB, a claim of 2,000 rows reads O(batch)
// index entries and pages, by the server's counters (Handler_read_next,
// ANALYZE's r_engine_stats.pages_accessed), whatever the statistics say
// and however many rows were sent since InnoDB's purge last ran:
//
//   - no_statistics: statistics taken on the empty table, never updated
//     (STATS_AUTO_RECALC=0), then 200,000 pending rows;
//   - backlog_statistics_purge_held: ANALYZE ... PERSISTENT FOR ALL with
//     200,000 pending, then 150,000 marked sent by the relay's own
//     statement while a consistent snapshot holds purge back (their
//     delete-marked records stay in the pending set's primary key), then
//     statistics again (they now count the sent rows);
//   - in_flight_skip: the 2,000 rows of a batch still being marked sent
//     are left out; as one NOT IN list of 2,000 values MariaDB turned it
//     into a derived table and read all of them by primary key (twice the
//     pages); as a range they are not visited.
//
// The plan must keep the outer scan on the pending set's primary key in
// id order (a range, never a sort), each outbox row read by primary key
// (eq_ref), and the pending rows behind the purge backlog are still all
// claimed: the exclusion hides sent ids only.
func TestMySQLClaimCostFlat(t *testing.T) {
	t.Parallel()
	tg := testdb.All[2]
	if tg.Dialect != driver.MySQL {
		t.Fatalf("testdb.All[2] is %s, want the MySQL target", tg.Name)
	}
	const pending, batch = 200000, 2000
	// A claim of batch rows reads, per row, its record in the pending
	// set's primary key and its outbox row by primary key (about 3 pages:
	// the B-tree's upper levels are counted on every lookup); the hold
	// probe's two empty ranges and the derived table add a few. Twice that
	// leaves room; the walk over 150,000 delete-marked records with their
	// lookups is 450,000 pages.
	const maxPages, maxReadNext = 6*batch + 200, batch + 10
	check := func(t *testing.T, what string, c claimCost) {
		t.Helper()
		t.Logf("%s: %s", what, c)
		if c.rows != batch {
			t.Fatalf("%s: claim returned %d rows, want %d", what, c.rows, batch)
		}
		// index: the primary key in order from its start (no id left out),
		// range: with ids left out; LIMIT stops either (the page and
		// Handler_read_next bounds below check it).
		if (c.access != "range" && c.access != "index") || c.inner != "eq_ref" {
			t.Fatalf("%s: scans %q then %q, want the pending set's primary key in order, then each outbox row by primary key (eq_ref):\n%s", what, c.access, c.inner, c.planText)
		}
		if strings.Contains(c.planText, "filesort") {
			t.Fatalf("%s: the claim sorts:\n%s", what, c.planText)
		}
		if c.derivedFromIN {
			t.Fatalf("%s: an id list became a derived table:\n%s", what, c.planText)
		}
		if c.pages > maxPages || c.readNext > maxReadNext {
			t.Fatalf("%s: %s; want at most %d pages and %d Handler_read_next for %d rows", what, c, maxPages, maxReadNext, batch)
		}
	}
	setup := func(t *testing.T) (*testdb.Env, *dialect.Dialect, context.Context) {
		e := testdb.New(t, tg, driver.Config{})
		d, err := dialect.New(dialect.MySQL, e.Table)
		if err != nil {
			t.Fatal(err)
		}
		return e, d, testCtx(t, 5*time.Minute)
	}
	exec := func(t *testing.T, ctx context.Context, e *testdb.Env, q string) {
		t.Helper()
		if _, err := e.RelayDB.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("no_statistics", func(t *testing.T) {
		t.Parallel()
		e, d, ctx := setup(t)
		exec(t, ctx, e, "ALTER TABLE "+e.Table+" STATS_AUTO_RECALC = 0")
		exec(t, ctx, e, "ALTER TABLE "+testdb.PendingTable(e.Table)+" STATS_AUTO_RECALC = 0")
		exec(t, ctx, e, "ANALYZE TABLE "+e.Table+", "+testdb.PendingTable(e.Table)+" PERSISTENT FOR ALL")
		mysqlPreload(t, ctx, e, pending)
		check(t, "stats of the empty table", measureClaim(t, ctx, e.RelayDB, d.Claim(allPartitions()), batch))
		checkLate(t, ctx, e, d, "stats of the empty table")
		exec(t, ctx, e, "ANALYZE TABLE "+e.Table+", "+testdb.PendingTable(e.Table)+" PERSISTENT FOR ALL")
		checkLate(t, ctx, e, d, "stats during the backlog")
	})

	t.Run("backlog_statistics_purge_held", func(t *testing.T) {
		t.Parallel()
		e, d, ctx := setup(t)
		mysqlPreload(t, ctx, e, pending)
		exec(t, ctx, e, "ANALYZE TABLE "+e.Table+", "+testdb.PendingTable(e.Table)+" PERSISTENT FOR ALL")
		check(t, "stats during the backlog", measureClaim(t, ctx, e.RelayDB, d.Claim(allPartitions()), batch))
		var lo int64
		if err := e.RelayDB.QueryRowContext(ctx, "SELECT MIN(id) FROM "+e.Table).Scan(&lo); err != nil {
			t.Fatal(err)
		}
		hl0 := historyListLength(t, e.RelayDB)
		release := holdPurge(t, ctx, e.RelayDB)
		sent := markSentAsRelay(t, ctx, e, d, lo, lo+150000-1)
		t.Logf("history list length %d -> %d (server-wide) with purge held; sent ranges %v", hl0, historyListLength(t, e.RelayDB), sent)
		q, _ := d.ClaimExcluding(allPartitions(), nil, sent)
		check(t, "purge held, 150,000 sent, stats from the backlog", measureClaim(t, ctx, e.RelayDB, q, batch))
		// Without the exclusion the same claim walks the delete-marked
		// entries: logged for comparison (their lookups depend on whether
		// purge's view of the pages is recent, so no bound is asserted).
		t.Logf("the same claim without the sent ranges: %s", measureClaim(t, ctx, e.RelayDB, d.Claim(allPartitions()), batch))
		exec(t, ctx, e, "ANALYZE TABLE "+e.Table+", "+testdb.PendingTable(e.Table)+" PERSISTENT FOR ALL")
		check(t, "purge held, stats after the sends", measureClaim(t, ctx, e.RelayDB, q, batch))
		release()
		// Every pending row is still claimable: the ranges hide sent rows only.
		all := runClaimQuery(t, ctx, e, q, pending)
		if len(all) != pending-150000 || all[0] != lo+150000 {
			t.Fatalf("claim of everything returned %d rows from id %d, want %d from %d", len(all), all[0], pending-150000, lo+150000)
		}
	})

	t.Run("released_dead_letters", func(t *testing.T) {
		t.Parallel()
		e, d, ctx := setup(t)
		// 50,000 dead letters released by SkipDead (status 2, no
		// next_retry_at: they hold nothing), then the backlog, statistics
		// from the empty table. The hold probe must read only dead rows
		// that hold (next_retry_at set), by its range on
		// status_retry_idx (pinned by FORCE INDEX: with no dead letters
		// MariaDB chose status_id_idx, ref on status alone, which reads
		// every dead row).
		exec(t, ctx, e, "ALTER TABLE "+e.Table+" STATS_AUTO_RECALC = 0")
		exec(t, ctx, e, "ALTER TABLE "+testdb.PendingTable(e.Table)+" STATS_AUTO_RECALC = 0")
		exec(t, ctx, e, "ANALYZE TABLE "+e.Table+", "+testdb.PendingTable(e.Table)+" PERSISTENT FOR ALL")
		// Written as dead from the start: an UPDATE from pending would
		// leave 50,000 delete-marked records at the head of the pending
		// set, which the claim walks until purge removes them (under
		// other clients' load, with a primary-key lookup each: 156,052
		// pages seen before the pending set), a cost of purge's lag that
		// TestMySQLClaimCostUnderWriters covers, not of the hold probe.
		exec(t, ctx, e, "INSERT INTO "+e.Table+" (message_id, aggregate_type, aggregate_id, event_type, partition_key, content_type, payload, status, attempts, created_at, updated_at) "+
			"SELECT CONCAT('d-', UUID_SHORT()), 'order', CONCAT('agg-', seq % 256), 't', seq % 32, 'application/json', REPEAT('x', 90), 2, 6, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) FROM seq_1_to_50000")
		mysqlPreload(t, ctx, e, pending)
		c := measureClaim(t, ctx, e.RelayDB, d.Claim(allPartitions()), batch)
		check(t, "50,000 released dead letters, stats of the empty table", c)
		if n := strings.Count(c.planText, `"key": "`+driver.DefaultTable+`_status_retry_idx"`); n != 2 {
			t.Fatalf("the hold probe reads status_retry_idx in %d of its 2 halves:\n%s", n, c.planText)
		}
	})

	t.Run("in_flight_skip", func(t *testing.T) {
		t.Parallel()
		e, d, ctx := setup(t)
		mysqlPreload(t, ctx, e, pending)
		var lo int64
		if err := e.RelayDB.QueryRowContext(ctx, "SELECT MIN(id) FROM "+e.Table).Scan(&lo); err != nil {
			t.Fatal(err)
		}
		skip := make([]int64, batch)
		for i := range skip {
			skip[i] = lo + int64(i)
		}
		skip[7] = lo + batch + 10 // a hole: the batch is not always contiguous
		q, _ := d.ClaimSkipping(allPartitions(), skip)
		c := measureClaim(t, ctx, e.RelayDB, q, batch)
		check(t, "2,000 in-flight ids left out", c)
		got := runClaimQuery(t, ctx, e, q, 3)
		if want := []int64{lo + 7, lo + batch, lo + batch + 1}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("claim after the in-flight batch returned %v, want %v", got, want)
		}
	})
}

// runClaimQuery runs a rendered claim with LIMIT limit and returns the ids.
func runClaimQuery(t *testing.T, ctx context.Context, e *testdb.Env, q string, limit int) []int64 {
	t.Helper()
	rows, err := e.RelayDB.QueryContext(ctx, q, limit)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var m struct {
			id                                   int64
			mid, at, aid, et, topic, ct, headers string
			part, attempts                       int
			payload                              []byte
			age                                  int64
		}
		if err := rows.Scan(&m.id, &m.mid, &m.at, &m.aid, &m.et, &m.topic, &m.part, &m.ct, &m.payload, &m.headers, &m.attempts, &m.age); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// mysqlLockWaitTimeout is MySQL's ER_LOCK_WAIT_TIMEOUT.
const mysqlLockWaitTimeout = 1205

// relayStatements is go-sql-driver/mysql for a relay's pool: it counts,
// per statement kind (first word), the statements the server refused with
// ER_LOCK_WAIT_TIMEOUT. The pool's DSN sets innodb_lock_wait_timeout = 0,
// so a relay statement that would wait on a row lock fails at once
// instead: a lock wait is then a counted error, not a latency.
type relayStatements struct {
	mu    sync.Mutex
	waits map[string]int
	total atomic.Int64
}

func (s *relayStatements) note(q string, err error) error {
	var me *mysql.MySQLError
	if !errors.As(err, &me) || me.Number != mysqlLockWaitTimeout {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waits == nil {
		s.waits = map[string]int{}
	}
	// The kind and its table ("UPDATE t_x.outbox_message_lease"): a lease
	// renewal meeting the relay's own fenced mark-sent is not a wait on a
	// writer's row.
	w := strings.Fields(q + " ?")
	s.waits[strings.Join(w[:min(2, len(w))], " ")]++
	s.total.Add(1)
	return err
}

type relayStatementsDriver struct{ s *relayStatements }

func (d relayStatementsDriver) Open(dsn string) (sqldriver.Conn, error) {
	c, err := (&mysql.MySQLDriver{}).Open(dsn)
	if err != nil {
		return nil, err
	}
	return relayStatementsConn{c.(mysqlConn), d.s}, nil
}

type relayStatementsConn struct {
	mysqlConn
	s *relayStatements
}

func (c relayStatementsConn) ExecContext(ctx context.Context, q string, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	r, err := c.mysqlConn.ExecContext(ctx, q, args)
	return r, c.s.note(q, err)
}

func (c relayStatementsConn) QueryContext(ctx context.Context, q string, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	r, err := c.mysqlConn.QueryContext(ctx, q, args)
	return r, c.s.note(q, err)
}

func (c relayStatementsConn) PrepareContext(ctx context.Context, q string) (sqldriver.Stmt, error) {
	st, err := c.mysqlConn.PrepareContext(ctx, q)
	if err != nil {
		return nil, c.s.note(q, err)
	}
	return relayStatementsStmt{st.(mysqlStmt), q, c.s}, nil
}

func (c relayStatementsConn) Prepare(q string) (sqldriver.Stmt, error) {
	return c.PrepareContext(context.Background(), q)
}

type relayStatementsStmt struct {
	mysqlStmt
	q string
	s *relayStatements
}

func (st relayStatementsStmt) ExecContext(ctx context.Context, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	r, err := st.mysqlStmt.ExecContext(ctx, args)
	return r, st.s.note(st.q, err)
}

func (st relayStatementsStmt) QueryContext(ctx context.Context, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	r, err := st.mysqlStmt.QueryContext(ctx, args)
	return r, st.s.note(st.q, err)
}

func globalStatusValue(t *testing.T, db *sql.DB, name string) int64 {
	t.Helper()
	var k string
	var v int64
	if err := db.QueryRow("SHOW GLOBAL STATUS LIKE '"+name+"'").Scan(&k, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// manyWriters serializes the runs with many writers (one connection
// each) of the tests in this file: two at once, beside the rest of the
// suite, would come close to MariaDB's default max_connections (151).
var manyWriters sync.Mutex

// startWriters runs n writers through e's wrapped driver (one event per
// transaction, each writer its own aggregates) until the returned stop is
// called; stop waits for them, fails t on a writer's error and returns the
// number of committed events.
func startWriters(t *testing.T, ctx context.Context, e *testdb.Env, n int) (stop func() int) {
	t.Helper()
	if n > 16 {
		manyWriters.Lock()
		t.Cleanup(manyWriters.Unlock)
	}
	e.DB.SetMaxOpenConns(n)
	var halt atomic.Bool
	var committed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; !halt.Load(); i++ {
				if err := inTx(ctx, e.DB, func(ctx context.Context, _ *sql.Tx) error {
					return outbox.Emit(ctx, ev(fmt.Sprintf("w%d-%d", w, i%8), i))
				}); err != nil {
					// The server is shared (another test run may hold
					// connections): a writer refused a connection tries
					// again; what is measured is the relay's claim.
					if strings.Contains(err.Error(), "Error 1040") && ctx.Err() == nil {
						select {
						case <-ctx.Done():
						case <-time.After(20 * time.Millisecond):
						}
						continue
					}
					errs <- err
					return
				}
				committed.Add(1)
			}
		}(w)
	}
	return func() int {
		halt.Store(true)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		return int(committed.Load())
	}
}

// TestMySQLClaimCostUnderWriters: with 16 and 64 writers committing (the
// real wrapped driver), with InnoDB's purge free and held back by a
// consistent snapshot, a relay's cycle (claim, then mark-sent by primary
// key, by the relay's own statements, its sent ranges remembered as the
// relay does) must keep every claim's page count O(rows it returns): the
// rows it marked sent, delete-marked in the status index until purge
// removes them, sit on pages the writers keep recent, so walking them
// costs a primary-key lookup each (measured here: the same claim without
// the sent ranges, logged beside). Each claim is measured by ANALYZE
// FORMAT=JSON just before it runs: only this loop marks rows sent, so
// nothing it excludes changes between the two.
func TestMySQLClaimCostUnderWriters(t *testing.T) {
	t.Parallel()
	tg := testdb.All[2]
	if tg.Dialect != driver.MySQL {
		t.Fatalf("testdb.All[2] is %s, want the MySQL target", tg.Name)
	}
	for _, writers := range []int{16, 64} {
		for _, held := range []bool{false, true} {
			name := fmt.Sprintf("writers_%d", writers)
			if held {
				name += "_purge_held"
			}
			t.Run(name, func(t *testing.T) {
				const cycles, batch = 150, 500
				e := testdb.New(t, tg, driver.Config{})
				ctx := testCtx(t, 5*time.Minute)
				d, err := dialect.New(dialect.MySQL, e.Table)
				if err != nil {
					t.Fatal(err)
				}
				if held {
					holdPurge(t, ctx, e.RelayDB)
				}
				hl0 := historyListLength(t, e.RelayDB)
				stop := startWriters(t, ctx, e, writers)
				var sent [][2]int64
				var with, without claimCost
				var worst, all claimCost
				marked := 0
				for i := 0; i < cycles; i++ {
					q, _ := d.ClaimExcluding(allPartitions(), nil, sent)
					c := measureClaim(t, ctx, e.RelayDB, q, batch)
					if i%10 == 9 {
						b := measureClaim(t, ctx, e.RelayDB, d.Claim(allPartitions()), batch)
						without.pages += b.pages
						without.rows += b.rows
						with.pages += c.pages
						with.rows += c.rows
					}
					all.pages += c.pages
					all.rows += c.rows
					if c.pages > worst.pages {
						worst = c
					}
					ids := runClaimQuery(t, ctx, e, q, batch)
					if len(ids) == 0 {
						continue
					}
					mq, args := d.MarkSent(ids, "")
					res, err := e.RelayDB.ExecContext(ctx, mq, args...)
					if err != nil {
						t.Fatal(err)
					}
					if n, _ := res.RowsAffected(); n == int64(len(ids)) {
						sent = dialect.IDRanges(ids, sent)
						if len(sent) > 64 {
							sent = sent[len(sent)-64:]
						}
					}
					marked += len(ids)
				}
				total := stop()
				// Over all cycles, not per claim: one claim may land on
				// pages other clients of the shared server just changed
				// (1,487 pages for 67 rows was seen beside another test
				// run), but the walk of the rows this relay marked sent,
				// what the ranges leave out, is the part that grows.
				if limit := 8*float64(all.rows) + float64(cycles)*(8*float64(writers)+100); all.pages > limit {
					t.Errorf("%d claims read %.0f pages for %d rows (limit %.0f); worst %s\n%s", cycles, all.pages, all.rows, limit, worst, worst.planText)
				}
				// (The same claim without the ranges, sampled every tenth
				// cycle, is logged, not asserted against: on a quiet server
				// it reads 2-5 times the pages, but beside another test run
				// with purge far behind, 5.0 against 4.1 per row was seen.)
				t.Logf("%d writers, purge held %v: %d events committed, %d marked sent in %d cycles; history list %d -> %d (server-wide); "+
					"sampled claims: %.0f pages for %d rows with the sent ranges, %.0f pages for %d rows without; worst %s; sent ranges %d",
					writers, held, total, marked, cycles, hl0, historyListLength(t, e.RelayDB), with.pages, with.rows, without.pages, without.rows, worst, len(sent))
			})
		}
	}
}

// TestMySQLRelayNoLockWaitsUnderWriters runs one relay on MariaDB while 16
// and then 64 writers commit (the real wrapped driver, one event per
// transaction). The relay's pool runs with innodb_lock_wait_timeout = 0,
// so a relay statement that would wait on a row lock fails with error
// 1205 at once, counted by its driver: none may, and every event must be
// published. The server-wide Innodb_row_lock_waits delta is logged (other
// clients of the server count there too).
func TestMySQLRelayNoLockWaitsUnderWriters(t *testing.T) {
	t.Parallel()
	tg := testdb.All[2]
	if tg.Dialect != driver.MySQL {
		t.Fatalf("testdb.All[2] is %s, want the MySQL target", tg.Name)
	}
	for _, writers := range []int{16, 64} {
		t.Run(fmt.Sprintf("writers_%d", writers), func(t *testing.T) {
			const runFor = 5 * time.Second
			e := testdb.New(t, tg, driver.Config{})
			ctx := testCtx(t, 3*time.Minute)
			stmts := &relayStatements{}
			drvName := "mysql-relay-statements-" + e.Schema
			sql.Register(drvName, relayStatementsDriver{stmts})
			mc, err := mysql.ParseDSN(e.DSN)
			if err != nil {
				t.Fatal(err)
			}
			if mc.Params == nil {
				mc.Params = map[string]string{}
			}
			mc.Params["innodb_lock_wait_timeout"] = "0"
			rdb, err := sql.Open(drvName, mc.FormatDSN())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rdb.Close() })
			rdb.SetMaxOpenConns(2)
			pub := outboxtest.NewPublisher()
			// Leases long enough that no renewal runs during the run: a
			// renewal's lock on a lease row is the relay's own work, and a
			// fenced mark-sent meeting it would count here. (A heartbeat of
			// 30 s was not: beside another test run, at load 44, the 64
			// writers' subtest took 38 s and one UPDATE was refused.)
			startRelayOn(t, e, rdb, relay.Config{Publisher: pub, PollInterval: 100 * time.Millisecond, Logger: quietLogger(),
				LeaseTTL: 20 * time.Minute, LeaseHeartbeat: 10 * time.Minute})
			testdb.Eventually(t, ctx, "the relay owning every partition", func() bool {
				for _, n := range ownersOf(t, e) {
					if n == 32 {
						return true
					}
				}
				return false
			})
			waits0 := globalStatusValue(t, e.RelayDB, "Innodb_row_lock_waits")
			stop := startWriters(t, ctx, e, writers)
			timer := time.NewTimer(runFor)
			<-timer.C
			total := stop()
			if _, err := pub.WaitForCount(ctx, total); err != nil {
				t.Fatal(err)
			}
			testdb.Eventually(t, ctx, "every row marked sent", func() bool { return rowCount(t, e, e.IsSent()) == total })
			waits1 := globalStatusValue(t, e.RelayDB, "Innodb_row_lock_waits")
			t.Logf("%d writers committed %d events in %v; Innodb_row_lock_waits delta %d (server-wide); relay statements refused for a lock wait: %v",
				writers, total, runFor, waits1-waits0, stmts.waits)
			if n := stmts.total.Load(); n > 0 {
				t.Fatalf("%d relay statements would have waited on a row lock: %v", n, stmts.waits)
			}
		})
	}
}
