package relay

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/logmsg"
)

// The log-only mode's loss guard (driver.Config.LogOnly).
//
// In log-only mode an event exists only in the WAL until the relay
// publishes it or writes it to the table, and the server keeps that WAL
// only for the replication slots that exist. If the slot is dropped, or
// invalidated by max_slot_wal_keep_size, while it holds events the relay
// has not confirmed, those events are gone. Nothing can bring them back;
// what the relay must do is never go on silently. So the relay keeps, per
// slot, the last position it confirmed in a small table of its own
// (<table>_wal_log, created by the relay or by CreateWAL; Migrate does not
// know the mode): every StatusInterval while it streams, one UPDATE. When
// it finds its slot missing or lost and that table has a row for it, it
// creates the slot again (so that no more events are lost), records the
// window between the last recorded position and the new slot's start as
// a loss, logs it at ERROR, and from then on every relay of the table
// reports itself not ready (ErrWALLoss), the metric
// outbox_relay_wal_loss is 1, `outbox wal status` and the admin page show
// the window, until an operator acknowledges it (AckWALLoss, `outbox wal
// ack-loss`). The window is conservative: it may hold no event at all
// (the position is recorded once a second), never fewer than were lost.
// A slot missing with no row is a first start, not a loss; the writers
// refuse to commit events while no slot exists (driver.ErrNoSlot).

// ErrWALLoss is wrapped by Ready while a loss window of the log-only mode
// is recorded and not acknowledged (WALLoss, AckWALLoss).
var ErrWALLoss = errors.New("outbox relay: events of the log-only mode may have been lost (the replication slot was dropped or invalidated)")

// WALLoss is a recorded loss window of the log-only mode: the slot was
// missing or invalidated, so events committed after From (the last
// position the relay recorded as confirmed) and before To (the position
// the recreated slot starts at) were not kept by the server.
type WALLoss struct {
	Slot     string
	From, To string // LSNs, PostgreSQL's text form (0/16B3748)
	At       time.Time
	// Reason is "missing (dropped)", "invalidated (wal_status lost)",
	// WALLossUnreadableAtCreation, or "unreadable by the server (<the
	// decoder's error>)" for a slot whose reads kept failing (walslot.go).
	Reason string
}

// WALLossUnreadableAtCreation is the WALLoss.Reason of a window recorded
// because a slot just created could not be read by the server's decoder
// and was created again (ErrSlotUnreadable; docs/wal.md): log-only
// writers may have emitted into the slot dropped in the moment between.
// A process that knows no log-only writer ran meanwhile (an operator's
// `outbox wal create` before the writers start) may acknowledge it at
// once (AckWALLoss).
const WALLossUnreadableAtCreation = "unreadable by the server when created"

// WALLossObserver is an optional interface of an Observer (package
// metrics' RelayMetrics implements it: outbox_relay_wal_loss). A relay
// whose Outbox is log-only calls WALLoss every Config.HealthInterval with
// the recorded, unacknowledged loss window, or nil when there is none.
type WALLossObserver interface {
	WALLoss(*WALLoss)
}

// walLogState is the reader's side of the loss guard.
type walLogState struct {
	table string // <table>_wal_log, quoted
	log   *slog.Logger

	mu       sync.Mutex
	recorded pglogrepl.LSN
}

// walLogTableDDL creates the state table (idempotent).
func walLogTableDDL(table string) string {
	return "CREATE TABLE IF NOT EXISTS " + table + ` (
    slot_name     TEXT        NOT NULL PRIMARY KEY,
    confirmed_lsn PG_LSN      NOT NULL,
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    loss_from     PG_LSN,
    loss_to       PG_LSN,
    loss_at       TIMESTAMPTZ,
    loss_reason   TEXT
)`
}

