package dialect

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Errors from Migrate and Check.
var (
	ErrSchemaTooNew      = errors.New("outbox: schema is newer than this build")
	ErrSchemaMissing     = errors.New("outbox: outbox table is missing or not migrated")
	ErrSchemaOutdated    = errors.New("outbox: outbox schema is outdated")
	ErrUnsupportedServer = errors.New("outbox: unsupported database server version")
)

// DDL returns every migration's statements as one script, for teams that
// apply schema changes with their own tool. It does not include the
// migrations bookkeeping table.
func (d *Dialect) DDL() string {
	var b strings.Builder
	for _, m := range d.migrations {
		fmt.Fprintf(&b, "-- outbox schema version %d: %s (%s, table %s)\n", m.Version, m.Name, d.name, d.table)
		for _, s := range m.Statements {
			b.WriteString(s)
			b.WriteString(";\n")
		}
	}
	return b.String()
}

func (d *Dialect) createMigrationsTable() string {
	switch d.name {
	case Postgres:
		return "CREATE TABLE IF NOT EXISTS " + d.MigrationsTable() + " (version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())"
	case MySQL:
		return "CREATE TABLE IF NOT EXISTS " + d.MigrationsTable() + " (version INT PRIMARY KEY, applied_at DATETIME(6) NOT NULL) ENGINE = InnoDB"
	default:
		return "CREATE TABLE IF NOT EXISTS " + d.MigrationsTable() + " (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)"
	}
}

func (d *Dialect) insertVersion() string {
	switch d.name {
	case Postgres:
		return "INSERT INTO " + d.MigrationsTable() + " (version) VALUES ($1) ON CONFLICT DO NOTHING"
	case MySQL:
		return "INSERT IGNORE INTO " + d.MigrationsTable() + " (version, applied_at) VALUES (?, UTC_TIMESTAMP(6))"
	default:
		return "INSERT OR IGNORE INTO " + d.MigrationsTable() + " (version, applied_at) VALUES (?, CAST(unixepoch('subsec') * 1000 AS INTEGER))"
	}
}

type execQueryer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
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

// Migrate applies every migration not yet recorded, under a lock that
// serializes concurrent callers (PostgreSQL: a transaction-scoped advisory
// lock, with transactional DDL; MySQL/MariaDB: GET_LOCK on one connection,
// every statement idempotent since DDL commits implicitly; SQLite: BEGIN
// IMMEDIATE). Running it twice, or from several processes at once, is safe.
// A server older than SupportedVersion allows is refused with
// ErrUnsupportedServer before anything is changed.
func (d *Dialect) Migrate(ctx context.Context, db *sql.DB) (err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("outbox: migrate %s table %s: %w", d.name, d.table, err)
		}
	}()
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	// Refuse an unsupported server before changing anything: the relay
	// would refuse to run on it (Check), and events would pile up.
	var ver string
	if err := conn.QueryRowContext(ctx, d.Query("version")).Scan(&ver); err != nil {
		return fmt.Errorf("reading server version: %w", err)
	}
	if err := SupportedVersion(d.name, ver); err != nil {
		return err
	}
	var q execQueryer = conn
	var finish func(ok bool) error
	switch d.name {
	case Postgres:
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", d.LockKey()); err != nil {
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
		name := "outbox_migrate_" + strconv.FormatUint(uint64(d.LockKey()), 16)
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 60)", name).Scan(&got); err != nil {
			return err
		}
		if got.Int64 != 1 {
			return fmt.Errorf("timed out after 60 s waiting for lock %s held by another migration", name)
		}
		finish = func(bool) error {
			_, err := conn.ExecContext(context.WithoutCancel(ctx), "SELECT RELEASE_LOCK(?)", name)
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
	if _, err := q.ExecContext(ctx, d.createMigrationsTable()); err != nil {
		return err
	}
	applied, err := appliedVersions(ctx, q, d.MigrationsTable())
	if err != nil {
		return err
	}
	for v := range applied {
		if v > d.LatestVersion() {
			return fmt.Errorf("%w: database has version %d, this build knows up to %d", ErrSchemaTooNew, v, d.LatestVersion())
		}
	}
	for _, m := range d.migrations {
		if applied[m.Version] {
			continue
		}
		for _, s := range m.Statements {
			if _, err := q.ExecContext(ctx, s); err != nil {
				return fmt.Errorf("version %d (%s): %w", m.Version, m.Name, err)
			}
		}
		if _, err := q.ExecContext(ctx, d.insertVersion(), m.Version); err != nil {
			return fmt.Errorf("recording version %d: %w", m.Version, err)
		}
	}
	ok = true
	return nil
}

