package outboxotel

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// ScopeName is the instrumentation scope name of the tracer NewObserver
// uses.
const ScopeName = "github.com/sqloutbox/outbox/otel"

// Option configures Capture, NewObserver, ExtractFranz and ExtractSarama;
// each uses the options that apply to it (the extractors and Capture only
// WithPropagator) and ignores the others. A nil Option is ignored.
type Option func(*config)

type config struct {
	prop       propagation.TextMapPropagator
	tp         trace.TracerProvider
	topic      func(relay.Message) string
	perMessage bool
}

// WithPropagator sets the propagator that injects the trace context into
// events' headers (Capture) and extracts it from them (NewObserver's
// links, ExtractFranz, ExtractSarama). Default (or nil): the global
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

// WithTopic sets how NewObserver names a message's destination
// (messaging.destination.name) when its event has no Topic of its own.
// Give it the route of your relay/kafka.Config.Topic. Default (or nil):
// kafka.DefaultTopic, the Kafka publisher's default route.
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
	if c.topic == nil {
		c.topic = kafka.DefaultTopic
	}
	return c
}

// destination returns m's topic as the Kafka publisher routes it.
func (c *config) destination(m *relay.Message) string {
	if m.Topic != "" {
		return m.Topic
	}
	return c.topic(*m)
}
