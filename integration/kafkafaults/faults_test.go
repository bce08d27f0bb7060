// Package kafkafaults is the Kafka broker-fault matrix: the relay with
// the default Kafka publisher (relay/kafka) against a private in-process
// broker (kfake) that fails produce requests, moves a partition's
// leadership away for longer than the publish deadline, revokes
// authorization mid-batch, resets connections mid-request or goes away,
// while serialized writers commit. Every case runs on every database
// target, in the exactly-once mode on pgx, and on pgx with the relay
// reading PostgreSQL's log (table mode, log-only writers, log-only
// writers exactly once), and is judged on the ledger of first deliveries: nothing lost,
// no ghost, per aggregate in commit order, duplicates bounded, and no
// order violation reported by the relay (relay.OrderObserver).
//
// It is its own package so that it runs beside the other slow packages.
package kafkafaults

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/integration/internal/ledger"
	"github.com/sqloutbox/outbox/internal/testkit/e2e"
	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

const (
	// topic is where the relay's default route sends aggregate type
	// "order", the writers' (kafka.DefaultTopic).
	topic = kafka.DefaultTopicPrefix + "order"
	// partitions of topic: an aggregate's records share one, and a fault
	// on one partition leaves the others flowing in the same batch.
	partitions = 6
	// aggregates and writers: 24 aggregates over 6 partitions put several
	// aggregates, and several events of one aggregate, in most batches.
	aggregates = 24
	writers    = 8
	// batchSize and maxBatchSize: a backlog grows the batch from 25 to
	// 50 messages. maxBatchSize bounds what one fault can leave
	// unresolved, and so the duplicates.
	batchSize    = 25
	maxBatchSize = 50
	// defaultInjections: a mechanism that breaks order in 2 of 3
	// injections goes unnoticed by 5 injections with probability
	// (1/3)^5 < 0.5 %.
	defaultInjections = 5
	defaultTotal      = 600
	// extraTotal bounds the events a run may commit, as a multiple of its
	// total: a relay that keeps up with the writers claims small batches,
	// in which two events of one aggregate are rarer, and strike lets
	// more bursts through until one comes.
	extraTotal = 4
)

// wiring is how the publisher reaches the broker.
type wiring int

const (
	direct        wiring = iota // the broker's own port; faults are kfake's
	viaKafkaProxy               // faultproxy.Kafka: resets by request type
	viaTCPProxy                 // faultproxy.Proxy: refuses and cuts everything
)

// faultCase is one row of the matrix.
type faultCase struct {
	name   string
	wiring wiring
	// injections of the fault in one run, each while writers commit; 0:
	// defaultInjections.
	injections int
	// total events committed at least; 0: defaultTotal. A run commits
	// more (up to extraTotal times as many) only when its injections
	// needed more bursts to find their batches (see harness.strike).
	total int
	// publishTimeout is the relay's PublishTimeout; 0: its default
	// (relay.DefaultPublishTimeout).
	publishTimeout time.Duration
	// inject injects the fault for the i-th time and returns once it took
	// effect and was lifted.
	inject func(t *testing.T, ctx context.Context, h *harness, i int)
	// resends is how many batches a correct publisher may re-send per
	// injection: those in flight or unresolved when the fault hit. The
	// duplicates bound is injections x resends x maxBatchSize, and 0 in
	// the exactly-once mode.
	resends int
	// eos runs the publisher in its exactly-once mode, judged by a
	// read_committed consumer.
	eos bool
	// source is how the relay learns of committed events (see source).
	source source
}

// source is how a run's relay learns of committed events.
type source int

const (
	claim   source = iota // the table claim (the default relay)
	walRows               // the WAL source, writers writing rows (table mode)
	walLog                // the WAL source, log-only writers (driver.Config.LogOnly)
)

func (s source) String() string { return [...]string{"claim", "wal", "wal-log-only"}[s] }

