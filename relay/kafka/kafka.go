// Package kafka publishes outbox messages to Apache Kafka over IBM/sarama's
// client, keeping per-aggregate order by construction: within a batch, no
// record of an aggregate is written to the log unless every earlier record
// of that aggregate in the batch was acknowledged or is written with it,
// before it, in the same record batch. Once one fails, that aggregate's
// later records fail unsent (relay.ErrHeldBack) and other aggregates'
// outcomes stand; the relay's holds then keep the order across batches.
// That holds through every broker-side fault: a produce error on one
// partition mid-batch, a leader election longer than any deadline, lost
// producer state, an authorization revoked mid-batch, a connection reset.
//
// # The produce path
//
// Publish groups the batch by Kafka partition (the aggregate ID is the
// record key, placed by the Java client's murmur2 partitioner, so one
// aggregate's records share a partition). Each partition's share is sent
// as record batches, one after another: a partition's next record batch
// goes out only once the previous one was answered, and normally the
// whole share is one record batch (up to Producer.MaxMessageBytes). A
// broker appends a record batch atomically: all of its records or none.
// The record batches of different partitions that are ready at the same
// time travel in one Produce request per broker, one request in flight
// per broker. So a batch costs one round trip per broker, not per record.
//
// What each answer means for a record batch (classify.go):
//
//   - Written (or DUPLICATE_SEQUENCE_NUMBER: written before): its records
//     are acknowledged and the partition's next record batch may go.
//   - Retriable (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE,
//     REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS, a connection reset or timed
//     out with no answer, ...): the same record batch, with the same
//     producer ID and sequence, is sent again after Producer.Retry's
//     backoff and a metadata refresh, until it is answered or Publish's
//     deadline. The broker recognizes a batch it already wrote by its
//     sequence (idempotence, Kafka KIP-98), so a resend never writes it
//     twice and never lets a later batch of the partition pass it.
//   - Producer state refused (OUT_OF_ORDER_SEQUENCE_NUMBER,
//     UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_EPOCH, ...): the batch was not
//     written; it is sent again under a fresh producer ID (InitProducerId),
//     its sequence starting at 0, up to three times in one Publish call,
//     then its records fail and count an attempt.
//   - Too large (MESSAGE_TOO_LARGE): the records are sent again one per
//     record batch, so only the oversized one fails, with
//     relay.ErrPermanent.
//   - Unavailable (TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_OR_PARTITION,
//     ...): relay.ErrUnavailable, no attempt counted; permanent
//     (INVALID_RECORD, CORRUPT_MESSAGE): relay.ErrPermanent; anything else
//     (UNKNOWN_SERVER_ERROR, ...): a per-message failure that counts an
//     attempt.
//
// Whenever a record batch fails, its aggregates' later records in the
// batch fail unsent with relay.ErrHeldBack, and the partition's next
// record batch (other aggregates) takes a fresh producer ID first, since
// its sequence state at the broker is no longer known.
//
// Deadlines. Publish returns at its context's deadline (the relay's
// PublishTimeout, or less: the lease trust window). Records not yet sent,
// and records of a request still unanswered, then fail wrapping a
// *relay.BatchError: the relay counts no attempt and re-sends them, after
// the acknowledged ones were marked sent. Nothing is closed or flushed
// behind a request still in flight: the next Publish first waits until
// every request of the previous one is answered (or its own deadline
// passes), and a partition whose request went unanswered continues under a
// fresh producer ID. A record whose request was unanswered may still have
// been written: it is then delivered twice, the first copy in order, since
// nothing of its aggregate was sent after it.
//
// A record is sent only after every earlier record of its aggregate was
// acknowledged (or is before it in the same record batch); that is true
// also for the rare aggregate whose events go to several topics (an
// event's own Topic), which then wait for each other across partitions.
//
// # Why not sarama's AsyncProducer
//
// Up to this version the publisher handed the batch to sarama's
// AsyncProducer. Its design cannot keep an aggregate's order when one
// request of a partition fails, whatever the configuration:
//
//   - It flushes as soon as anything is buffered (produce_set.go,
//     readyToFlush, when no Flush.* setting is made) and keeps filling the
//     next request meanwhile, so a partition's records of one batch travel
//     in several requests.
//   - When a request fails for good (UNKNOWN_SERVER_ERROR,
//     OUT_OF_ORDER_SEQUENCE_NUMBER, an authorization revoked), returnErrors
//     bumps the idempotent producer's epoch (bumpIdempotentProducerEpoch)
//     and the records queued behind it go out under the new epoch with
//     fresh sequences: the broker accepts them, after the earlier record
//     failed (reproduced in 9 of 12 runs with kfake's fault injection).
//   - AsyncClose, the only way to stop a producer at a deadline, still
//     flushes what is queued behind a batch sarama is retrying; the retried
//     batch then fails with ErrShuttingDown and its re-send lands after the
//     records that were behind it (4 of 6 runs with a 1.5 s
//     NOT_LEADER_FOR_PARTITION against a 300 ms deadline).
//
// sarama's issues describe the same class: IBM/sarama#2619 (the
// AsyncProducer reorders messages when retries happen) and #2860 (order
// still broken with Net.MaxOpenRequests = 1 after the fix for #2619). The
// Java client had to learn the same lesson (KAFKA-14034: wait for a
// partition's in-flight batches before resetting its sequence). Its lower-level API (Client for
// metadata and connections, Broker.Produce, RecordBatch) does what is
// needed, so the publisher keeps sarama and the *sarama.Config users pass,
// and drives the protocol itself.
//
// # Configuration
//
// Whatever *sarama.Config the caller passes is copied; from it the
// publisher uses Net (TLS, SASL, timeouts), ClientID, Version, Metadata,
// Producer.Compression and CompressionLevel, Producer.MaxMessageBytes (the
// most bytes of one record batch, and so of one record), Producer.Timeout
// (how long the broker may wait for the in-sync replicas) and
// Producer.Retry.Backoff or BackoffFunc (the wait between resends; by
// default 100 ms doubling to 1 s). It enforces, on the copy:
//
//   - Producer.Idempotent = true: every record batch carries a producer ID
//     and sequence, so resends are deduplicated by the broker (KIP-98).
//     (In the exactly-once mode the publisher stamps the transactional
//     batches itself and sets Idempotent = false with Net.MaxOpenRequests
//     = 5, which sarama's validation requires together; each transaction
//     still sends one request at a time.)
//   - Producer.RequiredAcks = WaitForAll (acks=all): an acknowledged
//     record survives the leader's loss (the seed article's setting).
//   - Net.MaxOpenRequests = 1: one request in flight per broker
//     connection (the seed's max.in.flight = 1).
//   - Producer.Partitioner = Partitioner (the Java client's murmur2); the
//     publisher places records itself with partition.KafkaPartition.
//   - Producer.Retry.Max >= MinRetries; Version >= 0.11 (record headers and
//     idempotence need it; older is refused).
//
// Producer.Flush, Producer.Return and Producer.Interceptors are not used.
//
// # Exactly once
//
// With Config.ExactlyOnce the publisher runs in its exactly-once mode, and
// the relay with it (the Publisher is a relay.Reconciler). Consumers that
// read at read_committed (inboxkafka.Runner does by default) then receive
// every outbox row exactly once, in order per aggregate, through relay
// crashes, frozen relays, lease takeovers and broker faults.
//
// Producers. Each relay partition p publishes through a transactional
// producer of its own, transactional.id "<prefix><table>.<p>"
// (TransactionalID), over connections of its own (as each Java producer
// has). The relay calls Reconcile(p, epoch) when it acquires p's lease,
// before its first claim from p: InitProducerId bumps the producer epoch,
// which fences every earlier producer of p at the broker (its open
// transaction is aborted, its later writes and its commit are refused
// with PRODUCER_FENCED) and completes a commit it had already asked for.
// A fenced producer is never reused (sarama surfaces the error as an
// unknown code 90, IBM/sarama#2859): the partition is reconciled again,
// which makes a new one, if the relay still owns it.
//
// Transactions. A relay batch spans several relay partitions; Publish runs
// one transaction per relay partition's share, all at the same time. A
// transaction adds its Kafka partitions (one AddPartitionsToTxn), writes
// the share's records (each Kafka partition's records in batch order, in
// as few record batches as Producer.MaxMessageBytes allows, one after
// another; the partitions' record batches travel together, one produce
// request per leader broker, since a share of a backlog's batch touches
// most partitions of the topic) and, at the same time, its manifest: the
// outbox ids it carries, as the metadata of a transactional offset commit
// (TxnOffsetCommit) of the consumer group named like the transactional.id
// for partition 0 of the state topic "<prefix><table>.outbox-txn"
// (StateTopic; it must exist with one partition: CreateStateTopic, or
// `outbox kafka state-topic create`; no record is ever written to it, so
// compaction or retention play no part). The commit makes records and
// manifest visible together, or neither. Reconcile checks once that the
// state topic exists, before any transaction: without it the publisher
// begins none (ErrStateTopicMissing, relay.ErrUnavailable), rather than
// leave each retried batch in the log as aborted records.
//
// Reconcile also reads p's last committed manifest (OffsetFetch with
// RequireStable, KIP-447) and returns its ids; the relay marks them sent
// before it claims. So rows whose transaction committed but were never
// marked sent (a relay killed in between, a mark-sent that failed) are
// not sent again; rows of an aborted transaction are. The manifest names
// only the partition's last transaction, so the relay pipelines its marks
// through Carry (relay.Pipeliner): while batch n is being marked sent,
// batch n+1's transactions list batch n's ids of their relay partition
// beside their own, and the relay marks durably (its commit waits for the
// WAL flush) so that a confirmed mark is never lost to a database crash
// after the manifest stopped listing it. A failed mark makes the relay
// reconcile those partitions before their next claim.
//
// Outcomes of one relay partition's transaction:
//
//   - Every record written, manifest and commit answered: all acknowledged.
//   - A message's record batch fails (any produce error that is not
//     retriable; retriable ones are retried with the same sequence until
//     the deadline): the transaction is aborted (by bumping the epoch, as
//     KAFKA-14053 has Java producers do, not with an EndTxn that a late
//     request could overtake). That message gets the broker's error,
//     classified as in the default mode (an attempt counts; ErrPermanent
//     dead-letters; ErrUnavailable backs off), its aggregate's later
//     messages fail with relay.ErrHeldBack, and every other message of the
//     transaction with relay.ErrAborted (no attempt, no hold: published
//     again in the next cycle). A transaction cannot partly commit.
//   - The commit goes unanswered: the producer bumps its epoch (which
//     completes the transaction either way) and reads the manifest back:
//     committed if it lists the transaction's ids, else relay.ErrAborted.
//     If that fails too, or the deadline passed, or the producer was
//     fenced (relay.ErrFenced): relay.ErrOutcomeUnknown, and the relay
//     reconciles the partition before it claims from it again.
//   - The manifest or commit refused (the state topic deleted after
//     Reconcile found it, authorization): relay.ErrUnavailable (no attempt; the relay backs
//     off and alerts); anything else about the manifest: a
//     *relay.BatchError.
//   - A share whose ids do not fit in one manifest (offset.metadata.max.bytes,
//     4096 bytes by default: about 3,000 ids of a dense range) is cut; the
//     rest fails with relay.ErrAborted and goes in the next cycle.
//
// transaction.timeout.ms (ExactlyOnce.TransactionTimeout, default 60 s)
// must exceed the relay's PublishTimeout: the coordinator aborts a
// transaction open longer. It also bounds how long a crashed relay's open
// transaction holds back read_committed consumers of its Kafka partitions
// (their last stable offset) if no other relay takes the partition first;
// the next owner's Reconcile, at most LeaseTTL after the crash, aborts it
// at once. So set LeaseTTL well below it (the default 10 s is).
//
// Kafka 2.5 or later is needed (sarama Version 2.5 is set when Sarama is
// nil; an older Version is refused). The principal needs WRITE and
// DESCRIBE on the transactional IDs "<prefix>*" (TRANSACTIONAL_ID
// resource, prefixed), WRITE on the topics, READ on the groups
// "<prefix>*" and the state topic, and, before Kafka 2.8, IDEMPOTENT_WRITE
// on the cluster.
//
// The boundary: exactly once holds for consumers at read_committed that
// commit their own offsets with their effects (the inbox does it with a
// dedupe row in the same database transaction, which also covers a
// consumer's own redeliveries). A read_uncommitted consumer also sees the
// records of aborted transactions. Every relay of a table must run in the
// same mode with the same prefix and table (one state topic): a relay in
// the default mode publishes outside the transactions, and one with
// another state topic reads other manifests, so either would send again
// what another committed. The relay enforces it: each relay stores its
// mode in its membership row ("exactly-once " + Scope, the state topic),
// and one started beside live relays in another mode is refused with
// relay.ErrModeMismatch. Switching a table's mode means stopping all its
// relays first; the switch itself is at least once (rows a default-mode
// relay sent but never marked are sent again by the first exactly-once
// owner, whose manifests do not name them).
// Cost: see BENCHMARKS.md ("exactlyonce").
//
// Why not sarama's transactional producer: it is built on the
// AsyncProducer (see above), turns a fenced producer into a fatal error
// that needs a new client (IBM/sarama#2859), waits without a context, and
// cannot be driven one request at a time. The mode is built on sarama's
// request types instead (internal/kafkatxn), as the default mode is.
//
// # Records
//
// The record key is the aggregate ID. Headers carry the message ID, event
// type, aggregate type and ID, content type, relay partition and lease
// epoch (emit.Header* names), then the event's own headers, sorted by
// name. An empty payload is sent as an empty value, never a null one (a
// tombstone).
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

