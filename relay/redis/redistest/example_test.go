package redistest_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
	redispub "github.com/sqloutbox/outbox/relay/redis"
	"github.com/sqloutbox/outbox/relay/redis/redistest"
)

// A test's own key prefix, a publisher routing into it and a consumer of
// the order stream.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	opts := &redis.Options{Addr: "127.0.0.1:6379"}
	client := redis.NewClient(opts)
	defer client.Close()
	prefix := redistest.UniqueName("example:") + ":"
	defer func() { _, _ = redistest.DeleteKeys(context.Background(), client, prefix+"*") }()

	pub, err := redispub.NewPublisher(redispub.Config{Client: client,
		Stream: func(m relay.Message) string { return prefix + redispub.DefaultStream(m) }})
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

	c, err := redistest.NewConsumer(opts, prefix+"outbox.event.order")
	if err != nil {
		fmt.Println("no Redis:", err)
		return
	}
	defer c.Close()
	recs, err := c.WaitForMessageIDs(ctx, "m-1")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(recs[0].Stream == prefix+"outbox.event.order", recs[0].Headers["outbox-aggregate-id"], string(recs[0].Payload))
	// The ledger: the rows the outbox table holds (read back with a SELECT
	// in a real test) against what was received; m-2 was never published.
	rows := []outboxtest.Row{{ID: 1, MessageID: "m-1", AggregateType: "order", AggregateID: "o-1"},
		{ID: 2, MessageID: "m-2", AggregateType: "order", AggregateID: "o-1"}}
	l := redistest.Check(rows, recs)
	fmt.Printf("committed %d, delivered %d, lost %v\n", l.Committed, l.Delivered, l.Lost)
	// Output:
	// true o-1 {"cents":1250}
	// committed 2, delivered 1, lost [m-2]
}
