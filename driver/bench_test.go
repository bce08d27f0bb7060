package driver_test

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"
	"modernc.org/sqlite"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/handwritten"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/partition"
)

// benchCommitPayload is every event's body: the small order document
// examples/bench uses (about 90 bytes of JSON).
var benchCommitPayload = []byte(`{"order_id":"o-000000","status":"paid","amount_cents":12345,"currency":"EUR","items":3}`)

// BenchmarkCommit measures one business transaction (BeginTx, one INSERT
// into an orders table, Commit) per op, on one goroutine, per target and
// variant:
//
//   - none: no event, on a pool without the outbox wrapper;
//   - none_wrapped: no event, on the wrapped pool with an emit scope in
//     the context (what the wrapper costs a transaction that emits nothing);
//   - handwritten: the seed's way, one hand-written INSERT into the outbox
//     table (UUIDv7 and partition.Of computed as the driver does), on the
//     unwrapped pool;
//   - handwritten10_prepared: the best hand-written way to write ten
//     events: one ten-row INSERT, prepared once (database/sql's Stmt), on
//     the unwrapped pool. emit10 against it is what the library costs; it
//     against handwritten is what nine more rows cost the database;
//   - emit1, emit10: outbox.Emit of 1 or 10 events through the wrapped
//     driver, written by its commit hook;
//   - emit1_nonotify (PostgreSQL only): emit1 with driver.Config.DisableNotify,
//     on the same table. Since the NOTIFY left the writers' transactions
//     (issue 12) the difference is what signalling the notifier, and its
//     NOTIFY on another connection running beside the next transaction,
//     cost one writer;
//   - emit1_nocache, emit10_nocache (not on pgx, which the statement cache
//     leaves to its own): emit1 and emit10 with
//     driver.Config.DisableStatementCache (the INSERT sent, and on
//     go-sql-driver/mysql prepared and closed, on every commit).
//
// The unwrapped pool uses the same driver as the wrapped one (lib/pq for
// pq, pgx for pgx). Each variant has its own private schema (database,
// SQLite file) with its own orders and outbox tables, and runs every
// transaction on one connection: on SQLite, a connection that begins a
// transaction after another connection wrote to the file reloads its
// page cache (15-40 µs on the 2-core test machine), so interleaving
// variants across the two pools would charge that to whichever variant
// follows a switch. The target ratios are emit1/handwritten and
// emit10/handwritten.
//
// CPU profile samples of the timed goroutine carry the labels target and
// variant, so one -cpuprofile over several variants splits with
// go tool pprof -tagfocus variant=emit1.
//
//	go test -run XXX -bench 'Commit/sqlite' -count 6 ./driver/
func BenchmarkCommit(b *testing.B) {
	for _, tg := range testdb.All {
		b.Run(tg.Name, func(b *testing.B) {
			variants := []string{"none", "none_wrapped", "handwritten", "handwritten10_prepared", "emit1", "emit10"}
			if tg.Name != "pgx" {
				variants = append(variants, "emit1_nocache", "emit10_nocache")
			}
			if tg.Dialect == driver.Postgres {
				variants = append(variants, "emit1_nonotify", "emit1_logonly", "emit10_logonly")
			}
			for _, v := range variants {
				b.Run(v, func(b *testing.B) { benchCommit(b, tg, v) })
			}
		})
	}
}

