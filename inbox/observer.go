package inbox

import "time"

// Observer hears what an Inbox does, for metrics (the Kafka runner's
// Prometheus collectors implement it). Methods are called synchronously,
// after the fact, from the goroutine that called Handle, Park or Retry:
// they must be quick and must not block. Embed NopObserver to implement
// only some of them (and stay compatible when methods are added).
type Observer interface {
	// Applied: msg's handler transaction committed (Handle or Retry);
	// took is from the start of the transaction to the end of the commit
	// (Handle: also the hold check and the insert).
	Applied(msg Message, took time.Duration)
	// Duplicate: msg was processed before and was skipped (by the Filter
	// or by the table).
	Duplicate(msg Message)
	// Held: msg was stored behind a parked message of its aggregate.
	Held(msg Message)
	// HandlerFailed: msg's handler returned err (wrapped with ErrHandler);
	// its transaction was rolled back.
	HandlerFailed(msg Message, err error)
	// Parked: msg was stored as parked with cause.
	Parked(msg Message, cause error)
}

// NopObserver is an Observer that observes nothing: the default, and a
// base to embed.
type NopObserver struct{}

// Applied does nothing.
func (NopObserver) Applied(Message, time.Duration) {}

// Duplicate does nothing.
func (NopObserver) Duplicate(Message) {}

// Held does nothing.
func (NopObserver) Held(Message) {}

// HandlerFailed does nothing.
func (NopObserver) HandlerFailed(Message, error) {}

// Parked does nothing.
func (NopObserver) Parked(Message, error) {}
