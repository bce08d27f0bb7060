// Package kafka publishes outbox messages to Apache Kafka with IBM/sarama,
// configured so that per-aggregate order and at-least-once delivery hold.
//
// Whatever *sarama.Config the caller passes (TLS, SASL, client ID,
// version, compression, timeouts are all theirs), NewPublisher enforces
// these settings on a copy, because sarama's defaults are unsafe for
// ordering:
//
//   - Producer.Idempotent = true: retries cannot duplicate or reorder
//     within a partition (Kafka KIP-98).
//   - Producer.RequiredAcks = WaitForAll (acks=all): an acknowledged
//     record survives the leader's loss.
//   - Net.MaxOpenRequests = 1: sarama's default of 5 lets a retried request
//     overtake a later one.
//   - Producer.Partitioner = a Java-compatible murmur2 partitioner
//     (partition.KafkaPartition): sarama's default hashes with FNV-1a, so
//     another team's Java or librdkafka producer would put the same key on
//     another partition.
//   - Producer.Return.Successes and Return.Errors = true, Version >= 0.11
//     (record headers and idempotence need it; older is refused).
//
// The record key is the aggregate ID, so one aggregate's events share a
// partition. Headers carry the message ID, event type, aggregate type and
// ID and content type (emit.Header* names), then the event's own headers.
//
// Sarama, like the Java client, does not stop later records when one fails
// for good; the relay holds an aggregate back itself (see package relay).
package kafka

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/IBM/sarama"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/internal/failpoint"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
)

// DefaultTopicPrefix is prepended to the aggregate type by DefaultTopic,
// following Debezium's outbox event router default
// (route.topic.replacement = outbox.event.${routedByValue}, routed by
// aggregatetype), so "order" events go to "outbox.event.order".
const DefaultTopicPrefix = "outbox.event."

// DefaultTopic routes a message without its own Topic to
// DefaultTopicPrefix + AggregateType.
func DefaultTopic(m relay.Message) string { return DefaultTopicPrefix + m.AggregateType }

// ErrConfig is returned by NewPublisher for an unusable configuration.
var ErrConfig = errors.New("outbox/kafka: invalid configuration")

// Config configures a Publisher.
type Config struct {
	// Brokers are the bootstrap addresses ("host:port"). Required.
	Brokers []string
	// Sarama is the caller's producer configuration; nil means
	// sarama.NewConfig(). It is copied, then the safety settings in the
	// package doc are enforced on the copy.
	Sarama *sarama.Config
	// Topic routes messages whose event has no Topic. Default DefaultTopic.
	Topic func(relay.Message) string
}

// Publisher implements relay.Publisher on a sarama AsyncProducer: a batch
// is handed to the producer at once (sarama groups it into one produce
// request per broker) and Publish waits for every acknowledgement.
type Publisher struct {
	producer sarama.AsyncProducer
	route    func(relay.Message) string
	maxBytes int
	done     chan struct{}
	closeMu  sync.Mutex
	closed   bool
}

// NewPublisher connects to cfg.Brokers and returns a Publisher. It returns
// an error wrapping ErrConfig for missing brokers or a Version older than
// 0.11, or sarama's error if the cluster cannot be reached or the
// configuration is invalid.
func NewPublisher(cfg Config) (*Publisher, error) {
	if len(cfg.Brokers) == 0 {
		return nil, fmt.Errorf("%w: no brokers", ErrConfig)
	}
	sc := sarama.NewConfig()
	if cfg.Sarama != nil {
		c := *cfg.Sarama
		sc = &c
	}
	if !sc.Version.IsAtLeast(sarama.V0_11_0_0) {
		return nil, fmt.Errorf("%w: sarama Version %s is older than 0.11 (record headers, idempotence)", ErrConfig, sc.Version)
	}
	sc.Producer.Idempotent = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Net.MaxOpenRequests = 1
	sc.Producer.Return.Successes = true
	sc.Producer.Return.Errors = true
	sc.Producer.Partitioner = NewPartitioner
	if sc.Producer.Retry.Max < 1 {
		sc.Producer.Retry.Max = 1 // idempotence requires retries
	}
	prod, err := sarama.NewAsyncProducer(cfg.Brokers, sc)
	if err != nil {
		return nil, fmt.Errorf("outbox/kafka: connecting to %v: %w", cfg.Brokers, err)
	}
	p := &Publisher{producer: prod, route: cfg.Topic, done: make(chan struct{})}
	if p.route == nil {
		p.route = DefaultTopic
	}
	p.maxBytes = min(emit.DefaultMaxRecordBytes, sc.Producer.MaxMessageBytes+emit.RecordBatchOverhead)
	go p.dispatch()
	return p, nil
}

