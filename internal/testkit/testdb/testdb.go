// Package testdb gives each test its own outbox database objects on every
// supported target: a private PostgreSQL schema (through lib/pq and through
// pgx), a private MariaDB/MySQL database, a private SQLite file.
//
// Servers come from OUTBOX_TEST_POSTGRES (default
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable) and
// OUTBOX_TEST_MYSQL (default root@tcp(127.0.0.1:3306)/test). When one is not
// reachable the test is skipped with the reason, unless OUTBOX_TEST_REQUIRE
// is set (CI sets it), in which case the test fails.
//
// This package starts no servers: the library's module does not depend on
// Docker. The nested test module (integration/) owns the container fallback:
// its tests start throwaway servers with testcontainers-go when none is
// reachable and a Docker engine is (integration/containers), and
// `go run ./integration/cmd/testservers -- CMD...` does the same for any
// command, this module's tests included, by setting the two variables.
package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	sqldriver "database/sql/driver"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"
	"modernc.org/sqlite"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/driver/dsn"
	"github.com/sqloutbox/outbox/internal/dialect"
)

// Target is one database and driver combination the suite runs against.
type Target struct {
	// Name is pq, pgx, mysql or sqlite (or pgx-simple, see PgxSimple).
	Name    string
	Dialect driver.Dialect
}

// All is every target, in the order the suite runs them.
var All = []Target{
	{"pq", driver.Postgres},
	{"pgx", driver.Postgres},
	{"mysql", driver.MySQL},
	{"sqlite", driver.SQLite},
}

// PgxSimple is pgx with QueryExecModeSimpleProtocol (what PgBouncer users
// choose: every statement is sent as text, nothing is prepared). It is not
// in All; suites that care about how statements reach the server add it.
var PgxSimple = Target{"pgx-simple", driver.Postgres}

// Env is one test's private database objects on one target.
type Env struct {
	Target Target
	// Schema is the private PostgreSQL schema or MySQL database ("" on SQLite).
	Schema string
	// Table is the outbox table, qualified with Schema.
	Table string
	// Outbox is the driver configuration bound to Table.
	Outbox *driver.Outbox
	// DB is opened through the outbox wrapper; business code uses it.
	DB *sql.DB
	// RelayDB is a separate small pool, without the wrapper, for relays
	// and for reading rows back. On SQLite it is DB itself (one connection).
	RelayDB *sql.DB
	// DSN is the private database's DSN for the target's driver (MySQL
	// and SQLite point at the private database; PostgreSQL at the server).
	DSN string

	connector sqldriver.Connector // the target driver's, unwrapped; nil on SQLite
}

// OpenWriter opens another pool through the outbox wrapper onto e's
// database, bound to a new Outbox for cfg (Dialect and Table default to
// e's), as a second writer process would; it does not migrate. The pool is
// closed at cleanup.
func (e *Env) OpenWriter(t testing.TB, cfg driver.Config) (*driver.Outbox, *sql.DB) {
	t.Helper()
	if cfg.Dialect == "" {
		cfg.Dialect = e.Target.Dialect
	}
	if cfg.Table == "" {
		cfg.Table = e.Table
	}
	ob, err := driver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var db *sql.DB
	if e.connector != nil {
		db = sql.OpenDB(ob.WrapConnector(e.connector))
		db.SetMaxOpenConns(4)
	} else {
		c, err := ob.Wrap(&sqlite.Driver{}).(sqldriver.DriverContext).OpenConnector(e.DSN)
		if err != nil {
			t.Fatal(err)
		}
		db = sql.OpenDB(c)
		db.SetMaxOpenConns(1)
	}
	t.Cleanup(func() { db.Close() })
	return ob, db
}

// PendingTable is the pending set of the outbox table named table (as
// configured, schema-qualified or not): the events waiting to be
// published (schema version 9 on PostgreSQL, 8 on SQLite, 6 on
// MySQL/MariaDB).
func PendingTable(table string) string { return table + "_pending" }

