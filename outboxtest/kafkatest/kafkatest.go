package kafkatest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Option configures [Start]. The zero configuration is one broker on a
// random free port of 127.0.0.1, no topics, data in memory only, kfake's
// default broker configuration.
type Option func(*options)

type options struct {
	port    int
	topics  []seed
	dataDir string
	configs map[string]string
	extra   []kfake.Opt
}

type seed struct {
	partitions int32
	names      []string
}

// Port makes the broker listen on 127.0.0.1:port instead of a random free
// port (0, the default, keeps the random choice). Start fails if the port
// is taken.
func Port(port int) Option { return func(o *options) { o.port = port } }

// Topics creates the named topics, each with the given number of
// partitions (at least 1), before Start returns, so a producer never sees
// "unknown topic". It may be given several times; a topic named twice
// takes the last count. Topics created later: [CreateTopic].
func Topics(partitions int32, names ...string) Option {
	return func(o *options) { o.topics = append(o.topics, seed{partitions, names}) }
}

// DataDir persists the broker's data in dir (created if missing), with
// every write synced before it is acknowledged, so that a broker started
// again with the same dir (and [Port]) keeps its topics and records: a
// broker "restart". By default data lives in memory and goes with Close.
func DataDir(dir string) Option { return func(o *options) { o.dataDir = dir } }

// BrokerConfigs sets broker configuration by Kafka's names and string
// values, e.g. {"message.max.bytes": "1048576"} (bytes); kfake's defaults
// stand for anything not given.
func BrokerConfigs(configs map[string]string) Option {
	return func(o *options) { o.configs = configs }
}

// KfakeOptions passes options to kfake.NewCluster as they are, after the
// kit's own (so they win): TLS (kfake.TLS), SASL (kfake.EnableSASL,
// kfake.Superuser), fault injection and the rest of kfake's API, without
// waiting for the kit to wrap them. It may be given several times.
func KfakeOptions(opts ...kfake.Opt) Option {
	return func(o *options) { o.extra = append(o.extra, opts...) }
}

// Broker is a running single-broker in-process Kafka cluster (kfake),
// speaking the Kafka protocol on 127.0.0.1, so any Kafka client (sarama,
// franz-go, the outbox's relay/kafka publisher) can produce to and consume
// from it. Safe for concurrent use.
type Broker struct {
	cluster *kfake.Cluster
	addrs   []string
}

// Start starts a one-broker kfake cluster with the given options and
// returns once it listens and its topics exist. The error wraps kfake's
// (a taken [Port], an unusable [DataDir]). Close the broker when done.
func Start(opts ...Option) (*Broker, error) {
	var o options
	for _, fn := range opts {
		fn(&o)
	}
	kopts := []kfake.Opt{kfake.NumBrokers(1)}
	if o.port != 0 {
		kopts = append(kopts, kfake.Ports(o.port))
	}
	for _, s := range o.topics {
		kopts = append(kopts, kfake.SeedTopics(s.partitions, s.names...))
	}
	if o.dataDir != "" {
		kopts = append(kopts, kfake.DataDir(o.dataDir), kfake.SyncWrites())
	}
	if o.configs != nil {
		kopts = append(kopts, kfake.BrokerConfigs(o.configs))
	}
	kopts = append(kopts, o.extra...)
	c, err := kfake.NewCluster(kopts...)
	if err != nil {
		return nil, fmt.Errorf("kafkatest: starting kfake: %w", err)
	}
	return &Broker{cluster: c, addrs: c.ListenAddrs()}, nil
}

// Addrs returns the broker's bootstrap addresses ("127.0.0.1:port", one
// per broker: one), a fresh slice each call.
func (b *Broker) Addrs() []string { return append([]string(nil), b.addrs...) }

// Cluster returns the underlying kfake cluster, for tests that inject
// faults or observe requests (kfake's Control, ControlKey).
func (b *Broker) Cluster() *kfake.Cluster { return b.cluster }

// Close shuts the broker down. It is safe to call twice.
func (b *Broker) Close() { b.cluster.Close() }