// prepare runs in ensureSlot on the replication connection (simple
// queries), before the slot is looked at: it creates the state table.
func (s *walLogState) prepare(ctx context.Context, conn *pgconn.PgConn) error {
	// Look first: CREATE TABLE IF NOT EXISTS needs CREATE on the schema
	// even when the table exists, and a relay's role made with `outbox wal
	// create` ahead need not have it.
	res, err := conn.Exec(ctx, "SELECT to_regclass("+sqlLiteral(s.table)+") IS NOT NULL").ReadAll()
	if err == nil && len(res) == 1 && len(res[0].Rows) == 1 && string(res[0].Rows[0][0]) == "t" {
		return nil
	}
	if _, err := conn.Exec(ctx, walLogTableDDL(s.table)).ReadAll(); err != nil {
		return fmt.Errorf("%w: log-only mode keeps its slot's position in %s and could not create it (create it with `outbox wal create` as the table's owner): %v", ErrWALUnavailable, s.table, err)
	}
	return nil
}

// slotFound records the position of a slot that exists (a row for it if
// there was none).
func (s *walLogState) slotFound(ctx context.Context, conn *pgconn.PgConn, slot string, at pglogrepl.LSN) error {
	if _, err := conn.Exec(ctx, slotFoundSQL(s.table, slot, at.String())).ReadAll(); err != nil {
		return fmt.Errorf("%w: recording slot %s in %s: %v", ErrWALUnavailable, slot, s.table, err)
	}
	return nil
}

// slotFoundSQL is the statement that records slot at position at (an LSN's
// text) in the state table if it has no row for it.
func slotFoundSQL(table, slot, at string) string {
	return "INSERT INTO " + table + " (slot_name, confirmed_lsn) VALUES (" + sqlLiteral(slot) + ", " + sqlLiteral(at) +
		") ON CONFLICT (slot_name) DO NOTHING"
}

// slotCreatedSQL is the statement that records, for a slot just created at
// start (an LSN's text) where the state table has a row for it (the slot
// existed and is gone: reason), the window from the recorded position to
// start as a loss (the first window stays until acknowledged; a later one
// widens it to the new start), and start as the slot's position. It
// returns the window (loss_from, loss_to), or no row when the table had
// none for the slot (slotFoundSQL then records it).
func slotCreatedSQL(table, slot, reason, start string) string {
	return "UPDATE " + table + " SET loss_from = COALESCE(loss_from, confirmed_lsn), loss_to = " + sqlLiteral(start) +
		", loss_at = COALESCE(loss_at, clock_timestamp()), loss_reason = COALESCE(loss_reason, " + sqlLiteral(reason) +
		"), confirmed_lsn = " + sqlLiteral(start) + ", updated_at = clock_timestamp() WHERE slot_name = " + sqlLiteral(slot) +
		" RETURNING loss_from::text, loss_to::text"
}

// slotCreated runs after the slot was created at start (its consistent
// point). If the table had a row for the slot, the slot was dropped or
// invalidated (reason): the window from the recorded position to start is
// recorded as a loss (the first window stays until acknowledged; a later
// one widens it to the new start) and logged at ERROR.
func (s *walLogState) slotCreated(ctx context.Context, conn *pgconn.PgConn, slot, reason string, start pglogrepl.LSN) error {
	res, err := conn.Exec(ctx, slotCreatedSQL(s.table, slot, reason, start.String())).ReadAll()
	if err != nil {
		return fmt.Errorf("%w: recording slot %s in %s: %v", ErrWALUnavailable, slot, s.table, err)
	}
	if len(res) == 1 && len(res[0].Rows) == 1 {
		s.log.Error("log-only mode: the replication slot was "+reason+" while it may have held events not yet published; "+
			"events committed in the window were not kept by the server and cannot be relayed. The relay goes on with a new slot and reports itself not ready until the loss is acknowledged (outbox wal ack-loss)",
			"slot", slot, "from_lsn", string(res[0].Rows[0][0]), "to_lsn", string(res[0].Rows[0][1]))
		return nil
	}
	return s.slotFound(ctx, conn, slot, start)
}

