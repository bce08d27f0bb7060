package relay_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

// TestClaimCostFlatOnPostgres is the regression test for a PostgreSQL
// claim whose cost depended on the table's state: with no planner
// statistics (or statistics taken when few rows were pending) the planner
// read every pending row, sorted them and kept the first BatchSize (226 ms
// per claim with a 20,000-row backlog), and its index walk read the
// entries of every row marked sent since the last VACUUM (1.8-3.4 ms per
// claim at 1,000 events/s; without bound as they pile up; since schema
// version 9 those are the pending set's entries of rows marked sent). Each case
// builds one state on a table of its own with autovacuum disabled for it
// (asserted: never analyzed unless the case says so, n_dead_tup at the
// target), lets a relay prove its scan floor, and counts the buffers the
// relay's claim reads (EXPLAIN (ANALYZE, BUFFERS) of the claim function:
// its Function Scan node counts every page the statements inside read).
// The same claim from floor 0, what the relay did before, is measured
// beside it: where rows were marked sent, it must cost far more, so the
// measurement can tell the two apart.
func TestClaimCostFlatOnPostgres(t *testing.T) {
	t.Parallel()
	const batch = 100
	cases := []struct {
		name          string
		sent, pending int
		stats         string // "", "stale" (ANALYZE when all rows were sent), "backlog" (ANALYZE with the backlog)
		writers       int
	}{
		{name: "fresh_table", pending: 1000},
		{name: "no_stats_large_backlog", pending: 1000000},
		{name: "sent_1m_since_vacuum", sent: 1000000, pending: 1000},
		{name: "stale_stats", sent: 100000, pending: 100000, stats: "stale"},
		{name: "stats_during_backlog", sent: 100000, pending: 100000, stats: "backlog"},
		{name: "writers_64", sent: 100000, pending: 1000, writers: 64},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := testdb.New(t, testdb.All[0], driver.Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			exec, insert := pgRows(t, ctx, e)
			pending := testdb.PendingTable(e.Table)
			exec("ALTER TABLE " + e.Table + " SET (autovacuum_enabled = false, toast.autovacuum_enabled = false)")
			exec("ALTER TABLE " + pending + " SET (autovacuum_enabled = false)")
			if c.sent > 0 {
				insert(1, c.sent)
				exec("DELETE FROM " + pending) // marked sent, as the relay does
			}
			if c.stats == "stale" {
				exec("ANALYZE " + e.Table)
			}
			insert(c.sent+1, c.pending)
			if c.stats == "backlog" {
				exec("ANALYZE " + e.Table)
			}
			// The state, asserted before measuring.
			testdb.Eventually(t, ctx, fmt.Sprintf("n_dead_tup >= %d", c.sent), func() bool {
				var dead int
				var analyzed bool
				if err := e.RelayDB.QueryRowContext(ctx, "SELECT (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $2::regclass), last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL FROM pg_stat_user_tables WHERE relid = $1::regclass", e.Table, pending).Scan(&dead, &analyzed); err != nil {
					t.Fatal(err)
				}
				if analyzed != (c.stats != "") {
					t.Fatalf("table analyzed: %v, want %v", analyzed, c.stats != "")
				}
				return dead >= c.sent
			})
			var firstPending int64
			if err := e.RelayDB.QueryRowContext(ctx, "SELECT MIN(id) FROM "+pending).Scan(&firstPending); err != nil {
				t.Fatal(err)
			}

			var stop atomic.Bool
			var wg sync.WaitGroup
			var written atomic.Int64
			for w := 0; w < c.writers; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					for i := 0; !stop.Load(); i++ {
						err := inTx(ctx, e.DB, func(ctx context.Context) error {
							return outbox.Emit(ctx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("w-%d", w), Type: "created", Payload: []byte(`{}`)})
						})
						if err != nil {
							if !stop.Load() {
								t.Error(err)
							}
							return
						}
						written.Add(1)
					}
				}(w)
			}
			defer func() { stop.Store(true); wg.Wait() }()
			if c.writers > 0 {
				testdb.Eventually(t, ctx, "writers committing", func() bool { return written.Load() >= int64(c.writers) })
			}

			r, err := relay.New(e.Outbox, e.RelayDB, relay.Config{Publisher: outboxtest.NewPublisher(), Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			var floor int64
			testdb.Eventually(t, ctx, "the relay's floor proven up to the first pending row", func() bool {
				msgs, f, err := r.ClaimOnce(ctx, batch, 32)
				if err != nil {
					t.Fatal(err)
				}
				if len(msgs) != batch || msgs[0].ID != firstPending {
					t.Fatalf("claim returned %d rows from id %d, want %d from %d", len(msgs), msgs[0].ID, batch, firstPending)
				}
				floor = f
				return f == firstPending
			})
			d, parts := postgresClaimOf(t, e.Table)
			withFloor := testdb.PostgresClaimBuffers(t, ctx, e.RelayDB, d, floor, batch, parts, nil)
			fromStart := testdb.PostgresClaimBuffers(t, ctx, e.RelayDB, d, 0, batch, parts, nil)
			t.Logf("%s: claim of %d with %d sent since VACUUM, %d pending, %d writers: %d buffers from the floor (%d), %d from the start",
				c.name, batch, c.sent, c.pending, c.writers, withFloor, floor, fromStart)
			// 100 rows: their entries in the pending set's primary key 1-2
			// pages and its heap 1; each row's probe of the outbox
			// table's primary key 3 pages (root, inner, leaf: 300 for
			// 100 rows, hits on the same few pages) and its heap 3-4
			// pages in all; the hold probes 100 more (one page per probe,
			// the hold index being empty); the meta row and the sequence
			// a few. About 410; 500 leaves room, and a walk of 100,000
			// dead index entries reads several hundred more.
			if withFloor > 500 {
				t.Errorf("claim read %d buffers: its cost depends on the table's state", withFloor)
			}
			// 100,000 dead entries of the pending set's primary key fill
			// about 275 leaf pages.
			if c.sent >= 100000 && fromStart < withFloor+c.sent/500 {
				t.Errorf("from the start the claim read %d buffers, from the floor %d: the measurement cannot tell a floor from none", fromStart, withFloor)
			}
		})
	}
}

