package dialect

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/sqloutbox/outbox/internal/migrate"
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

// plan is Migrate's work for migrate.Run.
func (d *Dialect) plan() migrate.Plan {
	return migrate.Plan{
		Flavor:     string(d.name),
		Table:      d.MigrationsTable(),
		LockKey:    d.LockKey(),
		LockName:   migrate.LockName("outbox_migrate_", d.LockKey()),
		Migrations: d.migrationList(),
		TooNew:     ErrSchemaTooNew,
		// Refuse an unsupported server before changing anything: the
		// relay would refuse to run on it (Check), and events would pile
		// up.
		Before: func(ctx context.Context, conn *sql.Conn) error {
			var ver string
			if err := conn.QueryRowContext(ctx, d.Query("version")).Scan(&ver); err != nil {
				return fmt.Errorf("reading server version: %w", err)
			}
			return SupportedVersion(d.name, ver)
		},
	}
}

func (d *Dialect) migrationList() []migrate.Migration {
	out := make([]migrate.Migration, len(d.migrations))
	for i, m := range d.migrations {
		out[i] = migrate.Migration{Version: m.Version, Name: m.Name, Statements: m.Statements}
	}
	return out
}

// Migrate applies every migration not yet recorded, under a lock that
// serializes concurrent callers (PostgreSQL: a transaction-scoped advisory
// lock, with transactional DDL; MySQL/MariaDB: GET_LOCK on one connection,
// every statement idempotent since DDL commits implicitly; SQLite: BEGIN
// IMMEDIATE; internal/migrate runs it). Running it twice, or from several
// processes at once, is safe. A server older than SupportedVersion allows
// is refused with ErrUnsupportedServer before anything is changed; a table
// migrated by a newer build with ErrSchemaTooNew.
func (d *Dialect) Migrate(ctx context.Context, db *sql.DB) error {
	if err := migrate.Run(ctx, db, d.plan()); err != nil {
		return fmt.Errorf("outbox: migrate %s table %s: %w", d.name, d.table, err)
	}
	return nil
}

// MigrateTo is Migrate up to version (inclusive) only: the schema an
// earlier build would leave, for upgrade tests and for trying an upgrade
// one version at a time. A version above LatestVersion applies them all.
func (d *Dialect) MigrateTo(ctx context.Context, db *sql.DB, version int) error {
	p := d.plan()
	var keep []migrate.Migration
	for _, m := range p.Migrations {
		if m.Version <= version {
			keep = append(keep, m)
		}
	}
	p.Migrations = keep
	if err := migrate.Run(ctx, db, p); err != nil {
		return fmt.Errorf("outbox: migrate %s table %s to version %d: %w", d.name, d.table, version, err)
	}
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
// at least RequiredVersion and at most LatestVersion. It returns ErrUnsupportedServer, ErrSchemaMissing,
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
	case v < d.RequiredVersion():
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
