package metrics

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/relay"
)

// Names of the metrics RelayMetrics exports. All carry the constant label
// table (the outbox table the relay serves).
const (
	// MetricPublished is a counter of messages the broker acknowledged.
	MetricPublished = "outbox_published_total"
	// MetricPublishErrors is a counter of publish failures per message,
	// labelled class (relay.ErrorClass: transient, permanent, unavailable,
	// batch).
	MetricPublishErrors = "outbox_publish_errors_total"
	// MetricRetries is a counter of retries scheduled (a failed attempt
	// that will be tried again after a backoff).
	MetricRetries = "outbox_retries_total"
	// MetricDeadLettered is a counter of messages marked failed (status 2).
	MetricDeadLettered = "outbox_dead_lettered_total"
	// MetricCommitToPublish is a histogram, in seconds, of the time from a
	// message's commit (its row's creation, by the database clock) to the
	// broker's acknowledgement.
	MetricCommitToPublish = "outbox_commit_to_publish_seconds"
	// MetricBatchSize is a histogram of the number of messages per
	// non-empty claim (one claim is one Publish batch).
	MetricBatchSize = "outbox_batch_size"
	// MetricClaimDuration is a histogram, in seconds, of how long a
	// non-empty claim query took.
	MetricClaimDuration = "outbox_claim_duration_seconds"
	// MetricPartitionsOwned is a gauge of the relay partitions this
	// instance holds a lease on.
	MetricPartitionsOwned = "outbox_partitions_owned"
	// MetricRelayUp is a gauge: 1 while the relay runs and is ready
	// (relay.Relay.Ready returns nil: its database and broker answer, its
	// cycles succeed, no partition mismatch), 0 before it started, after it
	// stopped, and while it is not ready (the database, the broker or its
	// cycles failing for longer than relay.Config.UnhealthyAfter).
	MetricRelayUp = "outbox_relay_up"
	// MetricRelayPartitionMismatch is a gauge: 1 while the relay detects
	// a relay partition mismatch (relay.ErrPartitionMismatch: a stored
	// count that differs from the configured one, a lease table of another
	// size, pending rows in partitions no relay owns), also after the
	// relay refused to start because of one; 0 otherwise.
	MetricRelayPartitionMismatch = "outbox_relay_partition_mismatch"
	// MetricOrderViolations is a counter of messages the publisher
	// acknowledged although an earlier message of their aggregate in the
	// same batch had failed (relay.OrderObserver): first deliveries that
	// may be out of order. No publisher of this module does that; it must
	// stay 0, so alert on any increase.
	MetricOrderViolations = "outbox_relay_order_violations_total"
	// MetricTransactions is a counter of broker transactions in
	// relay/kafka's exactly-once mode (one per relay partition per batch),
	// labelled outcome (relay.TransactionOutcome: committed, aborted,
	// unknown, fenced). Aborted transactions cost a re-send, unknown ones
	// a reconcile; fenced ones mean another relay took a partition, or a
	// transaction outlived transaction.timeout.ms: alert on a rate.
	MetricTransactions = "outbox_transactions_total"
	// MetricReconciledRows is a counter of rows the relay marked sent when
	// it reconciled a partition (relay.Reconciler): rows whose transaction
	// had committed at the broker but were not marked sent in the
	// database. Each is a duplicate the exactly-once mode prevented.
	MetricReconciledRows = "outbox_reconciled_rows_total"
	// MetricSourceMessages is a counter of messages the relay's cycles
	// found, labelled source: "table" (claimed from the table) or "wal"
	// (read from the replication stream, relay.SourceWAL). With the WAL
	// source, a rising share of "table" means the stream is down or keeps
	// handing rows back (see docs/wal.md).
	MetricSourceMessages = "outbox_relay_source_messages_total"
	// MetricWALStreaming is a gauge: 1 while a relay with relay.SourceWAL
	// reads its replication slot, 0 while it stands by (another relay
	// reads the slot), cannot open it, or is stopped. It stays 0 without
	// the WAL source.
	MetricWALStreaming = "outbox_relay_wal_streaming"
	// MetricWALConfirmedLSN is a gauge: the WAL source's slot's
	// confirmed_flush_lsn as a number (relay.WALLag.ConfirmedLSN), set by
	// the relay reading the slot every relay.Config.HealthInterval. A
	// value that stops moving while events are written means the stream
	// is stuck.
	MetricWALConfirmedLSN = "outbox_relay_wal_confirmed_lsn"
	// MetricWALUnconfirmedBytes is a gauge: pg_current_wal_lsn() -
	// confirmed_flush_lsn of the slot, in bytes (relay.WALLag): how far
	// the reading relay is behind the server.
	MetricWALUnconfirmedBytes = "outbox_relay_wal_unconfirmed_bytes"
	// MetricWALRetainedBytes is a gauge: pg_current_wal_lsn() - restart_lsn
	// of the slot, in bytes: the WAL the slot keeps on the server's disk.
	// Alert on it against max_slot_wal_keep_size (docs/wal.md).
	MetricWALRetainedBytes = "outbox_relay_wal_retained_bytes"
	// MetricWALDecodeDelay is a gauge: how long after its commit the relay
	// received the last outbox transaction the walsender decoded, in
	// seconds, 0 once the walsender caught up (relay.WALLag.DecodeDelay).
	MetricWALDecodeDelay = "outbox_relay_wal_decode_delay_seconds"
	// MetricWALLoss is a gauge: 1 while a loss window of the WAL source's
	// log-only mode is recorded and not acknowledged (relay.WALLoss: the
	// slot was dropped or invalidated while it may have held events; the
	// relay is not ready meanwhile), else 0. Alert on any 1.
	MetricWALLoss = "outbox_relay_wal_loss"
)

