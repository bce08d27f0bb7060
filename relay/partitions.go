package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
)

// ErrPartitionMismatch is returned by Run, and by Ready while it lasts,
// when the relay partitions of a table disagree: the stored count
// (driver.Outbox.PartitionCount) differs from driver.Config.Partitions of
// the relay's Outbox, the lease table has another number of rows, or
// pending rows sit in partitions outside 0..count-1, which no relay can
// own (written by a writer with another count). It is
// driver.ErrPartitionMismatch. Only Repartition changes the count; no
// relay ever resizes the lease table.
var ErrPartitionMismatch = driver.ErrPartitionMismatch

// PartitionObserver is an optional interface of an Observer (RelayMetrics
// implements it). The relay calls PartitionMismatch with an error wrapping
// ErrPartitionMismatch when it detects a mismatch (at start, or while
// running: at a lease heartbeat or a PartitionCheckInterval check), again
// when the details change, and with nil once a check finds the partitions
// consistent again. Like Observer's methods it must not block.
type PartitionObserver interface {
	PartitionMismatch(err error)
}

// dialectOf renders the SQL of ob's dialect and table.
func dialectOf(ob *driver.Outbox) (*dialect.Dialect, error) {
	c := ob.Config()
	d, err := dialect.New(dialect.Name(c.Dialect), c.Table)
	if err != nil { // cannot happen for an Outbox from driver.New
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return d, nil
}

// Ready reports whether the relay is relaying correctly: nil while Run is
// relaying, no partition mismatch is detected and nothing has been failing
// for longer than Config.UnhealthyAfter; an error wrapping
// ErrPartitionMismatch while a mismatch is detected (also after Run
// refused to start because of it); ErrNotRunning before Run started
// relaying and after it returned; an error wrapping ErrUnhealthy while
// the database pings, the broker checks (a HealthChecker Publisher) or the
// relay's cycles have been failing, with no success in between, for
// longer than UnhealthyAfter, or, in the log-only mode (whose events are
// in no table), while the WAL source's stream has not stayed open since
// it failed more than UnhealthyAfter ago (not counting a relay standing
// by while another reads the slot); an error wrapping ErrWALLoss while a
// loss window of the log-only mode is recorded and not acknowledged;
// and Live's error (wrapping ErrStalled)
// while the loop is stuck. A readiness probe (the outbox command's
// /readyz) serves it.
func (r *Relay) Ready() error {
	if err := r.watch.current(); err != nil {
		return err
	}
	if !r.running.Load() {
		return ErrNotRunning
	}
	if err := r.Live(); err != nil {
		return err // a stuck loop publishes nothing
	}
	if err := r.walLossErr(); err != nil {
		return err
	}
	if err := r.walDownErr(time.Now()); err != nil {
		return err
	}
	return r.health.verdict(time.Now(), r.cfg.UnhealthyAfter)
}

// readPartitions reads the stored count through the relay's Outbox (which
// checks it against driver.Config.Partitions), retrying transient
// failures until the relay is stopped (it then returns 0 and nil). A
// verdict (mismatch, schema) is returned at once.
func (r *Relay) readPartitions(ctx context.Context) (int, error) {
	bo := r.loopBackoff()
	for {
		qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
		n, err := r.ob.PartitionCount(qctx, r.db)
		cancel()
		if err == nil {
			return n, nil
		}
		if errors.Is(err, ErrPartitionMismatch) {
			r.watch.set(r, err)
			return 0, err
		}
		if errors.Is(err, dialect.ErrSchemaMissing) || errors.Is(err, dialect.ErrSchemaOutdated) {
			return 0, err
		}
		wait := bo.NextBackOff()
		r.log.Warn("relay cannot read the stored partition count; retrying", "error", err, "retry_in", wait.String())
		select {
		case <-r.stopping:
			return 0, nil
		case <-time.After(wait):
		}
	}
}

// partitionWatch is the relay's current partition verdict.
type partitionWatch struct {
	// running serializes the heartbeat's inspection with the periodic
	// full one, so that a verdict computed from an older out-of-range
	// count cannot overwrite a newer one; the heartbeat skips its own
	// while a full one runs, rather than wait for it.
	running sync.Mutex

	mu         sync.Mutex
	err        error // nil: consistent (as far as checked)
	logged     time.Time
	outOfRange int64 // pending rows outside 0..n-1 at the last full check
}

func (w *partitionWatch) current() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// set records a verdict: logs a new or changed mismatch at ERROR (and
// again every PartitionCheckInterval while it lasts), its end at INFO, and
// tells a PartitionObserver about every change.
func (w *partitionWatch) set(r *Relay, err error) {
	w.mu.Lock()
	prev := w.err
	changed := (prev == nil) != (err == nil) || (err != nil && prev.Error() != err.Error())
	w.err = err
	relog := err != nil && (changed || time.Since(w.logged) >= r.cfg.PartitionCheckInterval)
	if relog {
		w.logged = time.Now()
	}
	w.mu.Unlock()
	switch {
	case relog:
		r.log.Error("relay partition mismatch: some events cannot be published until the writers, relays and lease table agree (see relay.Repartition)",
			"error", err, "instance", r.cfg.InstanceID)
	case changed:
		r.log.Info("relay partition mismatch cleared", "instance", r.cfg.InstanceID)
	}
	if changed {
		if po, ok := r.cfg.Observer.(PartitionObserver); ok {
			po.PartitionMismatch(err)
		}
	}
}

// inspectPartitions compares the table with n, the count the relay runs
// with: the stored count and the lease table always (one query), the
// pending rows outside 0..n-1 when full is set (otherwise the last full
// check's figure stands). It returns the mismatch (nil if none) or the
// database error.
func (r *Relay) inspectPartitions(ctx context.Context, n int, full bool) (mismatch, err error) {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	var stored sql.NullInt64
	var rows, lo, hi int64
	if err := r.db.QueryRowContext(qctx, r.d.Query("partition_check")).Scan(&stored, &rows, &lo, &hi); err != nil {
		return nil, fmt.Errorf("checking the relay partitions of %s: %w", r.table, err)
	}
	r.watch.mu.Lock()
	outOfRange := r.watch.outOfRange
	r.watch.mu.Unlock()
	if full {
		if err := r.db.QueryRowContext(qctx, r.d.Bind(r.d.Query("out_of_range")), n).Scan(&outOfRange); err != nil {
			return nil, fmt.Errorf("counting pending rows outside the relay partitions of %s: %w", r.table, err)
		}
		r.watch.mu.Lock()
		r.watch.outOfRange = outOfRange
		r.watch.mu.Unlock()
	}
	var problems []string
	switch {
	case !stored.Valid:
		problems = append(problems, "the table stores no partition count (run Migrate)")
	case int(stored.Int64) != n:
		problems = append(problems, fmt.Sprintf("the table now stores %d partitions, this relay runs with %d (restart it)", stored.Int64, n))
	}
	if rows != int64(n) || lo != 0 || hi != int64(n-1) {
		problems = append(problems, fmt.Sprintf("the lease table has %d rows (partitions %d..%d), want %d (0..%d); relays never resize it: relay.Repartition does",
			rows, lo, hi, n, n-1))
	}
	if outOfRange > 0 {
		problems = append(problems, fmt.Sprintf("%d pending rows are in partitions outside 0..%d, which no relay owns (written by a writer configured with another count)",
			outOfRange, n-1))
	}
	if len(problems) == 0 {
		return nil, nil
	}
	return fmt.Errorf("%w: table %s: %s", ErrPartitionMismatch, r.table, strings.Join(problems, "; ")), nil
}

// checkPartitions counts the out-of-range pending rows every
// PartitionCheckInterval until ctx ends. It runs beside the heartbeat, not
// in it: over a large backlog the count can take long enough to delay a
// lease renewal.
func (r *Relay) checkPartitions(ctx context.Context, n int) {
	t := time.NewTicker(r.cfg.PartitionCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.watchPartitions(ctx, n, true)
	}
}

// watchPartitions runs one inspection while the relay runs (the cheap one
// after each lease heartbeat, the full one every PartitionCheckInterval)
// and records its verdict; a database error leaves the verdict as it was.
func (r *Relay) watchPartitions(ctx context.Context, n int, full bool) {
	if full {
		r.watch.running.Lock()
	} else if !r.watch.running.TryLock() {
		return // a full inspection, which checks the same and more, is running
	}
	defer r.watch.running.Unlock()
	mismatch, err := r.inspectPartitions(ctx, n, full)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("relay partition check failed; retrying at the next heartbeat", "error", err)
		}
		return
	}
	r.watch.set(r, mismatch)
}