// MinRetries is the least Producer.Retry.Max NewPublisher sets on its copy
// of the caller's configuration. The publisher resends a record batch
// after a retriable error until Publish's deadline, whatever Retry.Max
// says; the value only feeds Retry.BackoffFunc's second argument, and
// sarama's validation of an idempotent configuration needs it above 0.
const MinRetries = 1000

// retryBackoff is the resend backoff unless the caller set a BackoffFunc:
// 100 ms doubling to 1 s.
func retryBackoff(retries, _ int) time.Duration {
	d := 100 * time.Millisecond
	for i := 1; i < retries && d < time.Second; i++ {
		d *= 2
	}
	return min(d, time.Second)
}

// ErrConfig is returned by NewPublisher for an unusable configuration.
var ErrConfig = errors.New("outbox/kafka: invalid configuration")

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("outbox/kafka: publisher closed")

// Config configures a Publisher.
type Config struct {
	// Brokers are the bootstrap addresses ("host:port"). Required.
	Brokers []string
	// Sarama is the caller's client configuration; nil means
	// sarama.NewConfig(). It is copied, then the settings in the package
	// documentation (Configuration) are enforced on the copy.
	Sarama *sarama.Config
	// Topic routes messages whose event has no Topic. Default DefaultTopic.
	Topic func(relay.Message) string
	// ExactlyOnce, if non-nil, turns on the exactly-once mode: each relay
	// partition publishes through its own transactional producer, one
	// transaction per batch, fenced by the relay's lease (package
	// documentation, "Exactly once"). Nil: the default mode (at least
	// once, idempotent producer).
	ExactlyOnce *ExactlyOnce
}

