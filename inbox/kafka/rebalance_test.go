package inboxkafka_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	inboxkafka "github.com/sqloutbox/outbox/inbox/kafka"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// TestRunnerKilledAfterStoreRedeliversAsDuplicate: a consumer process is
// SIGKILLed right after a record's transaction committed, before its
// offset was committed; the runner that takes over gets the record again
// and the inbox reports it as a Duplicate, so the ledger has each record
// once.
func TestRunnerKilledAfterStoreRedeliversAsDuplicate(t *testing.T) {
	t.Parallel()
	b, topic := startBroker(t, 1)
	c := ledgertest.NewDB(t, pgx)
	want := produce(t, b.Addrs(), topic, 3, 10)
	group := randomName("g-")
	ctx := testCtx(t, 60*time.Second)
	events := filepath.Join(t.TempDir(), "events")
	k := ledgertest.StartChild(t, "consumer", "consumer", append(c.ChildEnv(events, 0, "inboxkafka/after-store=kill@12"),
		kafkaEnv(b.Addrs(), group, topic)...)...)
	k.WaitKilled(t, ctx)
	if n := ledgertest.Count(t, c.DB, c.Ledger); n != 12 {
		t.Fatalf("%d rows applied before the kill at the 12th stored outcome, want 12", n)
	}
	if off := committed(t, ctx, b.Addrs(), group, topic); off > 11 {
		t.Fatalf("committed offset %d after a kill before the 12th record's offset commit", off)
	}
	r := newRunner(t, b.Addrs(), group, topic, c, nil)
	runRunner(t, r)
	testdb.Eventually(t, ctx, "offsets committed to the end", func() bool { return committed(t, ctx, b.Addrs(), group, topic) == 30 })
	if probs := ledgertest.Check(ledgertest.Read(t, c.DB, c.Ledger), want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
	if st := r.Stats(); st.Duplicates < 1 || st.Applied != 18 {
		t.Fatalf("after the restart: %+v, want at least the killed record as a duplicate and 18 applied", st)
	}
}

// TestRebalanceNeverRunsAPartitionTwiceAtOnce: runners of one group start
// and stop while records flow; a per-partition in-flight counter shows a
// partition's handler never runs in two runners at once, and every record
// is applied once, in order.
func TestRebalanceNeverRunsAPartitionTwiceAtOnce(t *testing.T) {
	t.Parallel()
	const parts, aggs, per = 6, 24, 20
	b, topic := startBroker(t, parts)
	c := ledgertest.NewDB(t, pgx)
	group := randomName("g-")
	ctx := testCtx(t, 90*time.Second)
	var inFlight [parts]atomic.Int32
	var overlaps, handled atomic.Int64
	inner := ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger)
	var ownersMu sync.Mutex
	owners := map[int32]map[int]bool{} // partition -> runners that handled it
	var handle inboxkafka.Handler
	handler := func(id int) inboxkafka.Handler {
		return func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
			ownersMu.Lock()
			if owners[m.Partition] == nil {
				owners[m.Partition] = map[int]bool{}
			}
			owners[m.Partition][id] = true
			ownersMu.Unlock()
			return handle(ctx, tx, m)
		}
	}
	handle = func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
		if inFlight[m.Partition].Add(1) != 1 {
			overlaps.Add(1)
		}
		defer inFlight[m.Partition].Add(-1)
		handled.Add(1)
		time.Sleep(time.Millisecond) // widen the window a second runner would hit
		return inner(ctx, tx, m)
	}
	ids := 0
	mk := func() (*inboxkafka.Runner, func()) {
		ids++
		h := handler(ids)
		r := newRunner(t, b.Addrs(), group, topic, c, func(cfg *inboxkafka.Config) { cfg.Handler = h })
		return r, runRunner(t, r)
	}
	var want map[string]int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		want = produce(t, b.Addrs(), topic, aggs, per)
	}()
	_, stop1 := mk()
	testdb.Eventually(t, ctx, "first runner working", func() bool { return handled.Load() > 20 })
	_, stop2 := mk()
	testdb.Eventually(t, ctx, "two runners working", func() bool { return handled.Load() > 120 })
	stop1() // revokes its partitions while handlers run
	_, stop3 := mk()
	testdb.Eventually(t, ctx, "after the third joined", func() bool { return handled.Load() > 250 })
	stop2()
	wg.Wait()
	testdb.Eventually(t, ctx, "every record applied", func() bool { return ledgertest.Count(t, c.DB, c.Ledger) >= aggs*per })
	testdb.Eventually(t, ctx, "offsets committed to the end", func() bool { return committed(t, ctx, b.Addrs(), group, topic) == aggs*per })
	stop3()
	if n := overlaps.Load(); n != 0 {
		t.Fatalf("a partition's handler ran in two places at once %d times", n)
	}
	if probs := ledgertest.Check(ledgertest.Read(t, c.DB, c.Ledger), want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
	moved := 0
	for _, rs := range owners {
		if len(rs) > 1 {
			moved++
		}
	}
	if moved == 0 {
		t.Fatalf("no partition moved between runners: %v", owners)
	}
	t.Logf("%d of %d partitions moved between runners", moved, parts)
}

