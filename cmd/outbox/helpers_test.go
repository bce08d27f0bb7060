package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	sqldriver "database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"modernc.org/sqlite"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/driver/dsn"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

// result is one in-process invocation of the command.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout:\n%s--- stderr:\n%s", r.code, r.stdout, r.stderr)
}

// cli runs the command line args in-process.
func cli(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errb testdb.SyncBuffer
	code := run(ctx, args, &out, &errb)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// expect fails t unless r exited with code.
func expect(t *testing.T, r result, code int) result {
	t.Helper()
	if r.code != code {
		t.Fatalf("want exit %d, got %v", code, r)
	}
	return r
}

// dbTarget is one database the command runs against.
type dbTarget struct {
	name    string
	dialect driver.Dialect
	dsn     string // as given to --dsn
	path    string // SQLite file
}

func randomTable() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return "t_" + hex.EncodeToString(b)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func sqliteTarget(t *testing.T) dbTarget {
	path := filepath.Join(t.TempDir(), "outbox.db")
	return dbTarget{name: "sqlite", dialect: driver.SQLite, dsn: "sqlite:" + path, path: path}
}

// serverTarget returns the PostgreSQL or MySQL target, skipping t (or
// failing it under OUTBOX_TEST_REQUIRE) when the server is unreachable.
func serverTarget(t *testing.T, d driver.Dialect) dbTarget {
	t.Helper()
	var tg dbTarget
	switch d {
	case driver.Postgres:
		tg = dbTarget{name: "postgres", dialect: d, dsn: envOr("OUTBOX_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")}
	default:
		tg = dbTarget{name: "mysql", dialect: d, dsn: envOr("OUTBOX_TEST_MYSQL", "root@tcp(127.0.0.1:3306)/test")}
	}
	db := tg.plainDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		if os.Getenv("OUTBOX_TEST_REQUIRE") != "" {
			t.Fatalf("%s required (OUTBOX_TEST_REQUIRE is set) but unreachable: %v", tg.name, err)
		}
		t.Skipf("SKIP: no %s server at %s (%v); set OUTBOX_TEST_%s", tg.name, redactDSN(tg.dsn), err, strings.ToUpper(tg.name))
	}
	return tg
}

// forEachTarget runs fn against SQLite, PostgreSQL and MySQL/MariaDB.
func forEachTarget(t *testing.T, fn func(t *testing.T, tg dbTarget)) {
	t.Run("sqlite", func(t *testing.T) { t.Parallel(); fn(t, sqliteTarget(t)) })
	t.Run("postgres", func(t *testing.T) { t.Parallel(); fn(t, serverTarget(t, driver.Postgres)) })
	t.Run("mysql", func(t *testing.T) { t.Parallel(); fn(t, serverTarget(t, driver.MySQL)) })
}

