package inboxrabbitmq_test

import (
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sqloutbox/outbox/emit"
	inboxrabbitmq "github.com/sqloutbox/outbox/inbox/rabbitmq"
)

func TestMessage(t *testing.T) {
	t.Parallel()
	relayed := amqp.Delivery{Exchange: "outbox", RoutingKey: "order.o-1", DeliveryTag: 7, Body: []byte("{}"),
		Headers: amqp.Table{emit.HeaderMessageID: "m-1", emit.HeaderAggregateType: "order", emit.HeaderAggregateID: "o-1",
			"traceparent": "00-abc", "n": int32(5), "raw": []byte("b")}}
	m := inboxrabbitmq.Message(relayed)
	if m.ID != "m-1" || m.AggregateType != "order" || m.AggregateID != "o-1" || m.Topic != "outbox" ||
		string(m.Key) != "order.o-1" || string(m.Payload) != "{}" || m.Headers["traceparent"] != "00-abc" ||
		m.Headers["n"] != "5" || m.Headers["raw"] != "b" {
		t.Errorf("relayed: %+v", m)
	}

	foreign := amqp.Delivery{Exchange: "ex", RoutingKey: "k", DeliveryTag: 1, Body: []byte("a"), Headers: amqp.Table{"h": "v"}}
	withID := foreign
	withID.MessageId = "prop-1"
	if got := inboxrabbitmq.Message(withID); got.ID != "prop-1" || got.AggregateType != "ex" || got.AggregateID != "k" {
		t.Errorf("message-id property: %+v", got)
	}
	id := inboxrabbitmq.Message(foreign).ID
	if !strings.HasPrefix(id, "sha256:") || len(id) != len("sha256:")+64 {
		t.Fatalf("content ID %q", id)
	}
	for name, tc := range map[string]struct {
		mod  func(*amqp.Delivery)
		same bool
	}{
		"redelivered on another channel": {func(d *amqp.Delivery) { d.DeliveryTag, d.Redelivered = 1, true }, true},
		"another tag":                    {func(d *amqp.Delivery) { d.DeliveryTag = 99 }, true},
		"another body":                   {func(d *amqp.Delivery) { d.Body = []byte("b") }, false},
		"another key":                    {func(d *amqp.Delivery) { d.RoutingKey = "k2" }, false},
		"another header":                 {func(d *amqp.Delivery) { d.Headers = amqp.Table{"h": "w"} }, false},
		"fields shifted":                 {func(d *amqp.Delivery) { d.Exchange, d.RoutingKey = "e", "xk" }, false},
	} {
		d := foreign
		tc.mod(&d)
		if got := inboxrabbitmq.Message(d).ID; (got == id) != tc.same {
			t.Errorf("%s: ID %q, first %q, want same %v", name, got, id, tc.same)
		}
	}
}
