package main

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// endpoint is one broker as the bench drives it: it opens routes (a
// topic; a subject and its stream; an exchange and a queue; a stream key)
// with a publisher sending every message there and, if asked, a consumer
// of it. The drain and latency parts take an endpoint, so that the same
// machinery measures every broker (part "brokers").
type endpoint interface {
	// name is the broker's short name: kafka, nats, rabbitmq, redis.
	name() string
	// describe says what the route and its consumer are, for the output.
	describe() string
	// probe checks, within ctx, that the broker answers.
	probe(ctx context.Context) error
	// open creates a route of its own named after name, a publisher to
	// it and, with consume, a consumer of it (from its start) that is
	// running when open returns.
	open(ctx context.Context, name string, consume bool) (*route, error)
}

// route is one opened route; close removes what open created.
type route struct {
	pub  relay.Publisher
	cons receiver // nil unless opened with consume
	// topic is the Kafka topic (kafka only): the seed relay and the
	// standalone relay child produce to it themselves.
	topic string
	close func()
}

// receiver is a consumer as the latency part reads it.
type receiver interface {
	// waitSeen calls seen with each record's outbox message ID and
	// receive time, in receive order, every record once per call, until
	// seen returns true (then nil) or ctx ends (its error).
	waitSeen(ctx context.Context, seen func(id string, at time.Time) bool) error
	Close()
}

// kitReceiver adapts a test kit's consumer (kafkatest, natstest,
// rabbitmqtest, redistest: the same Wait shape) to a receiver.
type kitReceiver[R any] struct {
	wait  func(context.Context, func([]R) bool) ([]R, error)
	idAt  func(R) (string, time.Time)
	close func()
}

func (k kitReceiver[R]) waitSeen(ctx context.Context, seen func(string, time.Time) bool) error {
	scanned := 0
	_, err := k.wait(ctx, func(recs []R) bool {
		done := false
		for _, r := range recs[scanned:] {
			id, at := k.idAt(r)
			done = seen(id, at) || done
		}
		scanned = len(recs)
		return done
	})
	return err
}

func (k kitReceiver[R]) Close() { k.close() }

// kafkaEndpoint is Kafka: the kfake child (or -brokers); a topic of 8
// partitions per route, consumed by kafkatest's consumer.
type kafkaEndpoint struct {
	brokers []string
	label   string
}

func (k kafkaEndpoint) name() string { return "kafka" }

func (k kafkaEndpoint) describe() string {
	return k.label + "; a topic of 8 partitions per run, key = aggregate ID; consumer: kafkatest.Consumer (franz-go, every partition, fetch.max.wait 50 ms)"
}

func (k kafkaEndpoint) probe(ctx context.Context) error {
	_, err := topicFor(ctx, k.brokers, "probe-"+randomHex(3))
	return err
}

func (k kafkaEndpoint) open(ctx context.Context, name string, consume bool) (*route, error) {
	topic, err := topicFor(ctx, k.brokers, name+"-"+randomHex(3))
	if err != nil {
		return nil, err
	}
	pub, err := newPublisher(k.brokers, topic)
	if err != nil {
		return nil, err
	}
	return kafkaRoute(k.brokers, topic, pub, consume)
}

// kafkaRoute is the route of pub to topic, with (consume) a consumer of
// topic from its start; extra options go to the consumer. On an error it
// closes pub.
func kafkaRoute(brokers []string, topic string, pub *kafka.Publisher, consume bool, opts ...kgo.Opt) (*route, error) {
	r := &route{pub: pub, topic: topic, close: func() { pub.Close() }}
	if consume {
		c, err := kafkatest.NewConsumer(brokers, []string{topic}, opts...)
		if err != nil {
			pub.Close()
			return nil, err
		}
		r.cons = kitReceiver[kafkatest.Record]{wait: c.Wait, close: c.Close, idAt: func(rc kafkatest.Record) (string, time.Time) {
			id, _ := rc.MessageID()
			return id, rc.Received
		}}
		r.close = func() { c.Close(); pub.Close() }
	}
	return r, nil
}

// newPublisher returns a publisher routing every message to topic.
func newPublisher(brokers []string, topic string) (*kafka.Publisher, error) {
	return kafka.NewPublisher(kafka.Config{Brokers: brokers, Topic: func(relay.Message) string { return topic }})
}

// kafkaEOSEndpoint is Kafka in the publisher's exactly-once mode
// (kafka.ExactlyOnce): per route a topic of 8 partitions and the state
// topic of the route's transactional IDs, consumed at read_committed.
type kafkaEOSEndpoint struct{ kafkaEndpoint }

// eosPrefix is the bench's transactional ID prefix.
const eosPrefix = "outbox-bench."

func (k kafkaEOSEndpoint) name() string { return "kafka_eos" }

func (k kafkaEOSEndpoint) describe() string {
	return k.label + "; exactly-once mode (one transaction per relay partition per batch); a topic of 8 partitions per run, key = aggregate ID; consumer: kafkatest.Consumer at read_committed"
}

func (k kafkaEOSEndpoint) open(ctx context.Context, name string, consume bool) (*route, error) {
	topic, err := topicFor(ctx, k.brokers, name+"-"+randomHex(3))
	if err != nil {
		return nil, err
	}
	// The route's topic names its transactional IDs' namespace: the
	// Table of ExactlyOnce need not be the outbox table's name, only
	// unique per table.
	if err := kafkatest.CreateTopic(ctx, k.brokers, kafka.StateTopic(eosPrefix, topic), 1); err != nil {
		return nil, err
	}
	pub, err := kafka.NewPublisher(kafka.Config{Brokers: k.brokers, Topic: func(relay.Message) string { return topic },
		ExactlyOnce: &kafka.ExactlyOnce{TransactionalIDPrefix: eosPrefix, Table: topic}})
	if err != nil {
		return nil, err
	}
	return kafkaRoute(k.brokers, topic, pub, consume, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
}
