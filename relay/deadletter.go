package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
)

// DeadLetterPolicy says what a dead-lettered event does to the later
// events of its aggregate.
type DeadLetterPolicy int

const (
	// HoldAggregate (the default) keeps the aggregate's later events
	// pending until an operator retries or skips the dead one: strict order.
	HoldAggregate DeadLetterPolicy = iota
	// SkipDead lets the aggregate's later events go on past a dead event.
	// Consumers then see a gap; retrying the dead event later delivers it
	// out of order.
	SkipDead
)

// ErrInvalidSelector is returned by DeadLetters operations for a Selector
// that names nothing or more than one kind of target.
var ErrInvalidSelector = errors.New("outbox: dead letter selector must name exactly one of: a message ID, an aggregate, row ids, or all")

// MaxSelectorIDs is the most row ids one Selector may list (Selector.IDs).
const MaxSelectorIDs = deadLetterChunk

// Selector picks dead letters: exactly one of MessageID, the aggregate
// (AggregateType and AggregateID together), IDs, or All.
type Selector struct {
	MessageID     string
	AggregateType string
	AggregateID   string
	// IDs selects these rows by primary key (DeadLetter.ID), at most
	// MaxSelectorIDs: an operator's tool that showed a list and asked
	// "retry these N?" acts on exactly those rows (any of them no longer
	// dead is left alone), never on rows that match a filter later.
	IDs []int64
	All bool
}

// index is the index hint of the selector's listing (see
// dialect.WithSelectorIndex): by aggregate, the aggregate's; all, the
// status's; one message ID or row ids, none (a unique or primary key).
func (s Selector) index() string {
	switch {
	case s.AggregateType != "" && s.AggregateID != "":
		return "index_aggregate"
	case s.All:
		return "index_status"
	}
	return ""
}

func (s Selector) where() (string, []any, error) {
	byID := s.MessageID != ""
	byAgg := s.AggregateType != "" || s.AggregateID != ""
	byRows := len(s.IDs) > 0
	n := 0
	for _, b := range []bool{byID, byAgg, byRows, s.All} {
		if b {
			n++
		}
	}
	switch {
	case n != 1:
		return "", nil, ErrInvalidSelector
	case byID:
		return "message_id = ?", []any{s.MessageID}, nil
	case byAgg:
		if s.AggregateType == "" || s.AggregateID == "" {
			return "", nil, fmt.Errorf("%w: an aggregate needs both AggregateType and AggregateID", ErrInvalidSelector)
		}
		return "aggregate_type = ? AND aggregate_id = ?", []any{s.AggregateType, s.AggregateID}, nil
	case byRows:
		if len(s.IDs) > MaxSelectorIDs {
			return "", nil, fmt.Errorf("%w: %d ids, at most %d", ErrInvalidSelector, len(s.IDs), MaxSelectorIDs)
		}
		args := make([]any, len(s.IDs))
		for i, id := range s.IDs {
			args[i] = id
		}
		return "id IN (" + strings.TrimSuffix(strings.Repeat("?,", len(s.IDs)), ",") + ")", args, nil
	default:
		return "1 = 1", nil, nil
	}
}

// DeadLetter is one event the relay gave up on (status failed).
type DeadLetter struct {
	ID            int64
	MessageID     string
	AggregateType string
	AggregateID   string
	EventType     string
	Topic         string
	// Attempts made before it was dead-lettered.
	Attempts int
	// LastError is the last publish error (at most 2,000 bytes).
	LastError string
	// Held reports whether it still holds its aggregate's later events.
	Held bool
	// DeadAt is when it was dead-lettered or last acted on (database clock).
	DeadAt time.Time
}

// DeadLetters lists and acts on the dead letters of one outbox table. It
// is safe for concurrent use and may run beside live relays: retry and
// skip read the matching ids, then update those rows by primary key in one
// short transaction, which the claim sees at its next cycle; they never
// wait on other rows, such as a writer's whose COMMIT is held up.
type DeadLetters struct {
	db *sql.DB
	d  *dialect.Dialect
}

// NewDeadLetters returns the dead-letter operations for ob's table on db.
// It does not touch the database; it returns ErrInvalidConfig (wrapped)
// for a nil ob or db.
func NewDeadLetters(ob *driver.Outbox, db *sql.DB) (*DeadLetters, error) {
	if ob == nil || db == nil {
		return nil, fmt.Errorf("%w: NewDeadLetters needs a *driver.Outbox and a *sql.DB", ErrInvalidConfig)
	}
	dd, err := dialectOf(ob)
	if err != nil {
		return nil, err
	}
	return &DeadLetters{db: db, d: dd}, nil
}

