package rabbitmqtest_test

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/rabbitmq"
	"github.com/sqloutbox/outbox/relay/rabbitmq/rabbitmqtest"
)

// A test's own exchange, a consumer (and its queue) of an aggregate
// type's routing keys, and a publisher to the exchange.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const url = "amqp://guest:guest@127.0.0.1:5672/"
	conn, err := amqp.Dial(url)
	if err != nil {
		fmt.Println("no RabbitMQ:", err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		fmt.Println(err)
		return
	}
	ex, err := rabbitmqtest.DeclareExchange(ch)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = ch.ExchangeDelete(ex, false, false) }()
	c, err := rabbitmqtest.NewConsumer(conn, ex, "order.#")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = c.Close() }()

	pub, err := rabbitmq.NewPublisher(rabbitmq.Config{URL: url, Exchange: ex})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = pub.Close() }()
	err = pub.Publish(ctx, []relay.Message{{ID: 1, MessageID: "m-1", AggregateType: "order", AggregateID: "o-1",
		EventType: "order.paid", ContentType: "application/json", Payload: []byte(`{"cents":1250}`)}})
	if err != nil {
		fmt.Println(err)
		return
	}
	recs, err := c.WaitForMessageIDs(ctx, "m-1")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(recs[0].RoutingKey, recs[0].Headers["outbox-event-type"], string(recs[0].Payload))
	// The ledger: the rows the outbox table holds (read back with a SELECT
	// in a real test) against what was received; m-2 was never published.
	rows := []outboxtest.Row{{ID: 1, MessageID: "m-1", AggregateType: "order", AggregateID: "o-1"},
		{ID: 2, MessageID: "m-2", AggregateType: "order", AggregateID: "o-1"}}
	l := rabbitmqtest.Check(rows, recs)
	fmt.Printf("committed %d, delivered %d, lost %v\n", l.Committed, l.Delivered, l.Lost)
	// Output:
	// order.o-1 order.paid {"cents":1250}
	// committed 2, delivered 1, lost [m-2]
}
