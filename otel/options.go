package outboxotel

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sqloutbox/outbox/relay"
)

// ScopeName is the instrumentation scope name of the tracer NewObserver
// uses and of the meter NewMetrics uses.
const ScopeName = "github.com/sqloutbox/outbox/otel"

// Option configures Capture, NewObserver, NewMetrics, Extract and
// ExtractMap; each uses the options that apply to it (the extractors and
// Capture only WithPropagator; NewMetrics only WithMeterProvider and
// WithMetricAttributes) and ignores the others. A nil Option is ignored.
type Option func(*config)

type config struct {
	prop        propagation.TextMapPropagator
	tp          trace.TracerProvider
	mp          metric.MeterProvider
	metricAttrs []attribute.KeyValue
	topic       func(relay.Message) string
	perMessage  bool
}

// WithPropagator sets the propagator that injects the trace context into
// events' headers (Capture) and extracts it from them (NewObserver's
// links, Extract, ExtractMap). Default (or nil): the global
// otel.GetTextMapPropagator(). Give writers, relays and consumers the same
// propagator.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) { c.prop = p }
}

// WithTracerProvider sets the provider of NewObserver's tracer. Default (or
// nil): the global otel.GetTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithMeterProvider sets the provider of NewMetrics' meter. Default (or
// nil): the global otel.GetMeterProvider(), which records nothing until
// the application installs a provider (otel.SetMeterProvider).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithMetricAttributes adds attributes to every measurement of
// NewMetrics, beside TableKey: the OpenTelemetry counterpart of wrapping
// package metrics' registerer with constant labels, such as the broker
// (semconv.MessagingSystemKafka: messaging.system = "kafka") or the
// instance. An attribute of TableKey's key is overridden by the table,
// one of key error.type by the error class.
// Repeated options add up. Default none.
func WithMetricAttributes(attrs ...attribute.KeyValue) Option {
	return func(c *config) { c.metricAttrs = append(c.metricAttrs, attrs...) }
}

// WithTopic sets how NewObserver names a message's destination
// (messaging.destination.name) when its event has no Topic of its own.
// Give it the route of your relay/kafka.Config.Topic. Default (or nil):
// the Kafka publisher's default route, relay/kafka.DefaultTopic
// (DefaultTopicPrefix + the aggregate type). This package does not import
// relay/kafka, which would make its users download sarama; it applies the
// same rule (a test in the integration module keeps the two equal).
func WithTopic(route func(relay.Message) string) Option {
	return func(c *config) { c.topic = route }
}

// WithSpanPerMessage makes NewObserver create one producer span per
// message instead of one per batch: each a child of the message's
// originating span context (a new root if its headers carry none), so the
// publish appears inside the trace of the request that emitted it, with
// messaging.message.id, messaging.kafka.message.key and
// messaging.destination.name, and that message's own outcome (its
// relay.PublishErrors entry, or the batch's error). It costs a span per
// published row. Publish then gets the relay's context unchanged.
func WithSpanPerMessage() Option {
	return func(c *config) { c.perMessage = true }
}

func newConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.prop == nil {
		c.prop = otel.GetTextMapPropagator()
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	if c.topic == nil {
		c.topic = DefaultTopic
	}
	return c
}

// DefaultTopicPrefix is relay/kafka.DefaultTopicPrefix: "order" events go
// to "outbox.event.order" unless routed otherwise.
const DefaultTopicPrefix = "outbox.event."

// DefaultTopic is relay/kafka.DefaultTopic, WithTopic's default:
// DefaultTopicPrefix + m.AggregateType.
func DefaultTopic(m relay.Message) string { return DefaultTopicPrefix + m.AggregateType }

// destination returns m's topic as the Kafka publisher routes it.
func (c *config) destination(m *relay.Message) string {
	if m.Topic != "" {
		return m.Topic
	}
	return c.topic(*m)
}
