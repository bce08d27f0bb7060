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
//   - Producer.Retry.Max >= MinRetries (1,000; backoff capped at 1 s unless
//     the caller set a BackoffFunc): see MinRetries for why few retries
//     reorder an aggregate during a broker outage.
//   - Producer.Return.Successes and Return.Errors = true, Version >= 0.11
//     (record headers and idempotence need it; older is refused).
//
// The record key is the aggregate ID, so one aggregate's events share a
// partition. Headers carry the message ID, event type, aggregate type and
// ID, content type, relay partition and lease epoch (emit.Header* names),
// then the event's own headers.
//
// Sarama, like the Java client, does not stop later records when one fails
// for good; the relay holds an aggregate back itself (see package relay).
package kafka

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

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

// MinRetries is the least Producer.Retry.Max NewPublisher allows. With
// sarama's default of 3, a broker outage makes a partition's early records
// exhaust their retries and fail while later records of the same partition,
// still queued, succeed once the broker is back: the same "a failed record
// does not stop later ones" hazard as a permanent failure, reordering an
// aggregate. With 1,000 retries backing off up to 1 s, an outage of up to
// about 16 minutes is retried inside the producer, in order; the relay's
// PublishTimeout meanwhile gives up on the batch and backs off without
// counting attempts, and its next batch waits until this one is resolved.
const MinRetries = 1000

// retryBackoff is the producer retry backoff unless the caller set one:
// 100 ms doubling to 1 s.
func retryBackoff(retries, _ int) time.Duration {
	d := 100 * time.Millisecond
	for i := 0; i < retries && d < time.Second; i++ {
		d *= 2
	}
	return min(d, time.Second)
}

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
//
// After a batch with any transient failure, or one Publish gave up on,
// the producer is retired and the next Publish starts a fresh one, once
// the retired producer has resolved every record it held. Sarama fails a
// partition's records one by one while it cannot reach the leader (its
// circuit breaker), and succeeds again as soon as it can: a producer
// carried through an outage would let a batch's early records fail and its
// later ones, of the same aggregate, succeed. A fresh producer sees the
// broker either up or down for a whole batch. Publish calls are
// serialized; at most one batch is ever inside a producer.
type Publisher struct {
	brokers  []string
	sc       *sarama.Config
	route    func(relay.Message) string
	maxBytes int

	publishMu sync.Mutex // serializes Publish

	genMu    sync.RWMutex // guards gen, draining, closed; read-held while feeding Input
	gen      *generation  // the live producer; nil until (re)started
	draining *generation  // a retired producer still resolving its records
	closed   bool

	hc healthCheck // Healthy's client (health.go)
}

// generation is one sarama producer and the goroutine reading its outcomes.
type generation struct {
	producer sarama.AsyncProducer
	done     chan struct{} // closed when every outcome has been delivered
}

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("outbox/kafka: publisher closed")

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
	if sc.Producer.Retry.Max < MinRetries {
		sc.Producer.Retry.Max = MinRetries
	}
	if sc.Producer.Retry.BackoffFunc == nil {
		sc.Producer.Retry.BackoffFunc = retryBackoff
	}
	p := &Publisher{brokers: append([]string(nil), cfg.Brokers...), sc: sc, route: cfg.Topic}
	if p.route == nil {
		p.route = DefaultTopic
	}
	p.maxBytes = min(emit.DefaultMaxRecordBytes, sc.Producer.MaxMessageBytes+emit.RecordBatchOverhead)
	g, err := p.start()
	if err != nil {
		return nil, err
	}
	p.gen = g
	return p, nil
}

// MaxRecordBytes is the largest emit.RecordSize this publisher's producer
// accepts: sarama's Producer.MaxMessageBytes plus the batch header, capped
// at the broker default message.max.bytes. Use it as driver.Config's
// Limits.MaxRecordBytes (raise both if your brokers allow more).
func (p *Publisher) MaxRecordBytes() int { return p.maxBytes }

