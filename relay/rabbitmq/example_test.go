package rabbitmq_test

import (
	"fmt"

	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/rabbitmq"
)

// ExampleNewPublisher builds the publisher for a relay
// (relay.Config{Publisher: p}). The exchange must exist and have queues
// bound (for example "order.*", every key of the aggregate type order);
// the publisher declares nothing.
func ExampleNewPublisher() {
	p, err := rabbitmq.NewPublisher(rabbitmq.Config{URL: "amqp://guest:guest@127.0.0.1:5672/", Exchange: "outbox.event"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	_ = relay.Config{Publisher: p}
}

// ExampleDefaultRoutingKey shows one aggregate's routing key.
func ExampleDefaultRoutingKey() {
	fmt.Println(rabbitmq.DefaultRoutingKey(relay.Message{AggregateType: "order", AggregateID: "o-17"}))
	fmt.Println(rabbitmq.DefaultRoutingKey(relay.Message{AggregateType: "order", AggregateID: "eu.customer #42"}))
	// Output:
	// order.o-17
	// order.eu%2Ecustomer%20%2342
}
