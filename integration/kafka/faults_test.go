package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// These tests drive the publisher alone (no database) against kfake with
// faults injected on Produce for one partition, and check the rule of the
// package documentation: no record of an aggregate is written unless
// every earlier record of it in the batch was acknowledged; once one
// fails, the aggregate's later records fail unsent (relay.ErrHeldBack) and
// other aggregates' outcomes stand.

const faultTopic = "outbox.event.order"

// keysOn returns n aggregate IDs that murmur2 places on partition p of a
// topic with parts partitions.
func keysOn(p, parts int32, n int, prefix string) []string {
	var keys []string
	for i := 0; len(keys) < n; i++ {
		k := prefix + strconv.Itoa(i)
		if partition.KafkaPartition([]byte(k), parts) == p {
			keys = append(keys, k)
		}
	}
	return keys
}

// interleaved is a batch of per events for each aggregate, interleaved
// (a1-0, a2-0, ..., a1-1, a2-1, ...), with 1 KiB payloads.
func interleaved(aggs []string, per int) []relay.Message {
	var msgs []relay.Message
	payload := []byte(`"` + strings.Repeat("p", 1022) + `"`)
	for seq := 0; seq < per; seq++ {
		for _, a := range aggs {
			msgs = append(msgs, relay.Message{ID: int64(len(msgs) + 1), MessageID: fmt.Sprintf("%s-%03d", a, seq),
				AggregateType: "order", AggregateID: a, EventType: "order.updated", ContentType: emit.DefaultContentType,
				Payload: payload})
		}
	}
	return msgs
}

// nthProduceTo fails the nth Produce request (counting from 1) that
// carries partition part of topic, with err, count times in a row.
func nthProduceTo(c *kfake.Cluster, topic string, part int32, nth int64, count int, err *kerr.Error) *kfake.FaultHandle {
	var seen atomic.Int64
	return c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Partitions: []int32{part}, Err: err, Count: count,
		When: func(kmsg.Request) bool { return seen.Add(1) >= nth }})
}

// firstDeliveries checks recs against msgs: per aggregate, the first
// deliveries are in batch order; it returns the message IDs delivered.
func firstDeliveries(t *testing.T, recs []kafkatest.Record, msgs []relay.Message) map[string]bool {
	t.Helper()
	order := map[string]int{}
	for i, m := range msgs {
		order[m.MessageID] = i
	}
	seen := map[string]bool{}
	last := map[string]int{}
	for _, r := range recs {
		id := r.Headers[emit.HeaderMessageID]
		if seen[id] {
			continue
		}
		seen[id] = true
		agg := string(r.Key)
		if prev, ok := last[agg]; ok && order[id] < prev {
			t.Errorf("aggregate %s: %s first delivered after %s", agg, id, msgs[prev].MessageID)
		}
		last[agg] = order[id]
	}
	return seen
}

// allDelivered waits until faultTopic holds at least len(msgs) records,
// checks that every message was delivered with each aggregate's first
// deliveries in order, and returns the records.
func allDelivered(t *testing.T, b *kafkatest.Broker, msgs []relay.Message) []kafkatest.Record {
	t.Helper()
	recs, err := newConsumer(t, b, faultTopic).WaitForCount(testCtx(t, 30*time.Second), len(msgs))
	if err != nil {
		t.Fatal(err)
	}
	if seen := firstDeliveries(t, recs, msgs); len(seen) != len(msgs) {
		t.Errorf("%d of %d delivered", len(seen), len(msgs))
	}
	return recs
}

// smallBatches is a config whose record batches hold two of
// interleaved's records (about 1.2 KB each), so one partition's share of
// a batch spans several record batches (and requests).
func smallBatches() *sarama.Config {
	sc := sarama.NewConfig()
	sc.Producer.MaxMessageBytes = 3_000
	sc.Producer.Retry.Backoff = 10 * time.Millisecond
	sc.Producer.Retry.BackoffFunc = func(int, int) time.Duration { return 10 * time.Millisecond }
	return sc
}