type batch struct {
	p    *Publisher
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

// start connects a new producer and its outcome reader.
func (p *Publisher) start() (*generation, error) {
	prod, err := sarama.NewAsyncProducer(p.brokers, p.sc)
	if err != nil {
		return nil, fmt.Errorf("outbox/kafka: connecting to %v: %w", p.brokers, err)
	}
	g := &generation{producer: prod, done: make(chan struct{})}
	go g.dispatch()
	return g, nil
}

// dispatch delivers every outcome to its batch until sarama closes both
// channels (after AsyncClose has flushed everything).
func (g *generation) dispatch() {
	defer close(g.done)
	succ, errs := g.producer.Successes(), g.producer.Errors()
	for succ != nil || errs != nil {
		select {
		case m, ok := <-succ:
			if !ok {
				succ = nil
				continue
			}
			md := m.Metadata.(meta)
			md.b.p.hc.saw(m.Topic)
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

// retire closes the live producer without waiting; the next Publish waits
// for it to resolve its records, then starts a fresh one.
func (p *Publisher) retire() {
	p.genMu.Lock()
	g := p.gen
	p.gen = nil
	if g != nil {
		p.draining = g
		g.producer.AsyncClose()
	}
	p.genMu.Unlock()
}

// ready waits for a retired producer and starts a fresh one if needed.
func (p *Publisher) ready(ctx context.Context) error {
	p.genMu.RLock()
	closed, d, g := p.closed, p.draining, p.gen
	p.genMu.RUnlock()
	if closed {
		return ErrClosed
	}
	if d != nil {
		select {
		case <-d.done:
		case <-ctx.Done():
			return fmt.Errorf("outbox/kafka: the previous producer still holds unresolved records: %w", ctx.Err())
		}
		p.genMu.Lock()
		if p.draining == d {
			p.draining = nil
		}
		p.genMu.Unlock()
	}
	if g != nil {
		return nil
	}
	g, err := p.start()
	if err != nil {
		return err
	}
	p.genMu.Lock()
	defer p.genMu.Unlock()
	if p.closed {
		g.producer.AsyncClose()
		<-g.done
		return ErrClosed
	}
	p.gen = g
	return nil
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
	p.publishMu.Lock()
	defer p.publishMu.Unlock()
	if err := p.ready(ctx); err != nil {
		return err
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
	if failed > permanent {
		p.retire() // a transient failure: start the next batch on a fresh producer
	}
	switch {
	case failed == 0:
		return nil
	case failed == len(msgs) && permanent == 0:
		return fmt.Errorf("outbox/kafka: all %d messages failed: %w", len(msgs), first)
	}
	return relay.PublishErrors(errs)
}

// send hands msgs to the live producer and waits for every outcome. If
// ctx ends first it retires the producer (its records are still inside)
// and returns ctx's error.
func (p *Publisher) send(ctx context.Context, msgs []relay.Message, failpoints bool) ([]error, error) {
	b := &batch{p: p, errs: make([]error, len(msgs)), left: len(msgs), done: make(chan struct{})}
	p.genMu.RLock()
	if p.closed || p.gen == nil {
		p.genMu.RUnlock()
		return nil, ErrClosed
	}
	input := p.gen.producer.Input()
	for i := range msgs {
		if failpoints && i == len(msgs)/2 {
			failpoint.Inject(failpoint.MidBatch)
		}
		pm := p.record(&msgs[i])
		pm.Metadata = meta{b, i}
		select {
		case input <- pm:
		case <-ctx.Done():
			for j := i; j < len(msgs); j++ {
				b.finish(j, ctx.Err())
			}
			p.genMu.RUnlock()
			p.retire()
			return nil, fmt.Errorf("outbox/kafka: %w", ctx.Err())
		}
	}
	p.genMu.RUnlock()
	select {
	case <-b.done:
	case <-ctx.Done():
		p.retire()
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
			errs[i] = fmt.Errorf("%w (an earlier record of aggregate %s/%s failed permanently in this batch)", relay.ErrHeldBack, k.t, k.id)
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

func (p *Publisher) record(m *relay.Message) *sarama.ProducerMessage {
	topic := m.Topic
	if topic == "" {
		topic = p.route(*m)
	}
	hs := make([]sarama.RecordHeader, 0, 7+len(m.Headers))
	hs = append(hs,
		sarama.RecordHeader{Key: []byte(emit.HeaderMessageID), Value: []byte(m.MessageID)},
		sarama.RecordHeader{Key: []byte(emit.HeaderEventType), Value: []byte(m.EventType)},
		sarama.RecordHeader{Key: []byte(emit.HeaderAggregateType), Value: []byte(m.AggregateType)},
		sarama.RecordHeader{Key: []byte(emit.HeaderAggregateID), Value: []byte(m.AggregateID)},
		sarama.RecordHeader{Key: []byte(emit.HeaderContentType), Value: []byte(m.ContentType)},
		sarama.RecordHeader{Key: []byte(emit.HeaderPartition), Value: strconv.AppendInt(nil, int64(m.Partition), 10)},
		sarama.RecordHeader{Key: []byte(emit.HeaderEpoch), Value: strconv.AppendInt(nil, m.Epoch, 10)},
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
// batches to their Publish calls, and closes it. It always returns nil and
// is safe to call twice; Publish returns ErrClosed after it.
func (p *Publisher) Close() error {
	p.genMu.Lock()
	if p.closed {
		p.genMu.Unlock()
		return nil
	}
	p.closed = true
	g, d := p.gen, p.draining
	p.gen, p.draining = nil, nil
	p.genMu.Unlock()
	p.hc.close()
	// AsyncClose, not Close: sarama's Close drains Successes and Errors
	// itself, racing dispatch for acknowledgements a Publish waits for.
	if g != nil {
		g.producer.AsyncClose()
		<-g.done
	}
	if d != nil {
		<-d.done
	}
	return nil
}

// Partitioner is a sarama.Partitioner that places keyed records exactly as
// the Kafka Java client's default partitioner does
// (toPositive(murmur2(key)) % numPartitions), so other producers of the same
// keys agree. Unkeyed records go to partition 0.
//
// It is not sarama.NewMurmur2Partitioner, which hashes keyed records the
// same way (TestPartitionerAgreesWithSaramaMurmur2) but sends unkeyed ones
// to a random partition, and is a per-topic constructor rather than a
// value: the relay always sets a key, and a deterministic, stateless
// partitioner is what the tests and partition.KafkaPartition pin down.
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