func benchCommit(b *testing.B, tg testdb.Target, variant string) {
	e := testdb.New(b, tg, driver.Config{})
	ctx := context.Background()
	plain := benchPlainDB(b, e)

	orders := e.Q("bench_orders")
	if _, err := plain.ExecContext(ctx, "CREATE TABLE "+orders+
		" (id VARCHAR(64) PRIMARY KEY, status VARCHAR(16) NOT NULL, amount_cents BIGINT NOT NULL)"); err != nil {
		b.Fatalf("creating %s: %v", orders, err)
	}
	insOrder := "INSERT INTO " + orders + " (id, status, amount_cents) VALUES (" + e.Placeholder(1) + ", 'paid', " + e.Placeholder(2) + ")"
	insOutbox := handwritten.Insert(tg.Dialect, e.Table, 1)
	var insMulti *sql.Stmt

	// One connection per pool, like the unwrapped one: database/sql takes
	// the oldest idle connection, so a pool left with two (the migration
	// may open more) would alternate between them.
	e.DB.SetMaxOpenConns(1)
	db := e.DB
	events := 0
	switch variant {
	case "none", "handwritten":
		db = plain
	case "handwritten10_prepared":
		db = plain
		var err error
		if insMulti, err = plain.PrepareContext(ctx, handwritten.Insert(tg.Dialect, e.Table, 10)); err != nil {
			b.Fatalf("preparing the ten-row INSERT: %v", err)
		}
		defer insMulti.Close()
	case "emit1":
		events = 1
	case "emit10":
		events = 10
	case "emit1_logonly", "emit10_logonly":
		// driver.Config.LogOnly: one logical decoding message per
		// transaction. Its writers need a pgoutput slot of the database;
		// one nobody reads is made for the benchmark (dropped after it).
		events = 1
		if variant == "emit10_logonly" {
			events = 10
		}
		var walLevel string
		if err := plain.QueryRowContext(ctx, "SHOW wal_level").Scan(&walLevel); err != nil || walLevel != "logical" {
			b.Skipf("wal_level is %q, not logical (.ci/run sets it)", walLevel)
		}
		slot := strings.ToLower(testdb.RandomName("outbox_bench_"))
		if _, err := plain.ExecContext(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
			b.Fatalf("creating slot %s: %v", slot, err)
		}
		b.Cleanup(func() { _, _ = plain.ExecContext(context.Background(), "SELECT pg_drop_replication_slot($1)", slot) })
		db = benchWrappedDB(b, e, driver.Config{Dialect: tg.Dialect, Table: e.Table, LogOnly: true})
	case "emit1_nonotify", "emit1_nocache", "emit10_nocache":
		events = 1
		if variant == "emit10_nocache" {
			events = 10
		}
		cfg := driver.Config{Dialect: tg.Dialect, Table: e.Table,
			DisableNotify:         variant == "emit1_nonotify",
			DisableStatementCache: strings.HasSuffix(variant, "_nocache")}
		db = benchWrappedDB(b, e, cfg)
	}

	pprof.SetGoroutineLabels(pprof.WithLabels(ctx, pprof.Labels("target", tg.Name, "variant", variant)))
	defer pprof.SetGoroutineLabels(ctx)
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		i++
		id := "o-" + strconv.Itoa(i)
		tctx := outbox.NewContext(ctx) // one unit of work per transaction
		tx, err := db.BeginTx(tctx, nil)
		if err != nil {
			b.Fatalf("begin: %v", err)
		}
		if _, err := tx.ExecContext(tctx, insOrder, id, int64(i)); err != nil {
			b.Fatalf("insert order: %v", err)
		}
		if variant == "handwritten" {
			mid, err := outbox.NewMessageID()
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tx.ExecContext(tctx, insOutbox, mid, "order", id, "order.paid",
				int64(partition.Of("order", id, partition.DefaultCount)), "application/json", benchCommitPayload); err != nil {
				b.Fatalf("hand-written outbox insert: %v", err)
			}
		}
		if insMulti != nil {
			args := make([]any, 0, 70)
			for k := range 10 {
				mid, err := outbox.NewMessageID()
				if err != nil {
					b.Fatal(err)
				}
				aid := id + "-" + strconv.Itoa(k)
				args = append(args, mid, "order", aid, "order.paid",
					int64(partition.Of("order", aid, partition.DefaultCount)), "application/json", benchCommitPayload)
			}
			if _, err := tx.StmtContext(tctx, insMulti).ExecContext(tctx, args...); err != nil {
				b.Fatalf("hand-written ten-row insert: %v", err)
			}
		}
		for range events {
			if err := outbox.Emit(tctx, outbox.Event{AggregateType: "order", AggregateID: id, Type: "order.paid", Payload: benchCommitPayload}); err != nil {
				b.Fatalf("emit: %v", err)
			}
		}
		if err := tx.Commit(); err != nil {
			b.Fatalf("commit: %v", err)
		}
	}
	b.StopTimer()
	// Every variant wrote the outbox rows it should have: i*events
	// (handwritten: i; log-only: none).
	want := i * events
	switch variant {
	case "handwritten":
		want = i
	case "handwritten10_prepared":
		want = i * 10
	case "emit1_logonly", "emit10_logonly":
		want = 0 // the events are in the WAL (the slot), not in the table
	}
	var n int
	if err := plain.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+e.Table).Scan(&n); err != nil {
		b.Fatal(err)
	}
	if n != want {
		b.Fatalf("%s: %d outbox rows after %d transactions, want %d", variant, n, i, want)
	}
}

