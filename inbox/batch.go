package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
)

// MaxBatch is the most messages HandleBatch takes at once. It is
// PostgreSQL's per-backend cache of subtransaction IDs,
// PGPROC_MAX_CACHED_SUBXIDS = 64 (src/include/storage/proc.h): a
// transaction with more savepoints that wrote overflows it, and while it
// runs every other session's snapshots must look subtransactions up in
// pg_subtrans, a slowdown of the whole server. It also keeps the batch's
// lists of message IDs well under MariaDB's eq_range_index_dive_limit
// (200), above which its optimizer estimates an IN list from statistics
// and may choose a scan.
const MaxBatch = 64

// BatchResult is what HandleBatch did with one message.
type BatchResult struct {
	// Outcome is Applied, Duplicate or Held when the message's outcome is
	// stored, and 0 when it is not: then handle the message again, alone
	// (Handle), in order after the messages before it.
	Outcome Outcome
	// Err, with Outcome 0, says why: the handler's error (wrapping
	// ErrHandler; the handler's changes were rolled back to its savepoint,
	// the other messages' committed) or ErrInvalidMessage. nil with
	// Outcome 0: not tried in this batch, because an earlier message of
	// its aggregate was not applied in it (it failed, or is held, or was in
	// flight elsewhere), so applying this one would break the aggregate's
	// order.
	Err error
}

// HandleBatch applies several messages, in order, in one transaction: the
// batched form of Handle for a runner's partition (Kafka consumers,
// MassTransit and Wolverine batch the same way). One commit for the batch
// instead of one per message is where the throughput comes from: a
// partition handled one message per transaction is bounded by 1 / (commit
// latency).
//
// In the transaction (begun with a fresh outbox emit scope, as Handle's):
//   - the dedupe rows of every message are written together, in one
//     multi-row INSERT that skips the ones recorded before; those are
//     looked up in one query (processed or skipped: Duplicate; parked or
//     held: Held);
//   - each new message's fn runs, in order. The first run of a batch sets
//     no savepoints (they cost a round trip per message, as much as a
//     one-statement handler: BENCHMARKS.md "Batched inbox"). If a handler
//     fails, that transaction is rolled back and the batch runs again with
//     each fn inside its own savepoint: a failure then rolls back to it
//     (that handler's changes only) and the message's dedupe row is
//     deleted before the commit, so the other messages commit and the
//     failed one counts as not processed (Outcome 0, Err set). So a batch
//     with a failure runs the handlers before it twice, in two
//     transactions of which one commits, as a redelivery would; the
//     failed handler itself runs once (the second run reuses its error);
//   - the aggregate of a message that is not applied in the batch (it
//     failed, or was recorded as parked or held, or was in flight in
//     another transaction) is blocked for the rest of the batch: its later
//     messages are not tried (Outcome 0, Err nil), so that the caller
//     handles them alone after it, in order;
//   - one commit.
//
// Before the transaction, one query (one index probe per distinct
// aggregate of the batch) finds the aggregates held behind a parked
// message; their messages are left to the caller (Outcome 0, Err nil) and
// Handle stores them held. So a caller handles every message with Outcome
// 0, in order, with Handle (the runners do, with their retries and
// parking); every other result is final. Acknowledge the batch once every
// message has an outcome.
//
// msgs holds 1 to MaxBatch messages (more: ErrInvalidConfig, nothing
// written). An error (the database failed, the commit failed; a missing
// table is ErrSchemaMissing) means no message of the batch is stored: the
// caller may run the batch again or handle its messages alone. A deadlock
// in the inbox's own statements is retried as in Handle. A panic in fn is
// recovered into that message's Err (ErrHandlerPanic), as in Handle. The
// Filter is not asked (the batch's INSERT is the check) but is marked,
// after the commit, for each message applied or found a duplicate: in one
// call if it implements BatchMarker (inboxredis does), else one Mark each. The held rule is Handle's: one aggregate's
// messages are handled by one caller at a time, in order.
func (in *Inbox) HandleBatch(ctx context.Context, db *sql.DB, msgs []Message, fn func(ctx context.Context, tx *sql.Tx, msg Message) error) ([]BatchResult, error) {
	switch {
	case db == nil || fn == nil:
		return nil, fmt.Errorf("%w: HandleBatch needs a *sql.DB and a handler", ErrInvalidConfig)
	case len(msgs) == 0 || len(msgs) > MaxBatch:
		return nil, fmt.Errorf("%w: HandleBatch takes 1 to %d messages, got %d", ErrInvalidConfig, MaxBatch, len(msgs))
	}
	start := time.Now()
	var res []BatchResult
	var failed *isolateError
	err := in.retryDeadlocks(ctx, func() (err error) {
		for {
			res, err = in.handleBatch(ctx, db, msgs, fn, failed)
			// A handler failed in the run without savepoints: again,
			// with them (not a retry of the deadlock kind).
			ie := (*isolateError)(nil)
			if !errors.As(err, &ie) {
				return err
			}
			failed = ie
		}
	})
	if err != nil {
		return nil, in.storeErr(err)
	}
	var marks []string
	for i, r := range res {
		m := msgs[i]
		switch {
		case r.Outcome == Applied:
			in.stats.applied.Add(1)
			in.obs.Applied(m, time.Since(start))
			marks = append(marks, m.ID)
		case r.Outcome == Duplicate:
			in.stats.duplicates.Add(1)
			in.obs.Duplicate(m)
			marks = append(marks, m.ID)
		case r.Outcome == Held:
			in.stats.held.Add(1)
			in.obs.Held(m)
		case errors.Is(r.Err, ErrHandler):
			in.stats.handlerErrors.Add(1)
			in.obs.HandlerFailed(m, r.Err)
		}
	}
	in.markAll(ctx, marks)
	return res, nil
}