// Version returns the newest applied schema version, or 0 when the
// migrations table does not exist.
func (d *Dialect) Version(ctx context.Context, db *sql.DB) (int, error) {
	var v sql.NullInt64
	err := db.QueryRowContext(ctx, "SELECT MAX(version) FROM "+d.MigrationsTable()).Scan(&v)
	if err != nil {
		// A missing table is the common case of "not migrated"; the probe
		// below tells it apart from a dead connection.
		if perr := db.PingContext(ctx); perr != nil {
			return 0, perr
		}
		return 0, nil
	}
	return int(v.Int64), nil
}

// Check verifies that the server version is supported (PostgreSQL 12+,
// MySQL 8.0+, MariaDB 10.6+, SQLite 3.42+) and that the table is migrated to
// LatestVersion. It returns ErrUnsupportedServer, ErrSchemaMissing,
// ErrSchemaOutdated or ErrSchemaTooNew, wrapped with details.
func (d *Dialect) Check(ctx context.Context, db *sql.DB) error {
	var ver string
	if err := db.QueryRowContext(ctx, d.Query("version")).Scan(&ver); err != nil {
		return fmt.Errorf("outbox: reading server version: %w", err)
	}
	if err := SupportedVersion(d.name, ver); err != nil {
		return err
	}
	v, err := d.Version(ctx, db)
	if err != nil {
		return fmt.Errorf("outbox: reading schema version: %w", err)
	}
	switch {
	case v == 0:
		return fmt.Errorf("%w: table %s (migrate it: driver.Migrate, (*driver.Outbox).Migrate, `outbox migrate apply`, or the DDL from driver.DDL)", ErrSchemaMissing, d.table)
	case v < d.LatestVersion():
		return fmt.Errorf("%w: table %s at version %d, this build needs %d (migrate it: driver.Migrate or `outbox migrate apply`)", ErrSchemaOutdated, d.table, v, d.LatestVersion())
	case v > d.LatestVersion():
		return fmt.Errorf("%w: table %s at version %d, this build knows up to %d", ErrSchemaTooNew, d.table, v, d.LatestVersion())
	}
	return nil
}

// SupportedVersion checks a server version string as the "version" query
// returns it: PostgreSQL's server_version_num (120000 = 12.0), MySQL's or
// MariaDB's VERSION() ("10.11.6-MariaDB-0+deb12u1", "8.0.36"), SQLite's
// sqlite_version(). The minimums come from the features the SQL uses:
// FOR UPDATE SKIP LOCKED (MySQL 8.0, MariaDB 10.6), generated identity
// columns (PostgreSQL 10; 12 is the oldest release the project tests
// against), unixepoch('subsec') (SQLite 3.42).
func SupportedVersion(name Name, ver string) error {
	nums := func(s string) []int {
		var out []int
		for _, p := range strings.Split(s, ".") {
			n, err := strconv.Atoi(strings.TrimLeft(p, " "))
			if err != nil {
				break
			}
			out = append(out, n)
		}
		return out
	}
	atLeast := func(got []int, want ...int) bool {
		for i, w := range want {
			if i >= len(got) {
				return false
			}
			if got[i] != w {
				return got[i] > w
			}
		}
		return true
	}
	bad := func(min string) error {
		return fmt.Errorf("%w: %s %q, need %s or newer", ErrUnsupportedServer, name, ver, min)
	}
	switch name {
	case Postgres:
		n, err := strconv.Atoi(strings.TrimSpace(ver))
		if err != nil || n < 120000 {
			return bad("PostgreSQL 12")
		}
	case MySQL:
		core, _, _ := strings.Cut(ver, "-")
		v := nums(core)
		if strings.Contains(strings.ToLower(ver), "mariadb") {
			if !atLeast(v, 10, 6) {
				return bad("MariaDB 10.6")
			}
		} else if !atLeast(v, 8, 0) {
			return bad("MySQL 8.0")
		}
	case SQLite:
		if !atLeast(nums(ver), 3, 42) {
			return bad("SQLite 3.42")
		}
	}
	return nil
}
