package outboxotel_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/metrics"
	outboxotel "github.com/sqloutbox/outbox/otel"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

// otelMetrics reads a ManualReader: the data of each instrument by name.
func otelMetrics(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// sum is a counter's total over its points with error.type class ("" for
// a counter without error.type).
func sum(data metricdata.Aggregation, class string) int64 {
	s, _ := data.(metricdata.Sum[int64])
	var n int64
	for _, p := range s.DataPoints {
		if v, _ := p.Attributes.Value(semconv.ErrorTypeKey); v.AsString() == class {
			n += p.Value
		}
	}
	return n
}

func gaugeValue(data metricdata.Aggregation) (int64, bool) {
	g, ok := data.(metricdata.Gauge[int64])
	if !ok || len(g.DataPoints) != 1 {
		return 0, false
	}
	return g.DataPoints[0].Value, true
}

// promHistogram returns the Prometheus histogram name of reg: its count and
// upper bounds.
func promHistogram(t *testing.T, reg *prometheus.Registry, name string) (uint64, []float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name || len(mf.GetMetric()) != 1 {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		bounds := make([]float64, 0, len(h.GetBucket()))
		for _, b := range h.GetBucket() {
			bounds = append(bounds, b.GetUpperBound())
		}
		return h.GetSampleCount(), bounds
	}
	t.Fatalf("no histogram %s", name)
	return 0, nil
}

func promCounter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && mf.GetType() == dto.MetricType_COUNTER && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}

