package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// BenchmarkPublish measures Publisher.Publish of one batch of small
// messages (about 90-byte JSON payloads over 64 aggregates, the relay's
// own headers only) per op, acks=all and idempotent as the publisher
// enforces, to an in-process kfake broker with one 8-partition topic. Each
// sub-benchmark has its own broker and publisher, so records of earlier
// runs do not pile up in the broker's memory.
//
//	go test -run XXX -bench Publish -count 6 ./integration/kafka/
func BenchmarkPublish(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("batch%d", n), func(b *testing.B) { benchPublish(b, n) })
	}
}

func benchPublish(b *testing.B, n int) {
	const topic = "bench.publish"
	br, err := kafkatest.Start(kafkatest.Topics(8, topic))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(br.Close)
	p, err := kafka.NewPublisher(kafka.Config{Brokers: br.Addrs()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		// Before the broker closes (cleanups run last in, first out).
		if err := closeWithin(p, 30*time.Second); errors.Is(err, errCloseHung) {
			b.Error(err)
		}
	})
	msgs := benchPublishMessages(topic, n)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Warm up: metadata, connection, producer ID.
	if err := p.Publish(ctx, msgs); err != nil {
		b.Fatalf("Publish: %v", err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := p.Publish(ctx, msgs); err != nil {
			b.Fatalf("Publish: %v", err)
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// benchPublishMessages returns n messages as the relay claims them, all
// routed to topic.
func benchPublishMessages(topic string, n int) []relay.Message {
	payload := []byte(`{"order_id":"o-000000","status":"paid","amount_cents":12345,"currency":"EUR","items":3}`)
	msgs := make([]relay.Message, n)
	for i := range msgs {
		agg := fmt.Sprintf("agg-%d", i%64)
		msgs[i] = relay.Message{
			ID:            int64(i + 1),
			MessageID:     fmt.Sprintf("bench-%06d", i),
			AggregateType: "order",
			AggregateID:   agg,
			EventType:     "order.paid",
			Topic:         topic,
			ContentType:   emit.DefaultContentType,
			Payload:       payload,
			Partition:     partition.Of("order", agg, partition.DefaultCount),
			Epoch:         1,
		}
	}
	return msgs
}