// ErrInvalidConfig is returned (wrapped) by NewRelayMetrics for a nil
// Outbox.
var ErrInvalidConfig = errors.New("outbox metrics: invalid config")

// Histogram bucket upper bounds.
var (
	// Seconds: 0.5 ms doubling to 65.5 s (18 buckets), from a wake-up
	// delivery (milliseconds) to a minute of retries and polls.
	commitToPublishBuckets = prometheus.ExponentialBuckets(0.0005, 2, 18)
	// Messages: 1 to 1000 in a 1-2-5 series.
	batchSizeBuckets = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000}
	// Seconds: 0.1 ms doubling to 6.6 s (17 buckets).
	claimDurationBuckets = prometheus.ExponentialBuckets(0.0001, 2, 17)
)

// RelayMetrics is a relay.Observer that records what one relay does as
// Prometheus metrics (see the package documentation for the list). Create
// it with NewRelayMetrics and set it as relay.Config.Observer. Its methods
// only update atomic counters, gauges and histograms: they never block and
// are safe for concurrent use.
//
// Use one RelayMetrics per Relay: outbox_relay_up and
// outbox_partitions_owned describe a single relay instance. Several relays
// of different tables can share a registry, since every metric carries the
// table label.
//
// RelayMetrics is also a prometheus.Collector (NewRelayMetrics registers
// it); Describe and Collect exist for that and need not be called directly.
type RelayMetrics struct {
	published       prometheus.Counter
	errors          *prometheus.CounterVec
	errTransient    prometheus.Counter
	errPermanent    prometheus.Counter
	errUnavailable  prometheus.Counter
	errBatch        prometheus.Counter
	retries         prometheus.Counter
	deadLettered    prometheus.Counter
	commitToPublish prometheus.Histogram
	batchSize       prometheus.Histogram
	claimDuration   prometheus.Histogram
	partitionsOwned prometheus.Gauge
	up              prometheus.Gauge
	mismatch        prometheus.Gauge
	orderViolations prometheus.Counter
	transactions    *prometheus.CounterVec
	txnOutcomes     map[relay.TransactionOutcome]prometheus.Counter
	reconciledRows  prometheus.Counter
	sourceMessages  *prometheus.CounterVec
	fromTable       prometheus.Counter
	fromWAL         prometheus.Counter
	walStreaming    prometheus.Gauge
	walConfirmed    prometheus.Gauge
	walUnconfirmed  prometheus.Gauge
	walRetained     prometheus.Gauge
	walDelay        prometheus.Gauge
	walLoss         prometheus.Gauge
}

