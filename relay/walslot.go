package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sqloutbox/outbox/internal/sqlerr"
)

// A slot the server cannot read.
//
// PostgreSQL 15 can create a logical slot that its own decoder cannot
// read: every read fails with "could not map filenode ... to relation
// OID" (SQLSTATE XX000, an internal error raised by the decoder, not by
// the output plugin), at the same record, for ever. Measured here: a
// slot created while six other sessions created, filled and dropped
// tables in a loop could not be read in 2 of 30, 2 of 100 and (on a
// private server) 5 of 200 creations; without the drops, in none of 30
// (docs/wal.md). In every case the failing record was in the WAL the
// slot's first read covered once the transactions running at its
// creation had ended, and a second read 300 ms later found no slot that
// the first had passed.
//
// So a slot the relay or CreateWAL creates is read once before it is
// used (checkSlot): once the transactions running at its creation have
// ended (at most slotCheckWait), pg_logical_slot_peek_binary_changes
// decodes it up to the server's current position, and a decoder error
// means the slot is dropped and created again (slotCreateAttempts in
// all); it is recorded (log-only mode's state table) before it is read,
// so that a slot dropped as unreadable leaves its window recorded
// whatever fails next. A slot that fails later, at the same position in
// every stream for unreadableAfter (a record the first read did not
// reach; a slot created before this check existed, or by hand), is read
// once more under an advisory lock of the slot's (two relays must not
// both recreate it, the second dropping the first's new slot) and, if it
// still fails, dropped and created again by the relay holding the lock.
// In table mode nothing is lost: the rows are in the table, and the new
// stream starts with a claim. In
// log-only mode the events of the window between the old slot's last
// recorded position and the new slot's start cannot be read by anyone;
// the window is recorded as a loss (walstate.go: the relays are not
// ready until `outbox wal ack-loss`), as for a dropped slot: before
// this, such a slot kept its events, and every later one, from being
// relayed, and kept the server's WAL, until an operator dropped it.
//
// A slot fails the same way when a change of any table was committed
// while its publication did not exist (an operator dropped it under a
// running relay): pgoutput raises "publication ... does not exist"
// (42704) at that change in every read, even once the publication exists
// again (decoderFailure), and the same path recreates the slot.

// ErrSlotUnreadable is wrapped, with ErrWALUnavailable and the server's
// error, by the WAL source's errors when PostgreSQL's logical decoder
// fails on the slot (SQLSTATE XX000, "could not map filenode ... to
// relation OID"; or 42704, "publication ... does not exist", raised by
// pgoutput at a change committed while the publication was missing; see
// docs/wal.md, "A slot the server cannot read"):
// CreateWAL returns it when slotCreateAttempts slots in a row could not
// be read; a relay recreates such a slot by itself.
var ErrSlotUnreadable = errors.New("outbox relay: PostgreSQL's logical decoder cannot read the replication slot")

const (
	// slotCheckWait bounds how long checkSlot waits for the
	// transactions that were running when the slot was created (a long
	// transaction left open elsewhere must not stop the relay): past it,
	// the slot is read as far as the WAL goes.
	slotCheckWait = 5 * time.Second
	// slotCreateAttempts is how many slots are created, each read once,
	// before the creation gives up with ErrSlotUnreadable (three slots in
	// a row unreadable at ~2 % each is unlikely; a server that fails
	// every one has another problem).
	slotCreateAttempts = 3
	// unreadableAfter is how long a slot's streams must keep failing with
	// a decoder error at the same position before the relay recreates
	// the slot: an internal error that goes away (memory) must not cost
	// log-only events a loss window.
	unreadableAfter = 30 * time.Second
)

// unreadable wraps err (an error reading the slot) in ErrSlotUnreadable
// and ErrWALUnavailable if it is a decoder failure (decoderFailure), and
// returns it as it is otherwise.
func unreadable(err error) error {
	if err == nil || errors.Is(err, ErrSlotUnreadable) || !decoderFailure(err) {
		return err
	}
	if errors.Is(err, ErrWALUnavailable) {
		return fmt.Errorf("%w: %w", ErrSlotUnreadable, err)
	}
	return fmt.Errorf("%w: %w: %w", ErrWALUnavailable, ErrSlotUnreadable, err)
}

// decoderFailure reports whether err, from a read of a slot, is one that
// repeats at the same record in every read:
//   - SQLSTATE XX000, an internal error of the decoder ("could not map
//     filenode ... to relation OID");
//   - SQLSTATE 42704, "publication ... does not exist", raised by pgoutput
//     in a change callback (the error's context names the output plugin):
//     a change of some table was committed while the publication did not
//     exist (an operator dropped it under a running relay, which created
//     it again). pgoutput looks the publication up in the catalog as of
//     that change, so the record fails in every read, whatever exists now
//     (PostgreSQL 15; PostgreSQL 18 skips a missing publication with a
//     warning instead). The relay creates a missing publication before
//     each stream, so when the failure repeats (unreadableWatch) and a
//     read under the slot's lock fails again (stillUnreadable), the
//     publication exists and the record is the historic one.
func decoderFailure(err error) bool {
	switch sqlerr.PostgresCode(err) {
	case "XX000":
		return true
	case "42704":
		return strings.Contains(sqlerr.PostgresWhere(err), "output plugin")
	}
	return false
}

// decoderError is the server's message and SQLSTATE in err (a decoder
// error: unreadable), or err's text if it holds no server error.
func decoderError(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Message + " (SQLSTATE " + pe.Code + ")"
	}
	return err.Error()
}