// IsPending is a condition on an outbox row's unqualified columns: the
// row is pending (its id is in the pending set).
func (e *Env) IsPending() string { return "id IN (SELECT id FROM " + PendingTable(e.Table) + ")" }

// IsSent is a condition on an outbox row's unqualified columns: the row
// is sent (neither pending nor dead).
func (e *Env) IsSent() string {
	return "status <> 2 AND id NOT IN (SELECT id FROM " + PendingTable(e.Table) + ")"
}

// Q qualifies a business table name with the private schema.
func (e *Env) Q(name string) string {
	if e.Schema == "" {
		return name
	}
	return e.Schema + "." + name
}

// Placeholder returns the n-th (1-based) bind placeholder for the dialect.
func (e *Env) Placeholder(n int) string {
	if e.Target.Dialect == driver.Postgres {
		return fmt.Sprintf("$%d", n)
	}
	return "?"
}

// ForUpdate is the row-lock suffix for a SELECT ("" on SQLite, where
// BEGIN IMMEDIATE serializes writers).
func (e *Env) ForUpdate() string {
	if e.Target.Dialect == driver.SQLite {
		return ""
	}
	return " FOR UPDATE"
}

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

var (
	serverMu sync.Mutex
	servers  = map[driver.Dialect]string{}
	failures = map[driver.Dialect]error{}
)

// Environment variables naming the servers, and their defaults.
const (
	PostgresEnv     = "OUTBOX_TEST_POSTGRES"
	MySQLEnv        = "OUTBOX_TEST_MYSQL"
	DefaultPostgres = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultMySQL    = "root@tcp(127.0.0.1:3306)/test"
)

// EnvVar returns the environment variable naming d's server (PostgresEnv or
// MySQLEnv; "" for SQLite, which needs no server).
func EnvVar(d driver.Dialect) string {
	switch d {
	case driver.Postgres:
		return PostgresEnv
	case driver.MySQL:
		return MySQLEnv
	}
	return ""
}

// ConfiguredDSN returns d's server DSN: its environment variable, or the
// default (PostgreSQL and MySQL only; "" for SQLite).
func ConfiguredDSN(d driver.Dialect) string {
	switch d {
	case driver.Postgres:
		return envOr(PostgresEnv, DefaultPostgres)
	case driver.MySQL:
		return envOr(MySQLEnv, DefaultMySQL)
	}
	return ""
}

// Ping connects to d's server at dsn (pgx for PostgreSQL, go-sql-driver for
// MySQL) and reports whether it answered: within 3 s per attempt, attempts
// that time out repeated for up to 30 s (pingWithin).
func Ping(d driver.Dialect, dsn string) error {
	switch d {
	case driver.Postgres:
		return ping("pgx", dsn)
	case driver.MySQL:
		return ping("mysql", dsn)
	}
	return fmt.Errorf("testdb: %s has no server", d)
}

// PostgresDSN and MySQLDSN return the server DSNs; they skip or fail t
// when the server does not answer.
func PostgresDSN(t testing.TB) string { return server(t, driver.Postgres) }

// MySQLDSN: see PostgresDSN.
func MySQLDSN(t testing.TB) string { return server(t, driver.MySQL) }

// PrivatePostgresDatabase creates a database of t's own on the shared
// PostgreSQL server, drops it (WITH (FORCE)) when t ends, and returns its
// DSN, for NewOn. A test needs one when what it proves depends on the
// server's transaction horizon: VACUUM sets a page all-visible only when
// no transaction of the same database may still see older row versions,
// and other tests' transactions on the shared database 'test' hold that
// horizon back under load (CI: index-only scans turned into heap fetches).
// Transactions in other databases do not (PostgreSQL 14 and later).
func PrivatePostgresDatabase(t testing.TB) string {
	t.Helper()
	dsn := PostgresDSN(t)
	name := randomName("d_")
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	if _, err := admin.ExecContext(context.Background(), "CREATE DATABASE "+name); err != nil {
		t.Fatalf("creating database %s: %v", name, err)
	}
	t.Cleanup(func() {
		if _, err := admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("dropping database %s: %v", name, err)
		}
	})
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + name
		return u.String()
	}
	return dsn + " dbname=" + name // libpq keyword/value form: the last setting wins
}

