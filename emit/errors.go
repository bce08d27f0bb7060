package emit

import (
	"errors"
	"fmt"
)

// Errors returned by Emit. Match them with errors.Is; a *ValidationError
// carries the offending field. Every error listed here leaves the
// transaction usable: the rejected event is simply not buffered.
var (
	// ErrNoTransaction is returned by Emit when the context carries no emit
	// scope (see NewContext), or the scope has no open transaction: the
	// transaction was not begun with a context derived from the scope, was
	// begun on a database opened without the outbox driver, is read-only,
	// or has already committed or rolled back.
	ErrNoTransaction = errors.New("outbox: no open read-write transaction in the emit scope")

	// ErrConcurrentTransactions is returned by Emit while two or more
	// transactions begun with the same scope are open at once: the event
	// could belong to either, and Emit never guesses. Give each transaction
	// its own scope (NewContext) or finish one before beginning the other.
	ErrConcurrentTransactions = errors.New("outbox: more than one transaction open in the emit scope")

	// ErrInvalidEvent is matched by every per-event validation failure
	// (missing field, bad payload, bad header, record too large, duplicate ID).
	ErrInvalidEvent = errors.New("outbox: invalid event")

	// ErrMissingField: a required field (AggregateType, AggregateID, Type) is empty.
	ErrMissingField = errors.New("required field is empty")

	// ErrInvalidField: a field breaks its documented syntax or length limit.
	ErrInvalidField = errors.New("field is malformed")

	// ErrPayloadNotJSON: ContentType is application/json (the default) and
	// Payload is not one valid JSON value (encoding/json.Valid).
	ErrPayloadNotJSON = errors.New("payload is not valid JSON")

	// ErrRecordTooLarge: the Kafka record the relay would produce for the
	// event (key, value, headers and record overhead, see RecordSize) exceeds
	// Limits.MaxRecordBytes.
	ErrRecordTooLarge = errors.New("record too large")

	// ErrInvalidHeader: a header name is empty, longer than MaxHeaderNameBytes,
	// or not valid UTF-8 without control characters, or a value is not valid UTF-8.
	ErrInvalidHeader = errors.New("invalid header")

	// ErrReservedHeader: a header name starts with ReservedHeaderPrefix
	// ("outbox-", any case; those headers are written by the relay) or
	// BrokerHeaderPrefix ("Nats-", any case; JetStream acts on those).
	ErrReservedHeader = errors.New("reserved header name")

	// ErrDuplicateID: the event's ID equals the ID of an event already
	// buffered in the same transaction. (Across transactions the unique
	// index on message_id rejects it at COMMIT.)
	ErrDuplicateID = errors.New("message ID already used in this transaction")

	// ErrTooManyEvents: buffering the event would exceed Limits.MaxEvents
	// for the transaction.
	ErrTooManyEvents = errors.New("outbox: too many events in one transaction")

	// ErrTransactionTooLarge: buffering the event would exceed
	// Limits.MaxBytes of records for the transaction.
	ErrTransactionTooLarge = errors.New("outbox: too many bytes of events in one transaction")
)

// ValidationError describes why Emit rejected an event. It matches
// ErrInvalidEvent and the specific sentinel in Err (ErrMissingField,
// ErrInvalidField, ErrPayloadNotJSON, ErrRecordTooLarge, ErrInvalidHeader,
// ErrReservedHeader or ErrDuplicateID) with errors.Is.
type ValidationError struct {
	// Field is the Event field at fault: "ID", "AggregateType",
	// "AggregateID", "Type", "Topic", "ContentType", "Payload",
	// "Headers[name]", or "" for the record as a whole.
	Field string
	// Reason is a human-readable detail, never containing payload bytes.
	Reason string
	// Err is the specific sentinel.
	Err error
}

// Error implements error.
func (e *ValidationError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("outbox: invalid event: %v: %s", e.Err, e.Reason)
	}
	return fmt.Sprintf("outbox: invalid event: %s: %v: %s", e.Field, e.Err, e.Reason)
}

// Unwrap lets errors.Is match both ErrInvalidEvent and the specific sentinel.
func (e *ValidationError) Unwrap() []error { return []error{ErrInvalidEvent, e.Err} }

func invalid(field string, err error, format string, args ...any) error {
	return &ValidationError{Field: field, Err: err, Reason: fmt.Sprintf(format, args...)}
}
