package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
)

// repo is all the domain code needs from the database: *sql.Tx satisfies
// it, and the domain never sees a transaction by type. Events go out
// through outbox.Emit on the context, not through repo.
type repo interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Order states: created -> paid -> shipped.
const (
	statusCreated = "created"
	statusPaid    = "paid"
	statusShipped = "shipped"
)

// Event types, one per transition.
const (
	eventCreated = "order.created"
	eventPaid    = "order.paid"
	eventShipped = "order.shipped"
)

// errTransition is returned for a step the state machine does not allow
// (paying an order twice, shipping an unpaid or unknown one).
var errTransition = errors.New("order: transition not allowed")

// orders is the order aggregate's repository-and-domain logic: each method
// locks the order's row (Pay and Ship with SELECT ... FOR UPDATE, Create by
// inserting it), checks the state machine, writes the change and emits the
// matching event into the caller's transaction. Locking the row is what
// makes an order's outbox ids follow its commit order.
type orders struct {
	selectForUpdate string
	insert          string
	update          string
}

func newOrders(d driver.Dialect, table string) *orders {
	ph := func(n int) string { return "?" }
	lock := " FOR UPDATE"
	switch d {
	case driver.Postgres:
		ph = func(n int) string { return fmt.Sprintf("$%d", n) }
	case driver.SQLite:
		// No FOR UPDATE in SQLite: transactions begin with BEGIN IMMEDIATE
		// (_txlock=immediate), which takes the database's write lock, so
		// writers are already serialized.
		lock = ""
	}
	return &orders{
		selectForUpdate: fmt.Sprintf("SELECT status, amount_cents FROM %s WHERE id = %s%s", table, ph(1), lock),
		insert:          fmt.Sprintf("INSERT INTO %s (id, status, amount_cents) VALUES (%s, %s, %s)", table, ph(1), ph(2), ph(3)),
		update:          fmt.Sprintf("UPDATE %s SET status = %s WHERE id = %s", table, ph(1), ph(2)),
	}
}

// orderPayload is the JSON body of every order event.
type orderPayload struct {
	OrderID     string `json:"order_id"`
	Status      string `json:"status"`
	AmountCents int64  `json:"amount_cents"`
}

// lock reads the order's status under a row lock; found is false if the
// order does not exist.
func (o *orders) lock(ctx context.Context, r repo, id string) (status string, amount int64, found bool, err error) {
	err = r.QueryRowContext(ctx, o.selectForUpdate, id).Scan(&status, &amount)
	if errors.Is(err, sql.ErrNoRows) {
		return "", 0, false, nil
	}
	if err != nil {
		return "", 0, false, fmt.Errorf("locking order %s: %w", id, err)
	}
	return status, amount, true, nil
}

func emitOrderEvent(ctx context.Context, id, eventType, status string, amount int64) error {
	body, err := json.Marshal(orderPayload{OrderID: id, Status: status, AmountCents: amount})
	if err != nil {
		return err
	}
	return outbox.Emit(ctx, outbox.Event{
		AggregateType: "order",
		AggregateID:   id,
		Type:          eventType,
		Payload:       body,
	})
}

// Create inserts a new order and emits order.created. The INSERT itself
// takes the new row's lock; an existing order fails on the primary key.
// (A SELECT ... FOR UPDATE of a row that does not exist yet would lock the
// index gap on MySQL/InnoDB, and concurrent creates into one gap deadlock.)
func (o *orders) Create(ctx context.Context, r repo, id string, amountCents int64) error {
	if _, err := r.ExecContext(ctx, o.insert, id, statusCreated, amountCents); err != nil {
		return fmt.Errorf("creating order %s: %w", id, err)
	}
	return emitOrderEvent(ctx, id, eventCreated, statusCreated, amountCents)
}

// Pay moves a created order to paid and emits order.paid.
func (o *orders) Pay(ctx context.Context, r repo, id string) error {
	return o.transition(ctx, r, id, statusCreated, statusPaid, eventPaid)
}

// Ship moves a paid order to shipped and emits order.shipped.
func (o *orders) Ship(ctx context.Context, r repo, id string) error {
	return o.transition(ctx, r, id, statusPaid, statusShipped, eventShipped)
}

func (o *orders) transition(ctx context.Context, r repo, id, from, to, eventType string) error {
	status, amount, found, err := o.lock(ctx, r, id)
	if err != nil {
		return err
	}
	if !found || status != from {
		return fmt.Errorf("%w: order %s is %q, want %q for %s", errTransition, id, status, from, eventType)
	}
	if _, err := r.ExecContext(ctx, o.update, to, id); err != nil {
		return fmt.Errorf("updating order %s: %w", id, err)
	}
	return emitOrderEvent(ctx, id, eventType, to, amount)
}
