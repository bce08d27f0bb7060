package driver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"

	"github.com/sqloutbox/outbox/partition"
)

// ErrPartitionMismatch: the relay partition count a component was told
// (Config.Partitions, a relay's lease table, rows already written) differs
// from the count stored in the table's meta row, which Migrate sets and
// only relay.Repartition changes. Writing or relaying with a different
// count would put rows into partitions no relay owns, or split an
// aggregate across two partitions. relay.ErrPartitionMismatch is the same
// value.
var ErrPartitionMismatch = errors.New("outbox: relay partition count differs from the table's")

// PartitionCount reads the relay partition count stored in o's table (the
// <table>_meta row written by Migrate), through db (opened with or without
// the wrapper). It checks the count against Config.Partitions when that is
// set, and remembers it for the commit hook, which otherwise reads it once,
// on the first commit that emitted events, on that transaction's own
// connection. Every call reads the database again (one short query).
//
// It returns an error wrapping ErrSchemaMissing if the table was never
// migrated, ErrSchemaOutdated if it predates the stored count (schema
// version 5 on PostgreSQL and SQLite, 4 on MySQL/MariaDB: run Migrate),
// ErrPartitionMismatch if Config.Partitions is set and differs, or the
// database error.
func (o *Outbox) PartitionCount(ctx context.Context, db *sql.DB) (int, error) {
	var n sql.NullInt64
	err := db.QueryRowContext(ctx, o.dialect.Query("partitions")).Scan(&n)
	if err != nil || !n.Valid {
		return 0, o.countError(ctx, db, err)
	}
	return o.accept(n.Int64)
}

// Check verifies that db's server is supported and that o's table is
// migrated to the schema version this build needs, then reads the stored
// partition count (PartitionCount). Call it at start-up in an application
// that applies the schema with its own migration tool (Migrate does the
// same checks), so that a misconfiguration fails there rather than at the
// first commit. It returns ErrUnsupportedServer, ErrSchemaMissing,
// ErrSchemaOutdated, ErrSchemaTooNew or ErrPartitionMismatch (wrapped), or
// the database error.
func (o *Outbox) Check(ctx context.Context, db *sql.DB) error {
	if err := o.dialect.Check(ctx, db); err != nil {
		return err
	}
	_, err := o.PartitionCount(ctx, db)
	return err
}

// countError explains a failed read of the stored count: the schema is
// missing or too old, or the database failed.
func (o *Outbox) countError(ctx context.Context, db *sql.DB, err error) error {
	if v, verr := o.dialect.Version(ctx, db); verr == nil {
		switch {
		case v == 0:
			return fmt.Errorf("%w: table %s (migrate it: (*driver.Outbox).Migrate, `outbox migrate apply`, or the DDL from driver.DDL)", ErrSchemaMissing, o.cfg.Table)
		case v < o.dialect.LatestVersion():
			return fmt.Errorf("%w: table %s at version %d stores no relay partition count; this build needs version %d (run Migrate)", ErrSchemaOutdated, o.cfg.Table, v, o.dialect.LatestVersion())
		}
	}
	if err == nil || errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: %s has no relay partition count row (run Migrate to restore it)", ErrSchemaOutdated, o.dialect.MetaTable())
	}
	return fmt.Errorf("outbox: reading the relay partition count of %s: %w", o.cfg.Table, err)
}

// accept validates a stored count against Config.Partitions and caches it.
func (o *Outbox) accept(n int64) (int, error) {
	if n < 1 || n > partition.MaxCount {
		return 0, fmt.Errorf("%w: table %s stores %d, outside 1..%d", ErrPartitionMismatch, o.cfg.Table, n, partition.MaxCount)
	}
	if o.cfg.Partitions != 0 && int64(o.cfg.Partitions) != n {
		return 0, fmt.Errorf("%w: configured with %d partitions, table %s stores %d (relay.Repartition changes it; leave Config.Partitions 0 to use the stored count)",
			ErrPartitionMismatch, o.cfg.Partitions, o.cfg.Table, n)
	}
	o.partitions.Store(n)
	return int(n), nil
}

// commitPartitions is the count the commit hook hashes with: cached after
// the first read, which runs on conn, the committing transaction's own
// connection (no second connection, no extra round trip after the first
// commit). A failed read is not cached: the commit fails (and is rolled
// back) and the next one reads again.
func (o *Outbox) commitPartitions(ctx context.Context, c *conn) (int, error) {
	if n := o.partitions.Load(); n > 0 {
		return int(n), nil
	}
	v, ok, err := queryInt(ctx, c, o.dialect.Query("partitions"))
	switch {
	case err != nil:
		return 0, fmt.Errorf("reading the relay partition count from %s (stored by Migrate since schema version %d; run it): %w",
			o.dialect.MetaTable(), o.dialect.LatestVersion(), err)
	case !ok:
		return 0, fmt.Errorf("%w: %s has no relay partition count row (run Migrate)", ErrSchemaOutdated, o.dialect.MetaTable())
	}
	return o.accept(v)
}

// queryInt is queryValue as an integer; ok is false for no row or NULL.
func queryInt(ctx context.Context, c *conn, query string) (v int64, ok bool, err error) {
	x, err := queryValue(ctx, c, query, nil)
	if err != nil {
		return 0, false, err
	}
	switch x := x.(type) {
	case nil:
		return 0, false, nil
	case int64:
		return x, true, nil
	case float64:
		return int64(x), true, nil
	case []byte:
		v, err = strconv.ParseInt(string(x), 10, 64)
	case string:
		v, err = strconv.ParseInt(x, 10, 64)
	default:
		return 0, false, fmt.Errorf("unexpected %T for an integer column", x)
	}
	if err != nil {
		return 0, false, err
	}
	return v, true, nil
}
