package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sqloutbox/outbox"
)

// Parked is a message stored in the inbox's dead-letter state: parked (its
// handler failed and the consumer gave up on it) or held (stored behind a
// parked message of its aggregate, never run).
type Parked struct {
	Message
	// Consumer is the Inbox's consumer.
	Consumer string
	// Cause is the text of the last failure (at most MaxCauseBytes; empty
	// for a held message).
	Cause string
	// Attempts is how many times the handler failed for it: the attempts
	// Park was told, plus one per failed Retry.
	Attempts int
	// StoredAt is when the inbox first stored it; ParkedAt when it was
	// last parked, held or retried without success (database clock).
	StoredAt, ParkedAt time.Time
	// Held: stored behind another message of its aggregate, not (yet)
	// failed itself.
	Held bool
}

// DefaultListLimit is ListParked's default Limit; MaxListLimit its largest.
const (
	DefaultListLimit = 100
	MaxListLimit     = 10000
)

// ParkedFilter selects parked and held messages of the Inbox's consumer.
// Set fields combine (AND): ID selects one message; AggregateType and
// AggregateID (compared both, AggregateType may be empty) select one
// aggregate. The zero filter selects every message, which ListParked
// allows and Retry and Skip refuse unless All is set.
type ParkedFilter struct {
	AggregateType, AggregateID string
	ID                         string
	// All must be set for Retry or Skip to act on every parked message of
	// the consumer (a guard against a forgotten field).
	All bool
	// Limit bounds ListParked's result: 1..MaxListLimit, default
	// DefaultListLimit. Retry and Skip ignore it.
	Limit int
}

func (f ParkedFilter) where() (string, []any) {
	var w string
	var args []any
	if f.ID != "" {
		w += " AND message_id = ?"
		args = append(args, f.ID)
	}
	if f.AggregateType != "" || f.AggregateID != "" {
		w += " AND aggregate_type = ? AND aggregate_id = ?"
		args = append(args, f.AggregateType, f.AggregateID)
	}
	return w, args
}

func (f ParkedFilter) explicit() error {
	if f.ID == "" && f.AggregateID == "" && f.AggregateType == "" && !f.All {
		return fmt.Errorf("%w: name an ID or an aggregate, or set All", ErrInvalidFilter)
	}
	return nil
}

// Park stores msg as parked (the inbox's dead-letter state) with cause's
// text, counting one attempt: it is ParkAfter with attempts 1.
func (in *Inbox) Park(ctx context.Context, db *sql.DB, msg Message, cause error) error {
	return in.ParkAfter(ctx, db, msg, cause, 1)
}