func server(t testing.TB, d driver.Dialect) string {
	t.Helper()
	serverMu.Lock()
	defer serverMu.Unlock()
	if dsn, ok := servers[d]; ok {
		return dsn
	}
	if err, ok := failures[d]; ok {
		unavailable(t, d, err)
	}
	dsn := ConfiguredDSN(d)
	if err := Ping(d, dsn); err != nil {
		failures[d] = err
		unavailable(t, d, err)
	}
	servers[d] = dsn
	return dsn
}

func unavailable(t testing.TB, d driver.Dialect, err error) {
	t.Helper()
	if os.Getenv("OUTBOX_TEST_REQUIRE") != "" {
		t.Fatalf("%s server required (OUTBOX_TEST_REQUIRE is set) but unavailable: %v", d, err)
	}
	t.Skipf("SKIP: no %s server (%v); set %s, start one, or with Docker run the tests under `go run ./integration/cmd/testservers -- go test ...`", d, err, EnvVar(d))
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// ping is pingWithin with 3 s per attempt and 30 s in all.
func ping(drv, dsn string) error { return pingWithin(drv, dsn, 3*time.Second, 30*time.Second) }

// pingWithin connects to dsn and pings, each attempt bounded by attempt;
// an attempt that timed out (a server that accepts connections but is
// slow to answer: a loaded machine) is repeated until patience has
// passed. Any other error (connection refused: no server) is returned at
// once. The failure is cached for the whole test binary (server), so one
// slow answer must not count as no server: a CI run under load once
// failed every test of two packages that way.
func pingWithin(drv, dsn string, attempt, patience time.Duration) error {
	deadline := time.Now().Add(patience)
	for {
		err := pingOnce(drv, dsn, attempt)
		if err == nil || !timedOut(err) || time.Now().After(deadline) {
			return err
		}
	}
}

// timedOut reports whether err is a timeout (pgx wraps its own "timeout:
// context deadline exceeded"; go-sql-driver/mysql returns the context's).
func timedOut(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "timeout")
}

func pingOnce(drv, dsn string, attempt time.Duration) error {
	db, err := sql.Open(drv, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), attempt)
	defer cancel()
	return db.PingContext(ctx)
}

// New creates t's private objects on target, migrates the outbox table
// (named table, or driver.DefaultTable if empty) and registers cleanup.
func New(t testing.TB, target Target, cfg driver.Config) *Env {
	t.Helper()
	return NewOn(t, target, "", cfg)
}

