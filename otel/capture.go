package outboxotel

import (
	"context"

	"github.com/sqloutbox/outbox/emit"
)

// W3C Trace Context and Baggage header names, as propagation.TraceContext
// and propagation.Baggage write them.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
	HeaderBaggage     = "baggage"
)

// Capture returns a hook for driver.Config.Capture that injects the trace
// context and baggage of Emit's ctx, through the configured propagator,
// into each event's headers (see the package documentation for the header
// names and the rule when the application set its own). A ctx without a
// valid span context and without baggage adds nothing. The hook is safe
// for concurrent use.
//
//	ob, err := driver.Register("outbox-postgres", pq.Driver{}, driver.Config{
//		Dialect: driver.Postgres,
//		Capture: outboxotel.Capture(),
//	})
func Capture(opts ...Option) emit.Capture {
	c := newConfig(opts)
	prop := c.prop
	return func(ctx context.Context, app map[string]string) map[string]string {
		car := captureCarrier{app: app}
		prop.Inject(ctx, &car)
		return car.out
	}
}

// captureCarrier collects what a propagator injects, leaving out what the
// application's headers already say (the application wins).
type captureCarrier struct {
	app map[string]string // read-only
	out map[string]string // allocated at the first Set
}

func (c *captureCarrier) Get(key string) string {
	if v, ok := c.out[key]; ok {
		return v
	}
	return c.app[key]
}

func (c *captureCarrier) Set(key, value string) {
	if _, ok := c.app[key]; ok {
		return
	}
	if key == HeaderTraceparent || key == HeaderTracestate {
		// One span context: the application's traceparent or tracestate
		// keeps the other one out too.
		if _, ok := c.app[HeaderTraceparent]; ok {
			return
		}
		if _, ok := c.app[HeaderTracestate]; ok {
			return
		}
	}
	if c.out == nil {
		c.out = make(map[string]string, 3)
	}
	c.out[key] = value
}

func (c *captureCarrier) Keys() []string {
	keys := make([]string, 0, len(c.out)+len(c.app))
	for k := range c.out {
		keys = append(keys, k)
	}
	for k := range c.app {
		if _, ok := c.out[k]; !ok {
			keys = append(keys, k)
		}
	}
	return keys
}
