package kafka_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// Publisher must satisfy the relay's contract.
var _ relay.Publisher = (*kafka.Publisher)(nil)

// TestNewPublisherConfigErrors: missing brokers and a sarama Version older
// than 0.11 are refused with ErrConfig before any connection is attempted
// (the address is unroutable on purpose).
func TestNewPublisherConfigErrors(t *testing.T) {
	t.Parallel()
	old := sarama.NewConfig()
	old.Version = sarama.V0_10_2_0
	zero := sarama.NewConfig()
	zero.Version = sarama.KafkaVersion{}
	const nowhere = "127.0.0.1:1"
	for _, tc := range []struct {
		name string
		cfg  kafka.Config
	}{
		{"nil brokers", kafka.Config{}},
		{"empty brokers", kafka.Config{Brokers: []string{}, Sarama: sarama.NewConfig()}},
		{"version 0.10.2", kafka.Config{Brokers: []string{nowhere}, Sarama: old}},
		{"zero version", kafka.Config{Brokers: []string{nowhere}, Sarama: zero}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := kafka.NewPublisher(tc.cfg)
			if !errors.Is(err, kafka.ErrConfig) {
				t.Fatalf("NewPublisher = (%v, %v), want an error wrapping ErrConfig", p, err)
			}
			if p != nil {
				t.Errorf("NewPublisher returned a publisher with an error")
			}
		})
	}
	if old.Version != sarama.V0_10_2_0 {
		t.Errorf("caller's Version changed to %s", old.Version)
	}
}

// TestNewPublisherUnreachable: a broker that cannot be reached is sarama's
// error, not ErrConfig.
func TestNewPublisherUnreachable(t *testing.T) {
	t.Parallel()
	b := startBroker(t, 1, "t")
	addrs := b.Addrs()
	b.Close() // nothing listens there any more
	sc := sarama.NewConfig()
	sc.Metadata.Retry.Max = 0
	sc.Net.DialTimeout = 2 * time.Second
	p, err := kafka.NewPublisher(kafka.Config{Brokers: addrs, Sarama: sc})
	if err == nil {
		p.Close()
		t.Fatal("NewPublisher to a closed broker succeeded")
	}
	if errors.Is(err, kafka.ErrConfig) {
		t.Errorf("unreachable broker reported as ErrConfig: %v", err)
	}
}

// unsafeConfig is a caller's sarama config with every setting NewPublisher
// must override set to its unsafe value.
func unsafeConfig(clientID string) *sarama.Config {
	sc := sarama.NewConfig()
	sc.ClientID = clientID
	sc.Producer.Idempotent = false
	sc.Producer.RequiredAcks = sarama.NoResponse
	sc.Net.MaxOpenRequests = 5
	sc.Producer.Partitioner = sarama.NewHashPartitioner // FNV-1a, abs
	sc.Producer.Return.Successes = false
	sc.Producer.Return.Errors = false
	sc.Producer.Retry.Max = 0
	return sc
}

// configView is the part of a sarama.Config NewPublisher touches.
type configView struct {
	ClientID           string
	Idempotent         bool
	Acks               sarama.RequiredAcks
	MaxOpenRequests    int
	Partitioner        uintptr
	Successes, Errors  bool
	RetryMax           int
	Version            sarama.KafkaVersion
	MaxMessageBytes    int
	MetadataRetryMax   int
	MetadataRetryDelay time.Duration
}

func viewOf(sc *sarama.Config) configView {
	return configView{
		ClientID:           sc.ClientID,
		Idempotent:         sc.Producer.Idempotent,
		Acks:               sc.Producer.RequiredAcks,
		MaxOpenRequests:    sc.Net.MaxOpenRequests,
		Partitioner:        reflect.ValueOf(sc.Producer.Partitioner).Pointer(),
		Successes:          sc.Producer.Return.Successes,
		Errors:             sc.Producer.Return.Errors,
		RetryMax:           sc.Producer.Retry.Max,
		Version:            sc.Version,
		MaxMessageBytes:    sc.Producer.MaxMessageBytes,
		MetadataRetryMax:   sc.Metadata.Retry.Max,
		MetadataRetryDelay: sc.Metadata.Retry.Backoff,
	}
}

