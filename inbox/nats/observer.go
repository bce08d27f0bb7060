package inboxnats

import (
	"time"

	"github.com/sqloutbox/outbox/inbox"
)

// Observer is told what the runner does with messages, for metrics and
// tests. Its methods are called from the workers concurrently and must
// not block. (What the inbox does with messages, Retry's included, is
// told to the inbox's own inbox.Observer.)
type Observer interface {
	// Processed is called once per delivery whose outcome is stored (or
	// that was passed over as invalid), before its acknowledgement.
	Processed(Result)
	// AttemptFailed is called for every failed handler attempt (attempt
	// counts from 1), before the retry or the park; stream and seq locate
	// the message.
	AttemptFailed(stream string, seq uint64, attempt int, err error)
}

// Result is one delivery's stored outcome.
type Result struct {
	// Stream and Sequence locate the message: the stream's name and the
	// message's stream sequence, the same for every delivery of it,
	// whichever process or consumer incarnation received it.
	Stream   string
	Sequence uint64
	// Subject is the subject the message was published to.
	Subject string
	// Delivered is JetStream's delivery count of this consumer
	// incarnation (1 the first time; the consumer is recreated at every
	// lease handover, which starts the count again).
	Delivered uint64
	// Outcome is the inbox's (Applied, Duplicate or Held); 0 when Parked
	// or Invalid.
	Outcome inbox.Outcome
	// Parked: every attempt failed and the message was parked (with
	// SkipAfterPark, also skipped).
	Parked bool
	// Invalid: the inbox refused to store the message (ErrInvalidMessage);
	// it was passed over (and acknowledged).
	Invalid bool
	// Attempts is the number of handler attempts (1 for a success at the
	// first try; counting those that failed).
	Attempts int
	// Duration is the last attempt's inbox call, transaction included (0
	// for a parked message).
	Duration time.Duration
}

type nopObserver struct{}

func (nopObserver) Processed(Result)                         {}
func (nopObserver) AttemptFailed(string, uint64, int, error) {}
