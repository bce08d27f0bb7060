package tests

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/integration/internal/ledger"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

const orderTopic = "outbox.event.order"

// kafkaBundle is a private broker, a sarama publisher and a consumer.
type kafkaBundle struct {
	broker *kafkatest.Broker
	pub    *kafka.Publisher
	cons   *kafkatest.Consumer
}

func startKafka(t *testing.T, partitions int32, topics ...string) *kafkaBundle {
	t.Helper()
	b, err := kafkatest.Start(kafkatest.Topics(partitions, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	pub, err := kafka.NewPublisher(kafka.Config{Brokers: b.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	cons, err := kafkatest.NewConsumer(b.Addrs(), topics)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cons.Close)
	return &kafkaBundle{broker: b, pub: pub, cons: cons}
}

// TestKafkaRoundTrip: bytes in = bytes out, through the table and a real
// Kafka-protocol broker: payloads (unicode, JSON key order and spacing,
// raw bytes with NUL, the largest payload Emit accepts), headers, key,
// partition (Java-compatible murmur2) and topic routing.
func TestKafkaRoundTrip(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		kb := startKafka(t, 4, orderTopic, "custom.topic")
		e := testdb.New(t, tg, driver.Config{Limits: outbox.Limits{MaxRecordBytes: kb.pub.MaxRecordBytes()}})
		startRelay(t, e, kb.pub, nil)
		ctx := testCtx(t, 60*time.Second)

		largest := outbox.Event{ID: "largest", AggregateType: "order", AggregateID: "big", Type: "order.big", Payload: []byte(`""`)}
		room := kb.pub.MaxRecordBytes() - emit.RecordSize(&outbox.Event{ID: largest.ID, AggregateType: "order", AggregateID: "big", Type: "order.big", Payload: largest.Payload, ContentType: emit.DefaultContentType})
		largest.Payload = []byte(`"` + strings.Repeat("x", room) + `"`)
		events := []outbox.Event{
			{ID: "unicode", AggregateType: "order", AggregateID: "ü-1", Type: "order.créé",
				Payload: []byte("{\"z\" : \"日本語 ✓ \\u0000\",\n\t\"a\":[1 , 2.50, 1e3],  \"é\": null}"),
				Headers: map[string]string{"trace-id": "0af7651916cd43dd8448eb211c80319c", "klyuch": "значение", "empty": ""}},
			{ID: "raw", AggregateType: "order", AggregateID: "ü-1", Type: "order.blob", ContentType: "application/octet-stream",
				Payload: []byte{0x00, 0xff, 0xfe, 'a', 0x00}},
			{ID: "routed", AggregateType: "order", AggregateID: "r-2", Type: "order.routed", Payload: []byte(`{}`), Topic: "custom.topic"},
			largest,
		}
		err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error {
			for _, ev := range events {
				if err := outbox.Emit(ctx, ev); err != nil {
					return err
				}
			}
			// One byte more than the largest is refused at Emit.
			over := largest
			over.ID = "largesX" // same length as "largest"
			over.Payload = []byte(`"` + strings.Repeat("x", room+1) + `"`)
			if err := outbox.Emit(ctx, over); !errors.Is(err, outbox.ErrRecordTooLarge) {
				return fmt.Errorf("one byte over the limit: %v", err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		recs, err := kb.cons.WaitForCount(ctx, len(events))
		if err != nil {
			t.Fatal(err)
		}
		byID := map[string]kafkatest.Record{}
		for _, r := range recs {
			byID[r.Headers[emit.HeaderMessageID]] = r
		}
		for _, ev := range events {
			r, ok := byID[ev.ID]
			if !ok {
				t.Fatalf("%s not consumed", ev.ID)
			}
			if !bytes.Equal(r.Value, ev.Payload) {
				t.Errorf("%s: payload changed (%d bytes in, %d out)", ev.ID, len(ev.Payload), len(r.Value))
			}
			if string(r.Key) != ev.AggregateID {
				t.Errorf("%s: key %q, want %q", ev.ID, r.Key, ev.AggregateID)
			}
			wantTopic := ev.Topic
			if wantTopic == "" {
				wantTopic = orderTopic
			}
			if r.Topic != wantTopic {
				t.Errorf("%s: topic %s, want %s", ev.ID, r.Topic, wantTopic)
			}
			if want := partition.KafkaPartition([]byte(ev.AggregateID), 4); r.Partition != want {
				t.Errorf("%s: partition %d, want %d (Java murmur2)", ev.ID, r.Partition, want)
			}
			ct := ev.ContentType
			if ct == "" {
				ct = emit.DefaultContentType
			}
			want := map[string]string{emit.HeaderMessageID: ev.ID, emit.HeaderEventType: ev.Type,
				emit.HeaderAggregateType: ev.AggregateType, emit.HeaderAggregateID: ev.AggregateID, emit.HeaderContentType: ct}
			for k, v := range ev.Headers {
				want[k] = v
			}
			// The relay's own: partition as stored, epoch of its lease.
			if r.Headers[emit.HeaderPartition] != fmt.Sprint(partition.Of(ev.AggregateType, ev.AggregateID, partition.DefaultCount)) || r.Headers[emit.HeaderEpoch] == "" {
				t.Errorf("%s: partition/epoch headers %q/%q", ev.ID, r.Headers[emit.HeaderPartition], r.Headers[emit.HeaderEpoch])
			}
			want[emit.HeaderPartition], want[emit.HeaderEpoch] = r.Headers[emit.HeaderPartition], r.Headers[emit.HeaderEpoch]
			if fmt.Sprint(r.Headers) != fmt.Sprint(want) {
				t.Errorf("%s: headers %v, want %v", ev.ID, r.Headers, want)
			}
		}
	})
}

// TestKafkaOrderUnderConcurrency: 10,000 events from 32 goroutines that
// serialize per aggregate with a row lock arrive in commit order per
// aggregate, none lost, none invented.
func TestKafkaOrderUnderConcurrency(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		const total = 10000
		kb := startKafka(t, 8, orderTopic)
		e := testdb.New(t, tg, driver.Config{})
		startRelay(t, e, kb.pub, nil)
		ctx := testCtx(t, 4*time.Minute)
		ledger.WriteSerialized(t, ctx, e, 32, 200, total)
		rows := ledger.Read(t, e)
		if len(rows) != total {
			t.Fatalf("%d rows committed, want %d", len(rows), total)
		}
		ledger.Wait(t, ctx, e, kb.cons)
		rep := ledger.Check(rows, kb.cons.Records())
		// No fault is injected, so duplicates come only from a batch whose
		// publish timed out on an overloaded machine and was re-sent: at
		// most a batch or two, always with the same message ID.
		if rep.Ghosts != 0 || rep.OrderViolations != 0 || rep.Duplicates > 2*relay.DefaultMaxBatchFactor*relay.DefaultBatchSize {
			t.Fatalf("ledger: %+v", rep)
		}
		if rep.Duplicates > 0 {
			t.Logf("ledger: %+v (duplicates from a re-sent batch)", rep)
		}
	})
}

// TestRelayStopAndRestartLosesNothing stops the relay in the middle of a
// stream of commits, gracefully or with in-flight work cancelled, starts a
// new one, and checks the ledger: nothing lost, order kept, duplicates
// only from interrupted work (at most two batches).
func TestRelayStopAndRestartLosesNothing(t *testing.T) {
	t.Parallel()
	for _, hard := range []bool{false, true} {
		name := map[bool]string{false: "Graceful", true: "CancelInFlight"}[hard]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			forEachTarget(t, func(t *testing.T, tg testdb.Target) {
				const total, batch = 3000, 100
				kb := startKafka(t, 8, orderTopic)
				e := testdb.New(t, tg, driver.Config{})
				ctx := testCtx(t, 3*time.Minute)
				// What each relay published, in which batches, for a failing
				// ledger to explain (an order violation: which batch carried
				// the later row without the earlier one).
				pl := &publishLog{}
				first := startRelay(t, e, kb.pub, func(c *relay.Config) {
					c.BatchSize = batch
					c.Logger = pl.logger("first")
					c.Observer = pl.observer("first")
				})
				writerDone := make(chan struct{})
				go func() {
					defer close(writerDone)
					ledger.WriteSerialized(t, ctx, e, 8, 50, total)
				}()
				if _, err := kb.cons.WaitForCount(ctx, total/4); err != nil {
					t.Fatal(err)
				}
				sctx, cancel := context.WithCancel(ctx)
				if hard {
					cancel() // Stop's deadline is already over: cancel in-flight work
				}
				err := first.Stop(sctx)
				cancel()
				if hard != (err != nil) {
					t.Fatalf("Stop = %v (hard %v)", err, hard)
				}
				stoppedAt := len(kb.cons.Records())
				pl.note("first relay stopped after %d records", stoppedAt)
				startRelay(t, e, kb.pub, func(c *relay.Config) {
					c.BatchSize = batch
					c.Logger = pl.logger("second")
					c.Observer = pl.observer("second")
				})
				<-writerDone
				if t.Failed() {
					return
				}
				rows := ledger.Wait(t, ctx, e, kb.cons)
				rep := ledger.Check(rows, kb.cons.Records())
				if rep.Ghosts != 0 || rep.OrderViolations != 0 || rep.Duplicates > 2*relay.DefaultMaxBatchFactor*batch {
					ledger.Explain(t, e, rep, kb.cons.Records())
					t.Logf("publish calls and relay logs:\n%s", pl.String())
					t.Fatalf("ledger %+v (duplicates may be at most two batches of up to MaxBatchSize: the one being marked sent and the one in flight, %d)", rep, 2*relay.DefaultMaxBatchFactor*batch)
				}
				t.Logf("stopped after %d records; ledger %+v", stoppedAt, rep)
			})
		})
	}
}
