package inboxkafka

import (
	"time"

	"github.com/sqloutbox/outbox/inbox"
)

// Observer is told what the runner does with records, for metrics and
// tests. Its methods are called from partition workers concurrently and
// must not block. (What the inbox does with messages, Retry's included,
// is told to the inbox's own inbox.Observer; Metrics implements both.)
type Observer interface {
	// Processed is called once per record whose outcome is stored (or
	// that was passed over as invalid).
	Processed(Result)
	// AttemptFailed is called for every failed handler attempt (attempt
	// counts from 1), before the retry or the park.
	AttemptFailed(topic string, partition int32, attempt int, err error)
	// Lag is called after each record with the partition's lag: the high
	// watermark of the last fetch minus the offset after that record
	// (records), never negative.
	Lag(topic string, partition int32, lag int64)
	// PartitionRevoked is called when the runner stopped a partition's
	// worker because the partition was revoked or lost.
	PartitionRevoked(topic string, partition int32)
}

// Result is one record's stored outcome.
type Result struct {
	// Topic, Partition and Offset locate the record.
	Topic     string
	Partition int32
	Offset    int64
	// Outcome is the inbox's (Applied, Duplicate or Held); 0 when Parked
	// or Invalid.
	Outcome inbox.Outcome
	// Parked: every attempt failed and the record was parked (with
	// SkipAfterPark, also skipped).
	Parked bool
	// Invalid: the inbox refused to store the record (ErrInvalidMessage);
	// it was passed over.
	Invalid bool
	// Attempts is the number of handler attempts (1 for a success at the
	// first try; counting those that failed).
	Attempts int
	// Duration is the last attempt's inbox.Handle call, transaction
	// included (0 for a parked record).
	Duration time.Duration
}

type nopObserver struct{}

func (nopObserver) Processed(Result)                        {}
func (nopObserver) AttemptFailed(string, int32, int, error) {}
func (nopObserver) Lag(string, int32, int64)                {}
func (nopObserver) PartitionRevoked(string, int32)          {}
