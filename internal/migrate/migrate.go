// Package migrate runs numbered schema migrations, recording each applied
// version in a table of its own, under a lock that serializes concurrent
// callers. The outbox table's migrations (internal/dialect) and the
// inbox's (module github.com/sqloutbox/outbox/inbox, which imports this
// package across the module boundary as inbox/kafka imports
// internal/failpoint) run on it.
//
// Because another module compiles against it, change this package only
// by additions: an inbox release must build with every later release of
// the root module.
//
// # Locks
//
//   - PostgreSQL: one transaction holding pg_advisory_xact_lock(LockKey);
//     the DDL is transactional, so a failed migration leaves nothing.
//   - MySQL and MariaDB: GET_LOCK(LockName, 60) on one connection,
//     released at the end; DDL commits implicitly there, so every
//     statement of a migration must be idempotent (a failure midway is
//     finished by the next run).
//   - SQLite: BEGIN IMMEDIATE on one connection.
//
// Running Run twice, or from several processes at once, is safe: the
// second caller finds every version recorded and does nothing.
package migrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
)

// Flavors of SQL Run knows; any other Plan.Flavor is taken as SQLite.
const (
	Postgres = "postgres"
	MySQL    = "mysql"
	SQLite   = "sqlite"
)

// Migration is one schema version: its statements run in order, then the
// version is recorded.
type Migration struct {
	Version    int
	Name       string
	Statements []string
}

// DefaultSQLiteAppliedAt is the applied_at value recorded on SQLite
// unless Plan.SQLiteAppliedAt says otherwise: Unix milliseconds.
const DefaultSQLiteAppliedAt = "CAST(unixepoch('subsec') * 1000 AS INTEGER)"

// Plan is what Run applies and where it records it.
type Plan struct {
	// Flavor is Postgres, MySQL or SQLite (the default for anything else).
	Flavor string
	// Table is the migrations table, quoted and qualified as it goes into
	// SQL. Run creates it if missing: version (primary key) and applied_at.
	Table string
	// LockKey is the PostgreSQL advisory lock key (stable per migrated
	// table).
	LockKey int64
	// LockName is the MySQL/MariaDB GET_LOCK name (stable per migrated
	// table, at most 64 characters).
	LockName string
	// SQLiteAppliedAt is the SQL expression of applied_at on SQLite (an
	// INTEGER). "": DefaultSQLiteAppliedAt.
	SQLiteAppliedAt string
	// Migrations in ascending Version order.
	Migrations []Migration
	// TooNew is the sentinel Run wraps when the table records a version
	// newer than the last of Migrations. Nil: ErrTooNew.
	TooNew error
	// Before, if set, runs on Run's connection before the lock is taken
	// and anything is changed (a server version check); its error is
	// returned as is.
	Before func(ctx context.Context, conn *sql.Conn) error
}

// ErrTooNew is the default Plan.TooNew.
var ErrTooNew = errors.New("schema is newer than this build")

// Latest returns the newest version of p.Migrations, 0 if there are none.
func (p *Plan) Latest() int {
	if len(p.Migrations) == 0 {
		return 0
	}
	return p.Migrations[len(p.Migrations)-1].Version
}

// CreateTable returns the CREATE TABLE IF NOT EXISTS of p.Table.
func (p *Plan) CreateTable() string {
	switch p.Flavor {
	case Postgres:
		return "CREATE TABLE IF NOT EXISTS " + p.Table + " (version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())"
	case MySQL:
		return "CREATE TABLE IF NOT EXISTS " + p.Table + " (version INT PRIMARY KEY, applied_at DATETIME(6) NOT NULL) ENGINE = InnoDB"
	}
	return "CREATE TABLE IF NOT EXISTS " + p.Table + " (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)"
}

