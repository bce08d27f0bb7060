// Package outboxotel carries OpenTelemetry trace context through the
// outbox: from the span active at outbox.Emit, through the outbox row and
// the relay's publish, to the consumer that receives the Kafka record, and
// records the relay's metrics with OpenTelemetry instruments. It
// lives in its own module (github.com/sqloutbox/outbox/otel), so the
// outbox's core packages neither import OpenTelemetry nor make their users
// download it; it plugs into two hooks of the core, each off unless set:
//
//   - Capture returns an emit.Capture for driver.Config.Capture: every Emit
//     injects its ctx's context, through the configured propagator, into
//     the event's headers. With the W3C propagators these are
//     "traceparent" and "tracestate" (propagation.TraceContext) and
//     "baggage" (propagation.Baggage), the names a Kafka consumer's
//     OpenTelemetry instrumentation reads. They are ordinary event headers:
//     stored in the row's headers column (no schema change), counted
//     toward emit.Limits (an event they push past MaxRecordBytes is
//     refused at Emit with emit.ErrRecordTooLarge, never written), and
//     published by relay/kafka as record headers, byte for byte.
//   - NewObserver returns a relay.Observer that also implements
//     relay.PublishObserver: it wraps each Publisher.Publish call in a
//     producer span (below) and forwards everything else to the Observer
//     it wraps (metrics.RelayMetrics, say).
//
// NewMetrics returns a relay.Observer recording the relay's metrics with
// OpenTelemetry instruments (see Metrics), the counterpart of package
// metrics' Prometheus collectors.
//
// On the consumer side, Extract and ExtractMap return a context carrying
// the span context and baggage of a received message, to start the
// consumer's span under (see Consumers).
//
// # When the application sets its own trace headers
//
// One rule: the application's headers win; nothing it set is overwritten
// (emit.Capture enforces this for every header name). Since traceparent and
// tracestate describe one span context, an event whose Headers already hold
// either of them gets neither captured (a captured tracestate beside the
// application's traceparent would describe another span). Baggage is
// captured unless the application set "baggage" itself. Header names are
// compared byte for byte, as Kafka compares them.
//
// # Spans
//
// The relay publishes in batches (one Publish call per claimed batch), so
// NewObserver creates one span per batch, as OpenTelemetry's messaging
// semantic conventions prescribe for batch sends: kind producer, named
// "send <topic>" ("send" when the batch spans several topics), with
// messaging.system "kafka", messaging.operation.name "send",
// messaging.operation.type "send", messaging.batch.message_count, and
// messaging.destination.name when every message goes to one topic. Each
// message whose headers carry a valid span context (captured at Emit)
// becomes a link to that context, with messaging.message.id,
// messaging.kafka.message.key (the aggregate ID) and
// messaging.destination.name as link attributes; a batch of one message
// also carries those on the span itself. The span's parent is whatever
// span the relay's context holds (normally none: a new root), not a
// message's span: one span cannot be the child of every message it sends,
// and a batch's messages come from many traces. A span per message would
// cost the relay a span per row at thousands of rows per second for the
// same information the links carry. The SDK keeps at most 128 links per
// span by default (OTEL_SPAN_LINK_COUNT_LIMIT, or sdktrace.WithSpanLimits),
// fewer than the relay's default batch of 500; links past it are counted as
// dropped. Raise the limit, or choose WithSpanPerMessage: one producer span
// per message instead, a child of the message's originating span (the
// publish then appears inside the request's trace, with that message's own
// outcome), at the cost of a span per row.
//
// A failed Publish sets the span's status to Error with the error's text,
// records the error as an event, and sets error.type: "batch" (the batch
// failed as a whole), "unavailable" (relay.ErrUnavailable) or "partial"
// (relay.PublishErrors: some messages failed; outbox.publish.failed_count
// says how many). With WithSpanPerMessage each message's span gets its own
// outcome: its relay.PublishErrors entry ("permanent" for
// relay.ErrPermanent, "unavailable", else "transient"), or the batch's error.
// A message is retried in a later batch and so a later span, linked to (or
// the child of) the same originating context.
//
// The relay does not rewrite the captured headers: a consumer extracting
// them continues the trace of the span that was active at Emit (the batch
// publish span, in a trace of its own, links to that span; with
// WithSpanPerMessage the publish span is the consumer span's sibling), which
// keeps invariant 5, bytes in = bytes out.
//
// # Consumers
//
// Extract reads a received message's headers through a lookup function,
// get(key) string, so that this module imports no broker client (its users
// download none they do not use). Each broker's headers are one short
// adapter away; with rec, msg or d the received message:
//
//	// franz-go (*kgo.Record)
//	ctx = outboxotel.Extract(ctx, func(k string) string {
//		for _, h := range rec.Headers {
//			if h.Key == k {
//				return string(h.Value)
//			}
//		}
//		return ""
//	})
//
//	// sarama (*sarama.ConsumerMessage; its headers may hold nil entries)
//	ctx = outboxotel.Extract(ctx, func(k string) string {
//		for _, h := range msg.Headers {
//			if h != nil && string(h.Key) == k {
//				return string(h.Value)
//			}
//		}
//		return ""
//	})
//
//	// NATS (*nats.Msg; a jetstream.Msg: msg.Headers().Get)
//	ctx = outboxotel.Extract(ctx, msg.Header.Get)
//
//	// RabbitMQ (amqp091.Delivery: relay/rabbitmq writes string values)
//	ctx = outboxotel.Extract(ctx, func(k string) string {
//		s, _ := d.Headers[k].(string)
//		return s
//	})
//
//	// Redis Streams (go-redis XMessage: the entry's fields)
//	ctx = outboxotel.Extract(ctx, func(k string) string {
//		s, _ := msg.Values[k].(string)
//		return s
//	})
//
// ExtractMap takes a map[string]string as is: an inbox.Message's Headers
// (the inbox keeps a record's headers), say. With inbox/kafka, give the
// franz-go adapter as inboxkafka.Config.ContextFor.
//
// Why a function and not a type per broker, or a carrier type of ours: it
// fits every shape above without copying the headers (nats.Header.Get is
// one already), and it is what a propagator needs to
// extract the W3C headers. It cannot list the header names; the few
// propagators that enumerate them (prefixed baggage headers, not W3C's) get
// the names from ExtractMap, or from a propagation.TextMapCarrier of your
// own given to the propagator's Extract.
//
// # Metrics
//
// NewMetrics(ob, next, opts...) creates, with the meter named ScopeName of
// WithMeterProvider's provider (default otel.GetMeterProvider()), one
// instrument per fact that package metrics exports to Prometheus, named in
// OpenTelemetry's style (dot-separated namespaces, units in UCUM, durations
// in seconds; the Prometheus name is in parentheses):
//
//	outbox.relay.published                   counter    {message}    (outbox_published_total)
//	outbox.relay.publish.errors              counter    {message}    (outbox_publish_errors_total), error.type
//	outbox.relay.retries                     counter    {retry}      (outbox_retries_total)
//	outbox.relay.dead_lettered               counter    {message}    (outbox_dead_lettered_total)
//	outbox.relay.commit_to_publish.duration  histogram  s            (outbox_commit_to_publish_seconds)
//	outbox.relay.batch.size                  histogram  {message}    (outbox_batch_size)
//	outbox.relay.claim.duration              histogram  s            (outbox_claim_duration_seconds)
//	outbox.relay.partitions.owned            gauge      {partition}  (outbox_partitions_owned)
//	outbox.relay.up                          gauge      1            (outbox_relay_up)
//	outbox.relay.partition_mismatch          gauge      1            (outbox_relay_partition_mismatch)
//	outbox.relay.order_violations            counter    {message}    (outbox_relay_order_violations_total)
//	outbox.relay.transactions                counter    {transaction} (outbox_transactions_total; outbox.transaction.outcome)
//	outbox.relay.reconciled_rows             counter    {message}    (outbox_reconciled_rows_total)
//
// Every measurement carries outbox.table (TableKey: the table, the
// Prometheus table label) and the attributes of WithMetricAttributes (the
// broker as messaging.system, say, the counterpart of the command's broker
// label); publish errors carry error.type, the relay.ErrorClass (transient,
// permanent, unavailable, batch: the values of the publish span's
// error.type). The histograms' explicit bucket boundaries are package
// metrics' Prometheus buckets (CommitToPublishBuckets, BatchSizeBuckets,
// ClaimDurationBuckets), so both aggregate alike; a View of the SDK can
// change them. The gauges are synchronous (recorded when the relay reports
// a change), so a gauge appears once it was first recorded.
//
// Metrics and the tracing Observer each forward every call to the Observer
// they wrap, optional interfaces included (PartitionObserver,
// ReadinessObserver, OrderObserver, PublishObserver), so tracing, OpenTelemetry metrics
// and Prometheus combine by nesting, in any order:
//
//	prom, err := metrics.NewRelayMetrics(nil, ob) // optional: nil instead
//	m, err := outboxotel.NewMetrics(ob, prom)
//	cfg := relay.Config{Publisher: pub, Observer: outboxotel.NewObserver(m)}
//
// # Defaults
//
// Without WithPropagator, the global otel.GetTextMapPropagator() is used,
// which propagates nothing until the application installs one, e.g.
//
//	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(
//		propagation.TraceContext{}, propagation.Baggage{}))
//
// Without WithTracerProvider, the global otel.GetTracerProvider() is used,
// and without WithMeterProvider the global otel.GetMeterProvider(). The
// globals are looked up when Capture, NewObserver, NewMetrics, Extract or
// ExtractMap is called; they delegate to what is installed later.
package outboxotel