// TestContextForGetsTheRecord: Config.ContextFor receives each record
// (its trace headers included) and the handler runs with its context.
func TestContextForGetsTheRecord(t *testing.T) {
	t.Parallel()
	forBatchSizes(t, testContextForGetsTheRecord)
}

// testContextForGetsTheRecord: three records, each with its own
// traceparent; each handler's context carries its own record's (with
// batches too, where one transaction runs several handlers).
func testContextForGetsTheRecord(t *testing.T, batch int) {
	b, topic := startBroker(t, 1)
	c := ledgertest.NewDB(t, pgx)
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 60*time.Second)
	const records = 3
	for i := 1; i <= records; i++ {
		rec := record(fmt.Sprintf("agg-%d", i), 1)
		tp := fmt.Sprintf("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b%d-01", i)
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: "traceparent", Value: []byte(tp)})
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	cl.Close()
	type key struct{}
	got := make(chan [2]string, records)
	inner := ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger)
	r := newRunner(t, b.Addrs(), randomName("g-"), topic, c, func(cfg *inboxkafka.Config) {
		cfg.BatchSize = batch
		cfg.ContextFor = func(ctx context.Context, rec *kgo.Record) context.Context {
			for _, h := range rec.Headers {
				if h.Key == "traceparent" {
					return context.WithValue(ctx, key{}, string(h.Value))
				}
			}
			return ctx
		}
		cfg.Handler = func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
			v, _ := ctx.Value(key{}).(string)
			got <- [2]string{v, m.Headers["traceparent"]}
			return inner(ctx, tx, m)
		}
	})
	runRunner(t, r)
	for range records {
		select {
		case v := <-got:
			if v[0] == "" || v[0] != v[1] {
				t.Fatalf("handler context carries %q, want its record's traceparent %q", v[0], v[1])
			}
		case <-ctx.Done():
			t.Fatal("handlers never ran")
		}
	}
}

// TestMessageFromRecord: the relay's headers fill the message; a record
// without them gets a coordinate ID and its key as aggregate.
func TestMessageFromRecord(t *testing.T) {
	t.Parallel()
	rec := record("agg-7", 3)
	rec.Topic, rec.Partition, rec.Offset = "orders", 2, 41
	m := inboxkafka.Message(rec)
	if !strings.HasPrefix(m.ID, "m-") || m.AggregateType != "order" || m.AggregateID != "agg-7" ||
		m.Topic != "orders" || m.Partition != 2 || m.Offset != 41 || string(m.Payload) != `{"seq":3}` || m.Headers["outbox-event-type"] != "order.step" {
		t.Fatalf("message %+v", m)
	}
	plain := inboxkafka.Message(&kgo.Record{Topic: "raw", Partition: 1, Offset: 9, Key: []byte("k")})
	if plain.ID != "raw/1/9" || plain.AggregateType != "raw" || plain.AggregateID != "k" {
		t.Fatalf("plain record's message %+v", plain)
	}
}