// Publisher implements relay.Publisher over a sarama.Client, keeping
// per-aggregate order through broker faults (see the package
// documentation's produce path). Publish calls are serialized; Publish,
// Healthy, MaxRecordBytes and Close are safe for concurrent use.
type Publisher struct {
	brokers     []string
	sc          *sarama.Config
	route       func(relay.Message) string
	maxBytes    int
	client      sarama.Client
	reqVersion  int16 // Produce request version for sc.Version
	initVersion int16 // InitProducerId request version for sc.Version

	publishMu sync.Mutex // serializes Publish

	mu         sync.Mutex // guards everything below
	closed     bool
	closing    chan struct{} // closed by Close
	parts      map[topicPartition]*partState
	ident      producerIdent
	idCall     *idCall
	senders    map[*sarama.Broker]*sender
	inflight   int           // Produce requests in flight
	settled    chan struct{} // closed when inflight drops to 0
	plugged    chan struct{} // non-nil while senders wait for a run's first batches
	refreshing map[string]bool

	hc healthCheck // Healthy's client (health.go)

	eos *eos // the exactly-once mode's state (txn.go); nil in the default mode
}

// NewPublisher connects to cfg.Brokers, obtains a producer ID and returns
// a Publisher. It returns an error wrapping ErrConfig for missing brokers
// or a Version older than 0.11; sarama's error (wrapped) if the cluster
// cannot be reached or the configuration is invalid; an error wrapping
// relay.ErrUnavailable if the cluster refuses a producer ID (the
// principal lacks IDEMPOTENT_WRITE on brokers before Kafka 2.8).
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
	var e *eos
	if cfg.ExactlyOnce != nil {
		var err error
		if e, err = newEOS(*cfg.ExactlyOnce); err != nil {
			return nil, err
		}
		if cfg.Sarama == nil {
			sc.Version = sarama.V2_5_0_0
		}
		if !sc.Version.IsAtLeast(sarama.V2_5_0_0) {
			return nil, fmt.Errorf("%w: the exactly-once mode needs sarama Version 2.5 or later (KIP-447: OffsetFetch RequireStable, InitProducerId epoch bump); it is %s", ErrConfig, sc.Version)
		}
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
	p := &Publisher{
		brokers:     append([]string(nil), cfg.Brokers...),
		sc:          sc,
		route:       cfg.Topic,
		reqVersion:  produceVersion(sc.Version),
		initVersion: initProducerIDVersion(sc.Version),
		closing:     make(chan struct{}),
		parts:       map[topicPartition]*partState{},
		senders:     map[*sarama.Broker]*sender{},
		refreshing:  map[string]bool{},
		eos:         e,
	}
	if p.route == nil {
		p.route = DefaultTopic
	}
	p.maxBytes = min(emit.DefaultMaxRecordBytes, sc.Producer.MaxMessageBytes+emit.RecordBatchOverhead)
	if e != nil {
		// The transactions of all relay partitions share the client's
		// connection to each broker; each transaction sends one request
		// at a time and waits for its answer, so requests of different
		// transactions may be in flight together without reordering
		// anything of one partition.
		// sarama refuses that with Producer.Idempotent, which only
		// configures its own producers: the publisher stamps every
		// transactional record batch with its producer ID, epoch and
		// sequence itself (kafkatxn).
		sc.Net.MaxOpenRequests = eosMaxOpenRequests
		sc.Producer.Idempotent = false
	}
	client, err := sarama.NewClient(p.brokers, sc)
	if err != nil {
		return nil, fmt.Errorf("outbox/kafka: connecting to %v: %w", p.brokers, err)
	}
	p.client = client
	if e != nil {
		return p, nil // producers are made per relay partition, by Reconcile
	}
	id, err := p.initProducerID()
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	p.ident = producerIdent{pid: id.pid, epoch: id.epoch, gen: 1}
	return p, nil
}