// keysWherePartitionersDisagree returns keys that sarama's default hash
// partitioner and the Java-compatible murmur2 place on different partitions.
func keysWherePartitionersDisagree(t *testing.T, topic string, n int32, want int) []string {
	t.Helper()
	def := sarama.NewHashPartitioner(topic)
	var keys []string
	for i := 0; len(keys) < want && i < 10_000; i++ {
		k := "agg-" + strconv.Itoa(i)
		p, err := def.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(k)}, n)
		if err != nil {
			t.Fatal(err)
		}
		if p != partition.KafkaPartition([]byte(k), n) {
			keys = append(keys, k)
		}
	}
	if len(keys) < want {
		t.Fatalf("found only %d keys where the partitioners disagree", len(keys))
	}
	return keys
}

// TestNewPublisherEnforcesSafetyOnACopy: a caller's config with unsafe
// values is accepted; the caller's object is left exactly as it was; what
// reaches the broker is idempotent (InitProducerId, a real producer ID on
// every batch, which sarama only allows with acks=all, MaxOpenRequests 1 and
// Retry.Max >= 1), acks=all (-1), placed by murmur2 rather than the
// configured FNV-1a partitioner, acknowledged to Publish (Return.Successes
// forced on), and the caller's ClientID is what the broker sees.
func TestNewPublisherEnforcesSafetyOnACopy(t *testing.T) {
	t.Parallel()
	const (
		topic    = "outbox.event.order"
		parts    = 6
		clientID = "outbox-kafka-test-client"
	)
	b := startBroker(t, parts, topic)
	spy := spyOn(b.Cluster())
	proxy := startClientIDProxy(t, b.Addrs()[0])

	sc := unsafeConfig(clientID)
	before := viewOf(sc)
	p := newPublisher(t, kafka.Config{Brokers: []string{proxy.Addr()}, Sarama: sc})
	if after := viewOf(sc); after != before {
		t.Errorf("NewPublisher mutated the caller's config:\nbefore %+v\nafter  %+v", before, after)
	}

	keys := keysWherePartitionersDisagree(t, topic, parts, 5)
	msgs := make([]relay.Message, len(keys))
	for i, k := range keys {
		msgs[i] = relay.Message{ID: int64(i + 1), MessageID: "m-" + k, AggregateType: "order", AggregateID: k,
			EventType: "order.created", ContentType: emit.DefaultContentType, Payload: []byte(`{}`)}
	}
	ctx := testCtx(t, 30*time.Second)
	if err := p.Publish(ctx, msgs); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if after := viewOf(sc); after != before {
		t.Errorf("Publish mutated the caller's config:\nbefore %+v\nafter  %+v", before, after)
	}

	recs, err := newConsumer(t, b, topic).WaitForCount(ctx, len(msgs))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if want := partition.KafkaPartition(r.Key, parts); r.Partition != want {
			t.Errorf("key %q on partition %d, want murmur2's %d (the caller's FNV-1a partitioner was not replaced)", r.Key, r.Partition, want)
		}
	}

	acks, pids, inits := spy.snapshot()
	if len(acks) == 0 {
		t.Fatal("no Produce request observed")
	}
	for _, a := range acks {
		if a != -1 {
			t.Errorf("Produce request with acks=%d, want -1 (all)", a)
		}
	}
	if inits == 0 {
		t.Error("no InitProducerId request: the producer is not idempotent")
	}
	if len(pids) == 0 {
		t.Error("no record batch decoded from the Produce requests")
	}
	for _, pid := range pids {
		if pid < 0 {
			t.Errorf("record batch with producer ID %d: not idempotent", pid)
		}
	}

	ids := proxy.IDs()
	if len(ids) == 0 {
		t.Fatal("no request passed the bootstrap proxy")
	}
	for _, id := range ids {
		if id != clientID {
			t.Errorf("broker saw client ID %q, want the caller's %q", id, clientID)
		}
	}
}