// TestNonRetriableErrorMidBatch: a partition's share spans several record
// batches; its second one fails with a non-retriable error. The failed
// batch's aggregates have no later record written; the partition's other
// aggregates go on (under a fresh producer ID, accepted by the broker);
// other partitions are untouched. With sarama's AsyncProducer this broke
// order (the queued later records went out under a bumped epoch).
func TestNonRetriableErrorMidBatch(t *testing.T) {
	t.Parallel()
	for _, code := range []*kerr.Error{kerr.UnknownServerError, kerr.OutOfOrderSequenceNumber, kerr.UnknownProducerID,
		kerr.InvalidProducerEpoch, kerr.TopicAuthorizationFailed, kerr.CorruptMessage} {
		t.Run(code.Message, func(t *testing.T) {
			t.Parallel()
			const parts = 4
			b := startBroker(t, parts, faultTopic)
			p := newPublisher(t, kafka.Config{Brokers: b.Addrs(), Sarama: smallBatches()})
			// Producer-state errors are answered by a resend under a fresh
			// producer ID; repeat them past the resends a batch may take.
			count := 1
			if code == kerr.OutOfOrderSequenceNumber || code == kerr.UnknownProducerID || code == kerr.InvalidProducerEpoch {
				count = 4
			}
			nthProduceTo(b.Cluster(), faultTopic, 1, 2, count, code)
			onFaulty := keysOn(1, parts, 4, "f")
			msgs := interleaved(append(onFaulty, keysOn(2, parts, 2, "o")...), 10)
			err := p.Publish(testCtx(t, 30*time.Second), msgs)
			pe, ok := asPublishErrors(err)
			if !ok {
				t.Fatalf("Publish = %v, want PublishErrors", err)
			}
			failedAgg := map[string]int{} // aggregate -> first failed index
			var acked []relay.Message
			for i, e := range pe {
				a := msgs[i].AggregateID
				if e == nil {
					if f, ok := failedAgg[a]; ok {
						t.Errorf("%s acknowledged after %s failed", msgs[i].MessageID, msgs[f].MessageID)
					}
					acked = append(acked, msgs[i])
					continue
				}
				if _, ok := failedAgg[a]; !ok {
					failedAgg[a] = i
					if errors.Is(e, relay.ErrHeldBack) {
						t.Errorf("%s: first failure of its aggregate is ErrHeldBack: %v", msgs[i].MessageID, e)
					}
					continue
				}
				if !errors.Is(e, relay.ErrHeldBack) && !errors.Is(e, code) {
					t.Errorf("%s: later failure %v, want ErrHeldBack", msgs[i].MessageID, e)
				}
			}
			if len(failedAgg) == 0 {
				t.Fatal("nothing failed: the fault did not fire")
			}
			for a := range failedAgg {
				if !strings.HasPrefix(a, "f") {
					t.Errorf("aggregate %s on another partition failed", a)
				}
			}
			if len(failedAgg) == len(onFaulty) {
				t.Errorf("every aggregate of the faulty partition failed; the others should go on: %v", failedAgg)
			}
			// The broker holds exactly the acknowledged records, in order.
			recs, err := newConsumer(t, b, faultTopic).WaitForCount(testCtx(t, 30*time.Second), len(acked))
			if err != nil {
				t.Fatal(err)
			}
			seen := firstDeliveries(t, recs, msgs)
			if len(seen) != len(acked) {
				t.Errorf("broker holds %d messages, %d acknowledged", len(seen), len(acked))
			}
			for _, m := range acked {
				if !seen[m.MessageID] {
					t.Errorf("%s acknowledged but not in the log", m.MessageID)
				}
			}
		})
	}
}

// TestProducerStateErrorIsResentUnderFreshID: OUT_OF_ORDER_SEQUENCE_NUMBER,
// UNKNOWN_PRODUCER_ID or INVALID_PRODUCER_EPOCH once: the publisher takes
// a fresh producer ID and resends; nothing fails, nothing is reordered.
func TestProducerStateErrorIsResentUnderFreshID(t *testing.T) {
	t.Parallel()
	for _, code := range []*kerr.Error{kerr.OutOfOrderSequenceNumber, kerr.UnknownProducerID, kerr.InvalidProducerEpoch} {
		t.Run(code.Message, func(t *testing.T) {
			t.Parallel()
			const parts = 2
			b := startBroker(t, parts, faultTopic)
			spy := spyOn(b.Cluster())
			p := newPublisher(t, kafka.Config{Brokers: b.Addrs(), Sarama: smallBatches()})
			nthProduceTo(b.Cluster(), faultTopic, 0, 2, 1, code)
			msgs := interleaved(keysOn(0, parts, 3, "k"), 10)
			if err := p.Publish(testCtx(t, 30*time.Second), msgs); err != nil {
				t.Fatalf("Publish = %v, want nil", err)
			}
			recs := allDelivered(t, b, msgs)
			if len(recs) != len(msgs) {
				t.Errorf("%d records for %d messages: a refused batch was written", len(recs), len(msgs))
			}
			if _, _, inits := spy.snapshot(); inits != 2 {
				t.Errorf("%d InitProducerId requests, want 2 (NewPublisher's and the fresh producer ID)", inits)
			}
		})
	}
}