// List returns up to limit dead letters matching sel, oldest first
// (limit <= 0 means 100).
func (dl *DeadLetters) List(ctx context.Context, sel Selector, limit int) ([]DeadLetter, error) {
	where, args, err := sel.where()
	if err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 100
	}
	rows, err := dl.db.QueryContext(ctx, dl.d.WithSelectorIndex("dead_list", where, sel.index(), limit), args...)
	if err != nil {
		return nil, fmt.Errorf("outbox: listing dead letters: %w", err)
	}
	defer rows.Close()
	var out []DeadLetter
	for rows.Next() {
		var x DeadLetter
		var held int
		var micros int64
		if err := rows.Scan(&x.ID, &x.MessageID, &x.AggregateType, &x.AggregateID, &x.EventType, &x.Topic,
			&x.Attempts, &x.LastError, &held, &micros); err != nil {
			return nil, fmt.Errorf("outbox: reading dead letter: %w", err)
		}
		x.Held = held == 1
		x.DeadAt = time.UnixMicro(micros).UTC()
		out = append(out, x)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: listing dead letters: %w", err)
	}
	return out, nil
}

// Retry puts the dead letters matching sel back to pending with a fresh
// attempt budget and returns how many it moved. A retried event has a
// lower id than the events it held, so it is published before them.
func (dl *DeadLetters) Retry(ctx context.Context, sel Selector) (int64, error) {
	return dl.exec(ctx, "dead_retry", sel)
}

// Skip leaves the dead letters matching sel failed but releases their
// aggregates, and returns how many it released; already released ones are
// not counted. The events they held go out next, before later ones of
// their aggregates: on PostgreSQL it raises the floor epoch as Retry does,
// so that a relay on the WAL source claims them from the table first.
func (dl *DeadLetters) Skip(ctx context.Context, sel Selector) (int64, error) {
	return dl.exec(ctx, "dead_skip", sel)
}

// deadLetterChunk is the most ids one retry or skip statement lists.
const deadLetterChunk = 500

