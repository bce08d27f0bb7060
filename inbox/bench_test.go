package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
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
// (inbox.MaxBatch), on one connection and on 8 at once (conns=8: eight
// partitions' workers, the runner's shape), as BenchmarkHandleOverhead does
// for Handle (BENCH_TARGET as there). Reported per message. The plain
// variant is the ceiling of any consumer whose handler runs one statement
// per message: the inbox cannot be faster than its handler.
//
//	go test -run '^$' -bench HandleBatch -benchtime 300x -count 3 ./inbox/
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
	if benchTarget() == "mysql-interpolate" {
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
	var seq atomic.Int64
	plain := func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // no-op after Commit
		for range size {
			if _, err := tx.ExecContext(ctx, insert, fmt.Sprintf("p-%d", seq.Add(1))); err != nil {
				return err
			}
		}
		return tx.Commit()
	}
	fn := func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
		_, err := tx.ExecContext(ctx, insert, m.ID)
		return err
	}
	batch := func(aggregates bool) func() error {
		return func() error {
			msgs := make([]inbox.Message, size)
			for i := range msgs {
				n := seq.Add(1)
				msgs[i] = inbox.Message{ID: fmt.Sprintf("i-%d", n), Topic: "outbox.event.order", Offset: n}
				if aggregates {
					msgs[i].AggregateType, msgs[i].AggregateID = "order", fmt.Sprintf("o-%d", n%40)
				}
			}
			res, err := in.HandleBatch(ctx, db, msgs, fn)
			if err != nil {
				return err
			}
			for _, r := range res {
				if r.Outcome != inbox.Applied {
					return fmt.Errorf("result %+v", r)
				}
			}
			return nil
		}
	}
	for _, conns := range []int{1, 8} {
		if conns > 1 && tg.Dialect == driver.SQLite {
			continue
		}
		for _, v := range []struct {
			name string
			one  func() error
		}{
			{"plain-tx", plain},
			// 40 aggregates in a batch of 64: the hold probe asks about 40.
			{"inbox", batch(true)},
			// Without aggregates there is no hold probe.
			{"inbox-no-aggregate", batch(false)},
		} {
			b.Run(fmt.Sprintf("conns=%d/%s", conns, v.name), func(b *testing.B) {
				db.SetMaxOpenConns(conns)
				var next atomic.Int64
				var wg sync.WaitGroup
				errs := make(chan error, conns)
				b.ResetTimer()
				for range conns {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for next.Add(1) <= int64(b.N) {
							if err := v.one(); err != nil {
								errs <- err
								return
							}
						}
					}()
				}
				wg.Wait()
				close(errs)
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "msgs/s")
			})
		}
	}
}