// NewOn is New on the server at dsn instead of the shared one (a private
// server of the test's own: privateserver.StartPostgres); "" is the
// shared server. PostgreSQL and MySQL/MariaDB targets only.
func NewOn(t testing.TB, target Target, server string, cfg driver.Config) *Env {
	t.Helper()
	ctx := context.Background()
	e := &Env{Target: target}
	cfg.Dialect = target.Dialect
	if cfg.Logger == nil {
		// Quiet: Migrate's "outbox schema created" line for every test's
		// table would bury the test output (a test that reads the log
		// passes its own Logger).
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	base := cfg.Table
	if base == "" {
		base = driver.DefaultTable
	}
	var connector sqldriver.Connector
	var plain func() (*sql.DB, error)
	switch target.Dialect {
	case driver.Postgres:
		dsn := server
		if dsn == "" {
			dsn = PostgresDSN(t)
		}
		e.Schema = randomName("t_")
		admin, err := sql.Open("pgx", dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.Close() })
		if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+e.Schema); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), "DROP SCHEMA "+e.Schema+" CASCADE") })
		e.DSN = dsn
		// The relay's pool (RelayDB) uses the target's own driver and
		// mode, so the relay's statements (the claim function with its
		// array arguments, the floor proof, mark-sent) are tested over
		// lib/pq, pgx and pgx's simple protocol alike.
		if target.Name == "pq" {
			c, err := pq.NewConnector(dsn)
			if err != nil {
				t.Fatal(err)
			}
			connector = c
			plain = func() (*sql.DB, error) {
				c, err := pq.NewConnector(dsn)
				if err != nil {
					return nil, err
				}
				return sql.OpenDB(c), nil
			}
		} else {
			pc, err := pgx.ParseConfig(dsn)
			if err != nil {
				t.Fatal(err)
			}
			if target == PgxSimple {
				pc.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
			}
			connector = stdlib.GetConnector(*pc)
			plain = func() (*sql.DB, error) { return sql.OpenDB(stdlib.GetConnector(*pc)), nil }
		}
	case driver.MySQL:
		dsn := server
		if dsn == "" {
			dsn = MySQLDSN(t)
		}
		e.Schema = randomName("t_")
		admin, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.Close() })
		if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+e.Schema); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), "DROP DATABASE "+e.Schema) })
		mc, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		mc.DBName = e.Schema
		e.DSN = mc.FormatDSN()
		c, err := mysql.NewConnector(mc)
		if err != nil {
			t.Fatal(err)
		}
		connector = c
		plain = func() (*sql.DB, error) { return sql.Open("mysql", e.DSN) }
	case driver.SQLite:
		e.DSN = SQLiteDSN(filepath.Join(t.TempDir(), "outbox.db"))
		plain = func() (*sql.DB, error) { return sql.Open("sqlite", e.DSN) }
	}
	if e.Schema != "" {
		cfg.Table = e.Schema + "." + base
	} else {
		cfg.Table = base
	}
	e.Table = cfg.Table
	ob, err := driver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.Outbox = ob
	e.connector = connector
	if connector != nil {
		e.DB = sql.OpenDB(ob.WrapConnector(connector))
	} else {
		c, err := ob.Wrap(&sqlite.Driver{}).(sqldriver.DriverContext).OpenConnector(e.DSN)
		if err != nil {
			t.Fatal(err)
		}
		e.DB = sql.OpenDB(c)
	}
	t.Cleanup(func() { e.DB.Close() })
	if target.Dialect == driver.SQLite {
		// SQLite has one writer at a time. Writers queueing in
		// database/sql's pool are far faster than writers sleeping in
		// SQLite's busy handler, so the application and the relay share one
		// connection, as the README recommends.
		e.DB.SetMaxOpenConns(1)
		e.RelayDB = e.DB
	} else {
		if e.RelayDB, err = plain(); err != nil {
			t.Fatal(err)
		}
		e.RelayDB.SetMaxOpenConns(2)
		// Many tests run in parallel against one server (PostgreSQL's
		// default max_connections is 100): cap each test's pool.
		e.DB.SetMaxOpenConns(12)
	}
	if e.RelayDB != e.DB {
		t.Cleanup(func() { e.RelayDB.Close() })
	}
	if err := ob.Migrate(ctx, e.DB); err != nil {
		t.Fatal(err)
	}
	return e
}

// SQLiteDSN returns the project's DSN for a SQLite file (dsn.SQLite).
func SQLiteDSN(path string) string { return dsn.SQLite(path, nil) }

