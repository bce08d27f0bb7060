package outboxotel

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/relay"
)

// Names of the instruments Metrics creates, the OpenTelemetry counterparts
// of package metrics' Prometheus metrics (same facts, same histogram
// buckets; see the package documentation's Metrics). Every measurement
// carries TableKey and the attributes given WithMetricAttributes.
const (
	// MetricPublished is an Int64Counter, unit {message}, of messages the
	// broker acknowledged (metrics.MetricPublished).
	MetricPublished = "outbox.relay.published"
	// MetricPublishErrors is an Int64Counter, unit {message}, of publish
	// failures per message, with attribute error.type: the relay.ErrorClass
	// (transient, permanent, unavailable, batch) (metrics.MetricPublishErrors).
	MetricPublishErrors = "outbox.relay.publish.errors"
	// MetricRetries is an Int64Counter, unit {retry}, of retries scheduled
	// after a failed attempt (metrics.MetricRetries).
	MetricRetries = "outbox.relay.retries"
	// MetricDeadLettered is an Int64Counter, unit {message}, of messages
	// marked failed (metrics.MetricDeadLettered).
	MetricDeadLettered = "outbox.relay.dead_lettered"
	// MetricCommitToPublish is a Float64Histogram, unit s, of the time from
	// a message's commit (its row's creation, by the database clock) to the
	// broker's acknowledgement, with CommitToPublishBuckets
	// (metrics.MetricCommitToPublish).
	MetricCommitToPublish = "outbox.relay.commit_to_publish.duration"
	// MetricBatchSize is an Int64Histogram, unit {message}, of the messages
	// per non-empty claim (one Publish batch), with BatchSizeBuckets
	// (metrics.MetricBatchSize).
	MetricBatchSize = "outbox.relay.batch.size"
	// MetricClaimDuration is a Float64Histogram, unit s, of how long a
	// non-empty claim query took, with ClaimDurationBuckets
	// (metrics.MetricClaimDuration).
	MetricClaimDuration = "outbox.relay.claim.duration"
	// MetricPartitionsOwned is an Int64Gauge, unit {partition}, of the relay
	// partitions this instance holds a lease on; 0 once the relay stopped
	// (metrics.MetricPartitionsOwned).
	MetricPartitionsOwned = "outbox.relay.partitions.owned"
	// MetricUp is an Int64Gauge, unit 1: 1 while the relay runs and is
	// ready (relay.Relay.Ready returns nil), 0 when it stopped or is not
	// ready (metrics.MetricRelayUp). Nothing is recorded before the relay
	// starts.
	MetricUp = "outbox.relay.up"
	// MetricPartitionMismatch is an Int64Gauge, unit 1: 1 while the relay
	// detects a relay partition mismatch (relay.ErrPartitionMismatch), 0
	// once a check finds none (metrics.MetricRelayPartitionMismatch).
	MetricPartitionMismatch = "outbox.relay.partition_mismatch"
	// MetricOrderViolations is an Int64Counter, unit {message}, of
	// messages the publisher acknowledged although an earlier message of
	// their aggregate in the same batch had failed (relay.OrderObserver;
	// metrics.MetricOrderViolations). It must stay 0.
	MetricOrderViolations = "outbox.relay.order_violations"
	// MetricTransactions is an Int64Counter, unit {transaction}, of the
	// broker transactions of relay/kafka's exactly-once mode, one per
	// relay partition per batch, with the attribute TransactionOutcomeKey
	// (relay.TransactionOutcome; metrics.MetricTransactions).
	MetricTransactions = "outbox.relay.transactions"
	// MetricReconciledRows is an Int64Counter, unit {message}, of rows the
	// relay marked sent when it reconciled a partition: committed at the
	// broker, not yet marked in the database (metrics.MetricReconciledRows).
	MetricReconciledRows = "outbox.relay.reconciled_rows"
	// MetricSourceMessages is an Int64Counter, unit {message}, of the
	// messages the relay's cycles found, with the attribute SourceKey
	// (table or wal; relay.SourceObserver, metrics.MetricSourceMessages).
	MetricSourceMessages = "outbox.relay.source_messages"
	// MetricWALStreaming is an Int64Gauge, unit 1: 1 while a relay with
	// relay.SourceWAL reads its replication slot, else 0
	// (metrics.MetricWALStreaming).
	MetricWALStreaming = "outbox.relay.wal_streaming"
	// MetricWALConfirmedLSN is an Int64Gauge, unit 1: the WAL source's
	// slot's confirmed_flush_lsn as a number (relay.WALLagObserver,
	// metrics.MetricWALConfirmedLSN).
	MetricWALConfirmedLSN = "outbox.relay.wal_confirmed_lsn"
	// MetricWALUnconfirmedBytes is an Int64Gauge, unit By:
	// pg_current_wal_lsn() - confirmed_flush_lsn of the slot
	// (metrics.MetricWALUnconfirmedBytes).
	MetricWALUnconfirmedBytes = "outbox.relay.wal_unconfirmed"
	// MetricWALRetainedBytes is an Int64Gauge, unit By:
	// pg_current_wal_lsn() - restart_lsn of the slot, the WAL it keeps
	// (metrics.MetricWALRetainedBytes).
	MetricWALRetainedBytes = "outbox.relay.wal_retained"
	// MetricWALDecodeDelay is a Float64Gauge, unit s: how long after its
	// commit the relay received the last outbox transaction decoded, 0
	// once caught up (metrics.MetricWALDecodeDelay).
	MetricWALDecodeDelay = "outbox.relay.wal_decode_delay"
	// MetricWALLoss is an Int64Gauge: 1 while a loss window of the WAL
	// source's log-only mode is recorded and not acknowledged, else 0
	// (relay.WALLossObserver; metrics.MetricWALLoss).
	MetricWALLoss = "outbox.relay.wal_loss"
)

