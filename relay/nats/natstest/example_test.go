package natstest_test

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
	natspub "github.com/sqloutbox/outbox/relay/nats"
	"github.com/sqloutbox/outbox/relay/nats/natstest"
)

// A test's own stream, a publisher routing into it and a consumer of it.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc, err := nats.Connect("nats://127.0.0.1:4222")
	if err != nil {
		fmt.Println("no NATS server:", err)
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Println(err)
		return
	}
	prefix := natstest.UniqueName("example-")
	s, err := natstest.CreateStream(ctx, js, []string{prefix + ".>"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = s.Delete(context.Background()) }()

	pub, err := natspub.NewPublisher(natspub.Config{Conn: nc,
		Subject: func(m relay.Message) string { return prefix + "." + natspub.DefaultSubject(m) }})
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

	c, err := natstest.NewConsumer(ctx, js, s.Name)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	recs, err := c.WaitForMessageIDs(ctx, "m-1")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(recs[0].Sequence, recs[0].Subject == prefix+".outbox.event.order.o-1", string(recs[0].Payload))
	// The ledger: the rows the outbox table holds (read back with a SELECT
	// in a real test) against what was received; m-2 was never published.
	rows := []outboxtest.Row{{ID: 1, MessageID: "m-1", AggregateType: "order", AggregateID: "o-1"},
		{ID: 2, MessageID: "m-2", AggregateType: "order", AggregateID: "o-1"}}
	l := natstest.Check(rows, recs)
	fmt.Printf("committed %d, delivered %d, lost %v\n", l.Committed, l.Delivered, l.Lost)
	// Output:
	// 1 true {"cents":1250}
	// committed 2, delivered 1, lost [m-2]
}