// queryOne runs q and returns the first column of its one row as text.
type queryOne func(ctx context.Context, q string) (string, error)

// dbQuery is queryOne on a pool.
func dbQuery(db *sql.DB) queryOne {
	return func(ctx context.Context, q string) (string, error) {
		var s string
		err := db.QueryRowContext(ctx, q).Scan(&s)
		return s, err
	}
}

// pgconnQuery is queryOne on a (replication) connection: simple queries.
func pgconnQuery(conn *pgconn.PgConn) queryOne {
	return func(ctx context.Context, q string) (string, error) {
		res, err := conn.Exec(ctx, q).ReadAll()
		if err != nil {
			return "", err
		}
		if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) == 0 {
			return "", fmt.Errorf("no row from %q", q)
		}
		return string(res[0].Rows[0][0]), nil
	}
}

// checkSlot reads slot (created a moment ago) once: it waits until the
// transactions running now have ended (slotCheckWait at most) and
// decodes the slot up to the server's current position without consuming
// it (pg_logical_slot_peek_binary_changes, pgoutput with publication pub:
// whatever the source reads: the decoder maps every change of every
// table before the output plugin filters them). It returns nil if the slot
// can be read, an error wrapping ErrSlotUnreadable if the decoder fails
// on it, and another error if the check could not run.
func checkSlot(ctx context.Context, q queryOne, slot, pub string) error {
	snap, err := q(ctx, "SELECT pg_current_snapshot()::text")
	if err != nil {
		return fmt.Errorf("reading slot %s once: %w", slot, err)
	}
	running := "SELECT count(*) FROM pg_snapshot_xip(" + sqlLiteral(snap) + "::pg_snapshot) AS x(xid) WHERE pg_xact_status(x.xid) = 'in progress'"
	until := time.Now().Add(slotCheckWait)
	for {
		n, err := q(ctx, running)
		if err != nil {
			return fmt.Errorf("reading slot %s once: %w", slot, err)
		}
		if n == "0" || time.Now().After(until) {
			break
		}
		t := time.NewTimer(2 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	return peekSlot(ctx, q, slot, pub)
}

// peekSlot decodes slot up to the server's current position without
// consuming it (pgoutput, publication pub). It returns nil, an error
// wrapping ErrSlotUnreadable if the decoder fails on the slot, or another
// error (a reader holds the slot: 55006).
func peekSlot(ctx context.Context, q queryOne, slot, pub string) error {
	peek := "SELECT count(*) FROM pg_logical_slot_peek_binary_changes(" + sqlLiteral(slot) +
		", pg_current_wal_lsn(), NULL, 'proto_version', '1', 'publication_names', " + sqlLiteral(pub) + ")"
	if _, err := q(ctx, peek); err != nil {
		return unreadable(fmt.Errorf("reading slot %s once: %w", slot, err))
	}
	return nil
}

// stillUnreadable runs before the reader drops a slot whose streams kept
// failing (walReader.recreate). Under an advisory lock of the slot's
// (pg_try_advisory_lock, on conn's session: two relays that both decided
// to recreate the slot must not both do it, the second dropping the
// first's new slot), it reads the slot once more (peekSlot). It returns
// true and the lock's release if the decoder still fails on it; false if
// the slot can be read now (another relay recreated it meanwhile, or the
// failure passed), the lock released; and an error wrapping
// ErrWALUnavailable, the slot not to be dropped now, if another relay
// holds the lock, a reader holds the slot (55006: run's standby and
// fence), or the read could not run.
func (w *walReader) stillUnreadable(ctx context.Context, conn *pgconn.PgConn) (bool, func(), error) {
	q := pgconnQuery(conn)
	key := "hashtext('outbox relay slot'), hashtext(" + sqlLiteral(w.cfg.Slot) + ")"
	got, err := q(ctx, "SELECT pg_try_advisory_lock("+key+")")
	if err != nil {
		return false, nil, fmt.Errorf("%w: locking slot %s to recreate it: %w", ErrWALUnavailable, w.cfg.Slot, err)
	}
	if got != "t" {
		return false, nil, fmt.Errorf("%w: slot %s is being recreated by another relay", ErrWALUnavailable, w.cfg.Slot)
	}
	release := func() {
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, _ = q(rctx, "SELECT pg_advisory_unlock("+key+")")
	}
	err = peekSlot(ctx, q, w.cfg.Slot, w.cfg.Publication)
	switch {
	case err == nil:
		release()
		return false, nil, nil
	case errors.Is(err, ErrSlotUnreadable):
		return true, release, nil
	}
	release()
	return false, nil, fmt.Errorf("%w: reading slot %s before recreating it: %w", ErrWALUnavailable, w.cfg.Slot, err)
}

// unreadableWatch decides when a slot whose streams keep failing with a
// decoder error is to be recreated: after failures at the same position
// for unreadableAfter. Used by the reader's run goroutine only.
type unreadableWatch struct {
	after time.Duration
	at    pglogrepl.LSN // the position the failing streams started at
	since time.Time     // the first failure there
	n     int
}

// failed records a stream's end (err; pos is the position confirmed when
// it ended) and returns whether the slot is to be recreated now.
func (u *unreadableWatch) failed(err error, pos pglogrepl.LSN, now time.Time) bool {
	if pos != u.at {
		u.at, u.n = pos, 0 // the streams read on: another record, if any
	}
	if !errors.Is(err, ErrSlotUnreadable) {
		return false
	}
	if u.n == 0 {
		u.since = now
	}
	u.n++
	return u.n >= 3 && now.Sub(u.since) >= u.after
}