// SourceKey is MetricSourceMessages' attribute: table or wal
// (relay.Source's String).
const SourceKey = attribute.Key("outbox.relay.source")

// TransactionOutcomeKey is MetricTransactions' attribute: committed,
// aborted, unknown or fenced (relay.TransactionOutcome).
const TransactionOutcomeKey = attribute.Key("outbox.transaction.outcome")

// TableKey is the attribute of every Metrics measurement naming the outbox
// table the relay serves (driver.Config.Table), package metrics' table
// label.
const TableKey = attribute.Key("outbox.table")

// ErrInvalidConfig is returned (wrapped) by NewMetrics for a nil Outbox.
var ErrInvalidConfig = errors.New("outboxotel: invalid config")

// Histogram bucket boundaries of Metrics, the upper bounds of package
// metrics' Prometheus histograms (metrics/relay.go), so that both
// exporters aggregate alike and dashboards can move from one to the other.
// The package's tests keep them equal to the Prometheus ones.
var (
	// CommitToPublishBuckets, in seconds: 0.5 ms doubling to 65.5 s (18
	// boundaries), from a wake-up delivery to a minute of retries and polls.
	CommitToPublishBuckets = exponential(0.0005, 2, 18)
	// BatchSizeBuckets, in messages: a 1-2-5 series from 1 to 5000.
	BatchSizeBuckets = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000}
	// ClaimDurationBuckets, in seconds: 0.1 ms doubling to 6.6 s (17
	// boundaries).
	ClaimDurationBuckets = exponential(0.0001, 2, 17)
)

// exponential is prometheus.ExponentialBuckets for valid arguments.
func exponential(start, factor float64, n int) []float64 {
	b := make([]float64, n)
	for i := range b {
		b[i] = start
		start *= factor
	}
	return b
}