// TestMetricsEndToEnd: a relay on each database publishes N events and a
// poison one (dead-lettered as permanent) through the tracing Observer
// wrapping outboxotel.Metrics wrapping Prometheus' RelayMetrics: the
// ManualReader shows N published, N commit-to-publish observations, the
// failure and the dead letter, up while the relay runs and down after it
// stopped; Prometheus counts the same (every call reached it) with the
// same histogram buckets; the spans were made.
func TestMetricsEndToEnd(t *testing.T) {
	t.Parallel()
	const n = 25
	for _, tg := range testdb.All {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			reader := sdkmetric.NewManualReader()
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
			t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
			spans := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

			e := testdb.New(t, tg, driver.Config{Capture: outboxotel.Capture(outboxotel.WithPropagator(w3c))})
			reg := prometheus.NewRegistry()
			prom, err := metrics.NewRelayMetrics(reg, e.Outbox)
			if err != nil {
				t.Fatal(err)
			}
			om, err := outboxotel.NewMetrics(e.Outbox, prom, outboxotel.WithMeterProvider(mp),
				outboxotel.WithMetricAttributes(semconv.MessagingSystemKafka))
			if err != nil {
				t.Fatal(err)
			}
			pub := outboxtest.NewPublisher()
			pub.FailWith(func(m relay.Message) error {
				if m.AggregateID == "poison" {
					return fmt.Errorf("%w: refused", relay.ErrPermanent)
				}
				return nil
			})
			r, err := relay.New(e.Outbox, e.RelayDB, relay.Config{
				Publisher: pub, PollInterval: 20 * time.Millisecond, Wakeup: e.Outbox.Wakeup(),
				Observer: outboxtest.WatchOrder(t, outboxotel.NewObserver(om, outboxotel.WithPropagator(w3c), outboxotel.WithTracerProvider(tp))),
				Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
			})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- r.Run(context.Background()) }()
			stopped := false
			stop := func() {
				stopped = true
				sctx, c := context.WithTimeout(context.Background(), 10*time.Second)
				defer c()
				if err := r.Stop(sctx); err != nil {
					t.Errorf("relay stop: %v", err)
				}
				if err := <-done; err != nil {
					t.Errorf("relay run: %v", err)
				}
			}
			t.Cleanup(func() {
				if !stopped {
					stop()
				}
			})

			ids := make([]string, 0, n)
			for i := range n + 1 {
				agg := fmt.Sprintf("o-%d", i%5)
				if i == n {
					agg = "poison"
				}
				tctx := outbox.NewContext(ctx)
				tx, err := e.DB.BeginTx(tctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				id := fmt.Sprintf("msg-%d", i)
				if err := outbox.Emit(tctx, outbox.Event{ID: id, AggregateType: "order", AggregateID: agg, Type: "order.paid", Payload: []byte(`{}`)}); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				if i < n {
					ids = append(ids, id)
				}
			}
			if _, err := pub.WaitForIDs(ctx, ids...); err != nil {
				t.Fatalf("published: %v", err)
			}
			// The relay observes after Publish returns: wait for the reader.
			testdb.Eventually(t, ctx, "the OTel metrics of every outcome", func() bool {
				got := otelMetrics(t, reader)
				return sum(got[outboxotel.MetricPublished], "") == n && sum(got[outboxotel.MetricDeadLettered], "") == 1
			})
			got := otelMetrics(t, reader)
			h, ok := got[outboxotel.MetricCommitToPublish].(metricdata.Histogram[float64])
			if !ok || len(h.DataPoints) != 1 || h.DataPoints[0].Count != n {
				t.Errorf("%s: %+v, want one point of count %d", outboxotel.MetricCommitToPublish, got[outboxotel.MetricCommitToPublish], n)
			} else {
				p := h.DataPoints[0]
				if v, _ := p.Attributes.Value(outboxotel.TableKey); v.AsString() != e.Outbox.Config().Table {
					t.Errorf("table attribute %q, want %q", v.AsString(), e.Outbox.Config().Table)
				}
				if v, _ := p.Attributes.Value(semconv.MessagingSystemKey); v.AsString() != "kafka" {
					t.Errorf("messaging.system %q, want kafka", v.AsString())
				}
				count, bounds := promHistogram(t, reg, metrics.MetricCommitToPublish)
				if count != n || !slices.Equal(bounds, p.Bounds) || !slices.Equal(bounds, outboxotel.CommitToPublishBuckets) {
					t.Errorf("Prometheus %s: count %d bounds %v; OTel bounds %v, want count %d and equal bounds",
						metrics.MetricCommitToPublish, count, bounds, p.Bounds, n)
				}
			}
			if v := sum(got[outboxotel.MetricPublishErrors], string(relay.ClassPermanent)); v != 1 {
				t.Errorf("%s{error.type=permanent} = %d, want 1", outboxotel.MetricPublishErrors, v)
			}
			if v := promCounter(t, reg, metrics.MetricPublished); v != n {
				t.Errorf("Prometheus %s = %v, want %d (forwarded)", metrics.MetricPublished, v, n)
			}
			for name, want := range map[string][]float64{
				metrics.MetricBatchSize:     outboxotel.BatchSizeBuckets,
				metrics.MetricClaimDuration: outboxotel.ClaimDurationBuckets,
			} {
				if _, bounds := promHistogram(t, reg, name); !slices.Equal(bounds, want) {
					t.Errorf("Prometheus %s bounds %v, outboxotel's %v", name, bounds, want)
				}
			}
			bs, ok := got[outboxotel.MetricBatchSize].(metricdata.Histogram[int64])
			if !ok || len(bs.DataPoints) != 1 || bs.DataPoints[0].Sum < n+1 {
				t.Errorf("%s: %+v, want claims summing to at least %d", outboxotel.MetricBatchSize, got[outboxotel.MetricBatchSize], n+1)
			}
			if _, ok := got[outboxotel.MetricClaimDuration].(metricdata.Histogram[float64]); !ok {
				t.Errorf("%s not recorded", outboxotel.MetricClaimDuration)
			}
			if v, ok := gaugeValue(got[outboxotel.MetricUp]); !ok || v != 1 {
				t.Errorf("%s = %d (%v), want 1 while running", outboxotel.MetricUp, v, ok)
			}
			if v, ok := gaugeValue(got[outboxotel.MetricPartitionsOwned]); !ok || v < 1 {
				t.Errorf("%s = %d (%v), want the relay's partitions", outboxotel.MetricPartitionsOwned, v, ok)
			}
			if len(spans.Ended()) == 0 {
				t.Error("no publish span: the tracing Observer outside Metrics made none")
			}

			stop()
			got = otelMetrics(t, reader)
			if v, ok := gaugeValue(got[outboxotel.MetricUp]); !ok || v != 0 {
				t.Errorf("%s = %d (%v), want 0 after Stop", outboxotel.MetricUp, v, ok)
			}
			if v, ok := gaugeValue(got[outboxotel.MetricPartitionsOwned]); !ok || v != 0 {
				t.Errorf("%s = %d (%v), want 0 after Stop", outboxotel.MetricPartitionsOwned, v, ok)
			}
		})
	}
}