// plainDB opens the target without the outbox wrapper.
func (tg dbTarget) plainDB(t *testing.T) *sql.DB {
	t.Helper()
	var db *sql.DB
	var err error
	switch tg.dialect {
	case driver.Postgres:
		db, err = sql.Open("pgx", tg.dsn)
	case driver.MySQL:
		db, err = sql.Open("mysql", tg.dsn)
	default:
		db, err = sql.Open("sqlite", dsn.SQLite(tg.path, nil))
		if err == nil {
			db.SetMaxOpenConns(1)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// migrate applies the schema of a fresh table with the command and drops
// it when t ends.
func (tg dbTarget) migrate(t *testing.T, table string) {
	t.Helper()
	expect(t, cli(t, "--dsn", tg.dsn, "--table", table, "migrate", "apply"), 0)
	tg.dropAfter(t, table)
}

// dropAfter drops table's objects when t ends (server databases).
func (tg dbTarget) dropAfter(t *testing.T, table string) {
	if tg.dialect == driver.SQLite {
		return
	}
	t.Cleanup(func() {
		db, err := sql.Open(map[driver.Dialect]string{driver.Postgres: "pgx", driver.MySQL: "mysql"}[tg.dialect], tg.dsn)
		if err != nil {
			t.Error(err)
			return
		}
		defer db.Close()
		for _, suffix := range []string{"_archive", "_relay", "_lease", "_meta", "_migrations", ""} {
			if _, err := db.Exec("DROP TABLE IF EXISTS " + table + suffix); err != nil {
				t.Errorf("dropping %s%s: %v", table, suffix, err)
			}
		}
	})
}

// wrappedDB opens the target through the outbox driver bound to table.
func (tg dbTarget) wrappedDB(t *testing.T, table string) (*sql.DB, *driver.Outbox) {
	t.Helper()
	ob, err := driver.New(driver.Config{Dialect: tg.dialect, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	var c sqldriver.Connector
	switch tg.dialect {
	case driver.Postgres:
		pc, err := pgx.ParseConfig(tg.dsn)
		if err != nil {
			t.Fatal(err)
		}
		c = stdlib.GetConnector(*pc)
	case driver.MySQL:
		mc, err := mysql.ParseDSN(tg.dsn)
		if err != nil {
			t.Fatal(err)
		}
		if c, err = mysql.NewConnector(mc); err != nil {
			t.Fatal(err)
		}
	default:
		sc, err := ob.Wrap(&sqlite.Driver{}).(sqldriver.DriverContext).OpenConnector(dsn.SQLite(tg.path, nil))
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(sc)
		db.SetMaxOpenConns(1)
		t.Cleanup(func() { db.Close() })
		return db, ob
	}
	db := sql.OpenDB(ob.WrapConnector(c))
	t.Cleanup(func() { db.Close() })
	return db, ob
}

// emit commits one transaction emitting one event per aggregate ID given
// (aggregate type "order") and returns their message IDs.
func emit(t *testing.T, db *sql.DB, aggregateIDs ...string) []string {
	t.Helper()
	ctx := outbox.NewContext(context.Background())
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	var ids []string
	for _, agg := range aggregateIDs {
		id, err := outbox.NewMessageID()
		if err != nil {
			t.Fatal(err)
		}
		ev := outbox.Event{ID: id, AggregateType: "order", AggregateID: agg, Type: "order.placed", Payload: []byte(`{"id":"` + agg + `"}`)}
		if err := outbox.Emit(ctx, ev); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// relayUntil runs an in-process relay with an outboxtest publisher that
// fails aggregate "bad" permanently, until wantSent messages were
// published and wantDead dead-lettered, then stops it.
func relayUntil(t *testing.T, tg dbTarget, table string, wantSent, wantDead int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub := outboxtest.NewPublisher()
	pub.FailWith(func(m relay.Message) error {
		if m.AggregateID == "bad" {
			return fmt.Errorf("%w: refused by the test", relay.ErrPermanent)
		}
		return nil
	})
	deadCh := make(chan struct{}, 100)
	ob, err := driver.New(driver.Config{Dialect: tg.dialect, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(ob, tg.plainDB(t), relay.Config{
		Publisher: pub, PollInterval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler), Observer: outboxtest.WatchOrder(t, nil),
		OnDeadLetter: func(relay.Message, error) { deadCh <- struct{}{} },
	})
	if err != nil {
		t.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(ctx) }()
	if _, err := pub.WaitForCount(ctx, wantSent); err != nil {
		t.Fatal(err)
	}
	for range wantDead {
		select {
		case <-deadCh:
		case err := <-runErr:
			t.Fatalf("relay ended: %v", err)
		case <-ctx.Done():
			t.Fatal("timed out waiting for dead letters")
		}
	}
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-runErr; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// waitForRelay polls cond every 20 ms (no fixed sleeps) until it holds,
// failing t if the relay command exits first (its stderr is shown) or ctx
// ends.
func waitForRelay(t *testing.T, ctx context.Context, exited <-chan int, stderr *testdb.SyncBuffer, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case code := <-exited:
			t.Fatalf("relay exited %d while waiting for %s; stderr:\n%s", code, what, stderr.String())
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s; stderr:\n%s", what, stderr.String())
		case <-tick.C:
		}
	}
}