// record stores lsn as the slot's confirmed position if it moved since
// the last record (one UPDATE; the relay's pool, not the replication
// connection, which is streaming).
func (s *walLogState) record(ctx context.Context, db *sql.DB, slot string, lsn pglogrepl.LSN) error {
	s.mu.Lock()
	same := lsn <= s.recorded
	s.mu.Unlock()
	if same || lsn == 0 {
		return nil
	}
	if _, err := db.ExecContext(ctx, "UPDATE "+s.table+" SET confirmed_lsn = $2::pg_lsn, updated_at = clock_timestamp() WHERE slot_name = $1 AND confirmed_lsn < $2::pg_lsn",
		slot, lsn.String()); err != nil {
		return fmt.Errorf("recording the slot's position in %s: %w", s.table, err)
	}
	s.mu.Lock()
	s.recorded = max64(s.recorded, lsn)
	s.mu.Unlock()
	return nil
}

// readWALLoss returns the unacknowledged loss window recorded for slot in
// table, or nil. A missing state table is no loss.
func readWALLoss(ctx context.Context, db *sql.DB, table, slot string) (*WALLoss, error) {
	var l WALLoss
	err := db.QueryRowContext(ctx, "SELECT loss_from::text, loss_to::text, loss_at, COALESCE(loss_reason, '') FROM "+table+
		" WHERE slot_name = $1 AND loss_from IS NOT NULL", slot).Scan(&l.From, &l.To, &l.At, &l.Reason)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, nil
	case err != nil:
		var exists bool
		if db.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists) == nil && !exists {
			return nil, nil
		}
		return nil, fmt.Errorf("reading the loss windows of slot %s: %w", slot, err)
	}
	l.Slot = slot
	return &l, nil
}

// runLogState records the slot's confirmed position every StatusInterval
// and reads the loss window every HealthInterval (Ready, the observer, an
// ERROR line once a minute while it stands) until ctx ends.
func (r *Relay) runLogState(ctx context.Context) {
	rec := time.NewTicker(r.cfg.WAL.StatusInterval)
	defer rec.Stop()
	check := time.NewTicker(r.cfg.HealthInterval)
	defer check.Stop()
	lo, _ := r.cfg.Observer.(WALLossObserver)
	var lastLog time.Time
	// At WARN, not DEBUG: while the state table cannot be read or
	// written (dropped by hand: found by a helper), a lost slot's window
	// is not measured, and the relays cannot report it.
	stateLog := newRepeatLog(r.log, slog.LevelWarn, "log-only mode: the slot's state table cannot be read or written; a lost slot's window cannot be recorded meanwhile (a table dropped by hand is created again at the relay's next stream)")
	read := func() {
		_, slot, _ := r.wal.lagState()
		if slot == "" {
			return
		}
		qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
		loss, err := readWALLoss(qctx, r.db, r.d.WALLogTable(), slot)
		cancel()
		if err != nil {
			stateLog.failed(err, "table", r.d.WALLogTable(), "reading", "loss windows")
			return
		}
		r.walLoss.Store(loss)
		if lo != nil {
			lo.WALLoss(loss)
		}
		if loss != nil && time.Since(lastLog) >= time.Minute {
			lastLog = time.Now()
			r.log.Error("log-only mode: a loss window is recorded and not acknowledged; acknowledge it with outbox wal ack-loss once the events of the window are accounted for",
				"slot", loss.Slot, "from_lsn", loss.From, "to_lsn", loss.To, "at", loss.At, "reason", loss.Reason)
		}
	}
	read()
	for {
		select {
		case <-ctx.Done():
			return
		case <-check.C:
			read()
		case <-rec.C:
			confirmed, slot, streaming := r.wal.confirmedState()
			if !streaming {
				continue
			}
			qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
			if err := r.wal.logState.record(qctx, r.db, slot, confirmed); err != nil {
				stateLog.failed(err, "table", r.d.WALLogTable(), "writing", "the slot's position")
			} else {
				stateLog.ok()
			}
			cancel()
		}
	}
}

// walLossErr is Ready's verdict on a recorded loss window, or nil.
func (r *Relay) walLossErr() error {
	l := r.walLoss.Load()
	if l == nil {
		return nil
	}
	return fmt.Errorf("%w: %w: slot %s, events committed between %s and %s (%s, %s); acknowledge with outbox wal ack-loss",
		ErrUnhealthy, ErrWALLoss, l.Slot, l.From, l.To, l.Reason, l.At.UTC().Format(time.RFC3339))
}