// Metrics is a relay.Observer that records what one relay does with
// OpenTelemetry metric instruments (the constants Metric* list them), the
// counterpart of package metrics' Prometheus RelayMetrics, and forwards
// every call to the Observer it wraps. It also implements
// relay.PartitionObserver and relay.ReadinessObserver (recorded and
// forwarded) and relay.PublishObserver (forwarded only, so that a tracing
// Observer wrapped by Metrics keeps its spans). Create it with NewMetrics;
// its methods only update instruments, never block, and are safe for
// concurrent use. A zero Metrics records nothing.
//
// Use one Metrics per Relay: the up and partitions-owned gauges describe
// a single relay instance.
type Metrics struct {
	next relay.Observer
	inst *instruments
}

type instruments struct {
	table           metric.MeasurementOption // TableKey and the extra attributes
	published       metric.Int64Counter
	errors          metric.Int64Counter
	errorsFor       map[relay.ErrorClass]metric.MeasurementOption
	extra           []attribute.KeyValue // for a class added to relay later
	retries         metric.Int64Counter
	deadLettered    metric.Int64Counter
	commitToPublish metric.Float64Histogram
	batchSize       metric.Int64Histogram
	claimDuration   metric.Float64Histogram
	partitionsOwned metric.Int64Gauge
	up              metric.Int64Gauge
	mismatch        metric.Int64Gauge
	orderViolations metric.Int64Counter
	transactions    metric.Int64Counter
	reconciledRows  metric.Int64Counter
	sourceMessages  metric.Int64Counter
	walStreaming    metric.Int64Gauge
	walConfirmed    metric.Int64Gauge
	walUnconfirmed  metric.Int64Gauge
	walRetained     metric.Int64Gauge
	walDelay        metric.Float64Gauge
	walLoss         metric.Int64Gauge
}

var (
	_ relay.Observer            = (*Metrics)(nil)
	_ relay.PartitionObserver   = (*Metrics)(nil)
	_ relay.ReadinessObserver   = (*Metrics)(nil)
	_ relay.PublishObserver     = (*Metrics)(nil)
	_ relay.OrderObserver       = (*Metrics)(nil)
	_ relay.TransactionObserver = (*Metrics)(nil)
	_ relay.SourceObserver      = (*Metrics)(nil)
	_ relay.WALLagObserver      = (*Metrics)(nil)
	_ relay.WALLossObserver     = (*Metrics)(nil)
)