// markAll marks ids in the Filter: in one call if it is a BatchMarker.
func (in *Inbox) markAll(ctx context.Context, ids []string) {
	f := in.cfg.Filter
	if f == nil || len(ids) == 0 {
		return
	}
	bm, ok := f.(BatchMarker)
	if !ok {
		for _, id := range ids {
			in.mark(ctx, id)
		}
		return
	}
	if err := bm.MarkAll(context.WithoutCancel(ctx), in.cfg.Consumer, ids); err != nil {
		in.stats.filterErrors.Add(1)
		in.log.Warn("inbox filter mark failed (the table still dedupes)", "messages", len(ids), "error", err)
	}
}

// aggOf is a message's aggregate key ("" for none: never blocked).
func aggOf(m Message) string {
	if !m.held() {
		return ""
	}
	return strconv.Itoa(len(m.AggregateType)) + ":" + m.AggregateType + m.AggregateID
}

// isolateError: the handler of msgs[i] failed with err in a batch run
// without savepoints; the transaction is rolled back and the batch runs
// again with them, where msgs[i] counts as failed with err without its
// handler running a second time (so a message's handler runs once per
// attempt, batched or not).
type isolateError struct {
	i   int
	err error
}

func (e *isolateError) Error() string {
	return "inbox: a handler failed; run the batch with savepoints: " + e.err.Error()
}

