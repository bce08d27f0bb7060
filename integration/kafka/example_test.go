package kafka_test

import (
	"context"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// ExampleNewPublisher publishes two events of one aggregate to an
// in-process Kafka-protocol broker and reads them back. (relay/kafka's
// ExampleNewPublisher, which godoc shows, is the same without the broker:
// it is compiled there, and run here, because the library's module does
// not depend on kfake.)
//
// The caller's *sarama.Config keeps everything that is the caller's
// business (client ID, TLS, SASL, version, compression, timeouts).
// NewPublisher copies it and, on the copy only, enforces what ordering and
// at-least-once delivery need: Producer.Idempotent = true,
// RequiredAcks = WaitForAll, Net.MaxOpenRequests = 1, the Java-compatible
// murmur2 Partitioner, Return.Successes and Return.Errors = true, and
// Version >= 0.11 (older is refused with ErrConfig). The record key is the
// aggregate ID, so both events land on one partition, in order.
func ExampleNewPublisher() {
	topic := kafka.DefaultTopic(relay.Message{AggregateType: "order"}) // "outbox.event.order"
	broker, err := kafkatest.Start(kafkatest.Topics(3, topic))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer broker.Close()

	sc := sarama.NewConfig()
	sc.ClientID = "orders-relay"                 // kept
	sc.Producer.RequiredAcks = sarama.NoResponse // unsafe: overridden on the copy

	pub, err := kafka.NewPublisher(kafka.Config{Brokers: broker.Addrs(), Sarama: sc})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pub.Close()
	fmt.Println("caller's config untouched:", sc.Producer.RequiredAcks == sarama.NoResponse)
	// Give the same limit to the writers (driver.Config's Limits.MaxRecordBytes).
	fmt.Println("max record bytes:", pub.MaxRecordBytes())

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = pub.Publish(ctx, []relay.Message{
		{ID: 1, MessageID: "m-1", AggregateType: "order", AggregateID: "order-42", EventType: "order.created",
			ContentType: emit.DefaultContentType, Payload: []byte(`{"total":42}`)},
		{ID: 2, MessageID: "m-2", AggregateType: "order", AggregateID: "order-42", EventType: "order.paid",
			ContentType: emit.DefaultContentType, Payload: []byte(`{"paid":true}`),
			Headers: map[string]string{"trace-id": "abc"}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	cons, err := kafkatest.NewConsumer(broker.Addrs(), []string{topic})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cons.Close()
	recs, err := cons.WaitForCount(ctx, 2)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range recs {
		fmt.Printf("%s key=%s %s %s trace-id=%q\n", r.Topic, r.Key, r.Headers[emit.HeaderEventType], r.Value, r.Headers["trace-id"])
	}
	// Output:
	// caller's config untouched: true
	// max record bytes: 1048588
	// outbox.event.order key=order-42 order.created {"total":42} trace-id=""
	// outbox.event.order key=order-42 order.paid {"paid":true} trace-id="abc"
}
