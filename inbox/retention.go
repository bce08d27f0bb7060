package inbox

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

// Retention defaults (the outbox's, from the seed article).
const (
	// DefaultRetentionWindow keeps processed rows 7 days: the dedupe
	// window. A message redelivered (or replayed) after its row was
	// deleted is applied again.
	DefaultRetentionWindow = 7 * 24 * time.Hour
	// DefaultRetentionBatch is the most rows one retention transaction
	// deletes; MaxRetentionBatch the most it may be set to.
	DefaultRetentionBatch = 1000
	MaxRetentionBatch     = 1000
	// DefaultRetentionInterval is how often Run looks for expired rows.
	DefaultRetentionInterval = time.Minute
)

// RetentionConfig configures a Retention.
type RetentionConfig struct {
	// Window is how long processed and skipped rows are kept, by the time
	// they were processed (database clock): the dedupe window. Default
	// DefaultRetentionWindow (7 days); at least 1 s.
	Window time.Duration
	// BatchSize is the most rows per transaction, 1..MaxRetentionBatch.
	// Default DefaultRetentionBatch.
	BatchSize int
	// Interval is Run's period, at least 1 ms. Default DefaultRetentionInterval.
	Interval time.Duration
}

// Retention deletes the consumer's processed and skipped rows older than
// the window, in batches: each batch reads up to BatchSize expired ids and
// deletes them by primary key in one short transaction, so it never holds
// locks long nor blocks Handle. Parked and held rows are never deleted.
// Create it with (*Inbox).Retention.
type Retention struct {
	in  *Inbox
	db  *sql.DB
	cfg RetentionConfig
}

// Retention returns a Retention of the consumer's rows in db. It does not
// touch the database; it returns ErrInvalidConfig (wrapped) for a nil db or
// an out-of-range setting.
func (in *Inbox) Retention(db *sql.DB, cfg RetentionConfig) (*Retention, error) {
	if cfg.Window == 0 {
		cfg.Window = DefaultRetentionWindow
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultRetentionBatch
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultRetentionInterval
	}
	if db == nil || cfg.Window < time.Second || cfg.BatchSize < 1 || cfg.BatchSize > MaxRetentionBatch || cfg.Interval < time.Millisecond {
		return nil, fmt.Errorf("%w: retention needs a db, Window >= 1s, BatchSize 1..%d, Interval >= 1ms", ErrInvalidConfig, MaxRetentionBatch)
	}
	return &Retention{in: in, db: db, cfg: cfg}, nil
}

// RunOnce deletes every expired row, one batch per transaction, and
// returns how many it deleted. It stops early, returning what it did and
// the error (wrapped), if ctx ends or the database fails.
func (r *Retention) RunOnce(ctx context.Context) (int, error) {
	total := 0
	for {
		n, full, err := r.batch(ctx)
		total += n
		if err != nil || !full {
			return total, err
		}
	}
}

func (r *Retention) batch(ctx context.Context) (deleted int, full bool, err error) {
	s := r.in.s
	rows, err := r.db.QueryContext(ctx, s.q("retention_select", fmt.Sprintf(" LIMIT %d", r.cfg.BatchSize)), r.in.cfg.Consumer, r.cfg.Window.Microseconds())
	if err != nil {
		return 0, false, fmt.Errorf("inbox: retention: finding expired rows: %w", err)
	}
	var ids []any
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, false, fmt.Errorf("inbox: retention: finding expired rows: %w", err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, false, fmt.Errorf("inbox: retention: finding expired rows: %w", err)
	}
	if len(ids) == 0 {
		return 0, false, nil
	}
	list := " (" + strings.TrimSuffix(strings.Repeat("?, ", len(ids)), ", ") + ")"
	res, err := r.db.ExecContext(ctx, s.q("retention_delete", list), ids...)
	if err != nil {
		return 0, false, fmt.Errorf("inbox: retention: deleting: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, false, fmt.Errorf("inbox: retention: deleting: %w", err)
	}
	return int(n), len(ids) == r.cfg.BatchSize, nil
}

// Run calls RunOnce every Interval until ctx ends, logging failures, and
// returns nil then.
func (r *Retention) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		if n, err := r.RunOnce(ctx); err != nil && ctx.Err() == nil {
			r.in.log.Warn("inbox retention pass failed; retrying next interval", "deleted", n, "error", err)
		} else if n > 0 {
			r.in.log.Info("inbox retention pass", "deleted", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
