package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/partition"
)

// ErrNotDrained is returned by Repartition while the table still has
// pending rows or live relay instances.
var ErrNotDrained = errors.New("outbox: repartition needs a drained table and no running relay")

// Repartition changes the relay partition count of ob's table to n: the
// one way to change it (the count is stored in the table; writers and
// relays read it, and no relay resizes the lease table by itself). The
// partition is stored on every row when it is written, so a new count must
// not take effect while rows hashed with the old one are pending:
// otherwise an aggregate's new rows, in a different partition, could be
// published by another relay before its old ones. Repartition is the drain
// barrier that prevents it; the procedure is:
//
//  1. stop the writers (or hold their outbox transactions);
//  2. let the relays publish until no row is pending;
//  3. stop every relay (graceful stops leave the group at once);
//  4. call Repartition with the new count;
//  5. restart the writers and relays: they read the new count from the
//     table (an Outbox caches the count it read; one whose
//     driver.Config.Partitions is set must be set to n, or to 0).
//
// Repartition checks 2 and 3 itself and returns ErrNotDrained otherwise.
// In one transaction it re-hashes dead letters (so a later retry lands in
// the right partition), resizes the lease table and stores n. Then it
// reads the count back through ob (driver.Outbox.PartitionCount), so ob's
// own commit hook uses n; if ob's driver.Config.Partitions is set to
// another count it returns ErrPartitionMismatch (wrapped) after having
// repartitioned. It returns ErrInvalidConfig (wrapped) for a nil ob or db
// or a count outside 1..partition.MaxCount.
func Repartition(ctx context.Context, ob *driver.Outbox, db *sql.DB, n int) (err error) {
	if ob == nil || db == nil {
		return fmt.Errorf("%w: Repartition needs a *driver.Outbox and a *sql.DB", ErrInvalidConfig)
	}
	dd, err := dialectOf(ob)
	if err != nil {
		return err
	}
	if err := partition.Validate(n); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	var pending, live int
	if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+dd.PendingTable()).Scan(&pending); err != nil {
		return fmt.Errorf("outbox: counting pending rows: %w", err)
	}
	if err := tx.QueryRowContext(ctx, dd.Lease("member_count")).Scan(&live); err != nil {
		return fmt.Errorf("outbox: counting relay instances: %w", err)
	}
	if pending > 0 || live > 0 {
		return fmt.Errorf("%w: %d pending rows, %d live relay instances", ErrNotDrained, pending, live)
	}
	rows, err := tx.QueryContext(ctx, "SELECT id, aggregate_type, aggregate_id FROM "+dd.QuotedTable()+" WHERE status = 2")
	if err != nil {
		return fmt.Errorf("outbox: reading dead letters: %w", err)
	}
	type dead struct {
		id        int64
		typ, agID string
	}
	var deads []dead
	for rows.Next() {
		var x dead
		if err := rows.Scan(&x.id, &x.typ, &x.agID); err != nil {
			rows.Close()
			return err
		}
		deads = append(deads, x)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	upd := dd.Bind("UPDATE " + dd.QuotedTable() + " SET partition_key = ? WHERE id = ?")
	for _, x := range deads {
		if _, err := tx.ExecContext(ctx, upd, partition.Of(x.typ, x.agID, n), x.id); err != nil {
			return fmt.Errorf("outbox: re-hashing dead letter %d: %w", x.id, err)
		}
	}
	if _, err := tx.ExecContext(ctx, dd.Bind("DELETE FROM "+dd.LeaseTable()+" WHERE partition_key >= ?"), n); err != nil {
		return fmt.Errorf("outbox: shrinking the lease table: %w", err)
	}
	args := make([]any, n)
	for i := range args {
		args[i] = i
	}
	if _, err := tx.ExecContext(ctx, dd.LeaseInit(n), args...); err != nil {
		return fmt.Errorf("outbox: growing the lease table: %w", err)
	}
	// (MySQL counts a row whose value did not change as unaffected: the
	// read through ob below reports a missing row instead.)
	if _, err := tx.ExecContext(ctx, dd.Bind(dd.Query("set_partitions")), n); err != nil {
		return fmt.Errorf("outbox: storing the partition count: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	if _, err := ob.PartitionCount(ctx, db); err != nil {
		return fmt.Errorf("outbox: repartitioned %s to %d partitions, but: %w", ob.Config().Table, n, err)
	}
	return nil
}
