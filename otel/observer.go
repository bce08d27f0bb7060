package outboxotel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sqloutbox/outbox/relay"
)

// Attribute keys and values this package sets beyond the semantic
// conventions' own (semconv v1.40.0).
const (
	// FailedCountKey is the number of messages of a partially failed batch
	// (relay.PublishErrors) that failed.
	FailedCountKey = attribute.Key("outbox.publish.failed_count")
	// Error types (error.type) of a failed publish span.
	ErrorTypeBatch       = "batch"       // the batch failed as a whole
	ErrorTypeUnavailable = "unavailable" // relay.ErrUnavailable
	ErrorTypePartial     = "partial"     // relay.PublishErrors
	// Error types of one message's span (WithSpanPerMessage) when its
	// relay.PublishErrors entry failed.
	ErrorTypePermanent = "permanent" // relay.ErrPermanent: dead-lettered
	ErrorTypeTransient = "transient" // retried later
)

// Observer is a relay.Observer that traces the relay's publishes (it
// implements relay.PublishObserver; see the package documentation for the
// spans) and forwards every other call, PartitionMismatch, Readiness and OrderViolation included, to the
// Observer it wraps. Create it with NewObserver; it is safe for
// concurrent use.
type Observer struct {
	relay.Observer
	cfg    config
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// NewObserver returns an Observer wrapping next (nil: observe nothing but
// spans), for relay.Config.Observer:
//
//	obs := outboxotel.NewObserver(relayMetrics)
//	r, err := relay.New(ob, db, relay.Config{Publisher: pub, Observer: obs})
//
// If next implements relay.PublishObserver too, its StartPublish runs
// inside this Observer's span.
func NewObserver(next relay.Observer, opts ...Option) *Observer {
	if next == nil {
		next = relay.NopObserver{}
	}
	c := newConfig(opts)
	return &Observer{
		Observer: next,
		cfg:      c,
		tracer:   c.tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		prop:     c.prop,
	}
}

// PartitionMismatch forwards to the wrapped Observer if it implements
// relay.PartitionObserver.
func (o *Observer) PartitionMismatch(err error) {
	if po, ok := o.Observer.(relay.PartitionObserver); ok {
		po.PartitionMismatch(err)
	}
}

// Readiness forwards to the wrapped Observer if it implements
// relay.ReadinessObserver (package metrics' RelayMetrics does: it drives
// outbox_relay_up, which would otherwise stay at 1 behind this wrapper).
func (o *Observer) Readiness(err error) {
	if ro, ok := o.Observer.(relay.ReadinessObserver); ok {
		ro.Readiness(err)
	}
}

// OrderViolation forwards to the wrapped Observer if it implements
// relay.OrderObserver (package metrics' RelayMetrics and this package's
// Metrics do).
func (o *Observer) OrderViolation(m relay.Message) {
	if oo, ok := o.Observer.(relay.OrderObserver); ok {
		oo.OrderViolation(m)
	}
}

// Transaction forwards to the wrapped Observer if it implements
// relay.TransactionObserver (package metrics' RelayMetrics does).
func (o *Observer) Transaction(partition int, outcome relay.TransactionOutcome, messages int) {
	if to, ok := o.Observer.(relay.TransactionObserver); ok {
		to.Transaction(partition, outcome, messages)
	}
}

// Reconciled forwards to the wrapped Observer if it implements
// relay.TransactionObserver.
func (o *Observer) Reconciled(partition, rows int) {
	if to, ok := o.Observer.(relay.TransactionObserver); ok {
		to.Reconciled(partition, rows)
	}
}

// WALStreaming forwards to the wrapped Observer if it implements
// relay.SourceObserver.
func (o *Observer) WALStreaming(streaming bool, err error) {
	if so, ok := o.Observer.(relay.SourceObserver); ok {
		so.WALStreaming(streaming, err)
	}
}

// FromSource forwards to the wrapped Observer if it implements
// relay.SourceObserver.
func (o *Observer) FromSource(source relay.Source, n int) {
	if so, ok := o.Observer.(relay.SourceObserver); ok {
		so.FromSource(source, n)
	}
}

// StartPublish implements relay.PublishObserver: it starts the batch's
// producer span, linked to each message's originating span context, and
// returns ctx with the span and an end func that records Publish's
// outcome and ends the span.
func (o *Observer) StartPublish(ctx context.Context, msgs []relay.Message) (context.Context, func(error)) {
	if o.cfg.perMessage {
		return o.startPerMessage(ctx, msgs)
	}
	attrs := make([]attribute.KeyValue, 0, 8)
	attrs = append(attrs,
		semconv.MessagingSystemKafka,
		semconv.MessagingOperationName("send"),
		semconv.MessagingOperationTypeSend,
		semconv.MessagingBatchMessageCount(len(msgs)),
	)
	dest, same := "", true
	links := make([]trace.Link, 0, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		d := o.cfg.destination(m)
		if i == 0 {
			dest = d
		} else if d != dest {
			same = false
		}
		sc := trace.SpanContextFromContext(o.prop.Extract(context.Background(), mapCarrier(m.Headers)))
		if !sc.IsValid() {
			continue
		}
		links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{
			semconv.MessagingMessageID(m.MessageID),
			semconv.MessagingKafkaMessageKey(m.AggregateID),
			semconv.MessagingDestinationName(d),
		}})
	}
	name := "send"
	if same && len(msgs) > 0 {
		name += " " + dest
		attrs = append(attrs, semconv.MessagingDestinationName(dest))
	}
	if len(msgs) == 1 {
		attrs = append(attrs, semconv.MessagingMessageID(msgs[0].MessageID), semconv.MessagingKafkaMessageKey(msgs[0].AggregateID))
	}
	ctx, span := o.tracer.Start(ctx, name,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attrs...),
		trace.WithLinks(links...),
	)
	var nextEnd func(error)
	if po, ok := o.Observer.(relay.PublishObserver); ok {
		ctx, nextEnd = po.StartPublish(ctx, msgs)
	}
	return ctx, func(err error) {
		if nextEnd != nil {
			nextEnd(err)
		}
		recordOutcome(span, err)
		span.End()
	}
}

