package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/sqloutbox/outbox/driver"
)

// Retry requests. Retrying a parked message runs the consumer's own
// handler, which an operator's tool (the outbox CLI) does not have. So the
// tool records a request in <table>_requests (RequestRetry, or Skip for the
// aggregates it releases) and the running consumer serves it
// (ServeRequests; the runners call it every RequestInterval), the way a
// job queue's admin enqueues work for its workers.

// RequestRetry records a retry request for each aggregate (or, for a
// message without one, each message) that has a parked or held message
// matching f; the consumer's next ServeRequests runs them through its
// handler with Retry, in order. A request already pending is kept (one per
// aggregate). It returns how many aggregates or messages it requested,
// ErrInvalidFilter for a filter that names nothing (see ParkedFilter.All),
// ErrNothingMatched when nothing is parked or held there, ErrSchemaMissing
// without the tables, or the database error, wrapped.
func (in *Inbox) RequestRetry(ctx context.Context, db *sql.DB, f ParkedFilter) (int, error) {
	if db == nil {
		return 0, fmt.Errorf("%w: RequestRetry needs a *sql.DB", ErrInvalidConfig)
	}
	if err := f.explicit(); err != nil {
		return 0, err
	}
	w, args := f.where()
	args = append([]any{in.cfg.Consumer}, args...)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("inbox: requesting a retry: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	var matched int
	if err := tx.QueryRowContext(ctx, in.s.q("stored_count", w), args...).Scan(&matched); err != nil {
		return 0, in.storeErr(fmt.Errorf("inbox: requesting a retry: %w", err))
	}
	if matched == 0 {
		return 0, ErrNothingMatched
	}
	res, err := tx.ExecContext(ctx, in.s.q("request_insert", " AND status IN (2, 3)", w, in.s.ignoreConflict()), args...)
	if err != nil {
		return 0, in.storeErr(fmt.Errorf("inbox: requesting a retry: %w", err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("inbox: requesting a retry: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("inbox: requesting a retry: commit: %w", err)
	}
	return int(n), nil
}

// ServeRequests serves the consumer's pending retry requests (at most 100
// per call, oldest first): for each, Retry with fn runs the aggregate's
// (or the message's) parked and held messages in order. A request is
// deleted once served: when its aggregate has nothing parked or held left,
// when nothing matched, or when a message failed again (it stays parked,
// with one more attempt, and its aggregate held; the failure is in the
// returned error). It stays, to be served at the next call, when the
// database failed or when a message arrived held while Retry finished the
// aggregate. It returns how many messages it applied and an error joining
// each failure (handler failures wrap ErrHandler); ErrSchemaMissing
// without the tables.
//
// Serve requests from the process that consumes the aggregates' messages,
// with the same handler: the runners do so between deliveries.
func (in *Inbox) ServeRequests(ctx context.Context, db *sql.DB, fn func(ctx context.Context, tx *sql.Tx, msg Message) error) (int, error) {
	if db == nil || fn == nil {
		return 0, fmt.Errorf("%w: ServeRequests needs a *sql.DB and a handler", ErrInvalidConfig)
	}
	rows, err := db.QueryContext(ctx, in.s.q("requests_pending"), in.cfg.Consumer)
	if err != nil {
		return 0, in.storeErr(fmt.Errorf("inbox: reading retry requests: %w", err))
	}
	type request struct{ typ, id, msg string }
	var reqs []request
	for rows.Next() {
		var r request
		if err := rows.Scan(&r.typ, &r.id, &r.msg); err != nil {
			rows.Close()
			return 0, fmt.Errorf("inbox: reading retry requests: %w", err)
		}
		reqs = append(reqs, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("inbox: reading retry requests: %w", err)
	}
	applied := 0
	var errs []error
	for _, r := range reqs {
		f := ParkedFilter{AggregateType: r.typ, AggregateID: r.id}
		if r.msg != "" {
			f = ParkedFilter{ID: r.msg}
		}
		n, err := in.Retry(ctx, db, f, fn)
		applied += n
		served := true
		switch {
		case errors.Is(err, ErrNothingMatched):
		case err != nil && errors.Is(err, ErrHandler):
			errs = append(errs, err) // parked again: served
		case err != nil:
			errs = append(errs, err)
			served = false
		case r.msg == "":
			// Retry finished the aggregate; a message stored held just
			// then (its hold probe saw the last held row) would stay held.
			var status int
			switch err := db.QueryRowContext(ctx, in.s.q("aggregate_first"), in.cfg.Consumer, r.typ, r.id).Scan(&status); {
			case errors.Is(err, sql.ErrNoRows):
			case err != nil:
				errs = append(errs, fmt.Errorf("inbox: retry request for %s/%s: %w", r.typ, r.id, err))
				served = false
			case status == statusHeld:
				served = false
			}
		}
		if !served {
			continue
		}
		if _, err := db.ExecContext(ctx, in.s.q("request_delete"), in.cfg.Consumer, r.typ, r.id, r.msg); err != nil {
			errs = append(errs, fmt.Errorf("inbox: deleting a served retry request: %w", err))
		}
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) > 0 {
		return applied, errors.Join(errs...)
	}
	return applied, nil
}

// Request is a pending retry request (RequestRetry, or Skip releasing an
// aggregate): what the consumer's runner will serve at its next
// RequestInterval. A served request is deleted, so a request no longer
// listed has been applied (or found nothing to do).
type Request struct {
	// AggregateType and AggregateID name the aggregate, or MessageID the
	// message (for one without an aggregate).
	AggregateType, AggregateID, MessageID string
	// RequestedAt is when it was recorded (database clock).
	RequestedAt time.Time
}

// PendingRequests returns the consumer's pending retry requests, oldest
// first, at most 1,000. It returns ErrSchemaMissing without the tables,
// or the database error, wrapped.
func (in *Inbox) PendingRequests(ctx context.Context, db *sql.DB) ([]Request, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: PendingRequests needs a *sql.DB", ErrInvalidConfig)
	}
	rows, err := db.QueryContext(ctx, in.s.q("requests_list"), in.cfg.Consumer)
	if err != nil {
		return nil, in.storeErr(fmt.Errorf("inbox: listing retry requests: %w", err))
	}
	defer rows.Close()
	out := []Request{}
	for rows.Next() {
		var r Request
		var us int64
		if err := rows.Scan(&r.AggregateType, &r.AggregateID, &r.MessageID, &us); err != nil {
			return nil, fmt.Errorf("inbox: listing retry requests: %w", err)
		}
		r.RequestedAt = time.UnixMicro(us).UTC()
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, in.storeErr(fmt.Errorf("inbox: listing retry requests: %w", err))
	}
	return out, nil
}

// ConsumerParked is one consumer's count of parked and held messages
// (Consumers).
type ConsumerParked struct {
	Consumer     string
	Parked, Held int64
}

// Consumers returns the consumers of cfg's inbox table (cfg.Consumer is
// ignored) that have parked or held messages, with their counts, by name,
// at most 1,000. It reads only the rows in that state (PostgreSQL and
// SQLite: the partial hold index; MySQL/MariaDB: one index probe per
// consumer, then its unprocessed rows), never the processed history. It returns ErrInvalidConfig for a
// bad dialect or table, ErrSchemaMissing without the table, or the
// database error, wrapped.
func Consumers(ctx context.Context, db *sql.DB, cfg Config) ([]ConsumerParked, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: Consumers needs a *sql.DB", ErrInvalidConfig)
	}
	cfg.Consumer = "any"
	in, err := New(cfg)
	if err != nil {
		return nil, err
	}
	out := []ConsumerParked{}
	if cfg.Dialect == driver.MySQL {
		// No partial index: a skip scan of retention_idx, one probe per
		// consumer, then each one's count through its unprocessed rows.
		for next := ""; len(out) < 1000; {
			if err := db.QueryRowContext(ctx, in.s.q("consumer_next"), next).Scan(&next); errors.Is(err, sql.ErrNoRows) {
				break
			} else if err != nil {
				return nil, in.storeErr(fmt.Errorf("inbox: listing consumers: %w", err))
			}
			c := ConsumerParked{Consumer: next}
			if err := db.QueryRowContext(ctx, in.s.q("consumer_parked"), next).Scan(&c.Parked, &c.Held); err != nil {
				return nil, in.storeErr(fmt.Errorf("inbox: listing consumers: %w", err))
			}
			if c.Parked+c.Held > 0 {
				out = append(out, c)
			}
		}
		return out, nil
	}
	rows, err := db.QueryContext(ctx, in.s.q("consumers_stored"))
	if err != nil {
		return nil, in.storeErr(fmt.Errorf("inbox: listing consumers: %w", err))
	}
	defer rows.Close()
	for rows.Next() {
		var c ConsumerParked
		if err := rows.Scan(&c.Consumer, &c.Parked, &c.Held); err != nil {
			return nil, fmt.Errorf("inbox: listing consumers: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, in.storeErr(fmt.Errorf("inbox: listing consumers: %w", err))
	}
	return out, nil
}