// NewMetrics creates the relay instruments of ob's table (its
// driver.Config.Table is the TableKey attribute) with the meter named
// ScopeName of the configured provider (WithMeterProvider; default the
// global otel.GetMeterProvider()), and returns a Metrics forwarding to
// next (nil: nothing), for relay.Config.Observer. To trace as well, wrap
// one in the other, in either order; each forwards every call, optional
// interfaces included:
//
//	m, err := outboxotel.NewMetrics(ob, promMetrics) // promMetrics may be nil
//	if err != nil {
//		return err
//	}
//	cfg := relay.Config{Publisher: pub, Observer: outboxotel.NewObserver(m)}
//
// It returns ErrInvalidConfig (wrapped) for a nil ob, or the errors the
// meter returned creating instruments, wrapped and joined; it never
// panics.
func NewMetrics(ob *driver.Outbox, next relay.Observer, opts ...Option) (*Metrics, error) {
	if ob == nil {
		return nil, fmt.Errorf("%w: NewMetrics needs a *driver.Outbox", ErrInvalidConfig)
	}
	if next == nil {
		next = relay.NopObserver{}
	}
	c := newConfig(opts)
	table := ob.Config().Table
	meter := c.mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	// The table last: attribute.NewSet keeps the last value of a key.
	extra := append(append(make([]attribute.KeyValue, 0, len(c.metricAttrs)+1), c.metricAttrs...), TableKey.String(table))
	in := &instruments{
		table:     metric.WithAttributeSet(attribute.NewSet(extra...)),
		extra:     extra,
		errorsFor: map[relay.ErrorClass]metric.MeasurementOption{},
	}
	var errs []error
	check := func(name string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("outboxotel: creating instrument %s of table %q: %w", name, table, err))
		}
	}
	var err error
	in.published, err = meter.Int64Counter(MetricPublished, metric.WithUnit("{message}"),
		metric.WithDescription("Outbox messages acknowledged by the broker."))
	check(MetricPublished, err)
	in.errors, err = meter.Int64Counter(MetricPublishErrors, metric.WithUnit("{message}"),
		metric.WithDescription("Outbox messages whose publish failed, by error.type (transient, permanent, unavailable, batch)."))
	check(MetricPublishErrors, err)
	in.retries, err = meter.Int64Counter(MetricRetries, metric.WithUnit("{retry}"),
		metric.WithDescription("Outbox message retries scheduled after a failed publish attempt."))
	check(MetricRetries, err)
	in.deadLettered, err = meter.Int64Counter(MetricDeadLettered, metric.WithUnit("{message}"),
		metric.WithDescription("Outbox messages dead-lettered (marked failed)."))
	check(MetricDeadLettered, err)
	in.commitToPublish, err = meter.Float64Histogram(MetricCommitToPublish, metric.WithUnit("s"),
		metric.WithDescription("Time from an outbox message's commit to the broker's acknowledgement."),
		metric.WithExplicitBucketBoundaries(CommitToPublishBuckets...))
	check(MetricCommitToPublish, err)
	in.batchSize, err = meter.Int64Histogram(MetricBatchSize, metric.WithUnit("{message}"),
		metric.WithDescription("Outbox messages per non-empty relay claim (one publish batch)."),
		metric.WithExplicitBucketBoundaries(BatchSizeBuckets...))
	check(MetricBatchSize, err)
	in.claimDuration, err = meter.Float64Histogram(MetricClaimDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of a non-empty relay claim query."),
		metric.WithExplicitBucketBoundaries(ClaimDurationBuckets...))
	check(MetricClaimDuration, err)
	in.partitionsOwned, err = meter.Int64Gauge(MetricPartitionsOwned, metric.WithUnit("{partition}"),
		metric.WithDescription("Relay partitions this relay instance holds a lease on."))
	check(MetricPartitionsOwned, err)
	in.up, err = meter.Int64Gauge(MetricUp, metric.WithUnit("1"),
		metric.WithDescription("1 while the relay runs and is ready (database and broker answer, cycles succeed), 0 otherwise."))
	check(MetricUp, err)
	in.mismatch, err = meter.Int64Gauge(MetricPartitionMismatch, metric.WithUnit("1"),
		metric.WithDescription("1 while the relay detects a relay partition mismatch, else 0."))
	check(MetricPartitionMismatch, err)
	in.orderViolations, err = meter.Int64Counter(MetricOrderViolations, metric.WithUnit("{message}"),
		metric.WithDescription("Outbox messages acknowledged after an earlier message of their aggregate in the same batch failed (must stay 0)."))
	check(MetricOrderViolations, err)
	in.transactions, err = meter.Int64Counter(MetricTransactions, metric.WithUnit("{transaction}"),
		metric.WithDescription("Broker transactions of the exactly-once mode (one per relay partition per batch), by outcome."))
	check(MetricTransactions, err)
	in.reconciledRows, err = meter.Int64Counter(MetricReconciledRows, metric.WithUnit("{message}"),
		metric.WithDescription("Rows marked sent by reconciling: committed at the broker, not yet marked in the database."))
	check(MetricReconciledRows, err)
	in.sourceMessages, err = meter.Int64Counter(MetricSourceMessages, metric.WithUnit("{message}"),
		metric.WithDescription("Messages the relay's cycles found, by source (table: claimed; wal: read from the replication stream)."))
	check(MetricSourceMessages, err)
	in.walStreaming, err = meter.Int64Gauge(MetricWALStreaming, metric.WithUnit("1"),
		metric.WithDescription("1 while the relay reads its replication slot (relay.SourceWAL), else 0."))
	check(MetricWALStreaming, err)
	in.walConfirmed, err = meter.Int64Gauge(MetricWALConfirmedLSN, metric.WithUnit("1"),
		metric.WithDescription("The WAL source's slot's confirmed_flush_lsn, as a number (sampled by the relay reading it)."))
	check(MetricWALConfirmedLSN, err)
	in.walUnconfirmed, err = meter.Int64Gauge(MetricWALUnconfirmedBytes, metric.WithUnit("By"),
		metric.WithDescription("pg_current_wal_lsn() - confirmed_flush_lsn of the WAL source's slot: how far its reader is behind."))
	check(MetricWALUnconfirmedBytes, err)
	in.walRetained, err = meter.Int64Gauge(MetricWALRetainedBytes, metric.WithUnit("By"),
		metric.WithDescription("pg_current_wal_lsn() - restart_lsn of the WAL source's slot: the WAL it keeps on the server."))
	check(MetricWALRetainedBytes, err)
	in.walDelay, err = meter.Float64Gauge(MetricWALDecodeDelay, metric.WithUnit("s"),
		metric.WithDescription("Seconds between the commit of the last outbox transaction the walsender decoded and its arrival at the relay (0 once caught up)."))
	check(MetricWALDecodeDelay, err)
	in.walLoss, err = meter.Int64Gauge(MetricWALLoss, metric.WithUnit("1"),
		metric.WithDescription("1 while a loss window of the log-only mode (a slot dropped or invalidated with events in it) is recorded and not acknowledged."))
	check(MetricWALLoss, err)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	for _, class := range []relay.ErrorClass{relay.ClassTransient, relay.ClassPermanent, relay.ClassUnavailable, relay.ClassBatch} {
		in.errorsFor[class] = in.classOption(class)
	}
	return &Metrics{next: next, inst: in}, nil
}