// produceErrors fails count produce requests in a row that carry records
// of one partition with err, the first of them in the middle of a batch
// (see harness.strike); it returns once all count were answered with it.
// Count 1 is a single failed request of a batch; more is the same fault
// repeated while the publisher retries.
func produceErrors(err *kerr.Error, count int) func(*testing.T, context.Context, *harness, int) {
	return func(t *testing.T, ctx context.Context, h *harness, i int) {
		t.Helper()
		var fh *kfake.FaultHandle
		p := h.strike(t, ctx, i, func(p int32) {
			fh = h.broker.Cluster().Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Partitions: []int32{p}, Err: err, Count: count})
		})
		defer fh.Remove()
		if werr := fh.Wait(ctx, count); werr != nil {
			t.Fatalf("injection %d: %d of %d produce requests of partition %d failed with %s: %v", i, fh.Hits(), count, p, err.Message, werr)
		}
		h.note("injection %d: %d produce requests of partition %d answered %s", i, count, p, err.Message)
	}
}

// produceWindow fails every produce request for one partition, or for the
// whole topic, with err for window, counted from the first request it
// failed (in the middle of a batch: see harness.strike); then lifts the
// fault.
func produceWindow(err *kerr.Error, window time.Duration, wholeTopic bool) func(*testing.T, context.Context, *harness, int) {
	return func(t *testing.T, ctx context.Context, h *harness, i int) {
		t.Helper()
		var fh *kfake.FaultHandle
		p := h.strike(t, ctx, i, func(p int32) {
			f := kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: err, Count: -1}
			if !wholeTopic {
				f.Partitions = []int32{p}
			}
			fh = h.broker.Cluster().Fault(f)
		})
		defer fh.Remove()
		where := fmt.Sprintf("partition %d", p)
		if wholeTopic {
			where = "topic " + topic
		}
		if werr := fh.Wait(ctx, 1); werr != nil {
			t.Fatalf("injection %d: no produce request of %s reached the broker: %v", i, where, werr)
		}
		hold(ctx, window)
		fh.Remove()
		h.note("injection %d: %s answered %s for %v (%d requests)", i, where, err.Message, window, fh.Hits())
	}
}

// resetProduce resets the connection of the next produce request, in the
// middle of a batch (see harness.strike): before the broker saw it, or
// after it appended the records (the response lost).
func resetProduce(action faultproxy.Action) func(*testing.T, context.Context, *harness, int) {
	return func(t *testing.T, ctx context.Context, h *harness, i int) {
		t.Helper()
		h.strike(t, ctx, i, func(int32) { h.kproxy.ResetOn(int16(kmsg.Produce), 1, action) })
		defer h.kproxy.ResetOn(0, 0, action)
		testdb.Eventually(t, ctx, fmt.Sprintf("injection %d: a produce request reset", i), func() bool { return h.kproxy.Armed() == 0 })
		h.note("injection %d: a produce request's connection reset (%d so far)", i, h.kproxy.Tripped.Load())
	}
}

// unreachable cuts every connection to the broker as a batch is handed
// to the publisher (see harness.strike), refuses new ones for window,
// then lets them through again.
func unreachable(window time.Duration) func(*testing.T, context.Context, *harness, int) {
	return func(t *testing.T, ctx context.Context, h *harness, i int) {
		t.Helper()
		h.strike(t, ctx, i, func(int32) { h.tproxy.Refuse(true) })
		defer h.tproxy.Refuse(false)
		hold(ctx, window)
		h.tproxy.Refuse(false)
		h.note("injection %d: broker unreachable for %v (%d connections refused so far)", i, window, h.tproxy.Refused.Load())
	}
}

// hold waits for d, or less if ctx ends: the length of a fault window is
// the scenario, not synchronisation.
func hold(ctx context.Context, d time.Duration) {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
	case <-ctx.Done():
	}
}

// windowResends is what a correct publisher may re-send per window of a
// fault that holds records inside the producer: a batch for each
// PublishTimeout that runs out during the window (its records' outcome is
// then unknown), and the one in flight when the window ends.
func windowResends(window, publishTimeout time.Duration) int {
	return int(window/publishTimeout) + 1
}

