package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/sqloutbox/outbox"
)

// repo is what domain code needs of a transaction; it never sees *sql.Tx.
type repo interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var (
	errNotFound   = errors.New("order not found")
	errTransition = errors.New("order is not in a state that allows this")
)

// orders is the domain: each method changes an order and emits its event.
type orders struct {
	ph        func(n int) string // placeholder style
	forUpdate string
}

type orderEvent struct {
	OrderID     string `json:"order_id"`
	Status      string `json:"status"`
	AmountCents int64  `json:"amount_cents"`
}

func (o *orders) emit(ctx context.Context, id, typ, status string, amount int64) error {
	b, _ := json.Marshal(orderEvent{OrderID: id, Status: status, AmountCents: amount})
	return outbox.Emit(ctx, outbox.Event{AggregateType: "order", AggregateID: id, Type: typ, Payload: b})
}

// Create inserts a new order and emits order.created.
func (o *orders) Create(ctx context.Context, r repo, id string, amount int64) error {
	if _, err := r.ExecContext(ctx, fmt.Sprintf("INSERT INTO svc_order (id, status, amount_cents) VALUES (%s, 'created', %s)", o.ph(1), o.ph(2)), id, amount); err != nil {
		return err
	}
	return o.emit(ctx, id, "order.created", "created", amount)
}

// Pay moves a created order to paid (locking its row) and emits order.paid.
func (o *orders) Pay(ctx context.Context, r repo, id string) error {
	var status string
	var amount int64
	err := r.QueryRowContext(ctx, "SELECT status, amount_cents FROM svc_order WHERE id = "+o.ph(1)+o.forUpdate, id).Scan(&status, &amount)
	if errors.Is(err, sql.ErrNoRows) {
		return errNotFound
	}
	if err != nil {
		return err
	}
	if status != "created" {
		return errTransition
	}
	if _, err := r.ExecContext(ctx, "UPDATE svc_order SET status = 'paid' WHERE id = "+o.ph(1), id); err != nil {
		return err
	}
	return o.emit(ctx, id, "order.paid", "paid", amount)
}

// Get reads an order.
func (o *orders) Get(ctx context.Context, r repo, id string) (orderEvent, error) {
	ev := orderEvent{OrderID: id}
	err := r.QueryRowContext(ctx, "SELECT status, amount_cents FROM svc_order WHERE id = "+o.ph(1), id).Scan(&ev.Status, &ev.AmountCents)
	if errors.Is(err, sql.ErrNoRows) {
		return ev, errNotFound
	}
	return ev, err
}
