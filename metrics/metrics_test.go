package metrics_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/metrics"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
)

// sample is one gathered metric: a counter's or gauge's value, or a
// histogram's sample count and sum.
type sample struct {
	value, sum float64
	found      bool
}

// find gathers g and returns the metric name whose labels include labels.
func find(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) sample {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue metric
				}
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				return sample{value: m.GetCounter().GetValue(), found: true}
			case dto.MetricType_GAUGE:
				return sample{value: m.GetGauge().GetValue(), found: true}
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				return sample{value: float64(h.GetSampleCount()), sum: h.GetSampleSum(), found: true}
			default:
				t.Fatalf("%s: unexpected type %v", name, mf.GetType())
			}
		}
	}
	return sample{}
}

// value is find's value, failing t if the metric is missing.
func value(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	s := find(t, g, name, labels)
	if !s.found {
		t.Fatalf("metric %s%v not exported", name, labels)
	}
	return s.value
}

func lint(t *testing.T, g prometheus.Gatherer) {
	t.Helper()
	problems, err := testutil.GatherAndLint(g)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestRelayMetricsRecordsObserverCalls(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := metrics.NewRelayMetrics(reg, outboxOf(t, "orders_outbox"))
	if err != nil {
		t.Fatal(err)
	}
	var obs relay.Observer = m // the point of the type

	// Before anything happens every series exists, errors at 0 per class.
	if n := testutil.CollectAndCount(m); n != 27 {
		t.Errorf("CollectAndCount = %d, want 27 (17 single series + 4 error classes + 4 transaction outcomes + 2 sources)", n)
	}
	if n := testutil.CollectAndCount(m, metrics.MetricPublishErrors); n != 4 {
		t.Errorf("error classes exported = %d, want 4", n)
	}

	obs.Up(true)
	obs.Leases(5)
	obs.Claimed(3, 2*time.Millisecond)
	obs.Claimed(120, 30*time.Millisecond)
	obs.Published(relay.Message{Age: 10 * time.Millisecond}, 5*time.Millisecond)
	obs.Published(relay.Message{Age: 2 * time.Second}, time.Second)
	obs.Published(relay.Message{Age: -time.Second}, time.Millisecond) // skewed: clamped to 0
	obs.Failed(relay.Message{}, relay.ClassTransient, errors.New("x"))
	obs.Failed(relay.Message{}, relay.ClassTransient, errors.New("x"))
	obs.Failed(relay.Message{}, relay.ClassBatch, errors.New("x"))
	obs.Failed(relay.Message{}, relay.ClassPermanent, relay.ErrPermanent)
	obs.Failed(relay.Message{}, relay.ClassUnavailable, relay.ErrUnavailable)
	obs.Failed(relay.Message{}, relay.ErrorClass("future"), errors.New("x"))
	obs.Retried(relay.Message{}, 1, time.Second)
	obs.DeadLettered(relay.Message{}, relay.ErrPermanent)
	obs.(relay.OrderObserver).OrderViolation(relay.Message{})
	to := obs.(relay.TransactionObserver)
	to.Transaction(3, relay.TxnCommitted, 10)
	to.Transaction(4, relay.TxnCommitted, 2)
	to.Transaction(4, relay.TxnAborted, 5)
	to.Transaction(7, relay.TxnFenced, 1)
	to.Reconciled(3, 0)
	to.Reconciled(7, 40)
	so := obs.(relay.SourceObserver)
	so.FromSource(relay.SourceTable, 300)
	so.FromSource(relay.SourceWAL, 20)
	so.FromSource(relay.SourceWAL, 22)
	so.WALStreaming(true, nil)
	so.WALStreaming(false, errors.New("slot active"))
	so.WALStreaming(true, nil)
	obs.(relay.WALLagObserver).WALLag(relay.WALLag{ConfirmedLSN: 0x16B3748, UnconfirmedBytes: 512, RetainedBytes: 8192, DecodeDelay: 1500 * time.Millisecond})
	obs.(relay.WALLossObserver).WALLoss(&relay.WALLoss{Slot: "s", From: "0/10", To: "0/20"})

	want := `
# HELP outbox_dead_lettered_total Outbox messages dead-lettered (marked failed).
# TYPE outbox_dead_lettered_total counter
outbox_dead_lettered_total{table="orders_outbox"} 1
# HELP outbox_partitions_owned Relay partitions this relay instance holds a lease on.
# TYPE outbox_partitions_owned gauge
outbox_partitions_owned{table="orders_outbox"} 5
# HELP outbox_publish_errors_total Outbox messages whose publish failed, by class (transient, permanent, unavailable, batch).
# TYPE outbox_publish_errors_total counter
outbox_publish_errors_total{class="batch",table="orders_outbox"} 1
outbox_publish_errors_total{class="future",table="orders_outbox"} 1
outbox_publish_errors_total{class="permanent",table="orders_outbox"} 1
outbox_publish_errors_total{class="transient",table="orders_outbox"} 2
outbox_publish_errors_total{class="unavailable",table="orders_outbox"} 1
# HELP outbox_published_total Outbox messages acknowledged by the broker.
# TYPE outbox_published_total counter
outbox_published_total{table="orders_outbox"} 3
# HELP outbox_relay_order_violations_total Outbox messages acknowledged after an earlier message of their aggregate in the same batch failed (must stay 0).
# TYPE outbox_relay_order_violations_total counter
outbox_relay_order_violations_total{table="orders_outbox"} 1
# HELP outbox_relay_up 1 while the relay runs and is ready (database and broker answer, cycles succeed), 0 otherwise.
# TYPE outbox_relay_up gauge
outbox_relay_up{table="orders_outbox"} 1
# HELP outbox_retries_total Outbox message retries scheduled after a failed publish attempt.
# TYPE outbox_retries_total counter
outbox_retries_total{table="orders_outbox"} 1
# HELP outbox_transactions_total Broker transactions of the exactly-once mode (one per relay partition per batch), by outcome (committed, aborted, unknown, fenced).
# TYPE outbox_transactions_total counter
outbox_transactions_total{outcome="aborted",table="orders_outbox"} 1
outbox_transactions_total{outcome="committed",table="orders_outbox"} 2
outbox_transactions_total{outcome="fenced",table="orders_outbox"} 1
outbox_transactions_total{outcome="unknown",table="orders_outbox"} 0
# HELP outbox_reconciled_rows_total Rows marked sent by reconciling: committed at the broker, not yet marked in the database (each a duplicate avoided).
# TYPE outbox_reconciled_rows_total counter
outbox_reconciled_rows_total{table="orders_outbox"} 40
# HELP outbox_relay_source_messages_total Messages the relay's cycles found, by source (table: claimed; wal: read from the replication stream).
# TYPE outbox_relay_source_messages_total counter
outbox_relay_source_messages_total{source="table",table="orders_outbox"} 300
outbox_relay_source_messages_total{source="wal",table="orders_outbox"} 42
# HELP outbox_relay_wal_streaming 1 while the relay reads its replication slot (relay.SourceWAL), else 0.
# TYPE outbox_relay_wal_streaming gauge
outbox_relay_wal_streaming{table="orders_outbox"} 1
# HELP outbox_relay_wal_confirmed_lsn The WAL source's slot's confirmed_flush_lsn, as a number (sampled by the relay reading it).
# TYPE outbox_relay_wal_confirmed_lsn gauge
outbox_relay_wal_confirmed_lsn{table="orders_outbox"} 2.3803720e+07
# HELP outbox_relay_wal_unconfirmed_bytes pg_current_wal_lsn() - confirmed_flush_lsn of the WAL source's slot, in bytes: how far its reader is behind.
# TYPE outbox_relay_wal_unconfirmed_bytes gauge
outbox_relay_wal_unconfirmed_bytes{table="orders_outbox"} 512
# HELP outbox_relay_wal_retained_bytes pg_current_wal_lsn() - restart_lsn of the WAL source's slot, in bytes: the WAL it keeps on the server.
# TYPE outbox_relay_wal_retained_bytes gauge
outbox_relay_wal_retained_bytes{table="orders_outbox"} 8192
# HELP outbox_relay_wal_decode_delay_seconds Seconds between the commit of the last outbox transaction the walsender decoded and its arrival at the relay (0 once caught up).
# TYPE outbox_relay_wal_decode_delay_seconds gauge
outbox_relay_wal_decode_delay_seconds{table="orders_outbox"} 1.5
# HELP outbox_relay_wal_loss 1 while a loss window of the log-only mode (a slot dropped or invalidated with events in it) is recorded and not acknowledged (outbox wal ack-loss).
# TYPE outbox_relay_wal_loss gauge
outbox_relay_wal_loss{table="orders_outbox"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		metrics.MetricDeadLettered, metrics.MetricPartitionsOwned, metrics.MetricPublishErrors,
		metrics.MetricPublished, metrics.MetricOrderViolations, metrics.MetricRelayUp, metrics.MetricRetries,
		metrics.MetricTransactions, metrics.MetricReconciledRows, metrics.MetricSourceMessages, metrics.MetricWALStreaming,
		metrics.MetricWALConfirmedLSN, metrics.MetricWALUnconfirmedBytes, metrics.MetricWALRetainedBytes, metrics.MetricWALDecodeDelay, metrics.MetricWALLoss); err != nil {
		t.Error(err)
	}

	tbl := map[string]string{"table": "orders_outbox"}
	if s := find(t, reg, metrics.MetricCommitToPublish, tbl); s.value != 3 || !near(s.sum, 0.015+3+0) {
		t.Errorf("commit-to-publish: count %v sum %v, want 3 and 3.015", s.value, s.sum)
	}
	if s := find(t, reg, metrics.MetricBatchSize, tbl); s.value != 2 || s.sum != 123 {
		t.Errorf("batch size: count %v sum %v, want 2 and 123", s.value, s.sum)
	}
	if s := find(t, reg, metrics.MetricClaimDuration, tbl); s.value != 2 || !near(s.sum, 0.032) {
		t.Errorf("claim duration: count %v sum %v, want 2 and 0.032", s.value, s.sum)
	}
	// The commit-to-publish buckets span 0.5 ms to a minute.
	bounds := bucketBounds(t, reg, metrics.MetricCommitToPublish)
	if bounds[0] != 0.0005 || bounds[len(bounds)-1] < 60 {
		t.Errorf("commit-to-publish buckets %v, want 0.0005 .. >= 60", bounds)
	}
	if bounds := bucketBounds(t, reg, metrics.MetricBatchSize); bounds[0] != 1 || bounds[len(bounds)-1] != 5000 {
		t.Errorf("batch size buckets %v, want 1 .. 5000", bounds)
	}

	// Not ready (broker or database failing past the grace period): down,
	// leases kept; ready again: up.
	obs.(relay.ReadinessObserver).Readiness(errors.New("outbox: relay unhealthy: the broker failing for 11s"))
	if v := value(t, reg, metrics.MetricRelayUp, tbl); v != 0 {
		t.Errorf("relay_up while not ready = %v", v)
	}
	if v := value(t, reg, metrics.MetricPartitionsOwned, tbl); v != 5 {
		t.Errorf("partitions_owned while not ready = %v, want 5 (kept)", v)
	}
	obs.(relay.ReadinessObserver).Readiness(nil)
	if v := value(t, reg, metrics.MetricRelayUp, tbl); v != 1 {
		t.Errorf("relay_up when ready again = %v", v)
	}

	// Stopping: down, and no partitions owned.
	obs.Up(false)
	if v := value(t, reg, metrics.MetricRelayUp, tbl); v != 0 {
		t.Errorf("relay_up after Up(false) = %v", v)
	}
	if v := value(t, reg, metrics.MetricPartitionsOwned, tbl); v != 0 {
		t.Errorf("partitions_owned after Up(false) = %v", v)
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

func bucketBounds(t *testing.T, g prometheus.Gatherer, name string) []float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var out []float64
			for _, b := range mf.GetMetric()[0].GetHistogram().GetBucket() {
				out = append(out, b.GetUpperBound())
			}
			return out
		}
	}
	t.Fatalf("%s not gathered", name)
	return nil
}

func TestRelayMetricsLint(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := metrics.NewRelayMetrics(reg, outboxOf(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	m.Published(relay.Message{}, time.Millisecond)
	problems, err := testutil.CollectAndLint(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	// An Outbox without a table has the default table.
	if v := value(t, reg, metrics.MetricPublished, map[string]string{"table": driver.DefaultTable}); v != 1 {
		t.Errorf("published{table=%q} = %v, want 1", driver.DefaultTable, v)
	}
}

func TestRelayMetricsDuplicateRegistration(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := metrics.NewRelayMetrics(reg, outboxOf(t, "a")); err != nil {
		t.Fatal(err)
	}
	_, err := metrics.NewRelayMetrics(reg, outboxOf(t, "a"))
	var are prometheus.AlreadyRegisteredError
	if err == nil || !errors.As(err, &are) {
		t.Fatalf("second registration of table a: %v, want an AlreadyRegisteredError", err)
	}
	if !strings.Contains(err.Error(), `"a"`) {
		t.Errorf("error %q does not name the table", err)
	}
	// Another table in the same registry is fine: the table label differs.
	if _, err := metrics.NewRelayMetrics(reg, outboxOf(t, "b")); err != nil {
		t.Fatalf("registering table b: %v", err)
	}
	// An Outbox of the default table.
	if _, err := metrics.NewRelayMetrics(reg, outboxOf(t, "")); err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.NewRelayMetrics(reg, outboxOf(t, driver.DefaultTable)); err == nil {
		t.Error("registering the default table twice succeeded")
	}
	// A conflicting metric of another origin is reported, not panicked on.
	other := prometheus.NewRegistry()
	other.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: metrics.MetricPublished, Help: "not ours"}))
	if _, err := metrics.NewRelayMetrics(other, outboxOf(t, "c")); err == nil {
		t.Error("registering over a conflicting metric succeeded")
	}
}

func TestRelayMetricsNilRegistererUsesDefault(t *testing.T) {
	t.Parallel()
	m, err := metrics.NewRelayMetrics(nil, outboxOf(t, "nil_registerer_test"))
	if err != nil {
		t.Fatal(err)
	}
	defer prometheus.DefaultRegisterer.Unregister(m)
	m.Retried(relay.Message{}, 1, time.Second)
	if v := value(t, prometheus.DefaultGatherer, metrics.MetricRetries, map[string]string{"table": "nil_registerer_test"}); v != 1 {
		t.Errorf("retries = %v, want 1", v)
	}
}

// TestRelayMetricsConcurrent: observers are called from the relay loop and
// the lease heartbeat at once; -race checks the methods.
func TestRelayMetricsConcurrent(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := metrics.NewRelayMetrics(reg, outboxOf(t, "t"))
	if err != nil {
		t.Fatal(err)
	}
	const workers, each = 8, 500
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				m.Claimed(1, time.Microsecond)
				m.Published(relay.Message{Age: time.Millisecond}, time.Millisecond)
				m.Failed(relay.Message{}, relay.ClassTransient, nil)
				m.Leases(w + i)
				m.Up(i%2 == 0)
			}
		})
	}
	wg.Wait()
	tbl := map[string]string{"table": "t"}
	if v := value(t, reg, metrics.MetricPublished, tbl); v != workers*each {
		t.Errorf("published = %v, want %d", v, workers*each)
	}
	if v := value(t, reg, metrics.MetricBatchSize, tbl); v != workers*each {
		t.Errorf("batch size count = %v, want %d", v, workers*each)
	}
	if v := value(t, reg, metrics.MetricPublishErrors, map[string]string{"table": "t", "class": "transient"}); v != workers*each {
		t.Errorf("transient errors = %v, want %d", v, workers*each)
	}
}

// TestStatsCollectorError: a failed snapshot exports only the error gauge.
func TestStatsCollectorError(t *testing.T) {
	t.Parallel()
	c := metrics.NewStatsCollector(nil, nil, 0)
	if n := testutil.CollectAndCount(c); n != 1 {
		t.Fatalf("CollectAndCount = %d, want 1 (only %s)", n, metrics.MetricStatsScrapeError)
	}
	if v := testutil.ToFloat64(c); v != 1 {
		t.Errorf("%s = %v, want 1", metrics.MetricStatsScrapeError, v)
	}
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// notifying wraps RelayMetrics and signals every update, so the test waits
// for the relay's observations instead of sleeping.
type notifying struct {
	*metrics.RelayMetrics
	changed chan struct{} // capacity 1
}

func (n notifying) poke() {
	select {
	case n.changed <- struct{}{}:
	default:
	}
}

func (n notifying) Published(m relay.Message, took time.Duration) {
	n.RelayMetrics.Published(m, took)
	n.poke()
}

func (n notifying) DeadLettered(m relay.Message, err error) {
	n.RelayMetrics.DeadLettered(m, err)
	n.poke()
}

func (n notifying) waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-n.changed:
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func sqliteTarget(t *testing.T) testdb.Target {
	for _, tg := range testdb.All {
		if tg.Dialect == driver.SQLite {
			return tg
		}
	}
	t.Fatal("no SQLite target in testdb.All")
	return testdb.Target{}
}

// TestIntegrationSQLite runs a relay with RelayMetrics and the stats
// collector on an embedded SQLite outbox: four events are published, one
// fails permanently and is dead-lettered.
func TestIntegrationSQLite(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tg := sqliteTarget(t)
	e := testdb.New(t, tg, driver.Config{})

	reg := prometheus.NewRegistry()
	rm, err := metrics.NewRelayMetrics(reg, e.Outbox)
	if err != nil {
		t.Fatal(err)
	}
	obs := notifying{RelayMetrics: rm, changed: make(chan struct{}, 1)}
	if err := reg.Register(metrics.NewStatsCollector(e.Outbox, e.RelayDB, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	pub := outboxtest.NewPublisher()
	pub.FailWith(func(m relay.Message) error {
		if m.AggregateID == "C" {
			return fmt.Errorf("%w: x", relay.ErrPermanent)
		}
		return nil
	})
	r, err := relay.New(e.Outbox, e.RelayDB, relay.Config{Publisher: pub,
		PollInterval: 20 * time.Millisecond, RetryInitial: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Observer: outboxtest.WatchOrder(t, obs)})
	if err != nil {
		t.Fatal(err)
	}
	run := make(chan error, 1)
	go func() { run <- r.Run(context.Background()) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		sctx, c := context.WithTimeout(context.Background(), 10*time.Second)
		defer c()
		if err := r.Stop(sctx); err != nil {
			t.Errorf("stop: %v", err)
		}
		if err := <-run; err != nil {
			t.Errorf("run: %v", err)
		}
	}
	defer stop()

	ectx := outbox.NewContext(ctx)
	tx, err := e.DB.BeginTx(ectx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range []outbox.Event{
		{ID: "A-1", AggregateType: "acct", AggregateID: "A", Type: "t", Payload: []byte(`1`)},
		{ID: "B-1", AggregateType: "acct", AggregateID: "B", Type: "t", Payload: []byte(`1`)},
		{ID: "C-1", AggregateType: "acct", AggregateID: "C", Type: "t", Payload: []byte(`1`)},
		{ID: "A-2", AggregateType: "acct", AggregateID: "A", Type: "t", Payload: []byte(`2`)},
		{ID: "B-2", AggregateType: "acct", AggregateID: "B", Type: "t", Payload: []byte(`2`)},
	} {
		if err := outbox.Emit(ectx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.WaitForCount(ctx, 4); err != nil {
		t.Fatal(err)
	}
	tbl := map[string]string{"table": e.Table}
	obs.waitFor(t, ctx, "4 published and 1 dead letter observed", func() bool {
		return value(t, reg, metrics.MetricPublished, tbl) == 4 && value(t, reg, metrics.MetricDeadLettered, tbl) == 1
	})

	// While the relay runs: up, owning every partition, and every metric
	// of both halves is exported.
	if v := value(t, reg, metrics.MetricRelayUp, tbl); v != 1 {
		t.Errorf("relay_up while running = %v", v)
	}
	if v := value(t, reg, metrics.MetricPartitionsOwned, tbl); v != partition.DefaultCount {
		t.Errorf("partitions_owned = %v, want %d", v, partition.DefaultCount)
	}
	if s := find(t, reg, metrics.MetricPartitionOwnerInfo, tbl); !s.found || s.value != 1 {
		t.Errorf("partition owner info while running: %+v", s)
	}
	exported := gatheredNames(t, reg)
	wantNames := []string{
		metrics.MetricPublished, metrics.MetricPublishErrors, metrics.MetricRetries, metrics.MetricDeadLettered,
		metrics.MetricCommitToPublish, metrics.MetricBatchSize, metrics.MetricClaimDuration,
		metrics.MetricPartitionsOwned, metrics.MetricRelayUp, metrics.MetricRelayPartitionMismatch,
		metrics.MetricOrderViolations, metrics.MetricTransactions, metrics.MetricReconciledRows,
		metrics.MetricSourceMessages, metrics.MetricWALStreaming, metrics.MetricWALConfirmedLSN, metrics.MetricWALUnconfirmedBytes,
		metrics.MetricWALRetainedBytes, metrics.MetricWALDecodeDelay, metrics.MetricWALLoss, metrics.MetricPendingEvents, metrics.MetricOldestPendingAge, metrics.MetricSentEvents, metrics.MetricDeadLetters,
		metrics.MetricPartitionPendingEvents, metrics.MetricPartitionOldestPendingAge, metrics.MetricPartitionOwnerInfo,
		metrics.MetricStatsScrapeError, metrics.MetricPartitions, metrics.MetricLeasePartitions,
		metrics.MetricOutOfRangePending, metrics.MetricPartitionMismatch,
	}
	for _, n := range wantNames {
		if _, ok := exported[n]; !ok {
			t.Errorf("%s not exported", n)
		}
	}
	if len(exported) != len(wantNames) {
		t.Errorf("exported %d metric families, want %d: %v", len(exported), len(wantNames), exported)
	}
	lint(t, reg)
	t.Run("alerts reference exported metrics", func(t *testing.T) {
		checkReferences(t, "alerts.yml", alertExprs(t), exported, false)
	})
	t.Run("dashboard references exported metrics", func(t *testing.T) {
		checkReferences(t, "dashboard.json", dashboardExprs(t), exported, true)
	})

	// Stopped: everything acknowledged is marked sent (Stop waits for it).
	stop()
	if v := value(t, reg, metrics.MetricRelayUp, tbl); v != 0 {
		t.Errorf("relay_up after stop = %v", v)
	}
	if v := value(t, reg, metrics.MetricPartitionsOwned, tbl); v != 0 {
		t.Errorf("partitions_owned after stop = %v", v)
	}
	class := func(c relay.ErrorClass) map[string]string {
		return map[string]string{"table": e.Table, "class": string(c)}
	}
	for c, want := range map[relay.ErrorClass]float64{relay.ClassPermanent: 1, relay.ClassTransient: 0, relay.ClassBatch: 0, relay.ClassUnavailable: 0} {
		if v := value(t, reg, metrics.MetricPublishErrors, class(c)); v != want {
			t.Errorf("publish errors{class=%s} = %v, want %v", c, v, want)
		}
	}
	if v := value(t, reg, metrics.MetricPublished, tbl); v != 4 {
		t.Errorf("published = %v, want 4", v)
	}
	if v := value(t, reg, metrics.MetricRetries, tbl); v != 0 {
		t.Errorf("retries = %v, want 0 (ErrPermanent skips them)", v)
	}
	if v := value(t, reg, metrics.MetricDeadLettered, tbl); v != 1 {
		t.Errorf("dead_lettered = %v, want 1", v)
	}
	if s := find(t, reg, metrics.MetricCommitToPublish, tbl); s.value != 4 || s.sum <= 0 || s.sum > 4*60 {
		t.Errorf("commit-to-publish: count %v sum %v, want 4 samples of (0, 60] s", s.value, s.sum)
	}
	batches, claims := find(t, reg, metrics.MetricBatchSize, tbl), find(t, reg, metrics.MetricClaimDuration, tbl)
	if batches.value < 1 || batches.sum < 5 || claims.value != batches.value {
		t.Errorf("batch size count %v sum %v, claim duration count %v: want >= 1 batches of >= 5 messages, one claim each",
			batches.value, batches.sum, claims.value)
	}

	// The table: nothing pending, one dead letter, four sent.
	for name, want := range map[string]float64{
		metrics.MetricPendingEvents: 0, metrics.MetricOldestPendingAge: 0, metrics.MetricDeadLetters: 1,
		metrics.MetricSentEvents: 4, metrics.MetricStatsScrapeError: 0,
	} {
		if v := value(t, reg, name, tbl); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
	if n, err := testutil.GatherAndCount(reg, metrics.MetricPartitionPendingEvents); err != nil || n == 0 {
		t.Errorf("per-partition pending series: %d (%v), want the lease rows' partitions", n, err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == metrics.MetricPartitionPendingEvents {
			for _, m := range mf.GetMetric() {
				if m.GetGauge().GetValue() != 0 {
					t.Errorf("partition pending %v = %v, want 0", m.GetLabel(), m.GetGauge().GetValue())
				}
			}
		}
	}

	// Served over HTTP as in the package documentation.
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	body := httpGet(t, ctx, srv.URL)
	for _, line := range []string{
		fmt.Sprintf(`outbox_dead_letters{table=%q} 1`, e.Table),
		fmt.Sprintf(`outbox_pending_events{table=%q} 0`, e.Table),
		fmt.Sprintf(`outbox_published_total{table=%q} 4`, e.Table),
	} {
		if !strings.Contains(body, line+"\n") {
			t.Errorf("/metrics lacks %q", line)
		}
	}

	// A table that does not exist: only the error gauge.
	bad := metrics.NewStatsCollector(outboxOf(t, "no_such_outbox"), e.RelayDB, time.Second)
	if n := testutil.CollectAndCount(bad); n != 1 {
		t.Errorf("missing table: %d metrics, want 1", n)
	}
	if v := testutil.ToFloat64(bad); v != 1 {
		t.Errorf("missing table: %s = %v, want 1", metrics.MetricStatsScrapeError, v)
	}
}

func httpGet(t *testing.T, ctx context.Context, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s: %s", resp.Status, b)
	}
	return string(b)
}

// gatheredNames maps each gathered family name to its type.
func gatheredNames(t *testing.T, g prometheus.Gatherer) map[string]dto.MetricType {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]dto.MetricType{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf.GetType()
	}
	return out
}

var metricName = regexp.MustCompile(`outbox_[a-z_]+`)

// checkReferences checks that every outbox_ metric named in exprs is
// exported (a histogram's _bucket, _sum and _count series included) and,
// if all, that every exported metric is used.
func checkReferences(t *testing.T, file string, exprs []string, exported map[string]dto.MetricType, all bool) {
	t.Helper()
	if len(exprs) == 0 {
		t.Fatalf("%s: no expressions", file)
	}
	used := map[string]bool{}
	for _, expr := range exprs {
		names := metricName.FindAllString(expr, -1)
		if len(names) == 0 {
			t.Errorf("%s: expression uses no outbox metric: %s", file, expr)
		}
		for _, n := range names {
			base := n
			if _, ok := exported[n]; !ok {
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(n, suffix); ok && exported[b] == dto.MetricType_HISTOGRAM {
						base = b
					}
				}
			}
			if _, ok := exported[base]; !ok {
				t.Errorf("%s: %s is not an exported metric (in %s)", file, n, expr)
			}
			used[base] = true
		}
	}
	if all {
		for n := range exported {
			if !used[n] {
				t.Errorf("%s does not show %s", file, n)
			}
		}
	}
}

type rulesFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func readRules(t *testing.T) rulesFile {
	t.Helper()
	b, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rf rulesFile
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&rf); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	return rf
}

func alertExprs(t *testing.T) []string {
	var out []string
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			out = append(out, r.Expr)
		}
	}
	return out
}

func TestAlertsFile(t *testing.T) {
	t.Parallel()
	rf := readRules(t)
	type rule struct{ expr, dur string }
	got := map[string]rule{}
	for _, g := range rf.Groups {
		if g.Name == "" {
			t.Error("rule group without a name")
		}
		for _, r := range g.Rules {
			if r.Alert == "" || strings.TrimSpace(r.Expr) == "" {
				t.Errorf("rule %q: alert name and expr required", r.Alert)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: summary and description annotations required", r.Alert)
			}
			if r.Labels["severity"] == "" {
				t.Errorf("%s: no severity label", r.Alert)
			}
			if _, dup := got[r.Alert]; dup {
				t.Errorf("%s defined twice", r.Alert)
			}
			if strings.Count(r.Expr, "(") != strings.Count(r.Expr, ")") {
				t.Errorf("%s: unbalanced parentheses: %s", r.Alert, r.Expr)
			}
			got[r.Alert] = rule{strings.Join(strings.Fields(r.Expr), " "), r.For}
		}
	}
	names := make([]string, 0, len(got))
	for n := range got {
		names = append(names, n)
	}
	sort.Strings(names)
	want := []string{"OutboxBacklogHigh", "OutboxDeadLetters", "OutboxOldestPendingTooOld", "OutboxOrderViolation", "OutboxPartitionMismatch",
		"OutboxPublishSuccessLow", "OutboxRelayDown", "OutboxStatsScrapeFailing"}
	if !slices.Equal(names, want) {
		t.Fatalf("alerts %v, want %v", names, want)
	}
	// The seed's thresholds.
	for name, w := range map[string]struct{ in, dur string }{
		"OutboxBacklogHigh":         {"outbox_pending_events) > 1000", "5m"},
		"OutboxOldestPendingTooOld": {"outbox_oldest_pending_age_seconds) > 300", "1m"},
		"OutboxPublishSuccessLow":   {"< 0.99", "10m"},
		"OutboxRelayDown":           {"outbox_relay_up == 0 or absent(outbox_relay_up)", "2m"},
		"OutboxDeadLetters":         {"increase(outbox_dead_lettered_total[10m])) > 0", ""},
		"OutboxOrderViolation":      {"increase(outbox_relay_order_violations_total[10m])) > 0", ""},
	} {
		if r := got[name]; !strings.Contains(r.expr, w.in) || r.dur != w.dur {
			t.Errorf("%s: expr %q for %q, want expr containing %q for %q", name, r.expr, r.dur, w.in, w.dur)
		}
	}
	if e := got["OutboxPublishSuccessLow"].expr; !strings.Contains(e, "rate(outbox_published_total[5m])") ||
		!strings.Contains(e, "rate(outbox_publish_errors_total[5m])") {
		t.Errorf("OutboxPublishSuccessLow: %s", e)
	}
}

type dashboard struct {
	Title         string  `json:"title"`
	UID           string  `json:"uid"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // of a collapsed row
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(b) {
		t.Fatal("dashboard.json is not valid JSON")
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	return d
}

func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

func dashboardExprs(t *testing.T) []string {
	d := readDashboard(t)
	var out []string
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Definition != "" {
			out = append(out, v.Definition)
		}
	}
	return out
}

func TestDashboardJSON(t *testing.T) {
	t.Parallel()
	d := readDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Error("dashboard needs a title and a uid")
	}
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d, want a current one (39)", d.SchemaVersion)
	}
	ids := map[int]bool{}
	titles := map[string]bool{}
	for _, p := range allPanels(d.Panels) {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		titles[p.Title] = true
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: bad gridPos %+v", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" || tg.RefID == "" {
				t.Errorf("panel %q: empty expr or refId", p.Title)
			}
			if strings.Count(tg.Expr, "(") != strings.Count(tg.Expr, ")") {
				t.Errorf("panel %q: unbalanced parentheses: %s", p.Title, tg.Expr)
			}
		}
	}
	for _, want := range []string{"Pending events", "Oldest pending event age", "Publish rate", "Publish errors by class",
		"Commit-to-publish latency", "Batch size", "Claim duration", "Partitions owned per instance", "Dead letters"} {
		if !titles[want] {
			t.Errorf("no panel %q", want)
		}
	}
	exprs := strings.Join(dashboardExprs(t), "\n")
	for _, q := range []string{"histogram_quantile(0.5, ", "histogram_quantile(0.99, ", "outbox_commit_to_publish_seconds_bucket",
		"sum by (table, class)", "sum by (table, instance) (outbox_partitions_owned"} {
		if !strings.Contains(exprs, q) {
			t.Errorf("dashboard queries lack %q", q)
		}
	}
}

// outboxOf is an Outbox of table (SQLite; "" is driver.DefaultTable), as
// a process that only knows the table builds one.
func outboxOf(t testing.TB, table string) *driver.Outbox {
	t.Helper()
	ob, err := driver.New(driver.Config{Dialect: driver.SQLite, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	return ob
}
