package inbox

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// TestBatchLookupPlans: HandleBatch's per-message lookups (the recorded
// status, the hold probe) each read one key, on a table without statistics
// (fresh, never analyzed: autovacuum is off on the test server) holding
// 3,000 rows of the consumer. Checked with EXPLAIN: PostgreSQL must
// filter no row out (an IN list here scanned all 3,000 and filtered them,
// 15.7 ms against 2.2 ms per replayed batch of 64), MySQL/MariaDB must not
// scan a table or a whole index, SQLite must search, not scan.
func TestBatchLookupPlans(t *testing.T) {
	t.Parallel()
	for _, tg := range []testdb.Target{{Name: "pgx", Dialect: driver.Postgres}, {Name: "mysql", Dialect: driver.MySQL}, {Name: "sqlite", Dialect: driver.SQLite}} {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			e := testdb.New(t, tg, driver.Config{})
			ctx := context.Background()
			in, err := New(Config{Dialect: tg.Dialect, Table: e.Q("inbox_message"), Consumer: "c"})
			if err != nil {
				t.Fatal(err)
			}
			if err := in.Migrate(ctx, e.RelayDB); err != nil {
				t.Fatal(err)
			}
			nop := func(context.Context, *sql.Tx, Message) error { return nil }
			msgs := make([]Message, MaxBatch)
			for k := 0; k < 3000/MaxBatch+1; k++ {
				for i := range msgs {
					msgs[i] = Message{ID: fmt.Sprintf("m-%d-%d", k, i), AggregateType: "order", AggregateID: fmt.Sprint(i % 40)}
				}
				if _, err := in.HandleBatch(ctx, e.RelayDB, msgs, nop); err != nil {
					t.Fatal(err)
				}
			}
			idx := []int{0, 1, 2, 3, 4, 5, 6, 7}
			var status, held []string
			var sargs, hargs []any
			for _, i := range idx {
				status = append(status, in.s.queries["batch_status"])
				sargs = append(sargs, "c", msgs[i].ID)
				held = append(held, strings.Replace(in.s.queries["batch_held_probe"], "#", fmt.Sprint(i), 1))
				hargs = append(hargs, "c", "order", msgs[i].AggregateID)
			}
			lookups := map[string]struct {
				text string
				args []any
			}{
				"status": {strings.Join(status, " UNION ALL "), sargs},
				"held":   {strings.Join(held, " UNION ALL "), hargs},
			}
			if tg.Dialect != driver.MySQL {
				lookups["any held"] = struct {
					text string
					args []any
				}{in.s.queries["batch_any_held"], []any{"c"}}
			}
			for name, q := range lookups {
				plan := explain(t, e.RelayDB, tg.Dialect, in.s.placeholders(q.text), q.args)
				switch tg.Dialect {
				case driver.Postgres:
					if strings.Contains(plan, "Rows Removed by Filter") || strings.Contains(plan, "Seq Scan") ||
						name != "status" && !strings.Contains(plan, "hold_idx") {
						t.Errorf("%s lookup reads more than its keys:\n%s", name, plan)
					}
				case driver.MySQL:
					if strings.Contains(plan, "type=ALL") || strings.Contains(plan, "type=index ") {
						t.Errorf("%s lookup scans:\n%s", name, plan)
					}
				case driver.SQLite:
					if strings.Contains(plan, "SCAN") || name != "status" && !strings.Contains(plan, "hold_idx") {
						t.Errorf("%s lookup scans:\n%s", name, plan)
					}
				}
			}
		})
	}
}

// explain returns the plan of q: EXPLAIN ANALYZE's text on PostgreSQL;
// on MySQL one line per table access, "type key rows" (type ALL or index:
// a scan); on SQLite EXPLAIN QUERY PLAN's details (SCAN: a scan, SEARCH:
// an index lookup).
func explain(t *testing.T, db *sql.DB, d driver.Dialect, q string, args []any) string {
	t.Helper()
	var b strings.Builder
	for _, row := range testdb.Explain(t, context.Background(), db, d, true, q, args...) {
		switch d {
		case driver.SQLite:
			b.WriteString(row["detail"] + "\n")
		case driver.Postgres:
			b.WriteString(row["QUERY PLAN"] + "\n")
		default:
			b.WriteString("table=" + row["table"] + " type=" + row["type"] + " key=" + row["key"] + " rows=" + row["rows"] + "\n")
		}
	}
	return b.String()
}

// TestParkedListingCostFlatOnMySQL counts the rows MariaDB reads
// (Handler_read_*) to list a consumer's parked messages and the consumers
// with parked messages: with 20,000 processed rows more in the table it
// stays what it was with none. MySQL has no partial index; hold_idx starts
// with the aggregate and holds the processed history, so both listings
// read every row before they went through retention_idx.
func TestParkedListingCostFlatOnMySQL(t *testing.T) {
	t.Parallel()
	e := testdb.New(t, testdb.Target{Name: "mysql", Dialect: driver.MySQL}, driver.Config{})
	ctx := context.Background()
	db := e.RelayDB
	db.SetMaxOpenConns(1) // SHOW SESSION STATUS reads the session that ran the statement
	in, err := New(Config{Dialect: driver.MySQL, Table: e.Q("inbox_message"), Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := in.Park(ctx, db, Message{ID: "p-1", AggregateType: "order", AggregateID: "7"}, fmt.Errorf("poison")); err != nil {
		t.Fatal(err)
	}
	reads := func(fn func()) int {
		t.Helper()
		if _, err := db.ExecContext(ctx, "FLUSH STATUS"); err != nil {
			t.Fatal(err)
		}
		fn()
		var n int
		if err := db.QueryRowContext(ctx, "SELECT SUM(VARIABLE_VALUE) FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME LIKE 'HANDLER_READ%'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	measure := func() (list, consumers int) {
		list = reads(func() {
			if ps, err := in.ListParked(ctx, db, ParkedFilter{Limit: 51}); err != nil || len(ps) != 1 {
				t.Fatalf("ListParked = %v, %v", ps, err)
			}
		})
		consumers = reads(func() {
			if cs, err := Consumers(ctx, db, Config{Dialect: driver.MySQL, Table: e.Q("inbox_message")}); err != nil || len(cs) != 1 || cs[0].Parked != 1 {
				t.Fatalf("Consumers = %v, %v", cs, err)
			}
		})
		return list, consumers
	}
	list0, cons0 := measure()
	for _, consumer := range []string{"billing", "shipping"} {
		q := "INSERT INTO " + e.Q("inbox_message") + " (consumer, message_id, status, created_at, updated_at, processed_at) " +
			"SELECT ?, CONCAT('done-', seq), 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) FROM seq_1_to_10000"
		if _, err := db.ExecContext(ctx, q, consumer); err != nil {
			t.Fatal(err)
		}
	}
	list1, cons1 := measure()
	t.Logf("rows read: ListParked %d then %d, Consumers %d then %d (20,000 processed rows added)", list0, list1, cons0, cons1)
	if list1 > list0+5 || cons1 > cons0+5 {
		t.Errorf("rows read grow with the processed history: ListParked %d → %d, Consumers %d → %d", list0, list1, cons0, cons1)
	}
}
