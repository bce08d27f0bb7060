package inboxrabbitmq

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/inbox"
)

// Message converts a delivery to the inbox's message, as
// inbox.MessageFromHeaders does: ID from the outbox-message-id header,
// AggregateType and AggregateID from outbox-aggregate-type and
// outbox-aggregate-id (the headers relay/rabbitmq writes), Headers every
// header table entry as a string (long strings and byte arrays as they
// are, other types formatted with fmt), Payload the body (not copied),
// Topic the exchange and Key the routing key.
//
// A message that did not come from the outbox relay may lack the headers:
// then the ID is the message-id property, or else
// "<exchange>/<routing key>/<delivery tag>" (recognised only as a
// redelivery on the same channel), and the aggregate is the routing key
// (held per key).
func Message(d amqp.Delivery) inbox.Message {
	h := make(map[string]string, len(d.Headers))
	for k, v := range d.Headers {
		switch v := v.(type) {
		case string:
			h[k] = v
		case []byte:
			h[k] = string(v)
		default:
			h[k] = fmt.Sprint(v)
		}
	}
	m := inbox.Message{ID: h[emit.HeaderMessageID], AggregateType: h[emit.HeaderAggregateType],
		AggregateID: h[emit.HeaderAggregateID], Headers: h, Payload: d.Body, Topic: d.Exchange, Key: []byte(d.RoutingKey)}
	if m.ID == "" {
		m.ID = d.MessageId
	}
	if m.ID == "" {
		m.ID = fmt.Sprintf("%s/%s/%d", d.Exchange, d.RoutingKey, d.DeliveryTag)
	}
	if _, ok := h[emit.HeaderAggregateID]; !ok {
		m.AggregateType, m.AggregateID = d.Exchange, d.RoutingKey
	}
	return m
}