var (
	_ relay.Observer            = (*RelayMetrics)(nil)
	_ relay.PartitionObserver   = (*RelayMetrics)(nil)
	_ relay.ReadinessObserver   = (*RelayMetrics)(nil)
	_ relay.OrderObserver       = (*RelayMetrics)(nil)
	_ relay.TransactionObserver = (*RelayMetrics)(nil)
	_ relay.SourceObserver      = (*RelayMetrics)(nil)
)

// NewRelayMetrics creates the relay metrics of ob's table (its
// driver.Config.Table is the table label) and registers them with reg
// (prometheus.DefaultRegisterer if nil). It returns ErrInvalidConfig
// (wrapped) for a nil ob, or the registration error, wrapped (a
// prometheus.AlreadyRegisteredError when metrics of the same table are
// already registered with reg); it never panics.
func NewRelayMetrics(reg prometheus.Registerer, ob *driver.Outbox) (*RelayMetrics, error) {
	if ob == nil {
		return nil, fmt.Errorf("%w: NewRelayMetrics needs a *driver.Outbox", ErrInvalidConfig)
	}
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	table := ob.Config().Table
	m := newRelayMetrics(table)
	if err := reg.Register(m); err != nil {
		return nil, fmt.Errorf("outbox metrics: registering relay metrics of table %q: %w", table, err)
	}
	return m, nil
}

func newRelayMetrics(table string) *RelayMetrics {
	cl := prometheus.Labels{"table": table}
	m := &RelayMetrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        MetricPublished,
			Help:        "Outbox messages acknowledged by the broker.",
			ConstLabels: cl,
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        MetricPublishErrors,
			Help:        "Outbox messages whose publish failed, by class (transient, permanent, unavailable, batch).",
			ConstLabels: cl,
		}, []string{"class"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        MetricRetries,
			Help:        "Outbox message retries scheduled after a failed publish attempt.",
			ConstLabels: cl,
		}),
		deadLettered: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        MetricDeadLettered,
			Help:        "Outbox messages dead-lettered (marked failed).",
			ConstLabels: cl,
		}),
		commitToPublish: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        MetricCommitToPublish,
			Help:        "Seconds from an outbox message's commit to the broker's acknowledgement.",
			ConstLabels: cl,
			Buckets:     commitToPublishBuckets,
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        MetricBatchSize,
			Help:        "Outbox messages per non-empty relay claim (one publish batch).",
			ConstLabels: cl,
			Buckets:     batchSizeBuckets,
		}),
		claimDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        MetricClaimDuration,
			Help:        "Seconds a non-empty relay claim query took.",
			ConstLabels: cl,
			Buckets:     claimDurationBuckets,
		}),
		partitionsOwned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        MetricPartitionsOwned,
			Help:        "Relay partitions this relay instance holds a lease on.",
			ConstLabels: cl,
		}),
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        MetricRelayUp,
			Help:        "1 while the relay runs and is ready (database and broker answer, cycles succeed), 0 otherwise.",
			ConstLabels: cl,
		}),
		mismatch: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        MetricRelayPartitionMismatch,
			Help:        "1 while the relay detects a relay partition mismatch (rows no relay can own, or a lease table that disagrees), else 0.",
			ConstLabels: cl,
		}),
		orderViolations: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        MetricOrderViolations,
			Help:        "Outbox messages acknowledged after an earlier message of their aggregate in the same batch failed (must stay 0).",
			ConstLabels: cl,
		}),
		transactions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        MetricTransactions,
			Help:        "Broker transactions of the exactly-once mode (one per relay partition per batch), by outcome (committed, aborted, unknown, fenced).",
			ConstLabels: cl,
		}, []string{"outcome"}),
		reconciledRows: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        MetricReconciledRows,
			Help:        "Rows marked sent by reconciling: committed at the broker, not yet marked in the database (each a duplicate avoided).",
			ConstLabels: cl,
		}),
		sourceMessages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        MetricSourceMessages,
			Help:        "Messages the relay's cycles found, by source (table: claimed; wal: read from the replication stream).",
			ConstLabels: cl,
		}, []string{"source"}),
		walStreaming: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        MetricWALStreaming,
			Help:        "1 while the relay reads its replication slot (relay.SourceWAL), else 0.",
			ConstLabels: cl,
		}),
		walConfirmed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        MetricWALConfirmedLSN,
			Help:        "The WAL source's slot's confirmed_flush_lsn, as a number (sampled by the relay reading it).",
			ConstLabels: cl,
		}),
		walUnconfirmed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        MetricWALUnconfirmedBytes,
			Help:        "pg_current_wal_lsn() - confirmed_flush_lsn of the WAL source's slot, in bytes: how far its reader is behind.",
			ConstLabels: cl,
		}),
		walRetained: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        MetricWALRetainedBytes,
			Help:        "pg_current_wal_lsn() - restart_lsn of the WAL source's slot, in bytes: the WAL it keeps on the server.",
			ConstLabels: cl,
		}),
		walDelay: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        MetricWALDecodeDelay,
			Help:        "Seconds between the commit of the last outbox transaction the walsender decoded and its arrival at the relay (0 once caught up).",
			ConstLabels: cl,
		}),
		walLoss: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        MetricWALLoss,
			Help:        "1 while a loss window of the log-only mode (a slot dropped or invalidated with events in it) is recorded and not acknowledged (outbox wal ack-loss).",
			ConstLabels: cl,
		}),
	}
	m.fromTable = m.sourceMessages.WithLabelValues(relay.SourceTable.String())
	m.fromWAL = m.sourceMessages.WithLabelValues(relay.SourceWAL.String())
	m.txnOutcomes = map[relay.TransactionOutcome]prometheus.Counter{}
	for _, o := range []relay.TransactionOutcome{relay.TxnCommitted, relay.TxnAborted, relay.TxnUnknown, relay.TxnFenced} {
		m.txnOutcomes[o] = m.transactions.WithLabelValues(string(o))
	}
	// Resolve the known classes once (no map lookup or allocation per
	// failure) and export them from the start at 0, so that rates and
	// ratios are defined before the first failure.
	m.errTransient = m.errors.WithLabelValues(string(relay.ClassTransient))
	m.errPermanent = m.errors.WithLabelValues(string(relay.ClassPermanent))
	m.errUnavailable = m.errors.WithLabelValues(string(relay.ClassUnavailable))
	m.errBatch = m.errors.WithLabelValues(string(relay.ClassBatch))
	return m
}

