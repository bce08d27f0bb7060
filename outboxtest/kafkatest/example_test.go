package kafkatest_test

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
)

// Example starts a broker with a topic, produces two records as the relay
// would (the message ID in the outbox-message-id header), consumes them
// and checks them against the rows the outbox table holds. In a real test
// the relay produces and the rows come from a SELECT on the outbox table.
func Example() {
	const topic = "outbox.event.order"
	b, err := kafkatest.Start(kafkatest.Topics(3, topic))
	if err != nil {
		panic(err)
	}
	defer b.Close()
	c, err := kafkatest.NewConsumer(b.Addrs(), []string{topic})
	if err != nil {
		panic(err)
	}
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...))
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	for _, id := range []string{"m1", "m2"} {
		r := &kgo.Record{Topic: topic, Key: []byte("order-1"), Value: []byte(`{}`),
			Headers: []kgo.RecordHeader{{Key: emit.HeaderMessageID, Value: []byte(id)}}}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			panic(err)
		}
	}

	recs, err := c.WaitForMessageIDs(ctx, "m1", "m2")
	if err != nil {
		panic(err)
	}
	rows := []kafkatest.Row{
		{ID: 1, MessageID: "m1", AggregateType: "order", AggregateID: "order-1"},
		{ID: 2, MessageID: "m2", AggregateType: "order", AggregateID: "order-1"},
		{ID: 3, MessageID: "m3", AggregateType: "order", AggregateID: "order-2"},
	}
	l := kafkatest.Check(rows, recs)
	fmt.Println("delivered:", l.Delivered, "lost:", l.Lost)
	fmt.Println(l.Err())
	// Output:
	// delivered: 2 lost: [m3]
	// outboxtest: committed events not delivered: 1 of 3 (m3)
}
