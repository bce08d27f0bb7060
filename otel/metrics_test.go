package outboxotel_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/sqloutbox/outbox/driver"
	outboxotel "github.com/sqloutbox/outbox/otel"
	"github.com/sqloutbox/outbox/relay"
)

// callLog is a relay.Observer (with every optional interface) that logs
// the calls forwarded to it.
type callLog struct {
	mu    sync.Mutex
	calls []string
}

func (l *callLog) log(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, fmt.Sprintf(format, args...))
}

func (l *callLog) got() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

func (l *callLog) Claimed(n int, took time.Duration) { l.log("Claimed %d %v", n, took) }
func (l *callLog) Published(m relay.Message, took time.Duration) {
	l.log("Published %s %v", m.MessageID, took)
}
func (l *callLog) Failed(m relay.Message, c relay.ErrorClass, err error) {
	l.log("Failed %s %s %v", m.MessageID, c, err)
}
func (l *callLog) Retried(m relay.Message, attempt int, delay time.Duration) {
	l.log("Retried %s %d %v", m.MessageID, attempt, delay)
}
func (l *callLog) DeadLettered(m relay.Message, err error) {
	l.log("DeadLettered %s %v", m.MessageID, err)
}
func (l *callLog) Leases(owned int)               { l.log("Leases %d", owned) }
func (l *callLog) Up(up bool)                     { l.log("Up %v", up) }
func (l *callLog) PartitionMismatch(err error)    { l.log("PartitionMismatch %v", err) }
func (l *callLog) Readiness(err error)            { l.log("Readiness %v", err) }
func (l *callLog) OrderViolation(m relay.Message) { l.log("OrderViolation %s", m.MessageID) }
func (l *callLog) Transaction(p int, o relay.TransactionOutcome, n int) {
	l.log("Transaction %d %s %d", p, o, n)
}
func (l *callLog) Reconciled(p, rows int)           { l.log("Reconciled %d %d", p, rows) }
func (l *callLog) WALStreaming(on bool, err error)  { l.log("WALStreaming %v %v", on, err) }
func (l *callLog) FromSource(s relay.Source, n int) { l.log("FromSource %s %d", s, n) }
func (l *callLog) WALLag(w relay.WALLag) {
	l.log("WALLag %d %d %d %v", w.ConfirmedLSN, w.UnconfirmedBytes, w.RetainedBytes, w.DecodeDelay)
}
func (l *callLog) StartPublish(ctx context.Context, msgs []relay.Message) (context.Context, func(error)) {
	l.log("StartPublish %d", len(msgs))
	return ctx, func(err error) { l.log("end %v", err) }
}

// point is one expected data point: a counter's or gauge's value, or a
// histogram's count and sum.
type point struct {
	name  string
	unit  string
	attrs []attribute.KeyValue // beyond the table and the broker
	value float64              // counter, gauge: the value; histogram: the sum
	count uint64               // histogram only
}

type metricsBundle struct {
	reader *sdkmetric.ManualReader
	m      *outboxotel.Metrics
	next   *callLog
}

var broker = semconv.MessagingSystemKafka

// meterSetup returns a ManualReader, its MeterProvider (shut down at
// cleanup) and an Outbox on table orders_outbox.
func meterSetup(t *testing.T) (*sdkmetric.ManualReader, *sdkmetric.MeterProvider, *driver.Outbox) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	ob, err := driver.New(driver.Config{Dialect: driver.Postgres, Table: "orders_outbox"})
	if err != nil {
		t.Fatal(err)
	}
	return reader, mp, ob
}

func setupMetrics(t *testing.T) *metricsBundle {
	t.Helper()
	reader, mp, ob := meterSetup(t)
	next := &callLog{}
	m, err := outboxotel.NewMetrics(ob, next, outboxotel.WithMeterProvider(mp), outboxotel.WithMetricAttributes(broker))
	if err != nil {
		t.Fatal(err)
	}
	return &metricsBundle{reader: reader, m: m, next: next}
}