// TestRetriableErrorOutlastsDeadline: NOT_LEADER_FOR_PARTITION on one
// partition for longer than Publish's deadline. Publish returns at the
// deadline: the other partitions acknowledged, the faulty partition's
// records not acknowledged (wrapping a *relay.BatchError: no attempt),
// none of its later records written. Once the fault ends the next Publish
// delivers them, and every aggregate's first deliveries are in order.
// With sarama's AsyncProducer, retiring the producer at the deadline
// flushed the records queued behind the retried one.
func TestRetriableErrorOutlastsDeadline(t *testing.T) {
	t.Parallel()
	const parts = 4
	b := startBroker(t, parts, faultTopic)
	p := newPublisher(t, kafka.Config{Brokers: b.Addrs(), Sarama: smallBatches()})
	fault := nthProduceTo(b.Cluster(), faultTopic, 3, 2, -1, kerr.NotLeaderForPartition)
	msgs := interleaved(append(keysOn(3, parts, 3, "s"), keysOn(0, parts, 3, "o")...), 10)

	// The deadline must leave the healthy partition time for its 15 record
	// batches (one round trip each, smallBatches) on a loaded machine:
	// 500 ms failed beside the kafkafaults suite with "o9-004 on a
	// healthy partition: ... context deadline exceeded". The faulty
	// partition fails until the deadline whatever its length.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	err := p.Publish(ctx, msgs)
	cancel()
	pe, ok := asPublishErrors(err)
	if !ok {
		t.Fatalf("Publish = %v, want PublishErrors (the healthy partition was acknowledged)", err)
	}
	var left []relay.Message
	for i, e := range pe {
		switch onFaulty := strings.HasPrefix(msgs[i].AggregateID, "s"); {
		case !onFaulty && e != nil:
			t.Errorf("%s on a healthy partition: %v", msgs[i].MessageID, e)
		case onFaulty && e == nil:
			// the partition's first record batch went out before the fault
		case onFaulty:
			var be *relay.BatchError
			if !errors.As(e, &be) || !errors.Is(e, context.DeadlineExceeded) {
				t.Errorf("%s: %v, want a *relay.BatchError wrapping the deadline", msgs[i].MessageID, e)
			}
			left = append(left, msgs[i])
		}
	}
	if len(left) == 0 {
		t.Fatal("nothing of the faulty partition was left: the fault did not fire")
	}
	fault.Remove()
	if err := p.Publish(testCtx(t, 30*time.Second), left); err != nil {
		t.Fatalf("Publish after the fault = %v", err)
	}
	allDelivered(t, b, msgs)
}

// TestRetriableErrorShorterThanDeadline: NOT_LEADER_FOR_PARTITION for a
// few requests is retried inside Publish: everything is acknowledged, in
// order, once (the same batch is resent under the same sequence).
func TestRetriableErrorShorterThanDeadline(t *testing.T) {
	t.Parallel()
	for _, code := range []*kerr.Error{kerr.NotLeaderForPartition, kerr.RequestTimedOut, kerr.NotEnoughReplicasAfterAppend} {
		t.Run(code.Message, func(t *testing.T) {
			t.Parallel()
			const parts = 2
			b := startBroker(t, parts, faultTopic)
			p := newPublisher(t, kafka.Config{Brokers: b.Addrs(), Sarama: smallBatches()})
			// REQUEST_TIMED_OUT and NOT_ENOUGH_REPLICAS_AFTER_APPEND are
			// answered after the broker appended the batch: the resend
			// must be recognized as a duplicate, not written again.
			h := nthProduceTo(b.Cluster(), faultTopic, 1, 2, 3, code)
			msgs := interleaved(keysOn(1, parts, 3, "k"), 10)
			if err := p.Publish(testCtx(t, 30*time.Second), msgs); err != nil {
				t.Fatalf("Publish = %v, want nil", err)
			}
			if h.Hits() != 3 {
				t.Fatalf("fault answered %d requests, want 3", h.Hits())
			}
			recs := allDelivered(t, b, msgs)
			if len(recs) != len(msgs) {
				t.Errorf("%d records for %d messages: a resend was written twice", len(recs), len(msgs))
			}
		})
	}
}

