package kafka_test

import (
	"context"
	"log"
	"time"

	"github.com/IBM/sarama"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// ExampleNewPublisher publishes two events of one aggregate to the Kafka
// cluster at localhost:9092 (`outbox dev-broker --topic outbox.event.order`
// runs one in-process). It is compiled, not run: the same example against
// the in-process broker of outboxtest/kafkatest, with its output checked,
// is integration/kafka's ExampleNewPublisher.
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
	sc := sarama.NewConfig()
	sc.ClientID = "orders-relay"                 // kept
	sc.Producer.RequiredAcks = sarama.NoResponse // unsafe: overridden on the copy

	pub, err := kafka.NewPublisher(kafka.Config{Brokers: []string{"localhost:9092"}, Sarama: sc})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	// Give the same limit to the writers (driver.Config's Limits.MaxRecordBytes).
	log.Println("max record bytes:", pub.MaxRecordBytes())

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
		log.Fatal(err) // a relay.PublishErrors says which messages failed
	}
}