// InsertVersion returns the statement recording one version (its one
// argument), doing nothing if it is already recorded.
func (p *Plan) InsertVersion() string {
	switch p.Flavor {
	case Postgres:
		return "INSERT INTO " + p.Table + " (version) VALUES ($1) ON CONFLICT DO NOTHING"
	case MySQL:
		return "INSERT IGNORE INTO " + p.Table + " (version, applied_at) VALUES (?, UTC_TIMESTAMP(6))"
	}
	at := p.SQLiteAppliedAt
	if at == "" {
		at = DefaultSQLiteAppliedAt
	}
	return "INSERT OR IGNORE INTO " + p.Table + " (version, applied_at) VALUES (?, " + at + ")"
}

type execQueryer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Run applies every migration of p not yet recorded in p.Table, under
// the flavor's lock (see the package doc), on one connection of db. It
// returns p.Before's error; an error wrapping p.TooNew (ErrTooNew) if the
// table records a version newer than p.Latest(), before changing
// anything; an error naming the version whose statement failed; or the
// database's error (taking the lock, a lock not granted within 60 s on
// MySQL, committing). Errors carry no package prefix: the caller adds
// its own.
func Run(ctx context.Context, db *sql.DB, p Plan) (err error) {
	if db == nil {
		return errors.New("migrate: nil *sql.DB")
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if p.Before != nil {
		if err := p.Before(ctx, conn); err != nil {
			return err
		}
	}
	var q execQueryer = conn
	var finish func(ok bool) error
	switch p.Flavor {
	case Postgres:
		// READ COMMITTED whatever the server's default: a migration that
		// copies rows written before it (the outbox's pending set, schema
		// version 9) must see every transaction that committed before its
		// statement, not only those before its first one.
		tx, err := conn.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", p.LockKey); err != nil {
			_ = tx.Rollback()
			return err
		}
		q = tx
		finish = func(ok bool) error {
			if ok {
				return tx.Commit()
			}
			return tx.Rollback()
		}
	case MySQL:
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 60)", p.LockName).Scan(&got); err != nil {
			return err
		}
		if got.Int64 != 1 {
			return fmt.Errorf("timed out after 60 s waiting for lock %s held by another migration", p.LockName)
		}
		finish = func(bool) error {
			_, err := conn.ExecContext(context.WithoutCancel(ctx), "SELECT RELEASE_LOCK(?)", p.LockName)
			return err
		}
	default:
		if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
			return err
		}
		finish = func(ok bool) error {
			if ok {
				_, err := conn.ExecContext(ctx, "COMMIT")
				return err
			}
			_, err := conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
			return err
		}
	}
	ok := false
	defer func() {
		if ferr := finish(ok); err == nil && ferr != nil {
			err = ferr
		}
	}()
	if _, err := q.ExecContext(ctx, p.CreateTable()); err != nil {
		return err
	}
	applied, err := appliedVersions(ctx, q, p.Table)
	if err != nil {
		return err
	}
	tooNew := p.TooNew
	if tooNew == nil {
		tooNew = ErrTooNew
	}
	for v := range applied {
		if v > p.Latest() {
			return fmt.Errorf("%w: database has version %d, this build knows up to %d", tooNew, v, p.Latest())
		}
	}
	for _, m := range p.Migrations {
		if applied[m.Version] {
			continue
		}
		for _, s := range m.Statements {
			if _, err := q.ExecContext(ctx, s); err != nil {
				return fmt.Errorf("version %d (%s): %w", m.Version, m.Name, err)
			}
		}
		if _, err := q.ExecContext(ctx, p.InsertVersion(), m.Version); err != nil {
			return fmt.Errorf("recording version %d: %w", m.Version, err)
		}
	}
	ok = true
	return nil
}

// LockName returns a GET_LOCK name of prefix and key in hex, as both
// callers name their locks ("outbox_migrate_", "inbox_migrate_").
func LockName(prefix string, key int64) string {
	return prefix + strconv.FormatUint(uint64(key), 16)
}

func appliedVersions(ctx context.Context, q execQueryer, table string) (map[int]bool, error) {
	rows, err := q.QueryContext(ctx, "SELECT version FROM "+table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	got := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		got[v] = true
	}
	return got, rows.Err()
}
