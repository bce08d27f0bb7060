// Package emit defines the outbox event, its validation, and the emit scope
// that ties Emit calls to the transaction they belong to. The root package
// outbox re-exports what application code needs (Event, Emit, NewContext).
//
// # Scopes
//
// NewContext puts a Scope into a context. When a transaction is begun on
// an outbox-wrapped database with that context, the driver binds a Batch
// to the scope; Emit with the same context (or one derived from it)
// validates the event and appends it to that batch. At Commit the driver
// takes the batch and writes it; at Rollback it discards it. A scope holds
// at most one open transaction for Emit's purposes: with none open Emit
// returns ErrNoTransaction, with two open at once ErrConcurrentTransactions,
// never a guess.
//
// # Validation
//
// Every check happens in Emit, so a bad event is an error where it is
// created, never a poison row found later by the relay: required fields,
// syntax and length of every field (so each fits its column and Kafka's
// rules), JSON validity of payloads of the default content type, header
// names (the "outbox-" prefix is reserved for the relay's own headers)
// and values restricted to what every supported broker carries byte for
// byte (NATS header keys are tokens of visible ASCII, its header lines end
// at CR LF and their values are trimmed: see Event.Headers),
// the Kafka record size (RecordSize against Limits.MaxRecordBytes, which
// defaults to the broker's default message.max.bytes), duplicate IDs in the
// transaction, and the per-transaction caps. A rejected Emit changes
// nothing: the transaction stays usable.
//
// # Captured headers
//
// A Capture (driver.Config.Capture; off by default) adds headers to every
// event at Emit, for example the trace context of Emit's ctx
// (github.com/sqloutbox/outbox/otel). It runs before validation, so what it
// adds is validated and counted toward RecordSize like the application's
// own headers, and it never overwrites a header the application set.
package emit