// classOption is the measurement option of a failure of class.
func (in *instruments) classOption(class relay.ErrorClass) metric.MeasurementOption {
	kvs := append(append(make([]attribute.KeyValue, 0, len(in.extra)+1), in.extra...), semconv.ErrorTypeKey.String(string(class)))
	return metric.WithAttributeSet(attribute.NewSet(kvs...))
}

// observer is the wrapped Observer (NopObserver for a zero Metrics).
func (m *Metrics) observer() relay.Observer {
	if m == nil || m.next == nil {
		return relay.NopObserver{}
	}
	return m.next
}

// instruments returns m's instruments, nil for a zero Metrics.
func (m *Metrics) instruments() *instruments {
	if m == nil {
		return nil
	}
	return m.inst
}

// bg is the context of every measurement: the relay's callbacks carry
// none, and no exemplar or baggage is wanted from them.
var bg = context.Background()

// Claimed implements relay.Observer: it records n in
// outbox.relay.batch.size and took, in seconds, in
// outbox.relay.claim.duration, then forwards.
func (m *Metrics) Claimed(n int, took time.Duration) {
	if in := m.instruments(); in != nil {
		in.batchSize.Record(bg, int64(n), in.table)
		in.claimDuration.Record(bg, took.Seconds(), in.table)
	}
	m.observer().Claimed(n, took)
}

// Published implements relay.Observer: it adds 1 to outbox.relay.published
// and records msg.Age + took, in seconds (never below 0), in
// outbox.relay.commit_to_publish.duration, then forwards.
func (m *Metrics) Published(msg relay.Message, took time.Duration) {
	if in := m.instruments(); in != nil {
		in.published.Add(bg, 1, in.table)
		in.commitToPublish.Record(bg, max(msg.Age+took, 0).Seconds(), in.table)
	}
	m.observer().Published(msg, took)
}