// The matrix. Relay settings common to all cases are in newHarness.
func matrix() []faultCase {
	var cases []faultCase
	// Non-retriable produce errors on one partition, mid-stream: the
	// broker refuses the request's records (it appends none of them). A
	// correct publisher acknowledges nothing of a failed message's
	// aggregate behind it and reports the failures per message; the relay
	// retries them in order. Duplicates: only what the publisher could not
	// resolve when a fault hit, a batch per injection.
	for _, err := range []*kerr.Error{kerr.UnknownServerError, kerr.OutOfOrderSequenceNumber, kerr.UnknownProducerID, kerr.InvalidProducerEpoch} {
		name := camel(err.Message)
		cases = append(cases,
			faultCase{name: name + "/Once", inject: produceErrors(err, 1), resends: 1},
			faultCase{name: name + "/Repeated", inject: produceErrors(err, 5), resends: 1},
		)
	}
	// A retriable error (leadership moved away) on one partition, shorter
	// and longer than the relay's publish deadline of 1 s, and 10 s with
	// the default deadline (10 s), once.
	// The 1.5 s window broke order in about half of its injections on the
	// AsyncProducer publisher, fewer than the errors above: six
	// injections, over 800 events.
	for _, w := range []struct {
		window, timeout   time.Duration
		injections, total int
	}{
		{400 * time.Millisecond, time.Second, 5, 0},
		{1500 * time.Millisecond, time.Second, 6, 800},
		{10 * time.Second, 0, 1, 0},
	} {
		timeout := w.timeout
		if timeout == 0 {
			timeout = relay.DefaultPublishTimeout
		}
		cases = append(cases, faultCase{
			name:       fmt.Sprintf("NotLeaderForPartition/%v-deadline-%v", w.window, timeout),
			injections: w.injections, total: w.total, publishTimeout: w.timeout,
			inject:  produceWindow(kerr.NotLeaderForPartition, w.window, false),
			resends: windowResends(w.window, timeout),
		})
	}
	// Authorization revoked mid-batch and restored: for one produce
	// request of one partition, then for 500 ms on one partition and on
	// the whole topic. The publisher reports it as unavailable
	// (relay.ErrUnavailable): no attempt counted, the relay backs off as a
	// whole.
	cases = append(cases,
		faultCase{name: "TopicAuthorizationFailed/PartitionOnce", inject: produceErrors(kerr.TopicAuthorizationFailed, 1), resends: 1},
		faultCase{name: "TopicAuthorizationFailed/Partition500ms", inject: produceWindow(kerr.TopicAuthorizationFailed, 500*time.Millisecond, false), resends: 1},
		faultCase{name: "TopicAuthorizationFailed/Topic500ms", inject: produceWindow(kerr.TopicAuthorizationFailed, 500*time.Millisecond, true), resends: 1},
	)
	// A connection reset mid-request: before the broker saw the produce
	// request, or after it appended the records (the response lost).
	cases = append(cases,
		faultCase{name: "ConnectionReset/BeforeProduce", wiring: viaKafkaProxy, injections: 6,
			inject: resetProduce(faultproxy.CutBefore), resends: 1},
		faultCase{name: "ConnectionReset/AfterProduce", wiring: viaKafkaProxy, injections: 6,
			inject: resetProduce(faultproxy.CutAfter), resends: 1},
	)
	// The broker unreachable for 2 s, twice the publish deadline: every
	// connection cut and refused, then back.
	cases = append(cases, faultCase{name: "Unreachable/2s-deadline-1s", wiring: viaTCPProxy, injections: 3,
		publishTimeout: time.Second,
		inject:         unreachable(2 * time.Second), resends: windowResends(2*time.Second, time.Second)})
	return cases
}

// TestBrokerFaultsExactlyOnce runs the matrix with the publisher in its
// exactly-once mode, on PostgreSQL (pgx) only: the broker faults do not
// depend on the database, and the relay's reconciling writes are tested
// on every dialect in the relay package and under process kills on
// PostgreSQL and MariaDB (integration/tests); one target keeps CI's time.
// Judged by a read_committed consumer with no duplicate allowed.
func TestBrokerFaultsExactlyOnce(t *testing.T) {
	t.Parallel()
	for _, fc := range matrix() {
		fc.eos = true
		t.Run(fc.name, func(t *testing.T) {
			t.Parallel()
			for _, tg := range testdb.All {
				if tg.Name != "pgx" {
					continue
				}
				t.Run(tg.Name, func(t *testing.T) {
					t.Parallel()
					run(t, tg, fc)
				})
			}
		})
	}
}

