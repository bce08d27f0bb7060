package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/logmsg"
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
// In the log-only mode (driver.Config.LogOnly) step 2 includes the
// replication slot: events committed while no relay reads it are in no
// table, and they carry the partition of the count they were written
// with. Repartition checks 2 and 3 itself, the slots recorded for the
// table included (it peeks each one for the table's logical decoding
// messages; that needs the REPLICATION attribute and the slot released by
// its reader), and returns ErrNotDrained otherwise.
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
	if ob.Config().Dialect == driver.Postgres { // the only dialect with the WAL source
		if err := slotsDrained(ctx, db, ob.Config().Table, dd.WALLogTable(), dd.QuotedTable()); err != nil {
			return err
		}
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

// slotsDrained returns nil unless a replication slot recorded in the
// log-only mode's state table (walLog, if it exists) still holds a logical
// decoding message of table's events past its confirmed position:
// ErrNotDrained then (wrapped), or when a slot cannot be peeked (in use by
// a reader; no REPLICATION attribute; no publication of the table, which
// pgoutput needs). quoted is the table's quoted name.
func slotsDrained(ctx context.Context, db *sql.DB, table, walLog, quoted string) error {
	var exists bool
	if err := db.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL", walLog).Scan(&exists); err != nil {
		return fmt.Errorf("outbox: looking for %s: %w", walLog, err)
	}
	if !exists {
		return nil // the log-only mode never ran on this table
	}
	slots, err := scanColumn[string](db.QueryContext(ctx, "SELECT w.slot_name FROM "+walLog+" w JOIN pg_replication_slots s ON s.slot_name = w.slot_name AND s.database = current_database() ORDER BY 1"))
	if err != nil || len(slots) == 0 {
		if err != nil {
			err = fmt.Errorf("outbox: reading the slots recorded in %s: %w", walLog, err)
		}
		return err
	}
	pubs, err := scanColumn[string](db.QueryContext(ctx, `SELECT p.pubname FROM pg_publication p
		WHERE p.puballtables OR EXISTS (SELECT 1 FROM pg_publication_rel r WHERE r.prpubid = p.oid AND r.prrelid = $1::regclass)
		ORDER BY p.puballtables, 1 LIMIT 1`, quoted))
	if err != nil {
		return fmt.Errorf("outbox: looking for a publication of %s: %w", table, err)
	}
	if len(pubs) == 0 {
		return fmt.Errorf("%w: slots %v may hold log-only events of %s, and without a publication of the table they cannot be read to check (a relay with the WAL source creates it)", ErrNotDrained, slots, table)
	}
	// A pgoutput message: 'M', flags (1 byte), LSN (8), the prefix ending
	// in a zero byte, the content's length and the content.
	prefix := append([]byte(logmsg.Prefix(table)), 0)
	for _, slot := range slots {
		var n int64
		err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
				'proto_version', '1', 'publication_names', $2, 'messages', 'true') c
			WHERE get_byte(c.data, 0) = 77 AND substring(c.data FROM 11 FOR $3) = $4`, slot, pubs[0], len(prefix), prefix).Scan(&n)
		if err != nil {
			return fmt.Errorf("%w: reading slot %s for log-only events not yet published (stop its relays; the role needs REPLICATION): %w", ErrNotDrained, slot, err)
		}
		if n > 0 {
			return fmt.Errorf("%w: slot %s holds %d transactions of log-only events not yet published: run a relay until it has caught up, then stop it", ErrNotDrained, slot, n)
		}
	}
	return nil
}