func (m *RelayMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.published, m.errors, m.retries, m.deadLettered,
		m.commitToPublish, m.batchSize, m.claimDuration, m.partitionsOwned, m.up, m.mismatch, m.orderViolations,
		m.transactions, m.reconciledRows, m.sourceMessages, m.walStreaming,
		m.walConfirmed, m.walUnconfirmed, m.walRetained, m.walDelay, m.walLoss}
}

// Describe implements prometheus.Collector: it sends the descriptors of
// every metric listed in the package documentation under RelayMetrics.
func (m *RelayMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector: it sends the current value of
// every RelayMetrics metric.
func (m *RelayMetrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

// Claimed implements relay.Observer: it observes n in outbox_batch_size
// and took, in seconds, in outbox_claim_duration_seconds.
func (m *RelayMetrics) Claimed(n int, took time.Duration) {
	m.batchSize.Observe(float64(n))
	m.claimDuration.Observe(took.Seconds())
}

// Published implements relay.Observer: it increments
// outbox_published_total and observes msg.Age + took, in seconds (never
// below 0), in outbox_commit_to_publish_seconds.
func (m *RelayMetrics) Published(msg relay.Message, took time.Duration) {
	m.published.Inc()
	m.commitToPublish.Observe(max(msg.Age+took, 0).Seconds())
}

// Failed implements relay.Observer: it increments
// outbox_publish_errors_total{class}.
func (m *RelayMetrics) Failed(_ relay.Message, class relay.ErrorClass, _ error) {
	switch class {
	case relay.ClassTransient:
		m.errTransient.Inc()
	case relay.ClassPermanent:
		m.errPermanent.Inc()
	case relay.ClassUnavailable:
		m.errUnavailable.Inc()
	case relay.ClassBatch:
		m.errBatch.Inc()
	default: // a class added to relay later
		m.errors.WithLabelValues(string(class)).Inc()
	}
}

// Retried implements relay.Observer: it increments outbox_retries_total.
func (m *RelayMetrics) Retried(relay.Message, int, time.Duration) {
	m.retries.Inc()
}

// DeadLettered implements relay.Observer: it increments
// outbox_dead_lettered_total.
func (m *RelayMetrics) DeadLettered(relay.Message, error) {
	m.deadLettered.Inc()
}

// Leases implements relay.Observer: it sets outbox_partitions_owned to
// owned.
func (m *RelayMetrics) Leases(owned int) {
	m.partitionsOwned.Set(float64(owned))
}

// Up implements relay.Observer: it sets outbox_relay_up to 1 or 0. When
// the relay stops it also sets outbox_partitions_owned to 0, since a
// stopping relay gives up its leases.
func (m *RelayMetrics) Up(up bool) {
	if up {
		m.up.Set(1)
		return
	}
	m.up.Set(0)
	m.partitionsOwned.Set(0)
}

// PartitionMismatch implements relay.PartitionObserver: it sets
// outbox_relay_partition_mismatch to 1 when err is not nil, else to 0.
func (m *RelayMetrics) PartitionMismatch(err error) {
	if err != nil {
		m.mismatch.Set(1)
		return
	}
	m.mismatch.Set(0)
}

// Readiness implements relay.ReadinessObserver: it sets outbox_relay_up to
// 1 when err is nil (the relay is ready again), else to 0 (the relay still
// runs and keeps its leases, so outbox_partitions_owned is left as is).
func (m *RelayMetrics) Readiness(err error) {
	if err != nil {
		m.up.Set(0)
		return
	}
	m.up.Set(1)
}

// OrderViolation implements relay.OrderObserver: it increments
// outbox_relay_order_violations_total.
func (m *RelayMetrics) OrderViolation(relay.Message) {
	m.orderViolations.Inc()
}

// Transaction implements relay.TransactionObserver: it increments
// outbox_transactions_total{outcome}.
func (m *RelayMetrics) Transaction(_ int, outcome relay.TransactionOutcome, _ int) {
	if c, ok := m.txnOutcomes[outcome]; ok {
		c.Inc()
		return
	}
	m.transactions.WithLabelValues(string(outcome)).Inc() // an outcome added to relay later
}

// WALStreaming implements relay.SourceObserver: it sets
// outbox_relay_wal_streaming to 1 or 0.
func (m *RelayMetrics) WALStreaming(streaming bool, _ error) {
	if streaming {
		m.walStreaming.Set(1)
		return
	}
	m.walStreaming.Set(0)
}

// WALLag implements relay.WALLagObserver: it sets
// outbox_relay_wal_confirmed_lsn, outbox_relay_wal_unconfirmed_bytes,
// outbox_relay_wal_retained_bytes and outbox_relay_wal_decode_delay_seconds.
func (m *RelayMetrics) WALLag(l relay.WALLag) {
	m.walConfirmed.Set(float64(l.ConfirmedLSN))
	m.walUnconfirmed.Set(float64(l.UnconfirmedBytes))
	m.walRetained.Set(float64(l.RetainedBytes))
	m.walDelay.Set(l.DecodeDelay.Seconds())
}

// WALLoss implements relay.WALLossObserver: it sets outbox_relay_wal_loss
// to 1 while l is a loss window, 0 when nil.
func (m *RelayMetrics) WALLoss(l *relay.WALLoss) {
	if l != nil {
		m.walLoss.Set(1)
		return
	}
	m.walLoss.Set(0)
}

// FromSource implements relay.SourceObserver: it adds n to
// outbox_relay_source_messages_total{source}.
func (m *RelayMetrics) FromSource(source relay.Source, n int) {
	if source == relay.SourceWAL {
		m.fromWAL.Add(float64(n))
		return
	}
	m.fromTable.Add(float64(n))
}

// Reconciled implements relay.TransactionObserver: it adds rows to
// outbox_reconciled_rows_total.
func (m *RelayMetrics) Reconciled(_ int, rows int) {
	m.reconciledRows.Add(float64(rows))
}