// TestBrokerFaultsWALSource runs the matrix with the relay reading
// PostgreSQL's log (relay.SourceWAL, docs/wal.md), on pgx (the WAL source
// is PostgreSQL's): in table mode at least once, and with log-only writers
// at least once and in the exactly-once mode (where the relay writes each
// event it takes from the stream to the table and publishes the row).
// Each run has a slot of its own, dropped when it ends.
func TestBrokerFaultsWALSource(t *testing.T) {
	t.Parallel()
	for _, v := range []struct {
		source source
		eos    bool
	}{{walRows, false}, {walLog, false}, {walLog, true}} {
		name := v.source.String()
		if v.eos {
			name += "/exactly-once"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			for _, fc := range matrix() {
				fc.source, fc.eos = v.source, v.eos
				t.Run(fc.name, func(t *testing.T) {
					t.Parallel()
					run(t, testdb.Target{Name: "pgx", Dialect: driver.Postgres}, fc)
				})
			}
		})
	}
}

// TestBrokerFaults runs the matrix on every database target.
func TestBrokerFaults(t *testing.T) {
	t.Parallel()
	for _, fc := range matrix() {
		t.Run(fc.name, func(t *testing.T) {
			t.Parallel()
			for _, tg := range testdb.All {
				t.Run(tg.Name, func(t *testing.T) {
					t.Parallel()
					run(t, tg, fc)
				})
			}
		})
	}
}

// harness is one run's broker, proxy, consumer, table and relay.
type harness struct {
	e       *testdb.Env
	broker  *kafkatest.Broker
	kproxy  *faultproxy.Kafka
	tproxy  *faultproxy.Proxy
	cons    *kafkatest.Consumer
	watch   *outboxtest.OrderWatch
	striker *striker
	// gate lets the writers' events through in bursts; committed counts
	// their commits; the writers stop at most at ceiling, or where run
	// closes the gate; step is the size of a burst.
	gate          *ledger.Gate
	committed     atomic.Int64
	ceiling, step int64
	// struck is the partition the last injection struck (-1: none), and
	// struckID the highest outbox id of its batch, so that the next one
	// strikes another partition in a batch of later rows, not the same
	// rows re-sent; only the relay's loop uses them.
	struck     int32
	struckID   int64
	struckMsgs map[string]bool // the message IDs of every struck batch
	cfg        relay.Config
	logs       testdb.SyncBuffer
	start      time.Time

	mu    sync.Mutex
	notes []string
}

// note records what a run did, with the time since it started, for the
// report of a failure.
func (h *harness) note(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.notes = append(h.notes, fmt.Sprintf("%8.3fs ", time.Since(h.start).Seconds())+fmt.Sprintf(format, args...))
}

// dump logs what a run did so far, the relay's last log lines and the
// rows the relay has not sent, for a failure that ends the run early.
func (h *harness) dump(t *testing.T) {
	t.Helper()
	h.mu.Lock()
	t.Logf("what was injected:\n%s", strings.Join(h.notes, "\n"))
	h.mu.Unlock()
	t.Logf("%d events committed, %d records consumed", h.committed.Load(), len(h.cons.Records()))
	t.Logf("relay log (last lines):\n%s", lastLines(h.logs.String(), 40))
	rows, err := h.e.RelayDB.Query("SELECT id, aggregate_id, status, attempts, last_error FROM " + h.e.Table + " WHERE status = 0 ORDER BY id") // 0: pending
	if err != nil {
		t.Logf("reading the pending rows: %v", err)
		return
	}
	defer rows.Close()
	var b strings.Builder
	n := 0
	for rows.Next() {
		var id, status, attempts int64
		var agg string
		var lastErr sql.NullString
		if err := rows.Scan(&id, &agg, &status, &attempts, &lastErr); err != nil {
			t.Logf("scanning a pending row: %v", err)
			return
		}
		if n++; n <= 20 {
			fmt.Fprintf(&b, "  %d %s status %d attempts %d %q\n", id, agg, status, attempts, lastErr.String)
		}
	}
	t.Logf("%d rows pending (id aggregate status attempts last_error):\n%s", n, b.String())
}

// striker is the Observer the relay hands each batch to just before
// Publish (relay.PublishObserver): it lets a test fault the broker at
// that moment, when the batch is about to be on the wire.
type striker struct {
	relay.NopObserver
	mu  sync.Mutex
	arm func(msgs []relay.Message) bool // done once it returns true
}