// Record is one consumed Kafka record, as a [Consumer] received it.
type Record struct {
	// Topic, Partition and Offset locate the record.
	Topic     string
	Partition int32
	Offset    int64
	// Key and Value are the record's bytes as received.
	Key   []byte
	Value []byte
	// Headers maps header keys to values (a repeated key keeps the last).
	Headers map[string]string
	// Received is time.Now() taken right after the poll that returned the
	// record, before any processing.
	Received time.Time
	// ProducerID is the producer ID of the idempotent producer that wrote
	// the record (-1 for a producer that is not idempotent). It names a
	// producer session, not a process: relay/kafka's publisher takes one
	// at start and a fresh one for a partition after each record batch
	// that failed or went unanswered (its sequence state at the broker is
	// then unknown), so one relay process may write under several. Records
	// of different producer IDs come from different sessions; the record
	// headers outbox-partition and outbox-epoch say which lease owner
	// published them.
	ProducerID int64
}

// Consumer consumes topics in a background goroutine (without a consumer
// group: every partition, directly, so it never waits for a rebalance) and
// records every record it receives, in the order received, duplicates
// included. The zero value is not usable: call [NewConsumer] or
// [NewConsumerAt]. Safe for concurrent use.
type Consumer struct {
	cl     *kgo.Client
	cancel context.CancelFunc
	done   chan struct{}

	recs *outboxtest.Recorder[Record]

	mu   sync.Mutex
	errs []error
}

// DefaultFetchMaxWait is the consumer's fetch.max.wait: how long the broker
// may hold an empty fetch. A fetch returns as soon as one byte is available
// (fetch.min.bytes 1), so this bounds idle round trips, not latency.
const DefaultFetchMaxWait = 50 * time.Millisecond

// NewConsumer starts consuming topics from their start (offset 0 of every
// partition, also of partitions that appear later). Extra kgo options are
// appended after the defaults (seed brokers, topics, reset offset at
// start, [DefaultFetchMaxWait]) and so override them. It errors only if
// kgo rejects the options; an unreachable broker shows up in [Consumer.Errors]
// and as a [Consumer.Wait] that does not finish. Close it when done.
func NewConsumer(brokers, topics []string, opts ...kgo.Opt) (*Consumer, error) {
	base := []kgo.Opt{
		kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	}
	return newConsumer(brokers, append(base, opts...))
}

// NewConsumerAt starts consuming exactly the given partitions (topic ->
// partition -> offset), each at the given offset, as from [EndOffsets], to
// ignore what a reused topic already holds. Extra kgo options are appended
// after the defaults (seed brokers, [DefaultFetchMaxWait]). Errors as
// [NewConsumer].
func NewConsumerAt(brokers []string, offsets map[string]map[int32]int64, opts ...kgo.Opt) (*Consumer, error) {
	parts := make(map[string]map[int32]kgo.Offset, len(offsets))
	for t, ps := range offsets {
		parts[t] = make(map[int32]kgo.Offset, len(ps))
		for p, off := range ps {
			parts[t][p] = kgo.NewOffset().At(off)
		}
	}
	return newConsumer(brokers, append([]kgo.Opt{kgo.ConsumePartitions(parts)}, opts...))
}

func newConsumer(brokers []string, opts []kgo.Opt) (*Consumer, error) {
	all := append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.FetchMaxWait(DefaultFetchMaxWait)}, opts...)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		return nil, fmt.Errorf("kafkatest: consumer: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Consumer{cl: cl, cancel: cancel, done: make(chan struct{}), recs: outboxtest.NewRecorder[Record]("kafkatest")}
	go c.loop(ctx)
	return c, nil
}

func (c *Consumer) loop(ctx context.Context) {
	defer close(c.done)
	for {
		fetches := c.cl.PollFetches(ctx)
		now := time.Now()
		if fetches.IsClientClosed() || ctx.Err() != nil {
			return
		}
		var recs []Record
		fetches.EachRecord(func(r *kgo.Record) {
			h := make(map[string]string, len(r.Headers))
			for _, kv := range r.Headers {
				h[kv.Key] = string(kv.Value)
			}
			recs = append(recs, Record{
				Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
				Key: r.Key, Value: r.Value, Headers: h, Received: now, ProducerID: r.ProducerID,
			})
		})
		var errs []error
		fetches.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				errs = append(errs, fmt.Errorf("fetching %s[%d]: %w", t, p, err))
			}
		})
		if len(recs) == 0 && len(errs) == 0 {
			continue
		}
		if len(errs) > 0 {
			c.mu.Lock()
			c.errs = append(c.errs, errs...)
			c.mu.Unlock()
		}
		c.recs.Add(recs...)
	}
}