// TestOneRequestPerBrokerRound: a batch spread over 8 partitions of one
// broker travels in one Produce request, not one per partition or record.
func TestOneRequestPerBrokerRound(t *testing.T) {
	t.Parallel()
	const parts = 8
	b := startBroker(t, parts, faultTopic)
	var mu sync.Mutex
	var perRequest []int
	b.Cluster().ControlKey(kmsg.Produce.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		b.Cluster().KeepControl()
		n := 0
		for _, t := range req.(*kmsg.ProduceRequest).Topics {
			n += len(t.Partitions)
		}
		mu.Lock()
		perRequest = append(perRequest, n)
		mu.Unlock()
		return nil, nil, false
	})
	p := newPublisher(t, kafka.Config{Brokers: b.Addrs()})
	var aggs []string
	for i := range int32(parts) {
		aggs = append(aggs, keysOn(i, parts, 2, fmt.Sprintf("p%d-", i))...)
	}
	msgs := interleaved(aggs, 20) // 320 records of ~1 KiB: 40 KiB per partition
	if err := p.Publish(testCtx(t, 30*time.Second), msgs); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for _, n := range perRequest {
		total += n
	}
	if total != parts {
		t.Errorf("%d record batches over %v requests, want one per partition (%d)", total, perRequest, parts)
	}
	if len(perRequest) != 1 {
		t.Errorf("%d Produce requests (%v partitions each), want the batch in one", len(perRequest), perRequest)
	}
}

// TestAggregateAcrossTopics: an aggregate whose events go to two topics
// (an event's own Topic) keeps the rule across partitions: its event on
// the second topic is not written while an earlier one on the first is
// unacknowledged, and not at all once that one failed.
func TestAggregateAcrossTopics(t *testing.T) {
	t.Parallel()
	const other = "outbox.event.audit"
	b := startBroker(t, 1, faultTopic, other)
	p := newPublisher(t, kafka.Config{Brokers: b.Addrs()})
	msg := func(id, agg, topic string) relay.Message {
		return relay.Message{MessageID: id, AggregateType: "order", AggregateID: agg, EventType: "e",
			ContentType: emit.DefaultContentType, Payload: []byte(`{}`), Topic: topic}
	}
	// The first request to faultTopic fails: A-0 fails, so A-1 (audit)
	// and A-2 are held back; B, on audit only, is delivered.
	b.Cluster().Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: faultTopic, Err: kerr.UnknownServerError})
	msgs := []relay.Message{msg("A-0", "A", faultTopic), msg("B-0", "B", other), msg("A-1", "A", other),
		msg("A-2", "A", faultTopic), msg("B-1", "B", other)}
	err := p.Publish(testCtx(t, 30*time.Second), msgs)
	pe, ok := asPublishErrors(err)
	if !ok {
		t.Fatalf("Publish = %v, want PublishErrors", err)
	}
	if !errors.Is(pe[0], kerr.UnknownServerError) && !errors.Is(pe[0], sarama.ErrUnknown) {
		t.Errorf("A-0: %v, want UNKNOWN_SERVER_ERROR", pe[0])
	}
	for _, i := range []int{2, 3} {
		if !errors.Is(pe[i], relay.ErrHeldBack) {
			t.Errorf("%s: %v, want ErrHeldBack", msgs[i].MessageID, pe[i])
		}
	}
	if pe[1] != nil || pe[4] != nil {
		t.Errorf("B: %v, %v, want acknowledged", pe[1], pe[4])
	}
	recs, err := newConsumer(t, b, other).WaitForCount(testCtx(t, 30*time.Second), 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if id := r.Headers[emit.HeaderMessageID]; !strings.HasPrefix(id, "B-") {
			t.Errorf("%s written to %s although A-0 failed", id, other)
		}
	}
	// Without a fault, all of them, each aggregate in order on each topic.
	for i := range msgs {
		msgs[i].MessageID += "-again"
	}
	if err := p.Publish(testCtx(t, 30*time.Second), msgs); err != nil {
		t.Fatalf("Publish without a fault = %v", err)
	}
	all, err := newConsumer(t, b, faultTopic, other).WaitForCount(testCtx(t, 30*time.Second), 2+len(msgs))
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2+len(msgs) {
		t.Errorf("%d records, want %d", len(all), 2+len(msgs))
	}
}
