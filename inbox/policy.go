package inbox

import "errors"

// ErrPermanent marks a handler error that retrying cannot fix (a malformed
// payload, an event the consumer cannot map): the broker runners
// (inbox/kafka, inbox/nats, inbox/rabbitmq, inbox/redis) park a message
// whose handler error wraps it (errors.Is) after the first attempt
// instead of retrying it. Handle and HandleBatch treat it as any handler
// error. inboxkafka.ErrPermanent is this value.
var ErrPermanent = errors.New("inbox: permanent handler error")

// FailurePolicy says what a broker runner does with a message whose
// handler failed every attempt (or failed with ErrPermanent).
type FailurePolicy int

const (
	// ParkAndHold parks the message (Park) and so holds its aggregate:
	// the aggregate's later messages are stored as Held, not applied,
	// until the parked message is retried or skipped. The default; it
	// keeps the order of every aggregate.
	ParkAndHold FailurePolicy = iota
	// SkipAfterPark parks the message, for the record of it, and skips it
	// at once (Skip), so its aggregate is not held and later messages are
	// applied: order is given up for that message.
	SkipAfterPark
)