// TestNewPublisherDefaultConfig: a nil Sarama config works (sarama's
// defaults plus the enforced settings) and is idempotent on the wire.
func TestNewPublisherDefaultConfig(t *testing.T) {
	t.Parallel()
	b := startBroker(t, 2, "outbox.event.order")
	spy := spyOn(b.Cluster())
	p := newPublisher(t, kafka.Config{Brokers: b.Addrs()})
	if got := p.MaxRecordBytes(); got != emit.DefaultMaxRecordBytes {
		t.Errorf("MaxRecordBytes = %d with sarama's default MaxMessageBytes, want the cap %d", got, emit.DefaultMaxRecordBytes)
	}
	ctx := testCtx(t, 30*time.Second)
	err := p.Publish(ctx, []relay.Message{{ID: 1, MessageID: "m", AggregateType: "order", AggregateID: "a", EventType: "e", Payload: []byte(`1`)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newConsumer(t, b, "outbox.event.order").WaitForCount(ctx, 1); err != nil {
		t.Fatal(err)
	}
	acks, pids, inits := spy.snapshot()
	if inits == 0 || len(pids) == 0 || pids[0] < 0 || len(acks) == 0 || acks[0] != -1 {
		t.Errorf("default config on the wire: acks %v, producer IDs %v, InitProducerId %d; want acks=-1 and an idempotent producer", acks, pids, inits)
	}
}

// TestNewPublisherVersion011: the oldest accepted Version produces.
func TestNewPublisherVersion011(t *testing.T) {
	t.Parallel()
	b := startBroker(t, 2, "outbox.event.order")
	sc := sarama.NewConfig()
	sc.Version = sarama.V0_11_0_0
	p := newPublisher(t, kafka.Config{Brokers: b.Addrs(), Sarama: sc})
	ctx := testCtx(t, 30*time.Second)
	msg := relay.Message{ID: 1, MessageID: "m", AggregateType: "order", AggregateID: "a", EventType: "e",
		ContentType: "text/plain", Payload: []byte("x"), Headers: map[string]string{"h": "v"}}
	if err := p.Publish(ctx, []relay.Message{msg}); err != nil {
		t.Fatal(err)
	}
	recs, err := newConsumer(t, b, "outbox.event.order").WaitForCount(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if recs[0].Headers["h"] != "v" || recs[0].Headers[emit.HeaderMessageID] != "m" {
		t.Errorf("headers %v", recs[0].Headers)
	}
}

// checkRecord compares one consumed record with the message it came from.
func checkRecord(t *testing.T, r kafkatest.Record, m relay.Message, topic string, parts int32) {
	t.Helper()
	if r.Topic != topic {
		t.Errorf("%s: topic %q, want %q", m.MessageID, r.Topic, topic)
	}
	if string(r.Key) != m.AggregateID {
		t.Errorf("%s: key %q, want the aggregate ID %q", m.MessageID, r.Key, m.AggregateID)
	}
	if !bytes.Equal(r.Value, m.Payload) {
		t.Errorf("%s: value %q, want %q", m.MessageID, r.Value, m.Payload)
	}
	if want := partition.KafkaPartition([]byte(m.AggregateID), parts); r.Partition != want {
		t.Errorf("%s: partition %d, want KafkaPartition's %d", m.MessageID, r.Partition, want)
	}
	want := map[string]string{
		emit.HeaderMessageID:     m.MessageID,
		emit.HeaderEventType:     m.EventType,
		emit.HeaderAggregateType: m.AggregateType,
		emit.HeaderAggregateID:   m.AggregateID,
		emit.HeaderContentType:   m.ContentType,
		emit.HeaderPartition:     strconv.Itoa(m.Partition),
		emit.HeaderEpoch:         strconv.FormatInt(m.Epoch, 10),
	}
	maps.Copy(want, m.Headers)
	if !maps.Equal(r.Headers, want) {
		t.Errorf("%s: headers %v, want %v", m.MessageID, r.Headers, want)
	}
}

func TestDefaultTopic(t *testing.T) {
	t.Parallel()
	if got := kafka.DefaultTopic(relay.Message{AggregateType: "order", Topic: "ignored"}); got != "outbox.event.order" {
		t.Errorf("DefaultTopic = %q, want outbox.event.order", got)
	}
	if kafka.DefaultTopicPrefix != "outbox.event." {
		t.Errorf("DefaultTopicPrefix = %q", kafka.DefaultTopicPrefix)
	}
}

// TestPublishCustomRouter: Config.Topic routes messages without a Topic of
// their own; a message's Topic still wins and the router is not asked.
func TestPublishCustomRouter(t *testing.T) {
	t.Parallel()
	const parts = 3
	topics := []string{"routed.order", "routed.invoice", "custom.topic"}
	b := startBroker(t, parts, topics...)
	var (
		mu     sync.Mutex
		routed []string
	)
	router := func(m relay.Message) string {
		mu.Lock()
		routed = append(routed, m.MessageID)
		mu.Unlock()
		return "routed." + m.AggregateType
	}
	p := newPublisher(t, kafka.Config{Brokers: b.Addrs(), Topic: router})
	cons := newConsumer(t, b, topics...)
	msgs := []relay.Message{
		{ID: 1, MessageID: "a", AggregateType: "order", AggregateID: "o-1", EventType: "order.created", ContentType: "application/json", Payload: []byte(`{"n":1}`)},
		{ID: 2, MessageID: "b", AggregateType: "invoice", AggregateID: "i-1", EventType: "invoice.created", ContentType: "application/json", Payload: []byte(`{"n":2}`)},
		{ID: 3, MessageID: "c", AggregateType: "order", AggregateID: "o-1", EventType: "order.special", ContentType: "application/json", Payload: []byte(`{"n":3}`), Topic: "custom.topic"},
		{ID: 4, MessageID: "d", AggregateType: "order", AggregateID: "o-1", EventType: "order.paid", ContentType: "application/json", Payload: []byte(`{"n":4}`)},
	}
	ctx := testCtx(t, 30*time.Second)
	if err := p.Publish(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	recs, err := cons.WaitForCount(ctx, len(msgs))
	if err != nil {
		t.Fatal(err)
	}
	got := byMessageID(t, recs)
	wantTopic := map[string]string{"a": "routed.order", "b": "routed.invoice", "c": "custom.topic", "d": "routed.order"}
	for _, m := range msgs {
		checkRecord(t, got[m.MessageID], m, wantTopic[m.MessageID], parts)
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(routed)
	if !slices.Equal(routed, []string{"a", "b", "d"}) {
		t.Errorf("router asked for %v, want exactly the messages without a Topic [a b d]", routed)
	}
}

// TestMaxRecordBytesIsHonoured: a message whose emit.RecordSize is exactly
// MaxRecordBytes (what Emit accepts at most) is accepted by the producer.
func TestMaxRecordBytesIsHonoured(t *testing.T) {
	t.Parallel()
	const topic = "outbox.event.order"
	b := startBroker(t, 1, topic)
	sc := sarama.NewConfig()
	sc.Producer.MaxMessageBytes = 4_000
	p := newPublisher(t, kafka.Config{Brokers: b.Addrs(), Sarama: sc})

	ev := emit.Event{ID: "exact", AggregateType: "order", AggregateID: "a-1", Type: "order.big",
		ContentType: "application/octet-stream", Headers: map[string]string{"k": "v"}}
	ev.Payload = make([]byte, p.MaxRecordBytes()-emit.RecordSize(&ev))
	if emit.RecordSize(&ev) != p.MaxRecordBytes() {
		t.Fatalf("RecordSize %d, want %d", emit.RecordSize(&ev), p.MaxRecordBytes())
	}
	m := relay.Message{ID: 1, MessageID: ev.ID, AggregateType: ev.AggregateType, AggregateID: ev.AggregateID,
		EventType: ev.Type, ContentType: ev.ContentType, Payload: ev.Payload, Headers: ev.Headers}
	ctx := testCtx(t, 30*time.Second)
	if err := p.Publish(ctx, []relay.Message{m}); err != nil {
		t.Fatalf("Publish of a record of exactly MaxRecordBytes: %v", err)
	}
	recs, err := newConsumer(t, b, topic).WaitForCount(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	checkRecord(t, recs[0], m, topic, 1)
}

// TestMaxRecordBytesCap: MaxRecordBytes is MaxMessageBytes plus
// emit.RecordBatchOverhead, capped at emit.DefaultMaxRecordBytes, and the
// caller's config is not changed.
func TestMaxRecordBytesCap(t *testing.T) {
	t.Parallel()
	b := startBroker(t, 1, "t")
	for _, mmb := range []int{10_000, emit.DefaultMaxRecordBytes - emit.RecordBatchOverhead, emit.DefaultMaxRecordBytes, 4 << 20} {
		sc := sarama.NewConfig()
		sc.Producer.MaxMessageBytes = mmb
		p := newPublisher(t, kafka.Config{Brokers: b.Addrs(), Sarama: sc})
		if sc.Producer.MaxMessageBytes != mmb {
			t.Errorf("caller's MaxMessageBytes changed to %d", sc.Producer.MaxMessageBytes)
		}
		if got, want := p.MaxRecordBytes(), min(emit.DefaultMaxRecordBytes, mmb+emit.RecordBatchOverhead); got != want {
			t.Errorf("MaxMessageBytes %d: MaxRecordBytes = %d, want %d", mmb, got, want)
		}
		if p.MaxRecordBytes() > emit.DefaultMaxRecordBytes {
			t.Errorf("MaxRecordBytes %d above the cap", p.MaxRecordBytes())
		}
	}
}

// fastMetadata is a caller config that gives up on metadata quickly.
func fastMetadata() *sarama.Config {
	sc := sarama.NewConfig()
	sc.Metadata.Retry.Max = 1
	sc.Metadata.Retry.Backoff = 10 * time.Millisecond
	sc.Producer.Retry.Backoff = 10 * time.Millisecond
	return sc
}

func msgsTo(topic string, n int) []relay.Message {
	msgs := make([]relay.Message, n)
	for i := range msgs {
		msgs[i] = relay.Message{ID: int64(i + 1), MessageID: fmt.Sprintf("%s-%d", topic, i), AggregateType: "order",
			AggregateID: fmt.Sprintf("a-%d", i%3), EventType: "e", ContentType: "application/json",
			Payload: []byte(`{}`), Topic: topic}
	}
	return msgs
}

// TestPublishUnknownTopicShortDeadline: with sarama's default metadata
// retries, a batch to a topic that does not exist returns by its deadline
// with one error (the deadline or ErrUnknownTopicOrPartition), not
// PublishErrors. (The shared suite's Unroutable case covers the fast
// path; TestConformance.)
func TestPublishUnknownTopicShortDeadline(t *testing.T) {
	t.Parallel()
	b := startBroker(t, 2, "exists")
	p := newPublisher(t, kafka.Config{Brokers: b.Addrs()})
	const deadline = 2 * time.Second
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	start := time.Now()
	err := p.Publish(ctx, msgsTo("does.not.exist.either", 10))
	elapsed := time.Since(start)
	if err == nil {
		t.Fatal("Publish to a missing topic succeeded")
	}
	if pe, ok := asPublishErrors(err); ok {
		t.Fatalf("whole-batch failure reported as PublishErrors %v", pe)
	}
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		t.Errorf("Publish = %v, want the deadline or ErrUnknownTopicOrPartition", err)
	}
	if elapsed > deadline+time.Second {
		t.Errorf("Publish returned %v after a %v deadline", elapsed, deadline)
	}
}

// TestPublishUnknownTopicWrapsSarama: the missing-route error the shared
// suite checks (relay.ErrUnavailable) also wraps sarama's own.
func TestPublishUnknownTopicWrapsSarama(t *testing.T) {
	t.Parallel()
	b := startBroker(t, 2, "exists")
	p := newPublisher(t, kafka.Config{Brokers: b.Addrs(), Sarama: fastMetadata()})
	err := p.Publish(testCtx(t, 30*time.Second), msgsTo("does.not.exist", 3))
	if !errors.Is(err, sarama.ErrUnknownTopicOrPartition) || !errors.Is(err, relay.ErrUnavailable) {
		t.Errorf("Publish = %v, want it to wrap sarama.ErrUnknownTopicOrPartition and relay.ErrUnavailable", err)
	}
}

// TestPublishUnknownTopicNamesIt: the error of an unknown topic names
// that topic and the command that creates it with that very name (issue
// 36: the hint named a default, not the route that failed).
func TestPublishUnknownTopicNamesIt(t *testing.T) {
	t.Parallel()
	b := startBroker(t, 2, "exists")
	p := newPublisher(t, kafka.Config{Brokers: b.Addrs(), Sarama: fastMetadata()})
	err := p.Publish(testCtx(t, 30*time.Second), msgsTo("fu.nowhere", 2))
	for _, want := range []string{`topic "fu.nowhere" does not exist`, "fix the event's Topic", "--create --topic fu.nowhere "} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Publish = %v, want it to say %q", err, want)
		}
	}
}

func TestTopicHint(t *testing.T) {
	t.Parallel()
	if h := kafka.TopicHint("t1", fmt.Errorf("x: %w", sarama.ErrTopicAuthorizationFailed)); !strings.Contains(h, `may not write to topic "t1"`) || !strings.Contains(h, "--operation Write --operation Describe --topic t1`") {
		t.Errorf("TopicHint(authorization) = %q", h)
	}
	if h := kafka.TopicHint("t1", sarama.ErrOutOfBrokers); h != "" {
		t.Errorf("TopicHint(out of brokers) = %q, want none", h)
	}
}