// Eventually polls cond every 5 ms until it holds, failing t when ctx ends
// first: a condition with a deadline, not a sleep standing in for
// synchronisation.
func Eventually(t testing.TB, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

// Column returns the values of a one-column query on db, in the query's
// order, as text; it fails t on any error.
func Column(t testing.TB, ctx context.Context, db *sql.DB, q string, args ...any) []string {
	t.Helper()
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Connector returns the target driver's own connector for e's database,
// not wrapped by the outbox (nil on SQLite), for tests that wrap it
// themselves.
func (e *Env) Connector() sqldriver.Connector { return e.connector }

// RandomName returns prefix followed by 12 random hex digits: a name of a
// test's own.
func RandomName(prefix string) string { return randomName(prefix) }

// Listen LISTENs on channel on a PostgreSQL connection of its own (pgconn)
// and returns once the LISTEN is active; every notification's payload is
// sent on the returned channel (buffered; a full buffer blocks the
// listener). The connection closes when ctx ends or at cleanup.
func Listen(t testing.TB, ctx context.Context, dsn, channel string) <-chan string {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan string, 1<<14)
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) {
		if n.Channel == channel {
			out <- n.Payload
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	c, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, dialect.ListenStatement(channel)).ReadAll(); err != nil {
		c.Close(context.Background())
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer c.Close(context.Background())
		for c.WaitForNotification(ctx) == nil {
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return out
}

// PostgresClaimSQL is the relay's PostgreSQL claim (the claim function)
// with its arguments written in as literals: from floor (floor epoch 0),
// up to limit rows of partitions, leaving out skip, no floor proof.
func PostgresClaimSQL(d *dialect.Dialect, floor int64, limit int, partitions []int, skip []int64) string {
	return strings.NewReplacer("$1", fmt.Sprint(floor), "$2", "0", "$3", fmt.Sprint(limit),
		"$4", "'"+dialect.IDArray(skip)+"'", "$5", "'"+dialect.IntArray(partitions)+"'",
		"$6", "NULL", "$7", "false").Replace(d.ClaimFloor())
}

// PostgresClaimBuffers is the pages the PostgreSQL claim function reads
// for one claim of batch rows from floor over partitions, leaving out skip
// (EXPLAIN (ANALYZE, BUFFERS): its Function Scan node counts every page
// the statements inside it read). It runs twice on one connection and
// counts the second (the first compiles the function, loads the catalog
// and may set hint bits), and fails t unless the claim returned batch
// rows and its floor report.
func PostgresClaimBuffers(t testing.TB, ctx context.Context, db *sql.DB, d *dialect.Dialect, floor int64, batch int, partitions []int, skip []int64) int {
	t.Helper()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return PostgresClaimBuffersOn(t, ctx, conn, d, floor, batch, partitions, skip)
}

// PostgresClaimBuffersOn is PostgresClaimBuffers on conn: a session whose
// cached plans of the claim function's statements (made at its first
// call there) are the ones measured.
func PostgresClaimBuffersOn(t testing.TB, ctx context.Context, conn *sql.Conn, d *dialect.Dialect, floor int64, batch int, partitions []int, skip []int64) int {
	t.Helper()
	var buffers int
	for i := 0; i < 2; i++ {
		var text string
		if err := conn.QueryRowContext(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+PostgresClaimSQL(d, floor, batch, partitions, skip)).Scan(&text); err != nil {
			t.Fatal(err)
		}
		var plan []struct{ Plan map[string]any }
		if err := json.Unmarshal([]byte(text), &plan); err != nil {
			t.Fatal(err)
		}
		hit, _ := plan[0].Plan["Shared Hit Blocks"].(float64)
		read, _ := plan[0].Plan["Shared Read Blocks"].(float64)
		buffers = int(hit + read)
		if rows, _ := plan[0].Plan["Actual Rows"].(float64); int(rows) != batch+1 {
			t.Fatalf("claim returned %v rows, want %d and the floor report", rows-1, batch)
		}
	}
	return buffers
}

// RequireLogicalWAL skips t, or fails it under OUTBOX_TEST_REQUIRE, unless
// the PostgreSQL server behind db runs with wal_level = logical (what the
// relay's WAL source needs; .ci/run sets it, with one restart).
func RequireLogicalWAL(t testing.TB, db *sql.DB) {
	t.Helper()
	var level string
	if err := db.QueryRow("SHOW wal_level").Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level == "logical" {
		return
	}
	if os.Getenv("OUTBOX_TEST_REQUIRE") != "" {
		t.Fatalf("the PostgreSQL server runs with wal_level = %s; the WAL source needs logical (.ci/run sets it)", level)
	}
	t.Skipf("SKIP: the PostgreSQL server runs with wal_level = %s; the WAL source needs logical", level)
}