// MaxRecordBytes is the largest emit.RecordSize this publisher's producer
// accepts: sarama's Producer.MaxMessageBytes plus the batch header, capped
// at the broker default message.max.bytes. Use it as driver.Config's
// Limits.MaxRecordBytes (raise both if your brokers allow more).
func (p *Publisher) MaxRecordBytes() int { return p.maxBytes }

type batch struct {
	mu   sync.Mutex
	errs []error
	left int
	done chan struct{}
}

type meta struct {
	b *batch
	i int
}

func (b *batch) finish(i int, err error) {
	b.mu.Lock()
	b.errs[i] = err
	b.left--
	if b.left == 0 {
		close(b.done)
	}
	b.mu.Unlock()
}

func (p *Publisher) dispatch() {
	defer close(p.done)
	succ, errs := p.producer.Successes(), p.producer.Errors()
	for succ != nil || errs != nil {
		select {
		case m, ok := <-succ:
			if !ok {
				succ = nil
				continue
			}
			md := m.Metadata.(meta)
			md.b.finish(md.i, nil)
		case e, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			md := e.Msg.Metadata.(meta)
			md.b.finish(md.i, classify(e.Err))
		}
	}
}

// classify marks errors no retry of the message can fix as
// relay.ErrPermanent (the relay dead-letters it at once), and errors of the
// route or the producer as a whole as relay.ErrUnavailable (the relay backs
// off and counts no attempt). Everything else is transient.
func classify(err error) error {
	var ce sarama.ConfigurationError
	switch {
	case errors.As(err, &ce), // e.g. larger than Producer.MaxMessageBytes
		errors.Is(err, sarama.ErrMessageSizeTooLarge),
		errors.Is(err, sarama.ErrInvalidMessage),
		errors.Is(err, sarama.ErrInvalidMessageSize),
		errors.Is(err, sarama.ErrInvalidRecord):
		return fmt.Errorf("%w: %w", relay.ErrPermanent, err)
	case errors.Is(err, sarama.ErrTopicAuthorizationFailed),
		errors.Is(err, sarama.ErrClusterAuthorizationFailed),
		errors.Is(err, sarama.ErrUnknownTopicOrPartition),
		errors.Is(err, sarama.ErrInvalidTopic),
		errors.Is(err, sarama.ErrSASLAuthenticationFailed):
		return fmt.Errorf("%w: %w", relay.ErrUnavailable, err)
	}
	return err
}

// brokerTooLarge reports an error the broker returned for a whole record
// batch (MESSAGE_TOO_LARGE): it cannot say which record was too large.
func brokerTooLarge(err error) bool {
	var ce sarama.ConfigurationError
	return errors.Is(err, sarama.ErrMessageSizeTooLarge) && !errors.As(err, &ce)
}

// Publish sends msgs and waits for all acknowledgements or ctx's end. It
// returns nil if all were acknowledged; relay.PublishErrors if some failed
// (permanent ones wrap relay.ErrPermanent, configuration-wide ones
// relay.ErrUnavailable); a single error if all failed with retriable
// errors (the broker is unreachable: the relay backs off as a whole) or
// ctx ended first.
//
// When the broker refuses a record batch as too large, every record in it
// fails alike; those records are then re-sent one at a time, so only the
// oversized one fails (permanently) and the others are not penalized. A
// record behind a permanently failed one of its aggregate is not re-sent.
func (p *Publisher) Publish(ctx context.Context, msgs []relay.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("outbox/kafka: %w", err)
	}
	errs, err := p.send(ctx, msgs, true)
	if err != nil {
		return err
	}
	if err := p.isolateTooLarge(ctx, msgs, errs); err != nil {
		return err
	}
	failed, permanent := 0, 0
	var first error
	for _, e := range errs {
		if e != nil {
			if first == nil {
				first = e
			}
			failed++
			if errors.Is(e, relay.ErrPermanent) {
				permanent++
			}
		}
	}
	switch {
	case failed == 0:
		return nil
	case failed == len(msgs) && permanent == 0:
		return fmt.Errorf("outbox/kafka: all %d messages failed: %w", len(msgs), first)
	}
	return relay.PublishErrors(errs)
}

