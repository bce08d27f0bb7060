package rabbitmq_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/rabbitmq"
)

// BenchmarkPublish measures Publisher.Publish of one batch of small
// messages (the same ~90-byte JSON payloads over 64 aggregates as relay
// kafka's BenchmarkPublish, the relay's headers only) per op, confirmed,
// persistent and mandatory, to the real broker: an exchange of the
// benchmark's own bound to one queue (x-max-length 10,000, no consumer),
// both deleted at cleanup. One aggregate's messages go out one confirm
// after another, so a batch takes at least (batch / 64) round trips.
//
//	go test -run XXX -bench Publish ./relay/rabbitmq/
func BenchmarkPublish(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("batch%d", n), func(b *testing.B) {
			_, ch := admin(b)
			id := unique()
			ex, q := "outboxtest.bench."+id, "outboxtest.bench."+id
			if err := ch.ExchangeDeclare(ex, amqp.ExchangeTopic, false, false, false, false, nil); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = ch.ExchangeDelete(ex, false, false) })
			if _, err := ch.QueueDeclare(q, false, false, false, false, amqp.Table{"x-max-length": int32(10_000)}); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _, _ = ch.QueueDelete(q, false, false, false) })
			if err := ch.QueueBind(q, "#", ex, false, nil); err != nil {
				b.Fatal(err)
			}
			p, err := rabbitmq.NewPublisher(rabbitmq.Config{URL: brokerURL(), Exchange: ex})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = p.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			msgs := benchMessages(n)
			b.ReportAllocs()
			for b.Loop() {
				if err := p.Publish(ctx, msgs); err != nil {
					b.Fatalf("Publish: %v", err)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

func benchMessages(n int) []relay.Message {
	payload := []byte(`{"order_id":"o-000000","status":"paid","amount_cents":12345,"currency":"EUR","items":3}`)
	msgs := make([]relay.Message, n)
	for i := range msgs {
		agg := fmt.Sprintf("agg-%d", i%64)
		msgs[i] = relay.Message{ID: int64(i + 1), MessageID: fmt.Sprintf("bench-%06d", i), AggregateType: "order",
			AggregateID: agg, EventType: "order.paid", ContentType: emit.DefaultContentType, Payload: payload,
			Partition: partition.Of("order", agg, partition.DefaultCount), Epoch: 1}
	}
	return msgs
}