// startPerMessage is StartPublish with WithSpanPerMessage.
func (o *Observer) startPerMessage(ctx context.Context, msgs []relay.Message) (context.Context, func(error)) {
	spans := make([]trace.Span, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		d := o.cfg.destination(m)
		// The message's origin is the parent; the relay's own context only
		// bounds time, it is not part of the message's trace.
		parent := trace.SpanContextFromContext(o.prop.Extract(context.Background(), mapCarrier(m.Headers)))
		pctx := context.Background()
		if parent.IsValid() {
			pctx = trace.ContextWithRemoteSpanContext(pctx, parent)
		}
		_, spans[i] = o.tracer.Start(pctx, "send "+d,
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				semconv.MessagingSystemKafka,
				semconv.MessagingOperationName("send"),
				semconv.MessagingOperationTypeSend,
				semconv.MessagingDestinationName(d),
				semconv.MessagingMessageID(m.MessageID),
				semconv.MessagingKafkaMessageKey(m.AggregateID),
			),
		)
	}
	var nextEnd func(error)
	if po, ok := o.Observer.(relay.PublishObserver); ok {
		ctx, nextEnd = po.StartPublish(ctx, msgs)
	}
	return ctx, func(err error) {
		if nextEnd != nil {
			nextEnd(err)
		}
		var pe relay.PublishErrors
		perMsg := errors.As(err, &pe) && len(pe) == len(spans)
		for i, span := range spans {
			switch {
			case perMsg && pe[i] != nil:
				span.SetAttributes(semconv.ErrorTypeKey.String(errorType(pe[i])))
				span.RecordError(pe[i])
				span.SetStatus(codes.Error, pe[i].Error())
			case !perMsg && err != nil:
				recordOutcome(span, err)
			}
			span.End()
		}
	}
}

// errorType is error.type of one message's failure.
func errorType(err error) string {
	switch {
	case errors.Is(err, relay.ErrUnavailable):
		return ErrorTypeUnavailable
	case errors.Is(err, relay.ErrPermanent):
		return ErrorTypePermanent
	default:
		return ErrorTypeTransient
	}
}

// recordOutcome sets span's status and error attributes from a Publish
// result.
func recordOutcome(span trace.Span, err error) {
	if err == nil {
		return
	}
	var pe relay.PublishErrors
	if errors.As(err, &pe) {
		n := 0
		for _, e := range pe {
			if e != nil {
				n++
			}
		}
		if n == 0 {
			return // nothing failed after all
		}
		span.SetAttributes(semconv.ErrorTypeKey.String(ErrorTypePartial), FailedCountKey.Int(n))
	} else if errors.Is(err, relay.ErrUnavailable) {
		span.SetAttributes(semconv.ErrorTypeKey.String(ErrorTypeUnavailable))
	} else {
		span.SetAttributes(semconv.ErrorTypeKey.String(ErrorTypeBatch))
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

// mapCarrier reads a message's headers for a propagator's Extract.
type mapCarrier map[string]string

func (c mapCarrier) Get(key string) string { return c[key] }
func (c mapCarrier) Set(key, value string) {} // Extract only
func (c mapCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
