package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Message is one outbox row as the relay hands it to a Publisher.
type Message struct {
	// ID is the row's outbox id: ascending in insert order, the order the
	// relay first-delivers one aggregate's events in. 0 for an event of
	// the log-only mode (driver.Config.LogOnly) read from the WAL and not
	// written to the table: such events arrive in commit order.
	ID int64
	// MessageID is the event's message ID (consumers dedupe by it).
	MessageID     string
	AggregateType string
	AggregateID   string
	EventType     string
	// Topic is the event's own topic, or "" to let the publisher route it.
	Topic       string
	ContentType string
	// Partition is the relay partition (partition.Of) stored on the row.
	Partition int
	// Epoch is the fencing token of this relay's lease on Partition when
	// the message was claimed; publishers send it as a header so that
	// ownership can be audited from the records.
	Epoch int64
	// Payload and Headers are exactly what was given to Emit.
	Payload []byte
	Headers map[string]string
	// Attempts counts earlier publish attempts of this message (0 the first time).
	Attempts int
	// Age is how long before the claim the row was written, by the
	// database clock (written just before its transaction's COMMIT, so
	// about the time since commit).
	Age time.Duration

	// log marks an event read from a logical decoding message
	// (log-only mode) and not in the table.
	log bool
}

// Publisher sends messages to a broker. Publish receives a batch in outbox
// id order and must not return before every message is acknowledged or has
// failed. It returns nil when all were acknowledged; a PublishErrors (same
// length as msgs, nil for acknowledged entries) when some failed; or any
// other error when the whole batch failed (the relay then backs off as a
// whole and re-sends later without counting an attempt). Publish must
// honour ctx's deadline.
//
// In a PublishErrors, an entry wrapping ErrPermanent is dead-lettered at
// once; one wrapping ErrUnavailable or a *BatchError (not sent, or its
// outcome unknown, because of the route or the batch as a whole: a
// deadline, a lost connection) counts no attempt and stays pending, and
// the relay backs off as a whole after recording the other outcomes; any
// other error counts an attempt and schedules a retry. Only an
// aggregate's first failed entry in the batch counts; its later entries
// stay pending.
//
// Order: a Publisher must never let a message be written to the broker
// unless every earlier message of its aggregate (same AggregateType and
// AggregateID) in the batch was acknowledged or is written with it,
// atomically and before it. So once one fails, the aggregate's later
// messages must fail unsent (ErrHeldBack); the relay's holds keep the
// order across batches. The relay reports an acknowledged message behind
// a failed one of its aggregate as an order violation (OrderObserver).
type Publisher interface {
	Publish(ctx context.Context, msgs []Message) error
}

// PublishErrors reports per-message outcomes of one Publish call: entry i
// belongs to msgs[i]; nil means acknowledged.
type PublishErrors []error

// Error summarizes the failures.
func (pe PublishErrors) Error() string {
	n, first := 0, error(nil)
	for _, e := range pe {
		if e != nil {
			if first == nil {
				first = e
			}
			n++
		}
	}
	return fmt.Sprintf("outbox: %d of %d messages failed to publish; first: %v", n, len(pe), first)
}

// ErrPermanent marks a publish error that retrying cannot fix (for example a
// record the broker refuses as too large). Wrap it (fmt.Errorf("%w: ...",
// relay.ErrPermanent)) and the relay dead-letters the message at once
// instead of spending its remaining attempts.
var ErrPermanent = errors.New("outbox: permanent publish error")

// ErrUnavailable marks a publish error that no message can fix and that
// is not the message's fault: the route or the whole producer is
// misconfigured (authorization denied, unknown topic, TLS or SASL
// failure). The relay counts no attempt and dead-letters nothing for it:
// it logs the error, calls OnUnavailable, backs off as a whole and tries
// again, so a configuration mistake never dead-letters the backlog.
var ErrUnavailable = errors.New("outbox: route unavailable")

// errText returns err's text trimmed to what the last_error column keeps.
func errText(err error) string {
	s := err.Error()
	if len(s) > 2000 {
		s = s[:2000]
	}
	return strings.ToValidUTF8(s, "?")
}
