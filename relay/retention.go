package relay

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
)

// Retention defaults, from the seed article.
const (
	// DefaultRetention keeps sent rows 7 days.
	DefaultRetention = 7 * 24 * time.Hour
	// DefaultRetentionBatch is the most rows one retention transaction
	// touches; MaxRetentionBatch the most it may be set to.
	DefaultRetentionBatch = 1000
	MaxRetentionBatch     = 1000
	// DefaultRetentionInterval is how often Run looks for expired rows.
	DefaultRetentionInterval = time.Minute
)

// RetentionConfig configures a Retention.
type RetentionConfig struct {
	// After is how long sent rows are kept, counted from when they were
	// written (created_at, database clock): a row is removed by the first
	// pass after it is both sent and older than After. Since the pending
	// set (schema version 9 on PostgreSQL, 8 on SQLite, 6 on
	// MySQL/MariaDB) a row sent at its first attempt records no send time.
	// A message ID can be used again (driver.DuplicateIDError until then)
	// once its row is removed. Default DefaultRetention (7 days).
	After time.Duration
	// BatchSize is the most rows per transaction, 1..MaxRetentionBatch.
	// Default DefaultRetentionBatch.
	BatchSize int
	// Archive moves rows to <table>_archive (created by Migrate) instead
	// of deleting them.
	Archive bool
	// Interval is Run's period. Default DefaultRetentionInterval.
	Interval time.Duration
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// Retention deletes (or archives) sent rows older than After, in small
// batches, each its own short transaction touching only sent rows by
// primary key, so it never blocks writers (who insert new ids) or the
// relay (which reads and updates unsent rows), nor waits for them. Pending
// and dead rows are never touched. (On MySQL/MariaDB the primary key is
// forced, at most 500 ids per statement: MariaDB otherwise scanned the
// table for a few hundred ids and locked every row and gap.)
type Retention struct {
	db  *sql.DB
	cfg RetentionConfig
	d   *dialect.Dialect
	log *slog.Logger
}

// NewRetention returns a Retention of ob's table over db. It does not
// touch the database; it returns ErrInvalidConfig (wrapped) for a nil ob or
// db or an out-of-range setting.
func NewRetention(ob *driver.Outbox, db *sql.DB, cfg RetentionConfig) (*Retention, error) {
	if ob == nil {
		return nil, fmt.Errorf("%w: NewRetention needs a *driver.Outbox", ErrInvalidConfig)
	}
	if cfg.After == 0 {
		cfg.After = DefaultRetention
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultRetentionBatch
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultRetentionInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if db == nil || cfg.After < 0 || cfg.BatchSize < 1 || cfg.BatchSize > MaxRetentionBatch || cfg.Interval < 0 {
		return nil, fmt.Errorf("%w: retention needs a db, After >= 0, BatchSize 1..%d, Interval >= 0", ErrInvalidConfig, MaxRetentionBatch)
	}
	d, err := dialectOf(ob)
	if err != nil {
		return nil, err
	}
	return &Retention{db: db, cfg: cfg, d: d, log: cfg.Logger.With("component", "outbox.retention", "table", ob.Config().Table)}, nil
}

// RunOnce removes every expired sent row, one batch per transaction, and
// returns how many it removed. It stops early, returning what it did and
// the error, if ctx ends or the database fails.
func (r *Retention) RunOnce(ctx context.Context) (int64, error) {
	var total int64
	for {
		n, err := r.batch(ctx)
		total += n
		if err != nil {
			return total, err
		}
		if n < int64(r.cfg.BatchSize) {
			return total, nil
		}
	}
}

func (r *Retention) batch(ctx context.Context) (int64, error) {
	rows, err := r.db.QueryContext(ctx, r.d.WithSelector("retention_batch", "", r.cfg.BatchSize), r.cfg.After.Microseconds())
	if err != nil {
		return 0, fmt.Errorf("outbox: retention: finding expired rows: %w", err)
	}
	var ids []any
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(ids) == 0 {
		return 0, err
	}
	// MySQL/MariaDB: READ COMMITTED, so that the delete trigger's probe of
	// the pending set for a sent row (no entry there) takes no gap lock,
	// which under REPEATABLE READ would hold up writers adding pending
	// entries above it (with an empty pending set, every writer) until
	// this transaction commits.
	var opts *sql.TxOptions
	if r.d.Name() == dialect.MySQL {
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	tx, err := r.db.BeginTx(ctx, opts)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	if r.cfg.Archive {
		for _, c := range dialect.Chunks(len(ids), r.d.MaxIDs("retention_archive")) {
			if _, err := tx.ExecContext(ctx, r.d.WithIDs("retention_archive", c[1]-c[0]), ids[c[0]:c[1]]...); err != nil {
				return 0, fmt.Errorf("outbox: retention: archiving: %w", err)
			}
		}
	}
	var n int64
	for _, c := range dialect.Chunks(len(ids), r.d.MaxIDs("retention_delete")) {
		res, err := tx.ExecContext(ctx, r.d.WithIDs("retention_delete", c[1]-c[0]), ids[c[0]:c[1]]...)
		if err != nil {
			return 0, fmt.Errorf("outbox: retention: deleting: %w", err)
		}
		k, _ := res.RowsAffected()
		n += k
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	return n, nil
}

// Run calls RunOnce every Interval until ctx ends, logging failures, and
// returns nil then.
func (r *Retention) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		if n, err := r.RunOnce(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("retention pass failed; retrying next interval", "removed", n, "error", err)
		} else if n > 0 {
			r.log.Info("retention pass", "removed", n, "archive", r.cfg.Archive)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