// Records returns a copy of the records received so far, in receive order
// (per partition that is offset order).
func (c *Consumer) Records() []Record { return c.recs.Records() }

// Errors returns the fetch errors seen so far (kgo retries most of them
// itself; they are kept for diagnosis).
func (c *Consumer) Errors() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]error(nil), c.errs...)
}

// Wait blocks until cond, called with the records so far after every
// change (and once at the start), returns true, or ctx ends; then it
// returns a copy of the records so far and an error wrapping ctx's error
// (match it with errors.Is(err, context.DeadlineExceeded)). cond must not
// block, and must not modify the slice it is given: that is the
// consumer's own (not copied on every change, so that waiting on a long
// run stays cheap); keep what it needs, such as how far it has scanned.
// It is [outboxtest.Recorder.Wait].
func (c *Consumer) Wait(ctx context.Context, cond func([]Record) bool) ([]Record, error) {
	return c.recs.Wait(ctx, cond)
}

// WaitForCount waits, as [Consumer.Wait], until at least n records (duplicates
// counted) were received.
func (c *Consumer) WaitForCount(ctx context.Context, n int) ([]Record, error) {
	return c.recs.WaitForCount(ctx, n)
}

// Close stops the consumer and waits for its goroutine. Records stay
// readable. It is safe to call twice.
func (c *Consumer) Close() {
	c.cancel()
	c.cl.Close()
	<-c.done
}

// CreateTopic creates topic with the given partition count (at least 1)
// and the broker's default replication factor, waiting up to 30 s (or
// ctx) for the broker; a topic that already exists is left as it is (its
// partition count too) and is not an error. It works against any Kafka
// cluster, not only a [Broker].
func CreateTopic(ctx context.Context, brokers []string, topic string, partitions int32) error {
	adm, err := kadm.NewOptClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return fmt.Errorf("kafkatest: %w", err)
	}
	defer adm.Close()
	adm.SetTimeoutMillis(30000)
	resp, err := adm.CreateTopic(ctx, partitions, -1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("kafkatest: creating topic %s: %w", topic, err)
	}
	return nil
}

// EndOffsets returns each partition's current end offset (the offset the
// next produced record will get) of topic, by partition. It errors if the
// topic does not exist or has no partitions. It works against any Kafka
// cluster, not only a [Broker].
func EndOffsets(ctx context.Context, brokers []string, topic string) (map[int32]int64, error) {
	adm, err := kadm.NewOptClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return nil, fmt.Errorf("kafkatest: %w", err)
	}
	defer adm.Close()
	listed, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = listed.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("kafkatest: end offsets of %s: %w", topic, err)
	}
	out := map[int32]int64{}
	listed.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	if len(out) == 0 {
		return nil, fmt.Errorf("kafkatest: topic %s does not exist or has no partitions", topic)
	}
	return out, nil
}

// MessageID returns the record's outbox message ID (the
// [emit.HeaderMessageID] header the relay sets) and whether it has one.
func (r Record) MessageID() (string, bool) {
	id, ok := r.Headers[emit.HeaderMessageID]
	return id, ok
}

// ByMessageID groups recs by outbox message ID, each group in the order
// of recs (a group of two or more is a duplicate delivery). Records
// without a message ID are left out.
// It is [outboxtest.ByMessageID].
func ByMessageID(recs []Record) map[string][]Record {
	return outboxtest.ByMessageID(recs, Record.MessageID)
}

// WaitForMessageIDs waits, as [Consumer.Wait], until a record of every
// given outbox message ID was received, and returns all records so far
// (those of other IDs and duplicates included). With no IDs it returns at
// once. On timeout the error names how many IDs are still missing.
func (c *Consumer) WaitForMessageIDs(ctx context.Context, ids ...string) ([]Record, error) {
	return c.recs.WaitForMessageIDs(ctx, Record.MessageID, ids...)
}