// ParkAfter stores msg as parked with cause's text (at most MaxCauseBytes)
// and the number of failed attempts made (at least 1), keeping its key,
// headers and payload for Retry. While it is parked, later messages of its
// aggregate (if it has one) are stored as held by Handle. A message already
// parked or held is updated (status parked, cause replaced, attempts
// added). A message already processed or skipped is left alone: ParkAfter
// returns nil and changes nothing. It returns ErrInvalidMessage for an
// invalid msg, or the database error, wrapped.
func (in *Inbox) ParkAfter(ctx context.Context, db *sql.DB, msg Message, cause error, attempts int) error {
	if db == nil {
		return fmt.Errorf("%w: Park needs a *sql.DB", ErrInvalidConfig)
	}
	if err := validate(msg); err != nil {
		return err
	}
	if attempts < 1 {
		attempts = 1
	}
	c := causeText(cause)
	res, err := db.ExecContext(ctx, in.s.q("insert_stored"), in.storedArgs(msg, statusParked, c, attempts)...)
	if err != nil {
		return in.storeErr(fmt.Errorf("inbox: parking message %q: %w", msg.ID, err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return in.storeErr(fmt.Errorf("inbox: parking message %q: %w", msg.ID, err))
	}
	if n == 0 {
		var cv any
		if c != "" {
			cv = c
		}
		res, err := db.ExecContext(ctx, in.s.q("park_update"), cv, attempts, nilIfEmpty(msg.Key), encodeHeaders(msg.Headers), nilIfEmpty(msg.Payload), in.cfg.Consumer, msg.ID)
		if err != nil {
			return in.storeErr(fmt.Errorf("inbox: parking message %q: %w", msg.ID, err))
		}
		if n, err = res.RowsAffected(); err != nil {
			return in.storeErr(fmt.Errorf("inbox: parking message %q: %w", msg.ID, err))
		}
		if n == 0 {
			return nil // processed or skipped meanwhile: nothing to park
		}
	}
	in.stats.parked.Add(1)
	in.obs.Parked(msg, cause)
	return nil
}

func (in *Inbox) scanParked(rows *sql.Rows) (Parked, int64, error) {
	var p Parked
	var id, part, created, updated int64
	var status int
	var key, headers, payload []byte
	var c sql.NullString
	if err := rows.Scan(&id, &p.ID, &status, &p.AggregateType, &p.AggregateID, &p.Topic, &part, &p.Offset,
		&key, &headers, &payload, &c, &p.Attempts, &created, &updated); err != nil {
		return p, 0, err
	}
	h, err := decodeHeaders(headers)
	if err != nil {
		return p, 0, fmt.Errorf("%w (row %d)", err, id)
	}
	p.Partition = int32(part)
	p.Key, p.Headers, p.Payload = key, h, payload
	p.Consumer = in.cfg.Consumer
	p.Cause = c.String
	p.StoredAt, p.ParkedAt = time.UnixMicro(created).UTC(), time.UnixMicro(updated).UTC()
	p.Held = status == statusHeld
	return p, id, nil
}

// ListParked returns the consumer's parked and held messages that match
// f, in the order they were stored (an aggregate's in the order Retry runs
// them), at most f.Limit. Nothing matching is an empty list and nil. It
// returns ErrInvalidFilter for a Limit out of range.
func (in *Inbox) ListParked(ctx context.Context, db *sql.DB, f ParkedFilter) ([]Parked, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: ListParked needs a *sql.DB", ErrInvalidConfig)
	}
	if f.Limit == 0 {
		f.Limit = DefaultListLimit
	}
	if f.Limit < 0 || f.Limit > MaxListLimit {
		return nil, fmt.Errorf("%w: Limit %d, want 1..%d", ErrInvalidFilter, f.Limit, MaxListLimit)
	}
	w, args := f.where()
	query := "stored"
	if w == "" {
		query = "stored_all" // every aggregate: through the index of unprocessed rows
	}
	rows, err := db.QueryContext(ctx, in.s.q(query, w, " ORDER BY id LIMIT "+strconv.Itoa(f.Limit)), append([]any{in.cfg.Consumer}, args...)...)
	if err != nil {
		return nil, in.storeErr(fmt.Errorf("inbox: listing parked messages: %w", err))
	}
	defer rows.Close()
	out := []Parked{}
	for rows.Next() {
		p, _, err := in.scanParked(rows)
		if err != nil {
			return nil, in.storeErr(fmt.Errorf("inbox: listing parked messages: %w", err))
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, in.storeErr(fmt.Errorf("inbox: listing parked messages: %w", err))
	}
	return out, nil
}

// Skip marks the consumer's parked messages that match f as skipped: they
// count as processed from then on (a redelivery is a Duplicate; retention
// deletes them like processed rows) and their handler never runs. Held
// messages behind them stay held, in order, until the consumer runs them:
// in the same transaction Skip records a retry request for each skipped
// message's aggregate (see RequestRetry), which a running runner
// (inboxkafka and the other inbox runners) serves within its
// RequestInterval with its own handler, releasing the aggregate. A consumer
// without a runner calls ServeRequests or Retry itself. It returns how
// many it marked, ErrInvalidFilter for a filter that names nothing (see
// ParkedFilter.All), ErrNothingMatched when no parked message matched,
// ErrSchemaMissing without the tables, or the database error, wrapped.
func (in *Inbox) Skip(ctx context.Context, db *sql.DB, f ParkedFilter) (int, error) {
	if db == nil {
		return 0, fmt.Errorf("%w: Skip needs a *sql.DB", ErrInvalidConfig)
	}
	if err := f.explicit(); err != nil {
		return 0, err
	}
	w, args := f.where()
	args = append([]any{in.cfg.Consumer}, args...)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("inbox: skipping parked messages: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	if _, err := tx.ExecContext(ctx, in.s.q("request_insert", " AND status = 2 AND (aggregate_type <> '' OR aggregate_id <> '')", w, in.s.ignoreConflict()), args...); err != nil {
		return 0, in.storeErr(fmt.Errorf("inbox: skipping parked messages: requesting the release of their aggregates: %w", err))
	}
	res, err := tx.ExecContext(ctx, in.s.q("skip", w), args...)
	if err != nil {
		return 0, in.storeErr(fmt.Errorf("inbox: skipping parked messages: %w", err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("inbox: skipping parked messages: %w", err)
	}
	if n == 0 {
		return 0, ErrNothingMatched
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("inbox: skipping parked messages: commit: %w", err)
	}
	in.stats.skipped.Add(uint64(n))
	return int(n), nil
}

type aggKey struct {
	typ, id string
	row     int64 // a message without an aggregate: its row alone
}

// Retry runs the stored messages of the aggregates that f matches through
// fn, which gets each message as stored (ID, aggregate, topic, partition,
// offset, key, headers and payload, byte for byte; the live consumer's
// handler usually fits), each in its own transaction with the same rules
// as Handle (an
// outbox emit scope, the inbox row marked processed in the same commit,
// fn's error rolling back both): for each aggregate with a matching parked
// or held message, its parked and held messages in the order they were
// stored, from its first one (whichever message f names). An aggregate
// stops at its first failure: that message stays (or becomes) parked with
// the new cause and one more attempt, and the aggregate's later messages
// stay held. A message without an aggregate is run alone.
//
// It returns how many messages it applied and, if any failed, an error
// joining each failure (each wraps ErrHandler and fn's error). It returns
// ErrInvalidFilter for a filter that names nothing (see ParkedFilter.All)
// and ErrNothingMatched when nothing matched.
//
// Run it while the aggregate's live messages keep arriving and a message
// stored held just as Retry finished the aggregate may stay held (and hold
// the aggregate's later messages, in order) until the next Retry;
// ListParked shows it.
func (in *Inbox) Retry(ctx context.Context, db *sql.DB, f ParkedFilter, fn func(ctx context.Context, tx *sql.Tx, msg Message) error) (int, error) {
	if db == nil || fn == nil {
		return 0, fmt.Errorf("%w: Retry needs a *sql.DB and a handler", ErrInvalidConfig)
	}
	if err := f.explicit(); err != nil {
		return 0, err
	}
	w, args := f.where()
	rows, err := db.QueryContext(ctx, in.s.q("stored_keys", w, " ORDER BY id"), append([]any{in.cfg.Consumer}, args...)...)
	if err != nil {
		return 0, in.storeErr(fmt.Errorf("inbox: retry: finding parked messages: %w", err))
	}
	var keys []aggKey
	seen := map[aggKey]bool{}
	for rows.Next() {
		var k aggKey
		var id int64
		if err := rows.Scan(&id, &k.typ, &k.id); err != nil {
			rows.Close()
			return 0, in.storeErr(fmt.Errorf("inbox: retry: finding parked messages: %w", err))
		}
		if k.typ == "" && k.id == "" {
			k.row = id
		}
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, in.storeErr(fmt.Errorf("inbox: retry: finding parked messages: %w", err))
	}
	if len(keys) == 0 {
		return 0, ErrNothingMatched
	}
	applied := 0
	var errs []error
	for _, k := range keys {
		n, err := in.retryAggregate(ctx, db, k, fn)
		applied += n
		if err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
		}
	}
	if len(errs) > 0 {
		return applied, fmt.Errorf("inbox: retry: %w", errors.Join(errs...))
	}
	return applied, nil
}

func (in *Inbox) retryAggregate(ctx context.Context, db *sql.DB, k aggKey, fn func(ctx context.Context, tx *sql.Tx, msg Message) error) (int, error) {
	applied := 0
	for {
		var q string
		var args []any
		if k.row != 0 {
			q, args = in.s.q("stored", " AND id = ?"), []any{in.cfg.Consumer, k.row}
		} else {
			q, args = in.s.q("stored", " AND aggregate_type = ? AND aggregate_id = ? ORDER BY id LIMIT 1"), []any{in.cfg.Consumer, k.typ, k.id}
		}
		rows, err := db.QueryContext(ctx, q, args...)
		if err != nil {
			return applied, fmt.Errorf("inbox: retry: reading the next message: %w", err)
		}
		var p Parked
		var id int64
		found := rows.Next()
		if found {
			p, id, err = in.scanParked(rows)
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
		if err != nil {
			return applied, fmt.Errorf("inbox: retry: reading the next message: %w", err)
		}
		if !found {
			return applied, nil
		}
		ok, err := in.retryOne(ctx, db, id, p.Message, fn)
		if err != nil {
			return applied, err
		}
		if ok {
			applied++
		}
		if k.row != 0 {
			return applied, nil
		}
	}
}

// retryOne runs one stored message; ok is false when another Retry got
// there first.
func (in *Inbox) retryOne(ctx context.Context, db *sql.DB, id int64, msg Message, fn func(ctx context.Context, tx *sql.Tx, msg Message) error) (ok bool, err error) {
	start := time.Now()
	tctx := outbox.NewContext(ctx)
	tx, err := db.BeginTx(tctx, nil)
	if err != nil {
		return false, fmt.Errorf("inbox: retry: message %q: begin: %w", msg.ID, err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	var status int
	if err := tx.QueryRowContext(tctx, in.s.q("lock"), id).Scan(&status); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return false, nil
		}
		return false, fmt.Errorf("inbox: retry: message %q: lock: %w", msg.ID, err)
	}
	if status != statusParked && status != statusHeld {
		return false, nil
	}
	if herr, ferr := in.call(msg, func() error { return fn(tctx, tx, msg) }); herr != nil {
		_ = tx.Rollback()
		in.stats.handlerErrors.Add(1)
		in.obs.HandlerFailed(msg, herr)
		if _, err := db.ExecContext(ctx, in.s.q("retry_failed"), causeText(ferr), id); err != nil {
			return false, errors.Join(herr, fmt.Errorf("inbox: retry: message %q: recording the failure: %w", msg.ID, err))
		}
		return false, herr
	}
	if _, err := tx.ExecContext(tctx, in.s.q("mark_processed"), id); err != nil {
		return false, fmt.Errorf("inbox: retry: message %q: marking processed: %w", msg.ID, err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("inbox: retry: message %q: commit: %w", msg.ID, err)
	}
	in.stats.applied.Add(1)
	in.stats.retried.Add(1)
	in.obs.Applied(msg, time.Since(start))
	in.mark(ctx, msg.ID)
	return true, nil
}