// Failed implements relay.Observer: it adds 1 to
// outbox.relay.publish.errors with error.type = class, then forwards.
func (m *Metrics) Failed(msg relay.Message, class relay.ErrorClass, err error) {
	if in := m.instruments(); in != nil {
		opt, ok := in.errorsFor[class]
		if !ok { // a class added to relay later
			opt = in.classOption(class)
		}
		in.errors.Add(bg, 1, opt)
	}
	m.observer().Failed(msg, class, err)
}

// Retried implements relay.Observer: it adds 1 to outbox.relay.retries,
// then forwards.
func (m *Metrics) Retried(msg relay.Message, attempt int, delay time.Duration) {
	if in := m.instruments(); in != nil {
		in.retries.Add(bg, 1, in.table)
	}
	m.observer().Retried(msg, attempt, delay)
}

// DeadLettered implements relay.Observer: it adds 1 to
// outbox.relay.dead_lettered, then forwards.
func (m *Metrics) DeadLettered(msg relay.Message, err error) {
	if in := m.instruments(); in != nil {
		in.deadLettered.Add(bg, 1, in.table)
	}
	m.observer().DeadLettered(msg, err)
}

// Leases implements relay.Observer: it records owned in
// outbox.relay.partitions.owned, then forwards.
func (m *Metrics) Leases(owned int) {
	if in := m.instruments(); in != nil {
		in.partitionsOwned.Record(bg, int64(owned), in.table)
	}
	m.observer().Leases(owned)
}

// Up implements relay.Observer: it records 1 or 0 in outbox.relay.up and,
// when the relay stops (a stopping relay gives up its leases), 0 in
// outbox.relay.partitions.owned, then forwards.
func (m *Metrics) Up(up bool) {
	if in := m.instruments(); in != nil {
		if up {
			in.up.Record(bg, 1, in.table)
		} else {
			in.up.Record(bg, 0, in.table)
			in.partitionsOwned.Record(bg, 0, in.table)
		}
	}
	m.observer().Up(up)
}

// PartitionMismatch implements relay.PartitionObserver: it records 1 in
// outbox.relay.partition_mismatch when err is not nil, else 0, then
// forwards to the wrapped Observer if it implements
// relay.PartitionObserver.
func (m *Metrics) PartitionMismatch(err error) {
	if in := m.instruments(); in != nil {
		in.mismatch.Record(bg, boolInt(err != nil), in.table)
	}
	if po, ok := m.observer().(relay.PartitionObserver); ok {
		po.PartitionMismatch(err)
	}
}

// Readiness implements relay.ReadinessObserver: it records 1 in
// outbox.relay.up when err is nil (the relay is ready again), else 0 (the
// relay still runs and keeps its leases: outbox.relay.partitions.owned is
// left as is), then forwards to the wrapped Observer if it implements
// relay.ReadinessObserver.
func (m *Metrics) Readiness(err error) {
	if in := m.instruments(); in != nil {
		in.up.Record(bg, boolInt(err == nil), in.table)
	}
	if ro, ok := m.observer().(relay.ReadinessObserver); ok {
		ro.Readiness(err)
	}
}