// StartPublish implements relay.PublishObserver: it offers msgs to the
// armed function.
func (s *striker) StartPublish(ctx context.Context, msgs []relay.Message) (context.Context, func(error)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.arm != nil && s.arm(msgs) {
		s.arm = nil
	}
	return ctx, nil
}

func (s *striker) set(arm func(msgs []relay.Message) bool) {
	s.mu.Lock()
	s.arm = arm
	s.mu.Unlock()
}

// strike runs install (which must be quick: it runs in the relay's loop)
// with the Kafka partition p of an aggregate, just before the relay hands
// the publisher the next batch that holds two or more events of that
// aggregate (and only rows later than those of the last struck batch),
// and returns p. So each fault hits a fresh batch mid-flight where order
// is at stake: the aggregate's earlier event goes out in the first
// produce request for p and a later one waits behind it. To make such a
// batch, strike lets the writers' next burst through (the relay falls
// behind them), and more whenever they wait at the gate before the
// strike. It fails t if ctx ends first.
func (h *harness) strike(t *testing.T, ctx context.Context, i int, install func(p int32)) int32 {
	t.Helper()
	h.note("injection %d: armed; %d events committed, %d records consumed", i, h.committed.Load(), len(h.cons.Records()))
	fired := make(chan int32, 1)
	h.striker.set(func(msgs []relay.Message) bool {
		if msgs[0].ID != 0 && msgs[0].ID <= h.struckID || h.struckMsgs[msgs[0].MessageID] {
			// The relay has not moved past the last struck batch yet (by
			// outbox id; by message ID for events of the log-only mode
			// published from the stream, which have none).
			return false
		}
		agg, first, last, ok := pairedAggregate(msgs, h.struck)
		if !ok {
			return false
		}
		p := partition.KafkaPartition([]byte(agg), partitions)
		h.struck, h.struckID = p, msgs[len(msgs)-1].ID
		for _, m := range msgs {
			h.struckMsgs[m.MessageID] = true
		}
		install(p)
		h.note("injection %d: struck a batch of %d on partition %d, aggregate %s at positions %d and %d (outbox ids %d and %d)",
			i, len(msgs), p, agg, first, last, msgs[first].ID, msgs[last].ID)
		fired <- p
		return true
	})
	h.gate.Open(h.gate.Limit() + h.step)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case p := <-fired:
			return p
		case <-ctx.Done():
			h.striker.set(nil)
			h.dump(t)
			t.Fatalf("injection %d: no batch held two events of one aggregate, with %d events committed of at most %d: %v", i, h.committed.Load(), h.ceiling, ctx.Err())
			return 0
		case <-tick.C:
			if limit := h.gate.Limit(); h.committed.Load() >= limit && limit < h.ceiling {
				h.gate.Open(limit + h.step/2) // the burst is committed, and none struck yet
			}
		}
	}
}

// pairedAggregate returns, of the aggregates with two or more messages
// in msgs whose Kafka partition is not avoid, the one whose messages are
// spread the furthest apart in the batch (the earliest first on a tie),
// with the positions of its first and last messages: the further apart,
// the likelier the later one goes to the broker in a later request.
func pairedAggregate(msgs []relay.Message, avoid int32) (agg string, first, last int, ok bool) {
	firstAt, lastAt := map[string]int{}, map[string]int{}
	for i, m := range msgs {
		if partition.KafkaPartition([]byte(m.AggregateID), partitions) == avoid {
			continue
		}
		if _, seen := firstAt[m.AggregateID]; !seen {
			firstAt[m.AggregateID] = i
		}
		lastAt[m.AggregateID] = i
	}
	for a, f := range firstAt {
		l := lastAt[a]
		if l == f {
			continue
		}
		if !ok || l-f > last-first || l-f == last-first && f < first {
			agg, first, last, ok = a, f, l, true
		}
	}
	return agg, first, last, ok
}