// benchConnector returns a connector of the target's real driver for e's
// private database, built as testdb builds the one it wraps (nil on SQLite,
// whose driver has no connector: use sql.Open).
func benchConnector(b *testing.B, e *testdb.Env) sqldriver.Connector {
	b.Helper()
	switch e.Target.Name {
	case "pq":
		c, err := pq.NewConnector(e.DSN)
		if err != nil {
			b.Fatal(err)
		}
		return c
	case "pgx":
		pc, err := pgx.ParseConfig(e.DSN)
		if err != nil {
			b.Fatal(err)
		}
		return stdlib.GetConnector(*pc)
	case "mysql":
		mc, err := mysql.ParseDSN(e.DSN)
		if err != nil {
			b.Fatal(err)
		}
		c, err := mysql.NewConnector(mc)
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	return nil
}

// benchWrappedDB opens a second wrapped pool, configured by cfg, on e's
// private database (one connection).
func benchWrappedDB(b *testing.B, e *testdb.Env, cfg driver.Config) *sql.DB {
	b.Helper()
	ob, err := driver.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	var db *sql.DB
	if c := benchConnector(b, e); c != nil {
		db = sql.OpenDB(ob.WrapConnector(c))
	} else {
		c, err := ob.Wrap(&sqlite.Driver{}).(sqldriver.DriverContext).OpenConnector(e.DSN)
		if err != nil {
			b.Fatal(err)
		}
		db = sql.OpenDB(c)
	}
	b.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(1)
	return db
}

// benchPlainDB opens a pool without the outbox wrapper on e's private
// database, through the same driver as e.DB (e.RelayDB is pgx even for the
// pq target, and on SQLite it is e.DB itself).
func benchPlainDB(b *testing.B, e *testdb.Env) *sql.DB {
	b.Helper()
	var db *sql.DB
	if c := benchConnector(b, e); c != nil {
		db = sql.OpenDB(c)
	} else {
		var err error
		if db, err = sql.Open("sqlite", e.DSN); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(1)
	return db
}

// BenchmarkTxPath measures what the wrapper adds to a transaction that
// emits nothing: BeginTx, one INSERT into a table of its own, Commit, per
// op, on one connection, per target and variant:
//
//   - raw: the target's driver, without the wrapper;
//   - wrapped: through the wrapper, with an emit scope in the context, so
//     the transaction is bound (its INSERT is classified, its Commit finds
//     no events);
//   - wrapped_unbound: through the wrapper, without a scope (nothing is
//     bound: BeginTx, ExecContext and Commit are the driver's own).
//
// The context is made once, before the loop, so that only the driver's
// path is measured (BenchmarkCommit's none_wrapped makes a scope per
// transaction, as an application does). The goal (issue 34) is wrapped at
// most github.com/ngrok/sqlmw's cost above raw, in instructions per
// transaction; allocs/op here and the callgrind count carry it. The loop
// runs between calls of txPathStart and txPathEnd, so that callgrind can
// count it alone (BENCHMARKS.md, "Issue 34"):
//
//	go test -c -o /tmp/driver.test ./driver/
//	GOMAXPROCS=1 GOGC=off GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off \
//	  valgrind --tool=callgrind --dump-before='*txPathStart' --dump-before='*txPathEnd' \
//	  --callgrind-out-file=/tmp/cg.out /tmp/driver.test -test.run XXX \
//	  -test.bench 'TxPath/pq/wrapped$' -test.benchtime 2000x
//	grep summary: /tmp/cg.out.2   # instructions of the 2,000 transactions
func BenchmarkTxPath(b *testing.B) {
	for _, tg := range testdb.All {
		b.Run(tg.Name, func(b *testing.B) {
			for _, v := range []string{"raw", "wrapped", "wrapped_unbound"} {
				b.Run(v, func(b *testing.B) { benchTxPath(b, tg, v) })
			}
		})
	}
}

func benchTxPath(b *testing.B, tg testdb.Target, variant string) {
	e := testdb.New(b, tg, driver.Config{})
	ctx := context.Background()
	db := benchPlainDB(b, e)
	orders := e.Q("txpath_orders")
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+orders+
		" (id VARCHAR(64) PRIMARY KEY, status VARCHAR(16) NOT NULL, amount_cents BIGINT NOT NULL)"); err != nil {
		b.Fatalf("creating %s: %v", orders, err)
	}
	ins := "INSERT INTO " + orders + " (id, status, amount_cents) VALUES (" + e.Placeholder(1) + ", 'paid', " + e.Placeholder(2) + ")"
	switch variant {
	case "wrapped":
		db = benchWrappedDB(b, e, driver.Config{Dialect: tg.Dialect, Table: e.Table})
		ctx = outbox.NewContext(ctx)
	case "wrapped_unbound":
		db = benchWrappedDB(b, e, driver.Config{Dialect: tg.Dialect, Table: e.Table})
	}
	i := 0
	tx := func() {
		i++
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			b.Fatalf("begin: %v", err)
		}
		if _, err := tx.ExecContext(ctx, ins, "o-"+strconv.Itoa(i), int64(i)); err != nil {
			b.Fatalf("insert: %v", err)
		}
		if err := tx.Commit(); err != nil {
			b.Fatalf("commit: %v", err)
		}
	}
	for range 100 { // connect, and warm the pool and the driver's caches
		tx()
	}
	b.ReportAllocs()
	txPathStart()
	for b.Loop() {
		tx()
	}
	txPathEnd()
	var n int
	if err := db.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM "+orders).Scan(&n); err != nil {
		b.Fatal(err)
	}
	if n != i {
		b.Fatalf("%d rows after %d transactions", n, i)
	}
}

// txPathStart and txPathEnd mark BenchmarkTxPath's loop for callgrind's
// --dump-before; they do nothing.
//
//go:noinline
func txPathStart() {}

//go:noinline
func txPathEnd() {}
