package outboxotel

import (
	"context"
)

// Extract returns ctx with the span context and baggage that the
// configured propagator finds in a received message's headers, read
// through get: the context of the span that was active at outbox.Emit.
// Start the consumer's span with it (as parent, or as a link) to continue
// the trace. get returns the value of the header named key, or "" when
// the message has none; for a name present more than once, return the
// first (the relay writes each name once). A nil get, or headers without
// trace context, return ctx unchanged (or with nothing added).
//
// Extract takes a lookup function rather than a broker's message type so
// that this module imports no broker client: every broker the relay
// publishes to keeps headers in its own shape (Kafka a slice of key/value
// pairs, NATS a map[string][]string, AMQP a map[string]any, a Redis stream
// entry its fields), and each of them is a lookup of a few lines (see the
// package documentation's Consumers). A lookup cannot list the header
// names (the carrier's Keys returns nil): the W3C propagators
// (propagation.TraceContext, propagation.Baggage) and B3 do not need them;
// a propagator that enumerates prefixed headers (Jaeger's "uberctx-"
// baggage, OpenTracing's "ot-baggage-") does: call its Extract with a
// complete propagation.TextMapCarrier instead, or use ExtractMap.
func Extract(ctx context.Context, get func(key string) string, opts ...Option) context.Context {
	if get == nil {
		return ctx
	}
	c := newConfig(opts)
	return c.prop.Extract(ctx, funcCarrier(get))
}

// ExtractMap is Extract for headers already in a map[string]string: an
// inbox.Message's Headers, a relay.Message's, a Redis stream entry's
// fields read as strings. Its carrier lists the map's keys, so every
// propagator works with it. A nil or empty map returns ctx unchanged.
func ExtractMap(ctx context.Context, headers map[string]string, opts ...Option) context.Context {
	if len(headers) == 0 {
		return ctx
	}
	c := newConfig(opts)
	return c.prop.Extract(ctx, mapCarrier(headers))
}

// funcCarrier reads headers through a lookup function, for a propagator's
// Extract.
type funcCarrier func(key string) string

func (c funcCarrier) Get(key string) string { return c(key) }
func (c funcCarrier) Set(string, string)    {} // Extract only
func (c funcCarrier) Keys() []string        { return nil }