// produceVersion is the Produce request version sarama's own producer
// uses for v (produce_set.go, buildRequest): 3 (0.11, record batches) up
// to 10 (3.7).
func produceVersion(v sarama.KafkaVersion) int16 {
	switch {
	case v.IsAtLeast(sarama.V3_7_0_0):
		return 10
	case v.IsAtLeast(sarama.V2_8_0_0):
		return 9
	case v.IsAtLeast(sarama.V2_4_0_0):
		return 8
	case v.IsAtLeast(sarama.V2_1_0_0):
		return 7
	case v.IsAtLeast(sarama.V2_0_0_0):
		return 6
	case v.IsAtLeast(sarama.V1_0_0_0):
		return 5
	}
	return 3
}

// initProducerIDVersion is the InitProducerId request version sarama's
// client uses for v (client.go, InitProducerID).
func initProducerIDVersion(v sarama.KafkaVersion) int16 {
	switch {
	case v.IsAtLeast(sarama.V2_7_0_0):
		return 4
	case v.IsAtLeast(sarama.V2_5_0_0):
		return 3
	case v.IsAtLeast(sarama.V2_4_0_0):
		return 2
	case v.IsAtLeast(sarama.V2_0_0_0):
		return 1
	}
	return 0
}

// MaxRecordBytes is the largest emit.RecordSize this publisher accepts:
// sarama's Producer.MaxMessageBytes plus the batch header, capped at the
// broker default message.max.bytes. Use it as driver.Config's
// Limits.MaxRecordBytes (raise both if your brokers allow more).
func (p *Publisher) MaxRecordBytes() int { return p.maxBytes }

