package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/internal/testdb"
)

// BenchmarkHandleOverhead measures one consumer's handler transaction
// (one INSERT into a business table) through Handle against the same
// handler in a plain transaction without the inbox, one message at a time
// on one connection (the per-partition path of a consumer), on PostgreSQL
// through pgx (BENCH_TARGET=mysql, mysql-interpolate or sqlite for the
// others; mysql-interpolate: go-sql-driver with interpolateParams=true). The
// difference is the inbox's cost: the hold probe and the inbox INSERT
// (with its unique and retention index entries) in the same round trips
// budget.
//
//	go test -run '^$' -bench HandleOverhead -count 5 ./inbox/
func BenchmarkHandleOverhead(b *testing.B) {
	tg := testdb.Target{Name: "pgx", Dialect: driver.Postgres}
	switch benchTarget() {
	case "mysql", "mysql-interpolate":
		tg = testdb.Target{Name: "mysql", Dialect: driver.MySQL}
	case "sqlite":
		tg = testdb.Target{Name: "sqlite", Dialect: driver.SQLite}
	}
	e := testdb.New(b, tg, driver.Config{})
	ctx := context.Background()
	db := e.RelayDB // the target's own driver, not the outbox wrapper
	if benchTarget() == "mysql-interpolate" {
		// go-sql-driver/mysql writing the arguments into the statement
		// text: one round trip per statement instead of prepare+execute.
		sep := "?"
		if strings.Contains(e.DSN, "?") {
			sep = "&"
		}
		var err error
		if db, err = sql.Open("mysql", e.DSN+sep+"interpolateParams=true"); err != nil {
			b.Fatal(err)
		}
		defer db.Close()
	}
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
	b.Run("inbox", func(b *testing.B) { benchHandle(b, ctx, db, in, insert, &seq, true) })
	// Without an aggregate there is no hold probe: the inbox INSERT alone.
	b.Run("inbox-no-aggregate", func(b *testing.B) { benchHandle(b, ctx, db, in, insert, &seq, false) })
}

func benchHandle(b *testing.B, ctx context.Context, db *sql.DB, in *inbox.Inbox, insert string, seq *int, aggregate bool) {
	{
		for b.Loop() {
			*seq++
			id := fmt.Sprintf("i-%d", *seq)
			m := inbox.Message{ID: id, Topic: "outbox.event.order", Offset: int64(*seq)}
			if aggregate {
				m.AggregateType, m.AggregateID = "order", id
			}
			out, err := in.Handle(ctx, db, m, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, insert, id)
				return err
			})
			if err != nil || out != inbox.Applied {
				b.Fatal(out, err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	}
}

// BenchmarkHandleBatch measures HandleBatch against the same handler
// statements in one plain transaction per batch, batches of 64 messages
// (inbox.MaxBatch) on one connection, as BenchmarkHandleOverhead does for
// Handle (BENCH_TARGET as there). Reported per message.
//
//	go test -run '^$' -bench HandleBatch -count 3 ./inbox/
func BenchmarkHandleBatch(b *testing.B) {
	tg := testdb.Target{Name: "pgx", Dialect: driver.Postgres}
	switch benchTarget() {
	case "mysql", "mysql-interpolate":
		tg = testdb.Target{Name: "mysql", Dialect: driver.MySQL}
	case "sqlite":
		tg = testdb.Target{Name: "sqlite", Dialect: driver.SQLite}
	}
	e := testdb.New(b, tg, driver.Config{})
	ctx := context.Background()
	db := e.RelayDB
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
	const size = inbox.MaxBatch
	seq := 0
	b.Run("plain-tx", func(b *testing.B) {
		for b.Loop() {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			for range size {
				seq++
				if _, err := tx.ExecContext(ctx, insert, fmt.Sprintf("p-%d", seq)); err != nil {
					b.Fatal(err)
				}
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "msgs/s")
	})
	run := func(aggregates bool) func(b *testing.B) {
		return func(b *testing.B) {
			msgs := make([]inbox.Message, size)
			fn := func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
				_, err := tx.ExecContext(ctx, insert, m.ID)
				return err
			}
			for b.Loop() {
				for i := range msgs {
					seq++
					id := fmt.Sprintf("i-%d", seq)
					msgs[i] = inbox.Message{ID: id, Topic: "outbox.event.order", Offset: int64(seq)}
					if aggregates {
						msgs[i].AggregateType, msgs[i].AggregateID = "order", fmt.Sprintf("o-%d", seq%40)
					}
				}
				res, err := in.HandleBatch(ctx, db, msgs, fn)
				if err != nil {
					b.Fatal(err)
				}
				for _, r := range res {
					if r.Outcome != inbox.Applied {
						b.Fatal(r)
					}
				}
			}
			b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "msgs/s")
		}
	}
	// 40 aggregates in a batch of 64: the hold probe asks about 40.
	b.Run("inbox", run(true))
	// Without aggregates there is no hold probe.
	b.Run("inbox-no-aggregate", run(false))
}