// inTx runs f in a transaction of db with an outbox scope.
func inTx(ctx context.Context, db *sql.DB, f func(ctx context.Context) error) error {
	ctx = outbox.NewContext(ctx)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f(ctx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// TestClaimPlanMadeOnAnEmptyTable: the claim function's statements are
// planned once per session (a generic plan, kept until an invalidation:
// DDL, ANALYZE, VACUUM), and the relay plans them at its start on the
// connection it keeps for its claims, often on an empty, never analyzed
// table. The claim must then still walk the pending set and probe the
// outbox table, not the other way round: planned on an empty table, the
// join read the outbox table's primary key from the floor and probed the
// pending set for each row, so its cost grew with every row sent since
// (issue 34's latency bench, 1,000 events/s: 4,155 buffers and 3.7 ms
// for 3 rows after 5,215 sent; 1,000 events/s claims took 2.3-3.3 ms
// instead of 0.7-0.8).
func TestClaimPlanMadeOnAnEmptyTable(t *testing.T) {
	t.Parallel()
	const batch, sent = 50, 20000
	e := testdb.New(t, testdb.All[0], driver.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d, parts := postgresClaimOf(t, e.Table)
	conn, err := e.RelayDB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Planned on the empty table, as at a relay's start.
	for i := 0; i < 2; i++ {
		rows, err := conn.QueryContext(ctx, testdb.PostgresClaimSQL(d, 0, batch, parts, nil))
		if err != nil {
			t.Fatal(err)
		}
		rows.Close()
	}
	exec := func(q string) {
		t.Helper()
		if _, err := e.RelayDB.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	insert := func(from, n int) {
		exec(fmt.Sprintf("INSERT INTO %s (message_id, aggregate_type, aggregate_id, event_type, topic, partition_key, content_type, payload, headers) "+
			"SELECT 'm-' || g, 'order', 'agg-' || (g %% 100), 'created', 't', g %% 32, 'application/json', convert_to(repeat('x', 200), 'UTF8'), '' "+
			"FROM generate_series(%d, %d) g", e.Table, from, from+n-1))
	}
	insert(1, sent)
	exec("DELETE FROM " + testdb.PendingTable(e.Table)) // marked sent, as the relay does
	insert(sent+1, batch)
	var first int64
	if err := e.RelayDB.QueryRowContext(ctx, "SELECT MIN(id) FROM "+testdb.PendingTable(e.Table)).Scan(&first); err != nil {
		t.Fatal(err)
	}
	got := testdb.PostgresClaimBuffersOn(t, ctx, conn, d, first, batch, parts, nil)
	t.Logf("claim of %d pending rows behind %d sent ones, planned on the empty table: %d buffers", batch, sent, got)
	// 50 rows: about 4 buffers each (pending entry, outbox key and heap,
	// hold probe) and a few for the meta row: about 200. The outbox key
	// walked from the floor over 20,000 sent rows reads far more.
	if got > 400 {
		t.Errorf("claim read %d buffers for %d rows: its plan walks the sent history", got, batch)
	}
}

// postgresClaimOf returns the PostgreSQL dialect of table and its 32
// relay partitions, for testdb's claim measurements.
func postgresClaimOf(t *testing.T, table string) (*dialect.Dialect, []int) {
	t.Helper()
	d, err := dialect.New(dialect.Postgres, table)
	if err != nil {
		t.Fatal(err)
	}
	parts := make([]int, 32)
	for i := range parts {
		parts[i] = i
	}
	return d, parts
}
