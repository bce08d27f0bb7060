package relay

import (
	"context"
	"time"
)

// ErrorClass classifies a publish failure for observers.
type ErrorClass string

// The failure classes (see the package documentation's Outcomes).
const (
	// ClassTransient: a per-message failure that will be retried.
	ClassTransient ErrorClass = "transient"
	// ClassPermanent: ErrPermanent, dead-lettered at once.
	ClassPermanent ErrorClass = "permanent"
	// ClassUnavailable: ErrUnavailable, misconfiguration; nothing counted.
	ClassUnavailable ErrorClass = "unavailable"
	// ClassBatch: the whole batch failed (broker unreachable, timeout).
	ClassBatch ErrorClass = "batch"
)

// Observer receives what the relay does, for metrics (package metrics
// implements it on Prometheus). Methods are called synchronously from the
// relay's loop: they must be quick and must not block. A nil
// Config.Observer observes nothing. An Observer may also implement
// PartitionObserver to hear about relay partition mismatches.
type Observer interface {
	// Claimed: a claim returned n messages and took the given time.
	Claimed(n int, took time.Duration)
	// Published: m was acknowledged by the broker, took after its claim;
	// m.Age + took approximates commit-to-publish latency.
	Published(m Message, took time.Duration)
	// Failed: a publish failed for m (ClassBatch: for each message of a
	// batch that failed as a whole).
	Failed(m Message, class ErrorClass, err error)
	// Retried: m will be tried again after delay; attempt is the number
	// of attempts made so far.
	Retried(m Message, attempt int, delay time.Duration)
	// DeadLettered: m was marked failed.
	DeadLettered(m Message, err error)
	// Leases: the instance now owns this many partitions.
	Leases(owned int)
	// Up: the relay started (true) or stopped (false).
	Up(up bool)
}

// NopObserver is an Observer that observes nothing: the relay's default,
// and a base to embed in an Observer that implements only some methods
// (or only an optional interface such as PublishObserver).
type NopObserver struct{}

// Claimed does nothing.
func (NopObserver) Claimed(int, time.Duration) {}

// Published does nothing.
func (NopObserver) Published(Message, time.Duration) {}

// Failed does nothing.
func (NopObserver) Failed(Message, ErrorClass, error) {}

// Retried does nothing.
func (NopObserver) Retried(Message, int, time.Duration) {}

// DeadLettered does nothing.
func (NopObserver) DeadLettered(Message, error) {}

// Leases does nothing.
func (NopObserver) Leases(int) {}

// Up does nothing.
func (NopObserver) Up(bool) {}

// PublishObserver is an optional interface of an Observer, for tracing
// (package github.com/sqloutbox/outbox/otel implements it with
// OpenTelemetry spans). If Config.Observer implements it, the relay calls
// StartPublish just before each Publisher.Publish call with that call's
// context and batch (in outbox id order), passes the returned context to
// Publish (so a publisher's own instrumentation nests under a span started
// here), and calls end exactly once, right after Publish returns, with
// Publish's result: nil when every message was acknowledged, a
// PublishErrors when some failed, any other error when the batch failed
// as a whole (see Publisher). StartPublish must return a non-nil context
// (ctx itself if it adds nothing) and a non-nil end (the relay uses ctx
// for a nil context and skips a nil end). It may read msgs until
// end returns but must neither modify nor keep them. Like Observer's
// methods, both must be quick and must not block. An Observer that does
// not implement it costs the relay nothing.
type PublishObserver interface {
	StartPublish(ctx context.Context, msgs []Message) (_ context.Context, end func(err error))
}

// OrderObserver is an optional interface of an Observer (package metrics'
// RelayMetrics and package otel's Metrics implement it). The relay calls
// OrderViolation for a message m that the publisher acknowledged although
// an earlier message of the same aggregate in the same batch failed: m's
// first delivery may then precede the earlier message's, breaking
// per-aggregate order. The relay also logs each one at ERROR ("publisher
// acknowledged a message after an earlier one of its aggregate failed").
//
// No publisher of this module lets that happen: relay/kafka sends an
// aggregate's records only after every earlier one was acknowledged or
// inside the same record batch, and PublishInOrder holds an aggregate back
// after its first failure (ErrHeldBack). The detector stays as an alarm
// for a third-party Publisher and a regression: alert on any increase.
// Like Observer's methods it must not block.
type OrderObserver interface {
	OrderViolation(m Message)
}

// TransactionOutcome is how one broker transaction of a Reconciler
// Publisher ended (see TransactionObserver).
type TransactionOutcome string

// The transaction outcomes.
const (
	// TxnCommitted: every message of the transaction was acknowledged.
	TxnCommitted TransactionOutcome = "committed"
	// TxnAborted: a message failed (or the transaction could not be
	// committed) and the transaction was aborted: none of its messages
	// reached a read_committed consumer.
	TxnAborted TransactionOutcome = "aborted"
	// TxnUnknown: the outcome is unknown (ErrOutcomeUnknown); the relay
	// reconciles the partition before it claims from it again.
	TxnUnknown TransactionOutcome = "unknown"
	// TxnFenced: the publisher's producer of the partition was fenced
	// (ErrFenced): another relay took the partition, or the broker
	// aborted a transaction left open too long.
	TxnFenced TransactionOutcome = "fenced"
)

// TransactionObserver is an optional interface of an Observer (package
// metrics' RelayMetrics implements it). With a Publisher that is a
// Reconciler (relay/kafka's exactly-once mode), each relay partition's
// share of a batch is one broker transaction: after each Publish the relay
// calls Transaction once per relay partition of the batch with its outcome
// and message count, and Reconciled after each successful Reconcile with
// the number of rows the broker had committed that the relay then marked
// sent (0 when the database was up to date). Like Observer's methods they
// must not block.
type TransactionObserver interface {
	Transaction(partition int, outcome TransactionOutcome, messages int)
	Reconciled(partition int, rows int)
}
