package outboxotel

import (
	"context"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ExtractFranz returns ctx with the span context and baggage that the
// configured propagator finds in a franz-go record's headers: the context
// of the span that was active at outbox.Emit. Start the consumer's span
// with it (as parent, or as a link) to continue the trace. A nil record, or
// one without trace headers, returns ctx unchanged.
func ExtractFranz(ctx context.Context, rec *kgo.Record, opts ...Option) context.Context {
	if rec == nil {
		return ctx
	}
	c := newConfig(opts)
	return c.prop.Extract(ctx, franzCarrier(rec.Headers))
}

// ExtractSarama is ExtractFranz for a sarama consumer message.
func ExtractSarama(ctx context.Context, msg *sarama.ConsumerMessage, opts ...Option) context.Context {
	if msg == nil {
		return ctx
	}
	c := newConfig(opts)
	return c.prop.Extract(ctx, saramaCarrier(msg.Headers))
}

// franzCarrier reads franz-go record headers. Get returns the first
// header of a name (the relay writes each name once).
type franzCarrier []kgo.RecordHeader

func (c franzCarrier) Get(key string) string {
	for _, h := range c {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func (c franzCarrier) Set(string, string) {} // Extract only

func (c franzCarrier) Keys() []string {
	keys := make([]string, len(c))
	for i, h := range c {
		keys[i] = h.Key
	}
	return keys
}

// saramaCarrier reads sarama record headers; nil entries are skipped.
type saramaCarrier []*sarama.RecordHeader

func (c saramaCarrier) Get(key string) string {
	for _, h := range c {
		if h != nil && string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}

func (c saramaCarrier) Set(string, string) {} // Extract only

func (c saramaCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for _, h := range c {
		if h != nil {
			keys = append(keys, string(h.Key))
		}
	}
	return keys
}