// exec reads the ids of the dead letters sel matches (a plain read), then
// runs query on those rows by primary key, in one transaction: it locks
// only them, so it never waits on other rows (on MySQL/MariaDB, updating
// by the selector itself could scan and wait on any uncommitted writer).
func (dl *DeadLetters) exec(ctx context.Context, query string, sel Selector) (int64, error) {
	where, args, err := sel.where()
	if err != nil {
		return 0, err
	}
	rows, err := dl.db.QueryContext(ctx, dl.d.WithSelectorIndex("dead_ids", where, sel.index(), 0), args...)
	if err != nil {
		return 0, fmt.Errorf("outbox: dead letters %s: %w", query, err)
	}
	var ids []any
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, fmt.Errorf("outbox: dead letters %s: %w", query, err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(ids) == 0 {
		return 0, err
	}
	tx, err := dl.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("outbox: dead letters %s: %w", query, err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	var n int64
	for _, c := range dialect.Chunks(len(ids), deadLetterChunk) {
		res, err := tx.ExecContext(ctx, dl.d.WithIDs(query, c[1]-c[0]), ids[c[0]:c[1]]...)
		if err != nil {
			return 0, fmt.Errorf("outbox: dead letters %s: %w", query, err)
		}
		k, _ := res.RowsAffected()
		n += k
	}
	if (query == "dead_retry" || query == "dead_skip") && n > 0 && dl.d.HasClaimFloor() {
		// The retried rows are pending again below the relays' scan
		// floors: raising the floor epoch in the same transaction makes
		// the first claim that sees them walk from the start. A skip
		// releases the pending rows its dead letter held: a relay with
		// the WAL source, which checks each batch against the epoch,
		// then claims them from the table before it takes later events
		// of their aggregates from the stream.
		if _, err := tx.ExecContext(ctx, dl.d.Query("floor_bump")); err != nil {
			return 0, fmt.Errorf("outbox: dead letters %s: raising the floor epoch: %w", query, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("outbox: dead letters %s: %w", query, err)
	}
	return n, nil
}

// ErrAllPending wraps ErrInvalidSelector. ListPending returned it for
// Selector.All until it learned to list every pending event;
// DeadLetterPending takes the row ids an operator confirmed, never a
// selector, so dead-lettering every pending event (which would stop the
// whole outbox) still needs them listed and confirmed one by one.
//
// Deprecated: no call returns it; kept for code that matches it.
var ErrAllPending = fmt.Errorf("%w: pending events are selected by message ID, aggregate or row ids, never all", ErrInvalidSelector)

// PendingEvent is one event still waiting to be published (in the
// pending set), as ListPending shows it to an operator who may
// dead-letter it.
type PendingEvent struct {
	ID            int64
	MessageID     string
	AggregateType string
	AggregateID   string
	EventType     string
	Topic         string
	// Attempts counted so far (0 for an event whose route is unroutable:
	// errors wrapping ErrUnavailable count none).
	Attempts int
	// LastError is the last counted publish error, or "".
	LastError string
	// CreatedAt is when it was emitted (database clock).
	CreatedAt time.Time
}

// ListPending returns up to limit pending events matching sel, oldest
// first (limit <= 0 means 100); with sel.All (and nothing else), the
// oldest pending events of the whole table, read from the pending set in
// id order, at a cost of the rows listed, not of the sent history. Invalid
// selectors return ErrInvalidSelector.
func (dl *DeadLetters) ListPending(ctx context.Context, sel Selector, limit int) ([]PendingEvent, error) {
	where, args, err := sel.where()
	if err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 100
	}
	q := dl.d.WithSelector("pending_list", where, limit)
	if sel.All {
		q = dl.d.WithSelector("pending_list_all", "", limit)
	}
	rows, err := dl.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("outbox: listing pending events: %w", err)
	}
	defer rows.Close()
	var out []PendingEvent
	for rows.Next() {
		var x PendingEvent
		var micros int64
		if err := rows.Scan(&x.ID, &x.MessageID, &x.AggregateType, &x.AggregateID, &x.EventType, &x.Topic,
			&x.Attempts, &x.LastError, &micros); err != nil {
			return nil, fmt.Errorf("outbox: reading pending event: %w", err)
		}
		x.CreatedAt = time.UnixMicro(micros).UTC()
		out = append(out, x)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: listing pending events: %w", err)
	}
	return out, nil
}

// DeadLetterPending dead-letters the pending events with the given row
// ids (PendingEvent.ID, at most MaxSelectorIDs: the ones an operator was
// shown and confirmed) and returns how many it changed. The events are
// marked failed with reason as their last error (at most 2,000 bytes
// kept) and their attempt count unchanged; under HoldAggregate they hold
// their aggregate's later events like any dead letter, under SkipDead
// they do not (on PostgreSQL the floor epoch is raised then, as by Skip).
// They can then be retried or skipped with Retry and Skip.
//
// Only rows still pending change: an id the relay has marked sent
// meanwhile, or that is already dead, is left alone (and not counted).
// The statement locks the ids' pending-set rows first, so a relay's
// concurrent mark-sent either comes first (the row stays sent) or waits
// and finds the row dead. An event the relay was publishing at that
// moment may still have reached the broker: retrying it then delivers it
// twice, with the same message ID. It returns ErrInvalidSelector
// (wrapped) for no ids or too many, and database errors wrapped.
func (dl *DeadLetters) DeadLetterPending(ctx context.Context, ids []int64, policy DeadLetterPolicy, reason string) (int64, error) {
	if len(ids) == 0 || len(ids) > MaxSelectorIDs {
		return 0, fmt.Errorf("%w: DeadLetterPending takes 1 to %d row ids, got %d", ErrInvalidSelector, MaxSelectorIDs, len(ids))
	}
	if policy != HoldAggregate && policy != SkipDead {
		return 0, fmt.Errorf("%w: unknown DeadLetterPolicy %d", ErrInvalidConfig, policy)
	}
	if len(reason) > 2000 {
		reason = reason[:2000]
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	tx, err := dl.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("outbox: dead-lettering pending events: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	rows, err := tx.QueryContext(ctx, dl.d.WithIDs("pending_lock", len(args)), args...)
	if err != nil {
		return 0, fmt.Errorf("outbox: dead-lettering pending events: %w", err)
	}
	locked := []any{reason}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, fmt.Errorf("outbox: dead-lettering pending events: %w", err)
		}
		locked = append(locked, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("outbox: dead-lettering pending events: %w", err)
	}
	if len(locked) == 1 {
		return 0, nil
	}
	query := "pending_dead"
	if policy == SkipDead {
		query = "pending_dead_released"
	}
	res, err := tx.ExecContext(ctx, dl.d.WithIDs(query, len(locked)-1), locked...)
	if err != nil {
		return 0, fmt.Errorf("outbox: dead-lettering pending events: %w", err)
	}
	n, _ := res.RowsAffected()
	if policy == SkipDead && n > 0 && dl.d.HasClaimFloor() {
		// Released aggregates: the rows they held go out next (as after
		// Skip), so a relay on the WAL source claims them from the table
		// before later events of theirs from the stream.
		if _, err := tx.ExecContext(ctx, dl.d.Query("floor_bump")); err != nil {
			return 0, fmt.Errorf("outbox: dead-lettering pending events: raising the floor epoch: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("outbox: dead-lettering pending events: %w", err)
	}
	return n, nil
}
