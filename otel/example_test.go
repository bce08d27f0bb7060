package outboxotel_test

import (
	"context"
	"fmt"
	"net/http"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
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

	// Consumer: continue the trace from a received record.
	consume := func(ctx context.Context, rec *kgo.Record) {
		ctx, span := otel.Tracer("consumer").Start(outboxotel.ExtractFranz(ctx, rec), "process "+rec.Topic,
			trace.WithSpanKind(trace.SpanKindConsumer))
		defer span.End()
		_ = ctx
	}
	_ = consume
}