// isClosed reports whether Close was called.
func (p *Publisher) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// Publish sends msgs and waits until each is acknowledged, has failed, or
// ctx ends. It returns:
//   - nil if every message was acknowledged;
//   - an error wrapping ErrClosed after Close, before anything was sent;
//   - an error wrapping ctx's error if ctx ended before anything was
//     acknowledged and nothing failed on its own (the broker unreachable,
//     a leader election longer than the deadline), or if a request of the
//     previous call was still unanswered at ctx's end (nothing was sent);
//   - an error wrapping relay.ErrUnavailable if every message failed on
//     its route (authorization, an unknown topic) or was held back behind
//     such a failure;
//   - otherwise relay.PublishErrors, nil for acknowledged entries: an
//     entry wraps relay.ErrPermanent (dead-letter it), relay.ErrUnavailable
//     (the route; no attempt), relay.ErrHeldBack (an earlier message of its
//     aggregate failed in this batch; it was not sent), a *relay.BatchError
//     (not sent, or sent with its answer lost, before ctx's end; no
//     attempt), or another error (a per-message failure: the broker's
//     error code, wrapped, so errors.Is(err, sarama.ErrUnknownServerError)
//     and the like work).
//
// The package documentation says how each broker answer is handled and
// why an aggregate's later messages are never written after an earlier
// one failed.
func (p *Publisher) Publish(ctx context.Context, msgs []relay.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("outbox/kafka: %w", err)
	}
	p.publishMu.Lock()
	defer p.publishMu.Unlock()
	if p.isClosed() {
		return ErrClosed
	}
	if p.eos != nil {
		return p.publishTxn(ctx, msgs)
	}
	if err := p.settle(ctx); err != nil {
		return err
	}
	r := p.newRun(msgs)
	streams, err := r.route(ctx)
	if err != nil {
		return fmt.Errorf("outbox/kafka: %w", err)
	}
	r.firstLeft = len(streams)
	p.plug()
	defer p.unplug()
	if len(streams) == 0 {
		p.unplug()
	}
	var wg sync.WaitGroup
	for si, s := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.stream(ctx, si, s)
		}()
	}
	wg.Wait()
	return r.result(ctx)
}

