package main

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"modernc.org/sqlite"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/driver/dsn"
)

// database is the quickstart's storage: app is opened through the outbox
// wrapper (business code), relay is a separate small plain pool.
type database struct {
	dialect driver.Dialect
	label   string
	ob      *driver.Outbox
	app     *sql.DB
	relay   *sql.DB
	close   func()
}

// openDatabase picks the database from source (-db): a postgres:// or
// postgresql:// URL is PostgreSQL (pgx), a go-sql-driver DSN
// (user@tcp(host:port)/db, user@unix(/path)/db) or a mysql:// URL is
// MySQL, and "" is an embedded SQLite file in a temporary directory.
func openDatabase(source, outboxTable string) (*database, error) {
	var (
		d         driver.Dialect
		label     string
		connector sqldriver.Connector // the real driver's, wrapped below for app
		plain     *sql.DB
		cleanup   = func() {}
	)
	switch {
	case strings.HasPrefix(source, "postgres://") || strings.HasPrefix(source, "postgresql://"):
		pc, err := pgx.ParseConfig(source)
		if err != nil {
			return nil, fmt.Errorf("parsing -db: %w", err)
		}
		d, label = driver.Postgres, "postgres"
		connector = stdlib.GetConnector(*pc)
		plain = sql.OpenDB(stdlib.GetConnector(*pc))
	case strings.HasPrefix(source, "mysql://") || strings.Contains(source, "@tcp(") || strings.Contains(source, "@unix("):
		mc, err := dsn.MySQLConfig(source)
		if err != nil {
			return nil, fmt.Errorf("parsing -db: %w", err)
		}
		d, label = driver.MySQL, "mysql"
		if connector, err = mysql.NewConnector(mc); err != nil {
			return nil, err
		}
		pconn, err := mysql.NewConnector(mc)
		if err != nil {
			return nil, err
		}
		plain = sql.OpenDB(pconn)
	case source == "":
		dir, err := os.MkdirTemp("", "outbox-quickstart-")
		if err != nil {
			return nil, err
		}
		cleanup = func() { _ = os.RemoveAll(dir) }
		d, label = driver.SQLite, "sqlite"
		source = dsn.SQLite(filepath.Join(dir, "quickstart.db"), nil)
	default:
		return nil, fmt.Errorf("-db %q: want a postgres:// URL, a MySQL DSN (user@tcp(host:port)/db or mysql://...), or empty for embedded SQLite", source)
	}

	closePlain := func() {
		if plain != nil {
			_ = plain.Close()
		}
	}
	ob, err := driver.New(driver.Config{Dialect: d, Table: outboxTable})
	if err != nil {
		closePlain()
		cleanup()
		return nil, err
	}
	var app *sql.DB
	if connector != nil {
		app = sql.OpenDB(ob.WrapConnector(connector))
	} else {
		c, err := ob.Wrap(&sqlite.Driver{}).(sqldriver.DriverContext).OpenConnector(source)
		if err != nil {
			cleanup()
			return nil, err
		}
		app = sql.OpenDB(c)
		// SQLite has one writer at a time: writers queueing for one
		// connection in database/sql beat writers sleeping in SQLite's busy
		// handler, so the application and the relay share one connection.
		app.SetMaxOpenConns(1)
		plain = app
	}
	// Elsewhere the relay gets its own pool: it runs at most two
	// statements at a time, and can never starve business queries.
	if plain != app {
		plain.SetMaxOpenConns(2)
	}
	return &database{
		dialect: d, label: label, ob: ob, app: app, relay: plain,
		close: func() {
			_ = app.Close()
			if plain != app {
				_ = plain.Close()
			}
			cleanup()
		},
	}, nil
}

// prepare migrates the outbox table, creates the order table and, on a
// server database, empties both so that repeated runs start clean (the
// quickstart's tables are its own).
func (db *database) prepare(ctx context.Context, orderTable string) error {
	if err := db.ob.Migrate(ctx, db.app); err != nil {
		return fmt.Errorf("migrating the outbox table: %w", err)
	}
	ddl := "CREATE TABLE IF NOT EXISTS " + orderTable +
		" (id VARCHAR(64) PRIMARY KEY, status VARCHAR(16) NOT NULL, amount_cents BIGINT NOT NULL)"
	if _, err := db.app.ExecContext(ctx, ddl); err != nil {
		return fmt.Errorf("creating %s: %w", orderTable, err)
	}
	if db.dialect != driver.SQLite {
		for _, t := range []string{orderTable, db.ob.Config().Table} {
			if _, err := db.app.ExecContext(ctx, "DELETE FROM "+t); err != nil {
				return fmt.Errorf("emptying %s: %w", t, err)
			}
		}
	}
	return nil
}

// readOutbox reads back every outbox row, in id order.
func (db *database) readOutbox(ctx context.Context) ([]outboxRow, error) {
	rows, err := db.relay.QueryContext(ctx,
		"SELECT id, message_id, aggregate_id, event_type FROM "+db.ob.Config().Table+" ORDER BY id")
	if err != nil {
		return nil, fmt.Errorf("reading the outbox table: %w", err)
	}
	defer rows.Close()
	var out []outboxRow
	for rows.Next() {
		var r outboxRow
		if err := rows.Scan(&r.ID, &r.MessageID, &r.AggregateID, &r.EventType); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// retryable reports whether err is a transient concurrency failure worth
// running the transaction again for: a PostgreSQL serialization failure
// or deadlock, a MySQL deadlock or lock wait timeout, SQLite busy/locked.
func retryable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "40001" || pe.Code == "40P01"
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number == 1213 || me.Number == 1205
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		code := se.Code() & 0xff
		return code == 5 || code == 6 // SQLITE_BUSY, SQLITE_LOCKED
	}
	return false
}
