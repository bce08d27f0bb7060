package relay_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/relay"
)

// TestListAllPendingCostFlat: listing every pending event (ListPending
// with Selector.All, `outbox pending list` with no selector) on PostgreSQL
// reads the pending set, not the sent history before it: 3 pending rows
// behind 20,000 sent ones, on a table never analyzed and after ANALYZE,
// read at most the pending set's own pages (169 here, against 834 of the
// outbox table): until VACUUM removes them, its index holds the entries
// of the 20,000 rows marked sent, and its heap their dead versions, which
// the walk passes over (VACUUM is not measured: on a shared server
// another session's snapshot can keep it from removing anything).
// The generic listing's statement with a condition that is always true,
// what an All selector would otherwise run, is measured beside it:
// without statistics it walks the whole history (40,846 buffers here
// against 174), so the measurement tells the plans apart.
func TestListAllPendingCostFlat(t *testing.T) {
	t.Parallel()
	e := testdb.New(t, testdb.All[0], driver.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exec, insert := pgRows(t, ctx, e)
	pending := testdb.PendingTable(e.Table)
	exec("ALTER TABLE " + e.Table + " SET (autovacuum_enabled = false, toast.autovacuum_enabled = false)")
	exec("ALTER TABLE " + pending + " SET (autovacuum_enabled = false)")
	insert(1, 20000)
	exec("DELETE FROM " + pending) // marked sent, as the relay does
	insert(20001, 3)
	d, err := dialect.New(dialect.Postgres, e.Table)
	if err != nil {
		t.Fatal(err)
	}
	buffers := func(q string) int {
		t.Helper()
		var plan string
		if err := e.RelayDB.QueryRowContext(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+q).Scan(&plan); err != nil {
			t.Fatalf("EXPLAIN %s: %v", q, err)
		}
		var p []struct {
			Plan struct {
				Rows int `json:"Actual Rows"`
				Hit  int `json:"Shared Hit Blocks"`
				Read int `json:"Shared Read Blocks"`
			}
		}
		if err := json.Unmarshal([]byte(plan), &p); err != nil || len(p) != 1 {
			t.Fatalf("plan %s: %v", plan, err)
		}
		if p[0].Plan.Rows != 3 {
			t.Fatalf("%d rows listed, want the 3 pending", p[0].Plan.Rows)
		}
		return p[0].Plan.Hit + p[0].Plan.Read
	}
	dl, err := relay.NewDeadLetters(e.Outbox, e.RelayDB)
	if err != nil {
		t.Fatal(err)
	}
	var pages, pendingPages int
	if err := e.RelayDB.QueryRowContext(ctx, "SELECT pg_relation_size($1::regclass) / 8192, pg_total_relation_size($2::regclass) / 8192",
		e.Table, pending).Scan(&pages, &pendingPages); err != nil {
		t.Fatal(err)
	}
	for _, state := range []string{"never_analyzed", "analyzed"} {
		want := pendingPages + 40 // and the listed rows' probes of the outbox table
		if state == "analyzed" {
			exec("ANALYZE " + e.Table)
			exec("ANALYZE " + pending)
		}
		all := buffers(d.WithSelector("pending_list_all", "", 100))
		generic := buffers(d.WithSelector("pending_list", "1 = 1", 100))
		t.Logf("%s: pending_list_all %d buffers (at most %d), the generic listing %d; the table %d pages, the pending set %d", state, all, want, generic, pages, pendingPages)
		if all > want {
			t.Errorf("%s: listing 3 pending rows behind 20,000 sent read %d buffers, want at most %d", state, all, want)
		}
		if state == "never_analyzed" && generic < 5*all {
			t.Errorf("%s: the generic listing read %d buffers against %d: the measurement cannot tell the plans apart", state, generic, all)
		}
		l, err := dl.ListPending(ctx, relay.Selector{All: true}, 100)
		if err != nil || len(l) != 3 || l[0].MessageID != "m-20001" || l[2].MessageID != "m-20003" {
			t.Errorf("%s: ListPending(All) = %+v, %v; want m-20001..m-20003", state, l, err)
		}
	}
}
