package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	sqldriver "database/sql/driver"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"modernc.org/sqlite"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/driver/dsn"
)

// testEnv is one test's private database on one server, set up with plain
// database/sql as an application would: a PostgreSQL schema or a MySQL
// database of its own (dropped afterwards), or a SQLite file.
type testEnv struct {
	dialect driver.Dialect
	// ob is bound to the private outbox table.
	ob *driver.Outbox
	// db is the application's pool, through ob's wrapper; unqualified
	// table names resolve in the private schema or database.
	db *sql.DB
	// relayDB is the relay's own small pool, without the wrapper (on
	// SQLite db itself: one writer at a time).
	relayDB *sql.DB
}

// serverDSN returns the DSN in env (or def) if the server answers, or
// skips t (fails it if OUTBOX_TEST_REQUIRE is set, as CI does).
func serverDSN(t *testing.T, env, def, sqlDriver string) string {
	t.Helper()
	dsn := os.Getenv(env)
	if dsn == "" {
		dsn = def
	}
	db, err := sql.Open(sqlDriver, dsn)
	if err == nil {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		err = db.PingContext(ctx)
		cancel()
		db.Close()
	}
	if err != nil {
		if os.Getenv("OUTBOX_TEST_REQUIRE") != "" {
			t.Fatalf("%s required (OUTBOX_TEST_REQUIRE is set) but unreachable: %v", dsn, err)
		}
		t.Skipf("no server at %s (%v); set %s", dsn, err, env)
	}
	return dsn
}

// newTestEnv creates t's private database objects for dialect, migrates
// the outbox table and registers cleanup.
func newTestEnv(t *testing.T, d driver.Dialect) *testEnv {
	t.Helper()
	ctx := t.Context()
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	private := "os_" + hex.EncodeToString(suffix)
	e := &testEnv{dialect: d}
	var app, relay sqldriver.Connector
	table := driver.DefaultTable
	switch d {
	case driver.Postgres:
		dsn := serverDSN(t, "OUTBOX_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "pgx")
		admin, err := sql.Open("pgx", dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.Close() })
		if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+private); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), "DROP SCHEMA "+private+" CASCADE") })
		pc, err := pgx.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		pc.RuntimeParams["search_path"] = private
		app, relay = stdlib.GetConnector(*pc), stdlib.GetConnector(*pc)
		table = private + "." + table
	case driver.MySQL:
		dsn := serverDSN(t, "OUTBOX_TEST_MYSQL", "root@tcp(127.0.0.1:3306)/test", "mysql")
		admin, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.Close() })
		if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+private); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), "DROP DATABASE "+private) })
		mc, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		mc.DBName = private
		if app, err = mysql.NewConnector(mc); err != nil {
			t.Fatal(err)
		}
		if relay, err = mysql.NewConnector(mc); err != nil {
			t.Fatal(err)
		}
	}
	ob, err := driver.New(driver.Config{Dialect: d, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	e.ob = ob
	if d == driver.SQLite {
		c, err := ob.Wrap(&sqlite.Driver{}).(sqldriver.DriverContext).OpenConnector(dsn.SQLite(filepath.Join(t.TempDir(), "orders.db"), nil))
		if err != nil {
			t.Fatal(err)
		}
		e.db = sql.OpenDB(c)
		e.db.SetMaxOpenConns(1)
		e.relayDB = e.db
	} else {
		e.db = sql.OpenDB(ob.WrapConnector(app))
		e.db.SetMaxOpenConns(8)
		e.relayDB = sql.OpenDB(relay)
		e.relayDB.SetMaxOpenConns(2)
		t.Cleanup(func() { e.relayDB.Close() })
	}
	t.Cleanup(func() { e.db.Close() })
	if err := ob.Migrate(ctx, e.db); err != nil {
		t.Fatal(err)
	}
	return e
}
