package redispub_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
	redispub "github.com/sqloutbox/outbox/relay/redis"
)

// BenchmarkPublish measures Publisher.Publish of one batch of small
// messages (the same ~90-byte JSON payloads over 64 aggregates as relay
// kafka's BenchmarkPublish, the relay's headers only) per op, to the real
// Redis, into a stream of the benchmark's own. One aggregate's messages
// go out one XADD reply after another, so a batch takes at least
// (batch / 64) round trips.
//
//	go test -run XXX -bench Publish ./relay/redis/
func BenchmarkPublish(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("batch%d", n), func(b *testing.B) {
			s := newSpace(b)
			p, err := redispub.NewPublisher(redispub.Config{Client: connect(b, redisAddr()), Stream: s.Stream})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			round := 0
			b.ReportAllocs()
			for b.Loop() {
				round++
				if err := p.Publish(ctx, benchMessages(round, n)); err != nil {
					b.Fatalf("Publish: %v", err)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

func benchMessages(round, n int) []relay.Message {
	payload := []byte(`{"order_id":"o-000000","status":"paid","amount_cents":12345,"currency":"EUR","items":3}`)
	msgs := make([]relay.Message, n)
	for i := range msgs {
		agg := fmt.Sprintf("agg-%d", i%64)
		msgs[i] = relay.Message{ID: int64(i + 1), MessageID: fmt.Sprintf("bench-%d-%06d", round, i), AggregateType: "order",
			AggregateID: agg, EventType: "order.paid", ContentType: emit.DefaultContentType, Payload: payload,
			Partition: partition.Of("order", agg, partition.DefaultCount), Epoch: 1}
	}
	return msgs
}