func (in *Inbox) handleBatch(ctx context.Context, db *sql.DB, msgs []Message, fn func(ctx context.Context, tx *sql.Tx, msg Message) error, failed *isolateError) ([]BatchResult, error) {
	isolate := failed != nil
	res := make([]BatchResult, len(msgs))
	aggs := make([]string, len(msgs)) // each message's aggOf, computed once
	for i, m := range msgs {
		aggs[i] = aggOf(m)
	}
	// blocked: an aggregate's messages after this index are not tried.
	blocked := map[string]int{}
	block := func(i int) {
		if k := aggs[i]; k != "" {
			if _, ok := blocked[k]; !ok {
				blocked[k] = i
			}
		}
	}
	isBlocked := func(i int) bool {
		at, ok := blocked[aggs[i]]
		return ok && at < i && aggs[i] != ""
	}
	var valid []int
	for i, m := range msgs {
		if err := validate(m); err != nil {
			res[i].Err = err
			continue
		}
		valid = append(valid, i)
	}
	if err := in.batchHeld(ctx, db, msgs, aggs, valid, blocked); err != nil {
		return nil, err
	}
	var cand []int // valid, not behind a held aggregate, first of its ID
	ids := map[string]bool{}
	for _, i := range valid {
		if !isBlocked(i) && !ids[msgs[i].ID] {
			ids[msgs[i].ID] = true
			cand = append(cand, i)
		}
		// A second copy of a message in the batch is left to Handle,
		// after the first: a Duplicate, or applied if the first failed.
	}
	if len(cand) == 0 {
		return res, nil
	}
	tctx := outbox.NewContext(ctx)
	tx, err := db.BeginTx(tctx, nil)
	if err != nil {
		return nil, fmt.Errorf("inbox: batch: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit

	status := map[string]int{} // recorded before: message ID -> status
	inserted := map[string]bool{}
	if in.s.dialect == driver.MySQL {
		// No RETURNING on MySQL 8.0: read what is recorded (a consistent
		// read: no locks), insert the rest, and insist that every one of
		// them was inserted.
		if err := in.batchStatus(tctx, tx, msgs, cand, status); err != nil {
			return nil, err
		}
		var rest []int
		for _, i := range cand {
			if _, ok := status[msgs[i].ID]; !ok {
				rest = append(rest, i)
			}
		}
		if len(rest) > 0 {
			q, args := in.batchInsert(msgs, rest, "")
			r, err := tx.ExecContext(tctx, q, args...)
			if err != nil {
				return nil, fmt.Errorf("inbox: batch: recording: %w", err)
			}
			if n, err := r.RowsAffected(); err != nil {
				return nil, fmt.Errorf("inbox: batch: recording: %w", err)
			} else if int(n) != len(rest) {
				// Recorded meanwhile by another delivery (committed after
				// this transaction's snapshot): roll back and leave the
				// batch to Handle (res holds only invalid messages' errors).
				return res, nil
			}
			for _, i := range rest {
				inserted[msgs[i].ID] = true
			}
		}
	} else {
		q, args := in.batchInsert(msgs, cand, " RETURNING message_id")
		rows, err := tx.QueryContext(tctx, q, args...)
		if err != nil {
			return nil, fmt.Errorf("inbox: batch: recording: %w", err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, fmt.Errorf("inbox: batch: recording: %w", err)
			}
			inserted[id] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("inbox: batch: recording: %w", err)
		}
		if len(inserted) < len(cand) {
			if err := in.batchStatus(tctx, tx, msgs, cand, status); err != nil {
				return nil, err
			}
		}
	}

	const sp = "inbox_message"
	var undo []int // inserted, then not applied: their rows are deleted
	for _, i := range cand {
		m := msgs[i]
		if !inserted[m.ID] {
			if st, ok := status[m.ID]; ok {
				res[i].Outcome = recordedOutcome(st)
				if res[i].Outcome == Held {
					block(i)
				}
			} else {
				// Neither inserted nor recorded: a duplicate of an earlier
				// message of this batch, or another transaction's, in
				// flight. Handle decides.
				block(i)
			}
			continue
		}
		if isBlocked(i) {
			undo = append(undo, i)
			continue
		}
		if !isolate {
			if herr, _ := in.call(m, func() error { return fn(tctx, tx, m) }); herr != nil {
				return nil, &isolateError{i: i, err: herr}
			}
			res[i].Outcome = Applied
			continue
		}
		if i == failed.i {
			// Failed in the run without savepoints: not run again.
			res[i].Err = failed.err
			block(i)
			undo = append(undo, i)
			continue
		}
		if _, err := tx.ExecContext(tctx, "SAVEPOINT "+sp); err != nil {
			return nil, fmt.Errorf("inbox: batch: savepoint: %w", err)
		}
		if herr, _ := in.call(m, func() error { return fn(tctx, tx, m) }); herr != nil {
			if _, err := tx.ExecContext(tctx, "ROLLBACK TO SAVEPOINT "+sp); err != nil {
				return nil, fmt.Errorf("inbox: batch: rolling back message %q to its savepoint: %w", m.ID, err)
			}
			res[i].Err = herr
			block(i)
			undo = append(undo, i)
		} else {
			res[i].Outcome = Applied
		}
		// No RELEASE: the next SAVEPOINT of the same name replaces this
		// one (MySQL) or nests above it (PostgreSQL, SQLite; ROLLBACK TO
		// goes to the newest), and the commit ends them all: a round trip
		// fewer per message.
	}
	for _, i := range undo { // the rare path: one unique-key DELETE each
		if _, err := tx.ExecContext(tctx, in.s.q("batch_delete"), in.cfg.Consumer, msgs[i].ID); err != nil {
			return nil, fmt.Errorf("inbox: batch: deleting the row of message %q, not applied: %w", msgs[i].ID, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("inbox: batch: commit: %w", err)
	}
	return res, nil
}

// batchInsert is the multi-row dedupe INSERT of msgs[idx], with tail.
func (in *Inbox) batchInsert(msgs []Message, idx []int, tail string) (string, []any) {
	var b strings.Builder
	b.WriteString(in.s.queries["batch_insert_head"])
	args := make([]any, 0, 7*len(idx))
	for k, i := range idx {
		if k > 0 {
			b.WriteString(", ")
		} else {
			b.WriteString(" ")
		}
		b.WriteString(in.s.queries["batch_insert_row"])
		m := msgs[i]
		args = append(args, in.cfg.Consumer, m.ID, m.AggregateType, m.AggregateID, m.Topic, m.Partition, m.Offset)
	}
	if in.s.dialect != driver.MySQL {
		b.WriteString(" ON CONFLICT (consumer, message_id) DO NOTHING")
	}
	b.WriteString(tail)
	return in.s.placeholders(b.String()), args
}

// batchStatus reads the recorded status of msgs[idx] into status.
func (in *Inbox) batchStatus(ctx context.Context, tx *sql.Tx, msgs []Message, idx []int, status map[string]int) error {
	args := make([]any, 0, 2*len(idx))
	parts := make([]string, 0, len(idx))
	for _, i := range idx {
		args = append(args, in.cfg.Consumer, msgs[i].ID)
		parts = append(parts, in.s.queries["batch_status"])
	}
	rows, err := tx.QueryContext(ctx, in.s.placeholders(strings.Join(parts, " UNION ALL ")), args...)
	if err != nil {
		return fmt.Errorf("inbox: batch: reading recorded messages: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var st int
		if err := rows.Scan(&id, &st); err != nil {
			return fmt.Errorf("inbox: batch: reading recorded messages: %w", err)
		}
		status[id] = st
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("inbox: batch: reading recorded messages: %w", err)
	}
	return nil
}

// batchHeld blocks (index -1) the aggregates of msgs[idx] that are held
// behind a parked message. On PostgreSQL and SQLite one look at the
// partial hold index first says whether anything is held at all.
func (in *Inbox) batchHeld(ctx context.Context, db *sql.DB, msgs []Message, aggs []string, idx []int, blocked map[string]int) error {
	var parts []string
	var args []any
	var keys []string
	seen := map[string]bool{}
	for _, i := range idx {
		k := aggs[i]
		if k == "" || seen[k] {
			continue
		}
		seen[k] = true
		parts = append(parts, strings.Replace(in.s.queries["batch_held_probe"], "#", strconv.Itoa(len(keys)), 1))
		args = append(args, in.cfg.Consumer, msgs[i].AggregateType, msgs[i].AggregateID)
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil
	}
	if in.s.dialect != driver.MySQL {
		var one int
		switch err := db.QueryRowContext(ctx, in.s.q("batch_any_held"), in.cfg.Consumer).Scan(&one); {
		case errors.Is(err, sql.ErrNoRows):
			return nil // nothing parked or held: the common case
		case err != nil:
			return fmt.Errorf("inbox: batch: hold check: %w", err)
		}
	}
	rows, err := db.QueryContext(ctx, in.s.placeholders(strings.Join(parts, " UNION ALL ")), args...)
	if err != nil {
		return fmt.Errorf("inbox: batch: hold check: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var n int
		if err := rows.Scan(&n); err != nil {
			return fmt.Errorf("inbox: batch: hold check: %w", err)
		}
		if n >= 0 && n < len(keys) {
			blocked[keys[n]] = -1
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("inbox: batch: hold check: %w", err)
	}
	return nil
}
