// Package outbox is the transactional outbox for database/sql: events
// emitted inside a transaction are written to an outbox table on the same
// connection just before COMMIT, and a relay publishes them after it, in
// order per aggregate, at least once.
//
// Day to day, application code imports only this package:
//
//	ctx = outbox.NewContext(ctx)           // once per unit of work (or outbox.Middleware)
//	tx, _ := db.BeginTx(ctx, nil)          // db opened with an outbox driver (package driver)
//	err := outbox.Emit(ctx, outbox.Event{  // anywhere below, no *sql.Tx needed
//		AggregateType: "order", AggregateID: id, Type: "order.paid", Payload: body,
//	})
//	err = tx.Commit()                      // rows written, COMMIT, relay woken
//
// InTx does those steps (with Rollback on failure) around a function.
//
// Setup lives in the sub-packages: driver (wrap and register the database
// driver, migrate the table), relay (the loop that publishes) and
// relay/kafka (the Kafka publisher). See docs/guarantees.md for the guarantees.
package outbox

import (
	"context"
	"net/http"

	"github.com/sqloutbox/outbox/emit"
)

// Event is one domain event; see emit.Event for every field's rules.
type Event = emit.Event

// Limits bound what one transaction may emit; see emit.Limits.
type Limits = emit.Limits

// ValidationError says why Emit rejected an event; see emit.ValidationError.
type ValidationError = emit.ValidationError

// Errors returned by Emit; see package emit for when each occurs. Match
// them with errors.Is.
var (
	ErrNoTransaction          = emit.ErrNoTransaction
	ErrConcurrentTransactions = emit.ErrConcurrentTransactions
	ErrInvalidEvent           = emit.ErrInvalidEvent
	ErrMissingField           = emit.ErrMissingField
	ErrInvalidField           = emit.ErrInvalidField
	ErrPayloadNotJSON         = emit.ErrPayloadNotJSON
	ErrRecordTooLarge         = emit.ErrRecordTooLarge
	ErrInvalidHeader          = emit.ErrInvalidHeader
	ErrReservedHeader         = emit.ErrReservedHeader
	ErrDuplicateID            = emit.ErrDuplicateID
	ErrTooManyEvents          = emit.ErrTooManyEvents
	ErrTransactionTooLarge    = emit.ErrTransactionTooLarge
)

// NewContext returns ctx carrying a new emit scope: a transaction begun
// with it (or a context derived from it) on an outbox-wrapped database
// receives the events Emit buffers. See emit.NewContext.
func NewContext(ctx context.Context) context.Context { return emit.NewContext(ctx) }

// Emit validates ev and buffers it in the transaction open in ctx's scope,
// to be written just before that transaction's COMMIT. See emit.Emit for
// the errors it returns; after any error the transaction is still usable.
func Emit(ctx context.Context, ev Event) error { return emit.Emit(ctx, ev) }

// NewMessageID returns a new UUIDv7 message ID, the kind Emit assigns when
// Event.ID is empty; see emit.NewMessageID.
func NewMessageID() (string, error) { return emit.NewMessageID() }

// Middleware returns an http.Handler that gives each request's context its
// own emit scope before calling next, so handlers can begin transactions
// with r.Context() and emit from domain code.
func Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(emit.NewContext(r.Context())))
	})
}
