package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/internal/testdb"
)

// BenchmarkHandleOverhead measures one consumer's handler transaction
// (one INSERT into a business table) through Handle against the same
// handler in a plain transaction without the inbox, one message at a time
// on one connection (the per-partition path of a consumer), on PostgreSQL
// through pgx (BENCH_TARGET=mysql or sqlite for the others). The
// difference is the inbox's cost: the hold probe and the inbox INSERT
// (with its unique and retention index entries) in the same round trips
// budget.
//
//	go test -run '^$' -bench HandleOverhead -count 5 ./inbox/
func BenchmarkHandleOverhead(b *testing.B) {
	tg := testdb.Target{Name: "pgx", Dialect: driver.Postgres}
	switch benchTarget() {
	case "mysql":
		tg = testdb.Target{Name: "mysql", Dialect: driver.MySQL}
	case "sqlite":
		tg = testdb.Target{Name: "sqlite", Dialect: driver.SQLite}
	}
	e := testdb.New(b, tg, driver.Config{})
	ctx := context.Background()
	db := e.RelayDB // the target's own driver, not the outbox wrapper
	db.SetMaxOpenConns(1)
	effects := e.Q("bench_effects")
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+effects+" (id VARCHAR(100) PRIMARY KEY, n INTEGER NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	in, err := inbox.New(inbox.Config{Dialect: tg.Dialect, Table: e.Q("inbox_message"), Consumer: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	if err := in.Migrate(ctx, db); err != nil {
		b.Fatal(err)
	}
	insert := fmt.Sprintf("INSERT INTO %s (id, n) VALUES (%s, 1)", effects, e.Placeholder(1))
	var seq int
	b.Run("plain-tx", func(b *testing.B) {
		for b.Loop() {
			seq++
			id := fmt.Sprintf("p-%d", seq)
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tx.ExecContext(ctx, insert, id); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
	b.Run("inbox", func(b *testing.B) {
		for b.Loop() {
			seq++
			id := fmt.Sprintf("i-%d", seq)
			m := inbox.Message{ID: id, AggregateType: "order", AggregateID: id, Topic: "outbox.event.order", Offset: int64(seq)}
			out, err := in.Handle(ctx, db, m, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, insert, id)
				return err
			})
			if err != nil || out != inbox.Applied {
				b.Fatal(out, err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
}