// StartPublish implements relay.PublishObserver by forwarding to the
// wrapped Observer if it implements relay.PublishObserver (a tracing
// Observer, say); otherwise it returns ctx and an end that does nothing.
// Metrics records nothing here: the outcomes arrive through Published and
// Failed.
func (m *Metrics) StartPublish(ctx context.Context, msgs []relay.Message) (context.Context, func(error)) {
	if po, ok := m.observer().(relay.PublishObserver); ok {
		return po.StartPublish(ctx, msgs)
	}
	return ctx, func(error) {}
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// OrderViolation implements relay.OrderObserver: it adds 1 to
// outbox.relay.order_violations, then forwards to the wrapped Observer if
// it implements relay.OrderObserver.
func (m *Metrics) OrderViolation(msg relay.Message) {
	if in := m.instruments(); in != nil {
		in.orderViolations.Add(bg, 1, in.table)
	}
	if oo, ok := m.observer().(relay.OrderObserver); ok {
		oo.OrderViolation(msg)
	}
}

// Transaction implements relay.TransactionObserver: it adds 1 to
// outbox.relay.transactions with the outcome, then forwards to the
// wrapped Observer if it implements relay.TransactionObserver.
func (m *Metrics) Transaction(partition int, outcome relay.TransactionOutcome, messages int) {
	if in := m.instruments(); in != nil {
		kvs := append(append(make([]attribute.KeyValue, 0, len(in.extra)+1), in.extra...), TransactionOutcomeKey.String(string(outcome)))
		in.transactions.Add(bg, 1, metric.WithAttributeSet(attribute.NewSet(kvs...)))
	}
	if to, ok := m.observer().(relay.TransactionObserver); ok {
		to.Transaction(partition, outcome, messages)
	}
}

// Reconciled implements relay.TransactionObserver: it adds rows to
// outbox.relay.reconciled_rows, then forwards.
func (m *Metrics) Reconciled(partition, rows int) {
	if in := m.instruments(); in != nil {
		in.reconciledRows.Add(bg, int64(rows), in.table)
	}
	if to, ok := m.observer().(relay.TransactionObserver); ok {
		to.Reconciled(partition, rows)
	}
}

// WALStreaming implements relay.SourceObserver: it records 1 or 0 in
// outbox.relay.wal_streaming, then forwards to the wrapped Observer if it
// implements relay.SourceObserver.
func (m *Metrics) WALStreaming(streaming bool, err error) {
	if in := m.instruments(); in != nil {
		in.walStreaming.Record(bg, boolInt(streaming), in.table)
	}
	if so, ok := m.observer().(relay.SourceObserver); ok {
		so.WALStreaming(streaming, err)
	}
}

// WALLag implements relay.WALLagObserver: it records l in
// outbox.relay.wal_confirmed_lsn, wal_unconfirmed, wal_retained and
// wal_decode_delay, then forwards to the wrapped Observer if it
// implements relay.WALLagObserver.
func (m *Metrics) WALLag(l relay.WALLag) {
	if in := m.instruments(); in != nil {
		in.walConfirmed.Record(bg, int64(l.ConfirmedLSN), in.table)
		in.walUnconfirmed.Record(bg, l.UnconfirmedBytes, in.table)
		in.walRetained.Record(bg, l.RetainedBytes, in.table)
		in.walDelay.Record(bg, l.DecodeDelay.Seconds(), in.table)
	}
	if lo, ok := m.observer().(relay.WALLagObserver); ok {
		lo.WALLag(l)
	}
}

// WALLoss implements relay.WALLossObserver: it records 1 in
// outbox.relay.wal_loss while l is a loss window (0 for nil), then
// forwards to the wrapped Observer if it implements relay.WALLossObserver.
func (m *Metrics) WALLoss(l *relay.WALLoss) {
	if in := m.instruments(); in != nil {
		in.walLoss.Record(bg, boolInt(l != nil), in.table)
	}
	if lo, ok := m.observer().(relay.WALLossObserver); ok {
		lo.WALLoss(l)
	}
}

// FromSource implements relay.SourceObserver: it adds n to
// outbox.relay.source_messages with the source, then forwards to the
// wrapped Observer if it implements relay.SourceObserver.
func (m *Metrics) FromSource(source relay.Source, n int) {
	if in := m.instruments(); in != nil {
		kvs := append(append(make([]attribute.KeyValue, 0, len(in.extra)+1), in.extra...), SourceKey.String(source.String()))
		in.sourceMessages.Add(bg, int64(n), metric.WithAttributeSet(attribute.NewSet(kvs...)))
	}
	if so, ok := m.observer().(relay.SourceObserver); ok {
		so.FromSource(source, n)
	}
}