// send hands msgs to the producer and waits for every outcome (or ctx).
func (p *Publisher) send(ctx context.Context, msgs []relay.Message, failpoints bool) ([]error, error) {
	b := &batch{errs: make([]error, len(msgs)), left: len(msgs), done: make(chan struct{})}
	for i := range msgs {
		if failpoints && i == len(msgs)/2 {
			failpoint.Inject(failpoint.MidBatch)
		}
		pm := p.record(&msgs[i])
		pm.Metadata = meta{b, i}
		select {
		case p.producer.Input() <- pm:
		case <-ctx.Done():
			for j := i; j < len(msgs); j++ {
				b.finish(j, ctx.Err())
			}
			return nil, fmt.Errorf("outbox/kafka: %w", ctx.Err())
		}
	}
	select {
	case <-b.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("outbox/kafka: waiting for acknowledgements: %w", ctx.Err())
	}
	return b.errs, nil
}

// isolateTooLarge re-sends, one at a time, the records of a batch the
// broker refused as too large (see Publish), updating errs.
func (p *Publisher) isolateTooLarge(ctx context.Context, msgs []relay.Message, errs []error) error {
	var suspects []int
	for i, e := range errs {
		if e != nil && brokerTooLarge(e) {
			suspects = append(suspects, i)
		}
	}
	if len(suspects) < 2 {
		return nil
	}
	type key struct{ t, id string }
	dead := map[key]bool{}
	for _, i := range suspects {
		k := key{msgs[i].AggregateType, msgs[i].AggregateID}
		if dead[k] {
			errs[i] = errHeldBack
			continue
		}
		one, err := p.send(ctx, msgs[i:i+1], false)
		if err != nil {
			return err
		}
		errs[i] = one[0]
		if one[0] != nil && errors.Is(one[0], relay.ErrPermanent) {
			dead[k] = true
		}
	}
	return nil
}

// errHeldBack fails a record that was not re-sent because an earlier
// record of its aggregate failed permanently in the same batch.
var errHeldBack = errors.New("outbox/kafka: held back behind a failed record of the same aggregate")

func (p *Publisher) record(m *relay.Message) *sarama.ProducerMessage {
	topic := m.Topic
	if topic == "" {
		topic = p.route(*m)
	}
	hs := make([]sarama.RecordHeader, 0, 5+len(m.Headers))
	hs = append(hs,
		sarama.RecordHeader{Key: []byte(emit.HeaderMessageID), Value: []byte(m.MessageID)},
		sarama.RecordHeader{Key: []byte(emit.HeaderEventType), Value: []byte(m.EventType)},
		sarama.RecordHeader{Key: []byte(emit.HeaderAggregateType), Value: []byte(m.AggregateType)},
		sarama.RecordHeader{Key: []byte(emit.HeaderAggregateID), Value: []byte(m.AggregateID)},
		sarama.RecordHeader{Key: []byte(emit.HeaderContentType), Value: []byte(m.ContentType)},
	)
	if len(m.Headers) > 0 {
		keys := make([]string, 0, len(m.Headers))
		for k := range m.Headers {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			hs = append(hs, sarama.RecordHeader{Key: []byte(k), Value: []byte(m.Headers[k])})
		}
	}
	value := m.Payload
	if value == nil {
		value = []byte{} // an empty event, not a null value (a tombstone)
	}
	return &sarama.ProducerMessage{
		Topic:   topic,
		Key:     sarama.StringEncoder(m.AggregateID),
		Value:   sarama.ByteEncoder(value),
		Headers: hs,
	}
}

// Close flushes the producer, delivering the outcomes of in-flight
// batches to their Publish calls, and closes it. It always returns nil;
// Publish must not be called after it.
func (p *Publisher) Close() error {
	p.closeMu.Lock()
	defer p.closeMu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	// AsyncClose, not Close: sarama's Close drains Successes and Errors
	// itself, racing dispatch for acknowledgements a Publish waits for.
	// dispatch reads both until sarama closes them after flushing.
	p.producer.AsyncClose()
	<-p.done
	return nil
}

// Partitioner is a sarama.Partitioner that places keyed records exactly as
// the Kafka Java client's default partitioner does
// (toPositive(murmur2(key)) % numPartitions), so other producers of the same
// keys agree. Unkeyed records go to partition 0.
type Partitioner struct{}

// NewPartitioner returns a Partitioner; its signature is
// sarama.PartitionerConstructor.
func NewPartitioner(string) sarama.Partitioner { return Partitioner{} }

// Partition implements sarama.Partitioner.
func (Partitioner) Partition(msg *sarama.ProducerMessage, numPartitions int32) (int32, error) {
	if msg.Key == nil {
		return 0, nil
	}
	key, err := msg.Key.Encode()
	if err != nil {
		return -1, err
	}
	return partition.KafkaPartition(key, numPartitions), nil
}

// RequiresConsistency reports true: a key must always map to one partition.
func (Partitioner) RequiresConsistency() bool { return true }