// The relay's header keys, shared by every record: sarama only reads a
// header's bytes, and each is capped at its length, so an append copies.
var (
	keyMessageID     = fixedBytes(emit.HeaderMessageID)
	keyEventType     = fixedBytes(emit.HeaderEventType)
	keyAggregateType = fixedBytes(emit.HeaderAggregateType)
	keyAggregateID   = fixedBytes(emit.HeaderAggregateID)
	keyContentType   = fixedBytes(emit.HeaderContentType)
	keyPartition     = fixedBytes(emit.HeaderPartition)
	keyEpoch         = fixedBytes(emit.HeaderEpoch)
)

// fixedBytes returns s's bytes with no capacity past them.
func fixedBytes(s string) []byte { b := []byte(s); return b[:len(b):len(b)] }

// headers are the record headers of m: the relay's, then the event's
// own, sorted by name. Their values (and the event's own keys) are cut
// from one buffer: two allocations per record instead of one per header.
func (p *Publisher) headers(m *relay.Message) []sarama.RecordHeader {
	n := len(m.MessageID) + len(m.EventType) + len(m.AggregateType) + len(m.AggregateID) + len(m.ContentType) + 2*20
	var keys []string
	if len(m.Headers) > 0 {
		keys = make([]string, 0, len(m.Headers))
		for k, v := range m.Headers {
			keys = append(keys, k)
			n += len(k) + len(v)
		}
		sort.Strings(keys)
	}
	buf := make([]byte, 0, n)
	// cut appends to buf and returns what it appended (capped, so that
	// nothing appended to it overwrites the next).
	cut := func(from int) []byte { return buf[from:len(buf):len(buf)] }
	str := func(s string) []byte { from := len(buf); buf = append(buf, s...); return cut(from) }
	num := func(v int64) []byte { from := len(buf); buf = strconv.AppendInt(buf, v, 10); return cut(from) }
	hs := make([]sarama.RecordHeader, 0, 7+len(m.Headers))
	hs = append(hs,
		sarama.RecordHeader{Key: keyMessageID, Value: str(m.MessageID)},
		sarama.RecordHeader{Key: keyEventType, Value: str(m.EventType)},
		sarama.RecordHeader{Key: keyAggregateType, Value: str(m.AggregateType)},
		sarama.RecordHeader{Key: keyAggregateID, Value: str(m.AggregateID)},
		sarama.RecordHeader{Key: keyContentType, Value: str(m.ContentType)},
		sarama.RecordHeader{Key: keyPartition, Value: num(int64(m.Partition))},
		sarama.RecordHeader{Key: keyEpoch, Value: num(m.Epoch)},
	)
	for _, k := range keys {
		hs = append(hs, sarama.RecordHeader{Key: str(k), Value: str(m.Headers[k])})
	}
	return hs
}

// Close stops the publisher: Publish returns ErrClosed from then on; a
// Publish in progress sends nothing new but still gets the answers to the
// requests already in flight, which Close waits for (bounded by sarama's
// Net timeouts); then the client's connections are closed. It always
// returns nil and is safe to call twice.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.closing)
	p.mu.Unlock()
	p.hc.close()
	_ = p.settle(context.Background())
	p.publishMu.Lock() // the Publish in progress, if any, has returned
	p.closeEOS()
	_ = p.client.Close()
	p.publishMu.Unlock()
	return nil
}

// Partitioner is a sarama.Partitioner that places keyed records exactly as
// the Kafka Java client's default partitioner does
// (toPositive(murmur2(key)) % numPartitions), so other producers of the same
// keys agree. Unkeyed records go to partition 0. The Publisher places its
// records with the same function (partition.KafkaPartition); Partitioner is
// for a caller's own sarama producer that must agree with it.
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
