package inbox

import (
	"fmt"
	"maps"

	"github.com/sqloutbox/outbox/emit"
)

// MessageFromHeaders builds the Message of a message the outbox relay
// published, from its headers and payload, whatever the broker: ID from
// the outbox-message-id header, AggregateType and AggregateID from
// outbox-aggregate-type and outbox-aggregate-id (emit.Header*: the relay
// writes them on every broker), Headers a copy of headers (Retry needs
// them for a parked message), Payload as given (not copied). Topic,
// Partition, Offset and Key are left for the caller (where the broker has
// them).
//
// What each broker's client hands over as headers:
//   - NATS JetStream: msg.Headers(), a nats.Header; take each key's
//     first value (Header.Get).
//   - RabbitMQ: delivery.Headers, an amqp.Table whose values are strings.
//   - Redis Streams: the entry's fields, without the payload's field
//     (redispub.PayloadField, "outbox-payload").
//   - Kafka: inboxkafka.Message does the same for a *kgo.Record, and its
//     Runner calls it.
//
// It returns an error wrapping ErrInvalidMessage when the
// outbox-message-id header is missing or empty (the message did not come
// from the relay: give it an ID of your own, one its redeliveries share)
// or a field breaks Handle's rules (length, UTF-8, NUL).
func MessageFromHeaders(headers map[string]string, payload []byte) (Message, error) {
	m := Message{
		ID:            headers[emit.HeaderMessageID],
		AggregateType: headers[emit.HeaderAggregateType],
		AggregateID:   headers[emit.HeaderAggregateID],
		Headers:       maps.Clone(headers),
		Payload:       payload,
	}
	if m.ID == "" {
		return Message{}, fmt.Errorf("%w: no %s header: not a message of the outbox relay (build the Message with an ID its redeliveries share)", ErrInvalidMessage, emit.HeaderMessageID)
	}
	if err := validate(m); err != nil {
		return Message{}, err
	}
	return m, nil
}
