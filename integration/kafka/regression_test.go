package kafka_test

import (
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// TestPublishEmptyPayloadIsNotATombstone: an empty payload is delivered as
// an empty record value, whether the Message holds []byte{} or nil. A nil
// Payload is what the relay reads back for an empty BLOB on SQLite
// (modernc.org/sqlite returns nil for a zero-length blob, and database/sql
// keeps it nil), and emit accepts empty payloads for non-JSON content
// types. sarama encodes a nil value as Kafka's null value (length -1), a
// tombstone: on a compacted topic it deletes the aggregate's key, and
// consumers see "no value" instead of the empty event.
//
// REGRESSION: fails against the current kafka.go, which sets
// Value: sarama.ByteEncoder(m.Payload) with a nil Payload.
func TestPublishEmptyPayloadIsNotATombstone(t *testing.T) {
	t.Parallel()
	const topic = "outbox.event.order"
	b := startBroker(t, 2, topic)
	p := newPublisher(t, kafka.Config{Brokers: b.Addrs()})
	cons := newConsumer(t, b, topic)
	msgs := []relay.Message{
		{ID: 1, MessageID: "empty-slice", AggregateType: "order", AggregateID: "a", EventType: "order.ping",
			ContentType: "application/octet-stream", Payload: []byte{}},
		{ID: 2, MessageID: "nil-slice", AggregateType: "order", AggregateID: "a", EventType: "order.ping",
			ContentType: "application/octet-stream", Payload: nil},
	}
	ctx := testCtx(t, 30*time.Second)
	if err := p.Publish(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	recs, err := cons.WaitForCount(ctx, len(msgs))
	if err != nil {
		t.Fatal(err)
	}
	for id, r := range byMessageID(t, recs) {
		if r.Value == nil {
			t.Errorf("%s: record value is null (a tombstone), want an empty value", id)
		} else if len(r.Value) != 0 {
			t.Errorf("%s: record value %q, want empty", id, r.Value)
		}
	}
}

// TestCloseDuringPublishDeliversAcknowledgements: Close flushes the
// producer; a Publish that is waiting for acknowledgements of records
// already handed to sarama must receive them and return nil.
//
// The broker holds the one Produce request (sarama is configured to send
// all 100 records in one request, so when it arrives Publish has handed
// every record to the producer and is waiting), Close is called, then the
// broker answers.
//
// REGRESSION: fails against the current kafka.go. Close calls
// sarama.AsyncProducer.Close, which itself drains Successes() (in a
// goroutine) and Errors() until they close, racing the Publisher's own
// dispatch goroutine for the same channels. Every acknowledgement Close
// swallows is lost to its batch, so Publish waits until its context ends
// (forever without a deadline) and reports records that were delivered as
// failed.
func TestCloseDuringPublishDeliversAcknowledgements(t *testing.T) {
	t.Parallel()
	const (
		topic = "outbox.event.order"
		n     = 100
	)
	b := startBroker(t, 4, topic)
	c := b.Cluster()
	var once sync.Once
	held, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	doRelease := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(doRelease)
	c.ControlKey(kmsg.Produce.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		once.Do(func() { close(held) })
		c.SleepControl(func() { <-release })
		return nil, nil, false // the broker then handles it normally
	})

	sc := sarama.NewConfig()
	sc.Producer.Flush.Messages = n // one Produce request with all n records
	p, err := kafka.NewPublisher(kafka.Config{Brokers: b.Addrs(), Sarama: sc})
	if err != nil {
		t.Fatal(err)
	}
	msgs := msgsTo(topic, n)
	ctx := testCtx(t, 10*time.Second)
	published := make(chan error, 1)
	go func() { published <- p.Publish(ctx, msgs) }()

	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("no Produce request reached the broker")
	}
	closed := make(chan error, 1)
	go func() { closed <- closeWithin(p, 30*time.Second) }()
	doRelease()

	if err := <-published; err != nil {
		t.Errorf("Publish during Close = %v, want nil: records were delivered but their acknowledgements were lost", err)
	}
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
	recs, err := newConsumer(t, b, topic).WaitForCount(testCtx(t, 10*time.Second), n)
	if err != nil {
		t.Fatalf("records not delivered: %v", err)
	}
	if len(recs) != n {
		t.Errorf("consumed %d records, want %d", len(recs), n)
	}
}