// collect returns the reader's metrics by name.
func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != outboxotel.ScopeName {
			t.Errorf("scope %q, want %q", sm.Scope.Name, outboxotel.ScopeName)
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// checkPoints: got holds exactly the instruments of want, each with its
// unit, and each of its points.
func checkPoints(t *testing.T, got map[string]metricdata.Metrics, want []point) {
	t.Helper()
	names := map[string]bool{}
	for _, w := range want {
		names[w.name] = true
		m, ok := got[w.name]
		if !ok {
			t.Errorf("%s: not recorded", w.name)
			continue
		}
		if m.Unit != w.unit {
			t.Errorf("%s: unit %q, want %q", w.name, m.Unit, w.unit)
		}
		set := attribute.NewSet(append([]attribute.KeyValue{outboxotel.TableKey.String("orders_outbox"), broker}, w.attrs...)...)
		if !findPoint(m.Data, set, w) {
			t.Errorf("%s: no point %v value %v count %d in %+v", w.name, set.Encoded(attribute.DefaultEncoder()), w.value, w.count, m.Data)
		}
	}
	for name := range got {
		if !names[name] {
			t.Errorf("%s recorded, want only %v", name, want)
		}
	}
}

func findPoint(data metricdata.Aggregation, set attribute.Set, w point) bool {
	switch d := data.(type) {
	case metricdata.Sum[int64]:
		if !d.IsMonotonic || d.Temporality != metricdata.CumulativeTemporality {
			return false
		}
		for _, p := range d.DataPoints {
			if p.Attributes.Equals(&set) && float64(p.Value) == w.value {
				return true
			}
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			if p.Attributes.Equals(&set) && float64(p.Value) == w.value {
				return true
			}
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			if p.Attributes.Equals(&set) && p.Value == w.value {
				return true
			}
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			if p.Attributes.Equals(&set) && p.Count == w.count && p.Sum == w.value {
				return true
			}
		}
	case metricdata.Histogram[int64]:
		for _, p := range d.DataPoints {
			if p.Attributes.Equals(&set) && p.Count == w.count && float64(p.Sum) == w.value {
				return true
			}
		}
	}
	return false
}

// TestMetrics: each Observer callback records the right instrument, value,
// unit and attributes, and is forwarded to the wrapped Observer.
func TestMetrics(t *testing.T) {
	t.Parallel()
	msg := relay.Message{MessageID: "m-1", Age: 1500 * time.Millisecond}
	boom := errors.New("boom")
	mismatch := fmt.Errorf("%w: 2 stored, 4 configured", relay.ErrPartitionMismatch)
	errType := semconv.ErrorTypeKey.String
	for _, tc := range []struct {
		name  string
		call  func(m *outboxotel.Metrics)
		want  []point
		calls []string
	}{
		{"Claimed", func(m *outboxotel.Metrics) { m.Claimed(7, 250*time.Millisecond) }, []point{
			{name: outboxotel.MetricBatchSize, unit: "{message}", value: 7, count: 1},
			{name: outboxotel.MetricClaimDuration, unit: "s", value: 0.25, count: 1},
		}, []string{"Claimed 7 250ms"}},
		{"Published", func(m *outboxotel.Metrics) { m.Published(msg, 500*time.Millisecond) }, []point{
			{name: outboxotel.MetricPublished, unit: "{message}", value: 1},
			{name: outboxotel.MetricCommitToPublish, unit: "s", value: 2, count: 1},
		}, []string{"Published m-1 500ms"}},
		{"PublishedNegativeAge", func(m *outboxotel.Metrics) {
			m.Published(relay.Message{Age: -time.Second}, 10*time.Millisecond) // database clock behind
		}, []point{
			{name: outboxotel.MetricPublished, unit: "{message}", value: 1},
			{name: outboxotel.MetricCommitToPublish, unit: "s", value: 0, count: 1},
		}, []string{"Published  10ms"}},
		{"FailedByClass", func(m *outboxotel.Metrics) {
			m.Failed(msg, relay.ClassTransient, boom)
			m.Failed(msg, relay.ClassTransient, boom)
			m.Failed(msg, relay.ClassPermanent, boom)
			m.Failed(msg, relay.ClassUnavailable, boom)
			m.Failed(msg, relay.ClassBatch, boom)
			m.Failed(msg, "future", boom)
		}, []point{
			{name: outboxotel.MetricPublishErrors, unit: "{message}", attrs: []attribute.KeyValue{errType("transient")}, value: 2},
			{name: outboxotel.MetricPublishErrors, unit: "{message}", attrs: []attribute.KeyValue{errType("permanent")}, value: 1},
			{name: outboxotel.MetricPublishErrors, unit: "{message}", attrs: []attribute.KeyValue{errType("unavailable")}, value: 1},
			{name: outboxotel.MetricPublishErrors, unit: "{message}", attrs: []attribute.KeyValue{errType("batch")}, value: 1},
			{name: outboxotel.MetricPublishErrors, unit: "{message}", attrs: []attribute.KeyValue{errType("future")}, value: 1},
		}, []string{"Failed m-1 transient boom", "Failed m-1 transient boom", "Failed m-1 permanent boom",
			"Failed m-1 unavailable boom", "Failed m-1 batch boom", "Failed m-1 future boom"}},
		{"Retried", func(m *outboxotel.Metrics) { m.Retried(msg, 3, time.Second) }, []point{
			{name: outboxotel.MetricRetries, unit: "{retry}", value: 1},
		}, []string{"Retried m-1 3 1s"}},
		{"DeadLettered", func(m *outboxotel.Metrics) { m.DeadLettered(msg, boom) }, []point{
			{name: outboxotel.MetricDeadLettered, unit: "{message}", value: 1},
		}, []string{"DeadLettered m-1 boom"}},
		{"Leases", func(m *outboxotel.Metrics) { m.Leases(5); m.Leases(3) }, []point{
			{name: outboxotel.MetricPartitionsOwned, unit: "{partition}", value: 3},
		}, []string{"Leases 5", "Leases 3"}},
		{"Up", func(m *outboxotel.Metrics) { m.Leases(4); m.Up(true) }, []point{
			{name: outboxotel.MetricPartitionsOwned, unit: "{partition}", value: 4},
			{name: outboxotel.MetricUp, unit: "1", value: 1},
		}, []string{"Leases 4", "Up true"}},
		{"Down", func(m *outboxotel.Metrics) { m.Up(true); m.Leases(4); m.Up(false) }, []point{
			{name: outboxotel.MetricPartitionsOwned, unit: "{partition}", value: 0},
			{name: outboxotel.MetricUp, unit: "1", value: 0},
		}, []string{"Up true", "Leases 4", "Up false"}},
		{"NotReady", func(m *outboxotel.Metrics) { m.Up(true); m.Leases(2); m.Readiness(boom) }, []point{
			{name: outboxotel.MetricPartitionsOwned, unit: "{partition}", value: 2},
			{name: outboxotel.MetricUp, unit: "1", value: 0},
		}, []string{"Up true", "Leases 2", "Readiness boom"}},
		{"ReadyAgain", func(m *outboxotel.Metrics) { m.Readiness(boom); m.Readiness(nil) }, []point{
			{name: outboxotel.MetricUp, unit: "1", value: 1},
		}, []string{"Readiness boom", "Readiness <nil>"}},
		{"PartitionMismatch", func(m *outboxotel.Metrics) { m.PartitionMismatch(mismatch) }, []point{
			{name: outboxotel.MetricPartitionMismatch, unit: "1", value: 1},
		}, []string{"PartitionMismatch " + mismatch.Error()}},
		{"PartitionMismatchCleared", func(m *outboxotel.Metrics) { m.PartitionMismatch(mismatch); m.PartitionMismatch(nil) }, []point{
			{name: outboxotel.MetricPartitionMismatch, unit: "1", value: 0},
		}, []string{"PartitionMismatch " + mismatch.Error(), "PartitionMismatch <nil>"}},
		{"OrderViolation", func(m *outboxotel.Metrics) { m.OrderViolation(msg); m.OrderViolation(msg) }, []point{
			{name: outboxotel.MetricOrderViolations, unit: "{message}", value: 2},
		}, []string{"OrderViolation " + msg.MessageID, "OrderViolation " + msg.MessageID}},
		{"Transactions", func(m *outboxotel.Metrics) {
			m.Transaction(3, relay.TxnAborted, 5)
			m.Transaction(4, relay.TxnAborted, 1)
			m.Reconciled(3, 40)
		}, []point{
			{name: outboxotel.MetricTransactions, unit: "{transaction}", attrs: []attribute.KeyValue{outboxotel.TransactionOutcomeKey.String("aborted")}, value: 2},
			{name: outboxotel.MetricReconciledRows, unit: "{message}", value: 40},
		}, []string{"Transaction 3 aborted 5", "Transaction 4 aborted 1", "Reconciled 3 40"}},
		{"Sources", func(m *outboxotel.Metrics) {
			m.FromSource(relay.SourceTable, 300)
			m.FromSource(relay.SourceWAL, 20)
			m.FromSource(relay.SourceWAL, 22)
			m.WALStreaming(false, boom)
			m.WALStreaming(true, nil)
		}, []point{
			{name: outboxotel.MetricSourceMessages, unit: "{message}", attrs: []attribute.KeyValue{outboxotel.SourceKey.String("table")}, value: 300},
			{name: outboxotel.MetricSourceMessages, unit: "{message}", attrs: []attribute.KeyValue{outboxotel.SourceKey.String("wal")}, value: 42},
			{name: outboxotel.MetricWALStreaming, unit: "1", value: 1},
		}, []string{"FromSource table 300", "FromSource wal 20", "FromSource wal 22", "WALStreaming false boom", "WALStreaming true <nil>"}},
		{"WALLag", func(m *outboxotel.Metrics) {
			m.WALLag(relay.WALLag{ConfirmedLSN: 23803720, UnconfirmedBytes: 512, RetainedBytes: 8192, DecodeDelay: 1500 * time.Millisecond})
		}, []point{
			{name: outboxotel.MetricWALConfirmedLSN, unit: "1", value: 23803720},
			{name: outboxotel.MetricWALUnconfirmedBytes, unit: "By", value: 512},
			{name: outboxotel.MetricWALRetainedBytes, unit: "By", value: 8192},
			{name: outboxotel.MetricWALDecodeDelay, unit: "s", value: 1.5},
		}, []string{"WALLag 23803720 512 8192 1.5s"}},
		{"StartPublishForwardsOnly", func(m *outboxotel.Metrics) {
			_, end := m.StartPublish(context.Background(), []relay.Message{msg, msg})
			end(boom)
		}, nil, []string{"StartPublish 2", "end boom"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupMetrics(t)
			tc.call(b.m)
			checkPoints(t, collect(t, b.reader), tc.want)
			if got := b.next.got(); !slices.Equal(got, tc.calls) {
				t.Errorf("forwarded %q, want %q", got, tc.calls)
			}
		})
	}
}

// TestMetricsBuckets: the histograms aggregate with the documented
// boundaries (the integration module checks these against package
// metrics' Prometheus buckets).
func TestMetricsBuckets(t *testing.T) {
	t.Parallel()
	b := setupMetrics(t)
	b.m.Claimed(1, time.Millisecond)
	b.m.Published(relay.Message{}, time.Millisecond)
	got := collect(t, b.reader)
	for name, want := range map[string][]float64{
		outboxotel.MetricCommitToPublish: outboxotel.CommitToPublishBuckets,
		outboxotel.MetricClaimDuration:   outboxotel.ClaimDurationBuckets,
		outboxotel.MetricBatchSize:       outboxotel.BatchSizeBuckets,
	} {
		var bounds []float64
		switch d := got[name].Data.(type) {
		case metricdata.Histogram[float64]:
			bounds = d.DataPoints[0].Bounds
		case metricdata.Histogram[int64]:
			bounds = d.DataPoints[0].Bounds
		}
		if !slices.Equal(bounds, want) {
			t.Errorf("%s: bounds %v, want %v", name, bounds, want)
		}
	}
	if n, last := len(outboxotel.CommitToPublishBuckets), outboxotel.CommitToPublishBuckets[17]; n != 18 || last != 65.536 {
		t.Errorf("CommitToPublishBuckets: %d up to %v, want 18 up to 65.536", n, last)
	}
	if n, last := len(outboxotel.ClaimDurationBuckets), outboxotel.ClaimDurationBuckets[16]; n != 17 || last != 6.5536 {
		t.Errorf("ClaimDurationBuckets: %d up to %v, want 17 up to 6.5536", n, last)
	}
}

// TestMetricsNilAndZero: a nil next observes nothing more, zero-value
// messages and a zero Metrics do not panic, a nil Outbox is an error.
func TestMetricsNilAndZero(t *testing.T) {
	t.Parallel()
	exercise := func(m *outboxotel.Metrics) {
		var zero relay.Message
		m.Claimed(0, 0)
		m.Published(zero, 0)
		m.Failed(zero, "", nil)
		m.Retried(zero, 0, 0)
		m.DeadLettered(zero, nil)
		m.Leases(0)
		m.Up(true)
		m.Up(false)
		m.PartitionMismatch(nil)
		m.Readiness(nil)
		m.OrderViolation(zero)
		ctx, end := m.StartPublish(context.Background(), nil)
		if ctx == nil || end == nil {
			t.Error("StartPublish returned a nil context or end")
		} else {
			end(nil)
		}
	}
	t.Run("NilNext", func(t *testing.T) {
		t.Parallel()
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
		ob, err := driver.New(driver.Config{Dialect: driver.SQLite})
		if err != nil {
			t.Fatal(err)
		}
		m, err := outboxotel.NewMetrics(ob, nil, outboxotel.WithMeterProvider(mp), nil)
		if err != nil {
			t.Fatal(err)
		}
		exercise(m)
		got := collect(t, reader)
		pub, ok := got[outboxotel.MetricPublished].Data.(metricdata.Sum[int64])
		if !ok || len(pub.DataPoints) != 1 || pub.DataPoints[0].Value != 1 {
			t.Fatalf("published %+v, want 1", got[outboxotel.MetricPublished].Data)
		}
		if v, _ := pub.DataPoints[0].Attributes.Value(outboxotel.TableKey); v.AsString() != driver.DefaultTable {
			t.Errorf("table attribute %q, want %q", v.AsString(), driver.DefaultTable)
		}
		if _, ok := got[outboxotel.MetricPublishErrors]; !ok {
			t.Error("a failure of an empty class was not counted")
		}
	})
	t.Run("ZeroMetrics", func(t *testing.T) {
		t.Parallel()
		exercise(&outboxotel.Metrics{})
		var m *outboxotel.Metrics
		exercise(m)
	})
	t.Run("NilOutbox", func(t *testing.T) {
		t.Parallel()
		if _, err := outboxotel.NewMetrics(nil, nil); !errors.Is(err, outboxotel.ErrInvalidConfig) {
			t.Errorf("NewMetrics(nil) = %v, want ErrInvalidConfig", err)
		}
	})
	t.Run("GlobalProvider", func(t *testing.T) {
		t.Parallel()
		ob, err := driver.New(driver.Config{Dialect: driver.SQLite})
		if err != nil {
			t.Fatal(err)
		}
		m, err := outboxotel.NewMetrics(ob, nil) // the global no-op provider
		if err != nil {
			t.Fatal(err)
		}
		exercise(m)
	})
}

// TestMetricsAttributeOverrides: the table and the error class win over
// WithMetricAttributes' attributes of the same keys.
func TestMetricsAttributeOverrides(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	ob, err := driver.New(driver.Config{Dialect: driver.Postgres, Table: "orders_outbox"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := outboxotel.NewMetrics(ob, nil, outboxotel.WithMeterProvider(mp),
		outboxotel.WithMetricAttributes(outboxotel.TableKey.String("other"), semconv.ErrorTypeKey.String("x")),
		outboxotel.WithMetricAttributes(broker))
	if err != nil {
		t.Fatal(err)
	}
	m.Failed(relay.Message{}, relay.ClassBatch, nil)
	checkPoints(t, collect(t, reader), []point{
		{name: outboxotel.MetricPublishErrors, unit: "{message}", attrs: []attribute.KeyValue{semconv.ErrorTypeKey.String("batch")}, value: 1},
	})
}

// TestMetricsAndObserverCombine: the tracing Observer and Metrics wrap
// each other in either order; every call reaches the innermost Observer,
// StartPublish included.
func TestMetricsAndObserverCombine(t *testing.T) {
	t.Parallel()
	for _, order := range []string{"ObserverOutside", "MetricsOutside"} {
		t.Run(order, func(t *testing.T) {
			t.Parallel()
			tb := setup(t)
			reader, mp, ob := meterSetup(t)
			inner := &callLog{}
			var obs relay.Observer
			tracing := []outboxotel.Option{outboxotel.WithTracerProvider(tb.tp), outboxotel.WithPropagator(w3c)}
			metrics := []outboxotel.Option{outboxotel.WithMeterProvider(mp), outboxotel.WithMetricAttributes(broker)}
			if order == "ObserverOutside" {
				m, err := outboxotel.NewMetrics(ob, inner, metrics...)
				if err != nil {
					t.Fatal(err)
				}
				obs = outboxotel.NewObserver(m, tracing...)
			} else {
				var err error
				obs, err = outboxotel.NewMetrics(ob, outboxotel.NewObserver(inner, tracing...), metrics...)
				if err != nil {
					t.Fatal(err)
				}
			}
			msg := relay.Message{MessageID: "m-1", AggregateType: "order"}
			_, end := obs.(relay.PublishObserver).StartPublish(context.Background(), []relay.Message{msg})
			end(nil)
			obs.Published(msg, time.Millisecond)
			obs.(relay.ReadinessObserver).Readiness(nil)
			obs.(relay.PartitionObserver).PartitionMismatch(nil)
			obs.(relay.OrderObserver).OrderViolation(msg)
			want := []string{"StartPublish 1", "end <nil>", "Published m-1 1ms", "Readiness <nil>", "PartitionMismatch <nil>", "OrderViolation m-1"}
			if got := inner.got(); !slices.Equal(got, want) {
				t.Errorf("forwarded %q, want %q", got, want)
			}
			if spans := tb.rec.Ended(); len(spans) != 1 || spans[0].Name() != "send outbox.event.order" {
				t.Errorf("spans %v, want one send outbox.event.order", spans)
			}
			checkPoints(t, collect(t, reader), []point{
				{name: outboxotel.MetricPublished, unit: "{message}", value: 1},
				{name: outboxotel.MetricCommitToPublish, unit: "s", value: 0.001, count: 1},
				{name: outboxotel.MetricUp, unit: "1", value: 1},
				{name: outboxotel.MetricPartitionMismatch, unit: "1", value: 0},
				{name: outboxotel.MetricOrderViolations, unit: "{message}", value: 1},
			})
		})
	}
}