func newHarness(t *testing.T, tg testdb.Target, fc faultCase) *harness {
	t.Helper()
	h := &harness{start: time.Now(), striker: &striker{}, struck: -1, struckMsgs: map[string]bool{}}
	opts := []kafkatest.Option{kafkatest.Topics(partitions, topic)}
	switch fc.wiring {
	case viaKafkaProxy:
		opts = append(opts, kafkatest.KfakeOptions(kfake.ListenFn(faultproxy.Advertise(faultproxy.StartKafka, func(p *faultproxy.Kafka) { h.kproxy = p }))))
	case viaTCPProxy:
		opts = append(opts, kafkatest.KfakeOptions(kfake.ListenFn(faultproxy.Advertise(faultproxy.Start, func(p *faultproxy.Proxy) { h.tproxy = p }))))
	}
	b, err := kafkatest.Start(opts...)
	if err != nil {
		t.Fatal(err)
	}
	h.broker = b
	t.Cleanup(func() {
		b.Close()
		if h.kproxy != nil {
			h.kproxy.Close()
		}
		if h.tproxy != nil {
			h.tproxy.Close()
		}
	})
	h.e = testdb.New(t, tg, driver.Config{LogOnly: fc.source == walLog})
	var wal relay.WALConfig
	if fc.source != claim {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		wal = e2e.WALSlot(t, ctx, h.e)
		cancel()
	}
	kcfg := kafka.Config{Brokers: b.Addrs()}
	var consOpts []kgo.Opt
	if fc.eos {
		const prefix = "faults."
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		if err := kafkatest.CreateTopic(ctx, b.Addrs(), kafka.StateTopic(prefix, h.e.Table), 1); err != nil {
			t.Fatal(err)
		}
		kcfg.ExactlyOnce = &kafka.ExactlyOnce{TransactionalIDPrefix: prefix, Table: h.e.Table}
		consOpts = append(consOpts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	pub, err := kafka.NewPublisher(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closePublisher(t, pub) })
	h.cons, err = kafkatest.NewConsumer(b.Addrs(), []string{topic}, consOpts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.cons.Close)
	// The watch is checked by run, not at cleanup, so that its count is
	// reported with the ledger.
	h.watch = &outboxtest.OrderWatch{Observer: h.striker}
	h.cfg = relay.Config{
		Publisher: pub, PollInterval: 50 * time.Millisecond,
		BatchSize: batchSize, MaxBatchSize: maxBatchSize,
		// A correct publisher may report a produce error as a per-message
		// failure (the relay counts an attempt and holds the aggregate
		// until the retry is due). 1,000 attempts, retried after 10 ms
		// doubling to at most 100 ms, take more than 90 s: longer than
		// every fault window here together, so a dead letter (a lost
		// event in the ledger) is never the relay settings' doing.
		MaxAttempts: 1000, RetryInitial: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond,
		PublishTimeout: fc.publishTimeout,
		Observer:       h.watch,
		Logger:         slog.New(slog.NewTextHandler(&h.logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	if fc.source != claim {
		// The fallback poll less often: what is published comes from the
		// stream, mostly; retries come due at the polls.
		h.cfg.Source, h.cfg.WAL, h.cfg.PollInterval = relay.SourceWAL, wal, 250*time.Millisecond
	}
	r, err := relay.New(h.e.Outbox, h.e.RelayDB, h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := r.Stop(ctx); err != nil {
			t.Errorf("relay stop: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("relay run: %v", err)
		}
	})
	return h
}

// closePublisher closes pub, failing t if Close does not return within
// 30 s (its goroutine is then left behind; the test fails anyway).
func closePublisher(t *testing.T, pub *kafka.Publisher) {
	done := make(chan error, 1)
	go func() { done <- pub.Close() }()
	tm := time.NewTimer(30 * time.Second)
	defer tm.Stop()
	select {
	case err := <-done:
		if err != nil {
			t.Logf("publisher Close: %v", err)
		}
	case <-tm.C:
		t.Errorf("publisher Close did not return within 30 s")
	}
}

// run is one case on one target: writers commit while the fault is
// injected, then the ledger is judged.
func run(t *testing.T, tg testdb.Target, fc faultCase) {
	injections, total := fc.injections, fc.total
	if injections == 0 {
		injections = defaultInjections
	}
	if total == 0 {
		total = defaultTotal
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	h := newHarness(t, tg, fc)

	// The writers commit in bursts: a first share of the events, then a
	// share with each injection (see strike), then the rest, so that every
	// fault hits while records are flowing and more are still to come.
	h.ceiling, h.step = int64(total*extraTotal), int64(total/(injections+2))
	h.gate = ledger.NewGate(h.step)
	written := make(chan error, 1)
	go func() {
		written <- ledger.Writers{Writers: writers, Aggregates: aggregates, Total: int(h.ceiling), Gate: h.gate, Committed: &h.committed,
			SeqIDs: fc.source == walLog}.Write(ctx, h.e)
	}()
	testdb.Eventually(t, ctx, "the first events committed", func() bool { return h.committed.Load() >= h.step })
	for i := 0; i < injections; i++ {
		fc.inject(t, ctx, h, i)
	}
	// The writers stop at the ceiling whatever the gate let through: an
	// injection opens the gate by a step each time, past the ceiling when
	// the broker's faults struck late (SQLite's runs reported "3200 rows
	// committed, want 3400": the count, not the rows, was wrong).
	total = int(min(h.gate.Close(int64(total)), h.ceiling))
	if err := <-written; err != nil {
		t.Fatalf("writers: %v", err)
	}
	h.note("all %d events committed", total)
	var rows []ledger.Row
	if fc.source == walLog {
		rows = ledger.ReadSeq(t, h.e) // the writers wrote no rows
	} else {
		rows = ledger.Read(t, h.e)
	}
	if len(rows) != total {
		t.Fatalf("%d rows committed, want %d", len(rows), total)
	}
	recs, err := h.cons.Wait(ctx, func(r []kafkatest.Record) bool { return ledger.Check(rows, r).Lost == 0 })
	rep := ledger.Check(rows, recs)
	bound := injections * fc.resends * maxBatchSize
	if fc.eos {
		bound = 0 // read_committed: every row exactly once
	}
	violations := h.watch.Violations()
	summary := fmt.Sprintf("%d events, %d injections: ledger %+v; duplicates bound %d; relay-reported order violations %d; %v",
		total, injections, countsOf(rep), bound, len(violations), time.Since(h.start).Round(100*time.Millisecond))
	if err == nil && rep.OK() && rep.Duplicates <= bound && len(violations) == 0 {
		t.Log(summary)
		return
	}
	if err != nil {
		summary = fmt.Sprintf("not every event delivered: %v; %s", err, summary)
	}
	ledger.Explain(t, h.e, rep, recs)
	for i, v := range rep.Violations {
		if i == 5 {
			t.Logf("... and %d more", len(rep.Violations)-5)
			break
		}
		t.Logf("order violation: %s", v)
	}
	if len(violations) > 0 {
		t.Logf("the relay reported: %s", outboxtest.DescribeMessages(violations))
	}
	h.mu.Lock()
	t.Logf("what was injected:\n%s", strings.Join(h.notes, "\n"))
	h.mu.Unlock()
	t.Logf("relay log (last lines):\n%s", lastLines(h.logs.String(), 40))
	t.Errorf("%s (partitions of the aggregates: %s)", summary, aggregatePartitions(rep))
}

// counts is a Report without its lists, for one log line.
type counts struct {
	Delivered, Duplicates, Lost, Ghosts, OrderViolations int
}

func countsOf(r ledger.Report) counts {
	return counts{r.Delivered, r.Duplicates, r.Lost, r.Ghosts, r.OrderViolations}
}

// aggregatePartitions names the Kafka partition of each aggregate with an
// order violation.
func aggregatePartitions(r ledger.Report) string {
	seen := map[string]bool{}
	var s []string
	for _, agg := range r.Violated {
		if !seen[agg] {
			seen[agg] = true
			s = append(s, fmt.Sprintf("%s:%d", agg, partition.KafkaPartition([]byte(agg), partitions)))
		}
	}
	return strings.Join(s, " ")
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// camel turns a Kafka error name (UNKNOWN_SERVER_ERROR) into a subtest
// name (UnknownServerError).
func camel(s string) string {
	var b strings.Builder
	for _, w := range strings.Split(strings.ToLower(s), "_") {
		if w != "" {
			b.WriteString(strings.ToUpper(w[:1]) + w[1:])
		}
	}
	return b.String()
}
