package tests

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/internal/testdb"
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

// ledgerRow is one committed outbox row, read back from the database.
type ledgerRow struct {
	id          int64
	messageID   string
	aggregateID string
	seq         int
}

func readLedger(t *testing.T, e *testdb.Env) []ledgerRow {
	t.Helper()
	rows, err := e.RelayDB.Query("SELECT id, message_id, aggregate_id, payload FROM " + e.Table + " ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []ledgerRow
	for rows.Next() {
		var r ledgerRow
		var p []byte
		if err := rows.Scan(&r.id, &r.messageID, &r.aggregateID, &p); err != nil {
			t.Fatal(err)
		}
		var body struct{ Seq int }
		if err := json.Unmarshal(p, &body); err != nil {
			t.Fatal(err)
		}
		r.seq = body.Seq
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// ledgerReport is what checkLedger found.
type ledgerReport struct {
	delivered, duplicates, lost, ghosts, orderViolations int
	// violations describes each order violation: the aggregate, the two
	// rows (outbox id, seq) and where each was first delivered
	// (partition/offset), so a failure says what happened.
	violations []string
	// violated lists the aggregates of the violations, for explainLedger.
	violated []string
}

// checkLedger joins consumed records with committed rows by message ID:
// every row delivered, nothing else delivered, and per aggregate the first
// deliveries in outbox id order (which, for writers serialized by a row
// lock, is the seq order they committed in).
func checkLedger(rows []ledgerRow, recs []kafkatest.Record) ledgerReport {
	var rep ledgerReport
	byID := make(map[string]ledgerRow, len(rows))
	for _, r := range rows {
		byID[r.messageID] = r
	}
	seen := map[string]bool{}
	last := map[string]ledgerRow{}
	lastRec := map[string]kafkatest.Record{}
	for _, rec := range recs {
		id := rec.Headers[emit.HeaderMessageID]
		row, ok := byID[id]
		switch {
		case !ok:
			rep.ghosts++
			continue
		case seen[id]:
			rep.duplicates++
			continue
		}
		seen[id] = true
		rep.delivered++
		if prev, ok := last[row.aggregateID]; ok && (row.id < prev.id || row.seq < prev.seq) {
			rep.orderViolations++
			rep.violated = append(rep.violated, row.aggregateID)
			pr := lastRec[row.aggregateID]
			rep.violations = append(rep.violations, fmt.Sprintf("%s: id %d (seq %d, partition %d offset %d, producer %d) first delivered after id %d (seq %d, partition %d offset %d, producer %d)",
				row.aggregateID, row.id, row.seq, rec.Partition, rec.Offset, rec.ProducerID, prev.id, prev.seq, pr.Partition, pr.Offset, pr.ProducerID))
		}
		last[row.aggregateID] = row
		lastRec[row.aggregateID] = rec
	}
	rep.lost = len(rows) - rep.delivered
	return rep
}

// explainLedger logs, for each aggregate of rep's order violations, its
// rows as the table holds them now (id, partition, status, attempts,
// created, sent, updated) and its records in the order the consumer
// received them (partition, offset, producer ID, message ID): what a
// report's counts cannot say about how the order broke.
func explainLedger(t *testing.T, e *testdb.Env, rep ledgerReport, recs []kafkatest.Record) {
	t.Helper()
	for i, agg := range rep.violated {
		if i == 3 {
			break
		}
		var b strings.Builder
		fmt.Fprintf(&b, "aggregate %s, rows (id partition status attempts created sent updated message_id):\n", agg)
		rows, err := e.RelayDB.Query("SELECT id, partition_key, status, attempts, created_at, sent_at, updated_at, message_id FROM "+e.Table+
			" WHERE aggregate_id = "+e.Placeholder(1)+" ORDER BY id", agg)
		if err != nil {
			t.Logf("reading the rows of %s: %v", agg, err)
			continue
		}
		ids := map[string]int64{}
		for rows.Next() {
			var id, part, status, attempts int64
			var created, sent, updated sql.NullString
			var mid string
			if err := rows.Scan(&id, &part, &status, &attempts, &created, &sent, &updated, &mid); err != nil {
				t.Logf("scanning a row of %s: %v", agg, err)
				break
			}
			ids[mid] = id
			fmt.Fprintf(&b, "  %d %d %d %d %s %s %s %s\n", id, part, status, attempts, created.String, sent.String, updated.String, mid)
		}
		rows.Close()
		b.WriteString("records (partition offset producer id message_id received):\n")
		for _, r := range recs {
			mid := r.Headers[emit.HeaderMessageID]
			if id, ok := ids[mid]; ok {
				fmt.Fprintf(&b, "  %d %d %d %d %s %s\n", r.Partition, r.Offset, r.ProducerID, id, mid, r.Received.Format("15:04:05.000000"))
			}
		}
		t.Log(b.String())
	}
}

// waitLedger reads the committed rows of e and waits until cons has
// delivered every one of them (or fails t); it returns the rows.
func waitLedger(t *testing.T, ctx context.Context, e *testdb.Env, cons *kafkatest.Consumer) []ledgerRow {
	t.Helper()
	rows := readLedger(t, e)
	recs, err := cons.Wait(ctx, func(r []kafkatest.Record) bool { return checkLedger(rows, r).lost == 0 })
	if err != nil {
		t.Fatalf("%v; ledger %+v", err, checkLedger(rows, recs))
	}
	return rows
}

// writeSerialized runs writers goroutines that together commit total
// events, one per transaction, over aggregates aggregates. Each
// transaction locks its aggregate's row (SELECT ... FOR UPDATE; on SQLite
// BEGIN IMMEDIATE serializes all writers), increments seq and emits it, so
// per aggregate the seq order is the commit order. stop, if non-nil, is
// polled between transactions.
func writeSerialized(t *testing.T, ctx context.Context, e *testdb.Env, writers, aggregates, total int) {
	t.Helper()
	aggTable := e.Q("aggregate_seq")
	if _, err := e.RelayDB.Exec("CREATE TABLE " + aggTable + " (id VARCHAR(64) PRIMARY KEY, seq INTEGER NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	for a := 0; a < aggregates; a++ {
		if _, err := e.RelayDB.Exec("INSERT INTO "+aggTable+" (id, seq) VALUES ("+e.Placeholder(1)+", 0)", fmt.Sprintf("agg-%03d", a)); err != nil {
			t.Fatal(err)
		}
	}
	sel := "SELECT seq FROM " + aggTable + " WHERE id = " + e.Placeholder(1) + e.ForUpdate()
	upd := "UPDATE " + aggTable + " SET seq = " + e.Placeholder(1) + " WHERE id = " + e.Placeholder(2)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for next.Add(1) <= int64(total) {
				agg := fmt.Sprintf("agg-%03d", rng.IntN(aggregates))
				var err error
				for try := 0; try < 20; try++ {
					err = inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error {
						var seq int
						if err := tx.QueryRowContext(ctx, sel, agg).Scan(&seq); err != nil {
							return err
						}
						seq++
						if _, err := tx.ExecContext(ctx, upd, seq, agg); err != nil {
							return err
						}
						return outbox.Emit(ctx, outbox.Event{AggregateType: "order", AggregateID: agg, Type: "order.step",
							Payload: []byte(fmt.Sprintf(`{"seq":%d}`, seq))})
					})
					if err == nil || !retryable(err) {
						break
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// retryable reports deadlocks and lock timeouts, which a writer retries.
func retryable(err error) bool {
	s := err.Error()
	return strings.Contains(s, "Deadlock") || strings.Contains(s, "deadlock") || strings.Contains(s, "SQLITE_BUSY") ||
		strings.Contains(s, "database is locked") || strings.Contains(s, "Lock wait timeout")
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
		writeSerialized(t, ctx, e, 32, 200, total)
		rows := readLedger(t, e)
		if len(rows) != total {
			t.Fatalf("%d rows committed, want %d", len(rows), total)
		}
		waitLedger(t, ctx, e, kb.cons)
		rep := checkLedger(rows, kb.cons.Records())
		// No fault is injected, so duplicates come only from a batch whose
		// publish timed out on an overloaded machine and was re-sent: at
		// most a batch or two, always with the same message ID.
		if rep.ghosts != 0 || rep.orderViolations != 0 || rep.duplicates > 2*relay.DefaultMaxBatchFactor*relay.DefaultBatchSize {
			t.Fatalf("ledger: %+v", rep)
		}
		if rep.duplicates > 0 {
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
				first := startRelay(t, e, kb.pub, func(c *relay.Config) { c.BatchSize = batch })
				writerDone := make(chan struct{})
				go func() {
					defer close(writerDone)
					writeSerialized(t, ctx, e, 8, 50, total)
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
				startRelay(t, e, kb.pub, func(c *relay.Config) { c.BatchSize = batch })
				<-writerDone
				if t.Failed() {
					return
				}
				rows := waitLedger(t, ctx, e, kb.cons)
				rep := checkLedger(rows, kb.cons.Records())
				if rep.ghosts != 0 || rep.orderViolations != 0 || rep.duplicates > 2*relay.DefaultMaxBatchFactor*batch {
					t.Fatalf("ledger %+v (duplicates may be at most two batches of up to MaxBatchSize: the one being marked sent and the one in flight, %d)", rep, 2*relay.DefaultMaxBatchFactor*batch)
				}
				t.Logf("stopped after %d records; ledger %+v", stoppedAt, rep)
			})
		})
	}
}