// walDownErr is Ready's verdict on a log-only relay whose stream has not
// stayed open since an outage began more than UnhealthyAfter ago (not
// standing by: another reader holds the slot): its events are in no
// table, and nothing relays them meanwhile. Nil otherwise.
func (r *Relay) walDownErr(now time.Time) error {
	o := r.walDown.Load()
	if o == nil || now.Sub(o.since) <= r.cfg.UnhealthyAfter {
		return nil
	}
	return fmt.Errorf("%w: the log-only mode's WAL source has not streamed for %s (more than %s), and its events wait in the slot: %w",
		ErrUnhealthy, now.Sub(o.since).Round(time.Millisecond), r.cfg.UnhealthyAfter, o.err)
}

// AckWALLoss acknowledges the loss window recorded for the log-only mode's
// slot (cfg.Slot or the default) of ob's table, once an operator has
// accounted for the events committed in it (they were not relayed and
// cannot be): relays are ready again at their next health probe. It
// returns the window acknowledged, or nil if none was recorded. Errors:
// ErrInvalidConfig for an Outbox of another dialect or a bad name;
// ErrWALLoss (wrapped) when a relay recorded a new loss while the window
// was being acknowledged (the window grew): nothing is acknowledged, and
// the error names the new window; database errors wrapped with context.
func AckWALLoss(ctx context.Context, ob *driver.Outbox, db *sql.DB, cfg WALConfig) (*WALLoss, error) {
	slot, _, err := walNames(ctx, ob, db, cfg)
	if err != nil {
		return nil, err
	}
	d, err := dialectOf(ob)
	if err != nil {
		return nil, err
	}
	loss, err := readWALLoss(ctx, db, d.WALLogTable(), slot)
	if err != nil || loss == nil {
		return nil, err
	}
	// Only the window read: a relay that records a new loss meanwhile
	// widens it (its loss_to moves), and that must not be cleared unread.
	res, err := db.ExecContext(ctx, "UPDATE "+d.WALLogTable()+" SET loss_from = NULL, loss_to = NULL, loss_at = NULL, loss_reason = NULL "+
		"WHERE slot_name = $1 AND loss_from = $2::pg_lsn AND loss_to = $3::pg_lsn", slot, loss.From, loss.To)
	if err != nil {
		return nil, fmt.Errorf("outbox: acknowledging the loss window of slot %s: %w", slot, err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		now, rerr := readWALLoss(ctx, db, d.WALLogTable(), slot)
		if rerr == nil && now != nil {
			return nil, fmt.Errorf("%w: the loss window of slot %s changed while it was acknowledged (read %s to %s, now %s to %s): nothing acknowledged; review the new window and acknowledge it again",
				ErrWALLoss, slot, loss.From, loss.To, now.From, now.To)
		}
	}
	return loss, nil
}

// decodeLogMessage returns the events of one logical decoding message of
// the driver's log-only mode, as Messages with ID 0. content may be
// reused by the caller: the payloads alias one copy of it.
func decodeLogMessage(content []byte) ([]Message, error) {
	evs, err := logmsg.Decode(bytes.Clone(content))
	if err != nil {
		return nil, err
	}
	out := make([]Message, len(evs))
	for i, e := range evs {
		h, err := decodeHeaders(e.Headers)
		if err != nil {
			return nil, fmt.Errorf("event %s: %w", e.MessageID, err)
		}
		out[i] = Message{MessageID: e.MessageID, AggregateType: e.AggregateType, AggregateID: e.AggregateID, EventType: e.EventType,
			Topic: e.Topic, ContentType: e.ContentType, Partition: e.Partition, Payload: e.Payload, Headers: h, log: true}
	}
	return out, nil
}

// decodeHeaders decodes a headers JSON object ("" is none).
func decodeHeaders(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	var h map[string]string
	if err := json.Unmarshal([]byte(s), &h); err != nil {
		return nil, fmt.Errorf("headers: %w", err)
	}
	return h, nil
}
