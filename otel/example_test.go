package outboxotel_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	outboxotel "github.com/sqloutbox/outbox/otel"
	"github.com/sqloutbox/outbox/relay"
)

// ExampleCapture shows the headers Emit adds for the span active in its
// context.
func ExampleCapture() {
	capture := outboxotel.Capture(outboxotel.WithPropagator(propagation.TraceContext{}))
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd, 0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80, 0x31, 0x9c},
		SpanID:     trace.SpanID{0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31},
		TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	fmt.Println(capture(ctx, nil))
	fmt.Println(capture(ctx, map[string]string{"traceparent": "set by the application"}))
	// Output:
	// map[traceparent:00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01]
	// map[]
}

// Example wires tracing into the writer, the relay and a consumer.
func Example() {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))

	// Writer: capture the trace context at every Emit.
	ob, err := driver.New(driver.Config{Dialect: driver.Postgres, Capture: outboxotel.Capture()})
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = ob // driver.Register or ob.Wrap / ob.WrapConnector as usual
	_ = outbox.Middleware(http.NotFoundHandler())

	// Relay: a producer span per published batch, linked to each message's origin.
	cfg := relay.Config{Observer: outboxotel.NewObserver(nil /* or your metrics.RelayMetrics */)}
	_ = cfg

	// Consumer: continue the trace from a received message; Extract reads
	// its headers through a lookup (the package documentation has one for
	// each broker client).
	consume := func(ctx context.Context, topic string, headers map[string][]string) {
		ctx, span := otel.Tracer("consumer").Start(outboxotel.Extract(ctx, func(k string) string {
			if v := headers[k]; len(v) > 0 {
				return v[0]
			}
			return ""
		}), "process "+topic, trace.WithSpanKind(trace.SpanKindConsumer))
		defer span.End()
		_ = ctx
	}
	_ = consume
}

// ExampleExtract continues a trace from a received message's headers, here
// Kafka-style key/value pairs (a franz-go record's rec.Headers has this
// shape).
func ExampleExtract() {
	type header struct {
		Key   string
		Value []byte
	}
	headers := []header{
		{Key: "outbox-message-id", Value: []byte("m-1")},
		{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")},
	}
	ctx := outboxotel.Extract(context.Background(), func(k string) string {
		for _, h := range headers {
			if h.Key == k {
				return string(h.Value)
			}
		}
		return ""
	}, outboxotel.WithPropagator(propagation.TraceContext{}))
	sc := trace.SpanContextFromContext(ctx)
	fmt.Println(sc.TraceID(), sc.SpanID(), sc.IsRemote())
	// Output:
	// 0af7651916cd43dd8448eb211c80319c b7ad6b7169203331 true
}

// ExampleExtractMap continues a trace from headers held in a map, such as
// an inbox.Message's Headers.
func ExampleExtractMap() {
	headers := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	ctx := outboxotel.ExtractMap(context.Background(), headers, outboxotel.WithPropagator(propagation.TraceContext{}))
	fmt.Println(trace.SpanContextFromContext(ctx).TraceID())
	// Output:
	// 0af7651916cd43dd8448eb211c80319c
}

// ExampleNewMetrics records the relay's metrics with OpenTelemetry beside
// its spans (give metrics.RelayMetrics instead of nil to keep Prometheus
// too); a ManualReader stands in for an exporter.
func ExampleNewMetrics() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	ob, err := driver.New(driver.Config{Dialect: driver.Postgres})
	if err != nil {
		fmt.Println(err)
		return
	}
	m, err := outboxotel.NewMetrics(ob, nil /* or your metrics.RelayMetrics */, outboxotel.WithMeterProvider(mp))
	if err != nil {
		fmt.Println(err)
		return
	}
	cfg := relay.Config{Observer: outboxotel.NewObserver(m)} // spans and metrics
	_ = cfg

	m.Published(relay.Message{Age: 40 * time.Millisecond}, 10*time.Millisecond) // what the relay calls
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		fmt.Println(err)
		return
	}
	for _, sm := range rm.ScopeMetrics {
		for _, md := range sm.Metrics {
			switch d := md.Data.(type) {
			case metricdata.Sum[int64]:
				fmt.Println(md.Name, md.Unit, d.DataPoints[0].Value)
			case metricdata.Histogram[float64]:
				fmt.Println(md.Name, md.Unit, d.DataPoints[0].Count, d.DataPoints[0].Sum)
			}
		}
	}
	// Output:
	// outbox.relay.published {message} 1
	// outbox.relay.commit_to_publish.duration s 1 0.05
}
