package inboxrabbitmq

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"

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
// then the ID is the message-id property, or else "sha256:" and the
// SHA-256 of exchange, routing key, headers and body (a redelivery has
// the same; so has an identical message published twice, which is
// applied once), and the aggregate is the exchange and routing key (held
// per key). A delivery tag is never part of an ID: tags restart at 1 on
// every channel.
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
		m.ID = contentID(d, h)
	}
	if _, ok := h[emit.HeaderAggregateID]; !ok {
		m.AggregateType, m.AggregateID = d.Exchange, d.RoutingKey
	}
	return m
}

// contentID is "sha256:" and the hex SHA-256 of the delivery's exchange,
// routing key, headers (sorted by name) and body, each length-prefixed.
func contentID(d amqp.Delivery, h map[string]string) string {
	sum := sha256.New()
	field := func(s string) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		sum.Write(n[:])
		sum.Write([]byte(s))
	}
	field(d.Exchange)
	field(d.RoutingKey)
	for _, k := range slices.Sorted(maps.Keys(h)) {
		field(k)
		field(h[k])
	}
	field(string(d.Body))
	return "sha256:" + hex.EncodeToString(sum.Sum(nil))
}
