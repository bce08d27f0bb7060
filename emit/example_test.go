package emit_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/sqloutbox/outbox/emit"
)

// Example shows the life of one transaction's events: the outbox driver
// begins a batch at BeginTx, domain code emits with nothing but the context,
// invalid events are refused at once, and the driver takes the batch at
// COMMIT.
func Example() {
	ctx := emit.NewContext(context.Background()) // once per unit of work

	// What the outbox driver does at BeginTx.
	batch := emit.FromContext(ctx).Begin(emit.Limits{})

	// Deep in domain code.
	err := emit.Emit(ctx, emit.Event{
		ID:            "msg-0001",
		AggregateType: "order",
		AggregateID:   "o-42",
		Type:          "order.paid",
		Payload:       []byte(`{"total":42}`),
		Headers:       map[string]string{"trace-id": "abc"},
	})
	fmt.Println("emit:", err)

	// A payload that is not JSON is refused now, not discovered by the relay.
	err = emit.Emit(ctx, emit.Event{
		AggregateType: "order",
		AggregateID:   "o-42",
		Type:          "order.shipped",
		Payload:       []byte(`{"carrier":`),
	})
	var ve *emit.ValidationError
	fmt.Println("invalid:", errors.Is(err, emit.ErrInvalidEvent), errors.Is(err, emit.ErrPayloadNotJSON), errors.As(err, &ve) && ve.Field == "Payload")

	// The same ID twice in one transaction.
	err = emit.Emit(ctx, emit.Event{
		ID:            "msg-0001",
		AggregateType: "order",
		AggregateID:   "o-42",
		Type:          "order.paid",
		Payload:       []byte(`{}`),
	})
	fmt.Println("duplicate:", errors.Is(err, emit.ErrDuplicateID))

	// What the outbox driver does at COMMIT.
	for _, ev := range batch.Take() {
		fmt.Println(ev.ID, ev.AggregateType, ev.AggregateID, ev.Type, ev.ContentType, string(ev.Payload), ev.Headers["trace-id"], emit.RecordSize(&ev))
	}

	// The transaction is over: nothing to emit into.
	err = emit.Emit(ctx, emit.Event{AggregateType: "order", AggregateID: "o-42", Type: "order.paid", Payload: []byte(`{}`)})
	fmt.Println("after commit:", errors.Is(err, emit.ErrNoTransaction))

	// Output:
	// emit: <nil>
	// invalid: true true true
	// duplicate: true
	// msg-0001 order o-42 order.paid application/json {"total":42} abc 416
	// after commit: true
}
