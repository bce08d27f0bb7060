package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	sqldriver "database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"
	"modernc.org/sqlite"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/driver/dsn"
	"github.com/sqloutbox/outbox/relay"
)

// database is one run's private namespace on the target database: a
// PostgreSQL schema, a MariaDB/MySQL database or a SQLite file, dropped at
// the end of the run.
type database struct {
	dialect driver.Dialect
	label   string
	schema  string // "" on SQLite
	admin   *sql.DB
	// raw returns a fresh connector of the real driver for the private
	// namespace.
	raw   func() (sqldriver.Connector, error)
	cnt   *counter
	close func()
	// dsn is the -db value and file the SQLite file: what a relay in a
	// child process connects with (childConnector). Never printed.
	dsn  string
	file string
	// pgDriver is the PostgreSQL driver of the bench's pools (-pgdriver:
	// pq or pgx); the admin pool is always pgx.
	pgDriver string
	// noNotify is -nonotify: the in-process relay's and the soak's
	// outboxes do not NOTIFY (PostgreSQL; driver.Config.DisableNotify).
	noNotify bool
	// source is -source: the in-process relay's source in parts latency,
	// burst and drain (table or wal).
	source string
}

// withSource sets cfg's source to -source for env's table: with wal, a
// slot of the run's own, which the returned cleanup drops (call it after
// the relay stopped).
func (db *database) withSource(env *outboxEnv, cfg relay.Config) (relay.Config, func()) {
	if db.source != "wal" {
		return cfg, func() {}
	}
	cfg.Source = relay.SourceWAL
	cfg.WAL = relay.WALConfig{DSN: db.dsn, Slot: "outbox_bench_" + randomHex(6)}
	return cfg, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for ctx.Err() == nil {
			// The stopped relay's walsender may hold the slot a moment.
			if err := relay.DropWAL(ctx, env.ob, db.admin, cfg.WAL); err == nil || !errors.Is(err, relay.ErrWALUnavailable) {
				return
			}
			_, _ = db.admin.ExecContext(ctx, "SELECT pg_sleep(0.05)")
		}
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// pgConnector returns a connector of the named PostgreSQL driver (pq or
// pgx) for dsn.
func pgConnector(name, dsn string) (sqldriver.Connector, error) {
	switch name {
	case "pq":
		return pq.NewConnector(dsn)
	case "pgx":
		pc, err := pgx.ParseConfig(dsn)
		if err != nil {
			return nil, err
		}
		return stdlib.GetConnector(*pc), nil
	}
	return nil, fmt.Errorf("-pgdriver %q: want pq or pgx", name)
}

func openDatabase(ctx context.Context, source, pgDriver string) (*database, error) {
	db := &database{cnt: &counter{}, dsn: source, pgDriver: pgDriver}
	switch {
	case strings.HasPrefix(source, "postgres://") || strings.HasPrefix(source, "postgresql://"):
		pc, err := pgx.ParseConfig(source)
		if err != nil {
			return nil, fmt.Errorf("parsing -db: %w", err)
		}
		if _, err := pgConnector(pgDriver, source); err != nil {
			return nil, err
		}
		db.dialect, db.label = driver.Postgres, "postgres"
		db.raw = func() (sqldriver.Connector, error) { return pgConnector(pgDriver, source) }
		db.admin = sql.OpenDB(stdlib.GetConnector(*pc))
		db.schema = "bench_" + randomHex(4)
		if _, err := db.admin.ExecContext(ctx, "CREATE SCHEMA "+db.schema); err != nil {
			_ = db.admin.Close()
			return nil, fmt.Errorf("creating schema: %w", err)
		}
		db.close = func() {
			_, _ = db.admin.ExecContext(context.Background(), "DROP SCHEMA "+db.schema+" CASCADE")
			_ = db.admin.Close()
		}
	case strings.HasPrefix(source, "mysql://") || strings.Contains(source, "@tcp(") || strings.Contains(source, "@unix("):
		mc, err := dsn.MySQLConfig(source)
		if err != nil {
			return nil, fmt.Errorf("parsing -db: %w", err)
		}
		db.dialect, db.label = driver.MySQL, "mysql"
		ac, err := mysql.NewConnector(mc)
		if err != nil {
			return nil, err
		}
		db.admin = sql.OpenDB(ac)
		db.schema = "bench_" + randomHex(4)
		if _, err := db.admin.ExecContext(ctx, "CREATE DATABASE "+db.schema); err != nil {
			_ = db.admin.Close()
			return nil, fmt.Errorf("creating database: %w", err)
		}
		pc := mc.Clone()
		pc.DBName = db.schema
		db.raw = func() (sqldriver.Connector, error) { return mysql.NewConnector(pc) }
		db.close = func() {
			_, _ = db.admin.ExecContext(context.Background(), "DROP DATABASE "+db.schema)
			_ = db.admin.Close()
		}
	case source == "":
		dir, err := os.MkdirTemp("", "outbox-bench-")
		if err != nil {
			return nil, err
		}
		db.dialect, db.label = driver.SQLite, "sqlite"
		db.file = filepath.Join(dir, "bench.db")
		db.raw = func() (sqldriver.Connector, error) { return sqliteConnector(db.file), nil }
		c, _ := db.raw()
		db.admin = sql.OpenDB(c)
		db.admin.SetMaxOpenConns(1)
		db.close = func() {
			_ = db.admin.Close()
			_ = os.RemoveAll(dir)
		}
	default:
		return nil, fmt.Errorf("-db %q: want a postgres:// URL, a MySQL DSN (user@tcp(host:port)/db or mysql://...), or empty for embedded SQLite", source)
	}
	return db, nil
}

func sqliteConnector(file string) sqldriver.Connector {
	return dsnConnector{&sqlite.Driver{}, dsn.SQLite(file, nil)}
}

// childConnector returns, in a child process of the bench, a connector of
// the real driver for the run's namespace: source is the -db value, schema
// the run's MySQL database, file the SQLite file, pgDriver -pgdriver.
func childConnector(source, schema, file, pgDriver string) (driver.Dialect, sqldriver.Connector, error) {
	switch {
	case file != "":
		return driver.SQLite, sqliteConnector(file), nil
	case strings.HasPrefix(source, "postgres://") || strings.HasPrefix(source, "postgresql://"):
		c, err := pgConnector(pgDriver, source)
		return driver.Postgres, c, err
	default:
		mc, err := dsn.MySQLConfig(source)
		if err != nil {
			return "", nil, err
		}
		mc = mc.Clone()
		mc.DBName = schema
		c, err := mysql.NewConnector(mc)
		return driver.MySQL, c, err
	}
}

// table qualifies name with the run's schema.
func (db *database) table(name string) string {
	if db.schema == "" {
		return name
	}
	return db.schema + "." + name
}

func (db *database) ph(n int) string {
	if db.dialect == driver.Postgres {
		return fmt.Sprintf("$%d", n)
	}
	return "?"
}

// outboxEnv is one outbox table with its pools.
type outboxEnv struct {
	table string
	ob    *driver.Outbox
	// app is opened through the outbox wrapper over the counting connector.
	app *sql.DB
	// plainApp is the counting connector without the outbox wrapper: the
	// seed's application (hand-written INSERT).
	plainApp *sql.DB
	// relay is the relay's pool (on SQLite the app pool itself).
	relay *sql.DB
	close func()
}

func (db *database) newOutbox(ctx context.Context, name string, appConns int) (*outboxEnv, error) {
	return db.newOutboxNotify(ctx, name, appConns, true)
}

// newOutboxNotify is newOutbox; without notify the commit hook does not
// NOTIFY on PostgreSQL (driver.Config.DisableNotify).
func (db *database) newOutboxNotify(ctx context.Context, name string, appConns int, notify bool) (*outboxEnv, error) {
	e := &outboxEnv{table: db.table(name)}
	// With -pgdriver pgx the bench's pgx connections reach the wrapper
	// inside the round-trip counter, which hides them from the statement
	// cache's pgx check; a pgx user's connections do not, so the cache is
	// off here as it is for them (pgx caches statements itself). On lib/pq
	// the cache is on, as for a lib/pq user.
	ob, err := driver.New(driver.Config{Dialect: db.dialect, Table: e.table, DisableNotify: !notify, DisableStatementCache: db.dialect == driver.Postgres && db.pgDriver == "pgx"})
	if err != nil {
		return nil, err
	}
	e.ob = ob
	c1, err := db.raw()
	if err != nil {
		return nil, err
	}
	c2, err := db.raw()
	if err != nil {
		return nil, err
	}
	e.app = sql.OpenDB(ob.WrapConnector(countingConnector{c1, db.cnt}))
	e.plainApp = sql.OpenDB(countingConnector{c2, db.cnt})
	if db.dialect == driver.SQLite {
		e.app.SetMaxOpenConns(1)
		e.plainApp.SetMaxOpenConns(1)
		e.relay = e.app
	} else {
		e.app.SetMaxOpenConns(appConns)
		e.app.SetMaxIdleConns(appConns)
		e.plainApp.SetMaxOpenConns(appConns)
		e.plainApp.SetMaxIdleConns(appConns)
		c3, err := db.raw()
		if err != nil {
			return nil, err
		}
		e.relay = sql.OpenDB(c3)
		e.relay.SetMaxOpenConns(2)
	}
	e.close = func() {
		_ = e.app.Close()
		_ = e.plainApp.Close()
		if e.relay != e.app {
			_ = e.relay.Close()
		}
	}
	if err := ob.Migrate(ctx, e.app); err != nil {
		e.close()
		return nil, fmt.Errorf("migrating %s: %w", e.table, err)
	}
	if err := db.conditionTables(ctx); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}
