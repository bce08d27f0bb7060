package kafka_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/outboxtest/publishertest"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// conformancePartitions is the partition count of the suite's topics.
const conformancePartitions = 6

// TestConformance runs the shared publisher suite against relay/kafka and
// a private kfake broker per subtest. Kafka's quirks: the publisher holds
// an aggregate's later records back once one failed (HoldsBack, as every
// publisher of this module does); the producer refuses
// records above its Producer.MaxMessageBytes (10,000 here); a topic that
// does not exist is the missing route (kfake does not auto-create); the
// outage closes the broker for good (kfake keeps no data to restart with).
// CheckRecord adds what only Kafka has: the topic, the key (the aggregate
// ID) and the murmur2 partition.
func TestConformance(t *testing.T) {
	t.Parallel()
	topics := []string{kafka.DefaultTopicPrefix + "order", kafka.DefaultTopicPrefix + "invoice"}
	publishertest.Run(t, publishertest.Config{
		New: func(t *testing.T) publishertest.Target {
			b := startBroker(t, conformancePartitions, topics...)
			sc := fastMetadata()
			sc.Producer.MaxMessageBytes = 10_000
			p := newPublisher(t, kafka.Config{Brokers: b.Addrs(), Sarama: sc})
			cons := newConsumer(t, b, topics...)
			return publishertest.Target{
				Publisher: p,
				Received: func(ctx context.Context, n int) ([]publishertest.Record, error) {
					recs, err := cons.WaitForCount(ctx, n)
					return kafkaRecords(recs), err
				},
				Unroutable: func(m *relay.Message) { m.Topic = "does.not.exist" },
				Outage:     func() func() { b.Close(); return nil },
			}
		},
		Quirks: publishertest.Quirks{TooLargePayload: 20_000, HoldsBack: true},
		CheckRecord: func(t *testing.T, r publishertest.Record, m relay.Message) {
			t.Helper()
			kr := r.Raw.(kafkatest.Record)
			if want := kafka.DefaultTopic(m); m.Topic == "" && kr.Topic != want {
				t.Errorf("%s: topic %q, want %q", m.MessageID, kr.Topic, want)
			}
			if string(kr.Key) != m.AggregateID {
				t.Errorf("%s: key %q, want the aggregate ID %q", m.MessageID, kr.Key, m.AggregateID)
			}
			if want := partition.KafkaPartition([]byte(m.AggregateID), conformancePartitions); kr.Partition != want {
				t.Errorf("%s: partition %d, want KafkaPartition's %d", m.MessageID, kr.Partition, want)
			}
		},
	})
}

// kafkaRecords converts consumed records in (topic, partition, offset)
// order: one aggregate's records share a partition, so this is the order
// its consumer sees.
func kafkaRecords(recs []kafkatest.Record) []publishertest.Record {
	sorted := slices.Clone(recs)
	slices.SortStableFunc(sorted, func(a, b kafkatest.Record) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		if a.Partition != b.Partition {
			return int(a.Partition - b.Partition)
		}
		return int(a.Offset - b.Offset)
	})
	out := make([]publishertest.Record, len(sorted))
	for i, r := range sorted {
		out[i] = publishertest.Record{Payload: r.Value, Headers: r.Headers, Raw: r}
	}
	return out
}
