package outboxotel_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sqloutbox/outbox/emit"
	outboxotel "github.com/sqloutbox/outbox/otel"
	"github.com/sqloutbox/outbox/relay"
)

var w3c = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

type bundle struct {
	rec *tracetest.SpanRecorder
	tp  *sdktrace.TracerProvider
}

func setup(t *testing.T) *bundle {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &bundle{rec: rec, tp: tp}
}

// origin starts a span with baggage member k=v and returns its context.
func (b *bundle) origin(t *testing.T, name string) (context.Context, trace.SpanContext) {
	t.Helper()
	m, err := baggage.NewMemberRaw("tenant", "acme corp")
	if err != nil {
		t.Fatal(err)
	}
	bg, err := baggage.New(m)
	if err != nil {
		t.Fatal(err)
	}
	ctx := baggage.ContextWithBaggage(context.Background(), bg)
	ctx, span := b.tp.Tracer("test").Start(ctx, name)
	t.Cleanup(func() { span.End() })
	return ctx, span.SpanContext()
}

func TestCapture(t *testing.T) {
	t.Parallel()
	b := setup(t)
	capture := outboxotel.Capture(outboxotel.WithPropagator(w3c))
	ctx, sc := b.origin(t, "handler")
	wantTP := fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID())

	t.Run("TraceContextAndBaggage", func(t *testing.T) {
		t.Parallel()
		got := capture(ctx, nil)
		want := map[string]string{"traceparent": wantTP, "baggage": "tenant=acme%20corp"}
		if !maps.Equal(got, want) {
			t.Fatalf("captured %v, want %v", got, want)
		}
	})
	t.Run("NothingWithoutSpanOrBaggage", func(t *testing.T) {
		t.Parallel()
		if got := capture(context.Background(), map[string]string{"x": "y"}); got != nil {
			t.Fatalf("captured %v, want nil", got)
		}
	})
	t.Run("ApplicationTraceparentWins", func(t *testing.T) {
		t.Parallel()
		for _, app := range []map[string]string{
			{"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"},
			{"tracestate": "vendor=1"},
		} {
			got := capture(ctx, app)
			if want := map[string]string{"baggage": "tenant=acme%20corp"}; !maps.Equal(got, want) {
				t.Errorf("app headers %v: captured %v, want %v", app, got, want)
			}
		}
	})
	t.Run("ApplicationBaggageWins", func(t *testing.T) {
		t.Parallel()
		got := capture(ctx, map[string]string{"baggage": "mine=1"})
		if want := map[string]string{"traceparent": wantTP}; !maps.Equal(got, want) {
			t.Errorf("captured %v, want %v", got, want)
		}
	})
}

// TestCaptureDefaultsToGlobalPropagator: without WithPropagator, Capture
// uses the global propagator, also one installed after Capture was built.
// Not parallel: it sets the global propagator (for good: setting the
// delegating global back onto itself is refused; the other tests pass
// their propagator explicitly).
func TestCaptureDefaultsToGlobalPropagator(t *testing.T) {
	b := setup(t)
	capture := outboxotel.Capture()
	ctx, sc := b.origin(t, "handler")
	otel.SetTextMapPropagator(propagation.TraceContext{})
	got := capture(ctx, nil)
	if want := fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID()); len(got) != 1 || got["traceparent"] != want {
		t.Fatalf("captured %v, want only traceparent %s", got, want)
	}
}

// recordingObserver records forwarded calls.
type recordingObserver struct {
	relay.NopObserver
	mu         sync.Mutex
	published  int
	mismatches []error
	readiness  []error
	inner      []string // span names active in StartPublish's ctx
	ended      []error
}

func (o *recordingObserver) Published(relay.Message, time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.published++
}

func (o *recordingObserver) PartitionMismatch(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.mismatches = append(o.mismatches, err)
}

func (o *recordingObserver) Readiness(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.readiness = append(o.readiness, err)
}

func (o *recordingObserver) StartPublish(ctx context.Context, _ []relay.Message) (context.Context, func(error)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s, _ := trace.SpanFromContext(ctx).(sdktrace.ReadOnlySpan)
	if s != nil {
		o.inner = append(o.inner, s.Name())
	}
	return ctx, func(err error) {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.ended = append(o.ended, err)
	}
}

func message(ctx context.Context, id, agg, topic string) relay.Message {
	h := propagation.MapCarrier{}
	w3c.Inject(ctx, h)
	return relay.Message{ID: 1, MessageID: id, AggregateType: "order", AggregateID: agg, Topic: topic, EventType: "order.paid",
		Headers: map[string]string(h), Payload: []byte(`{}`)}
}

func attrs(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

func wantAttrs(t *testing.T, what string, got []attribute.KeyValue, want map[attribute.Key]any) {
	t.Helper()
	m := attrs(got)
	for k, v := range want {
		g, ok := m[k]
		switch {
		case v == nil && ok:
			t.Errorf("%s: attribute %s = %v, want absent", what, k, g.AsInterface())
		case v != nil && (!ok || g.AsInterface() != v):
			t.Errorf("%s: attribute %s = %v (set %v), want %v", what, k, g.AsInterface(), ok, v)
		}
	}
}

func TestObserverBatchSpan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	obs := outboxotel.NewObserver(nil, outboxotel.WithPropagator(w3c), outboxotel.WithTracerProvider(b.tp))
	ctxA, scA := b.origin(t, "a")
	ctxB, scB := b.origin(t, "b")
	msgs := []relay.Message{
		message(ctxA, "m-1", "o-1", ""),
		message(context.Background(), "m-2", "o-2", ""), // no trace context: no link
		message(ctxB, "m-3", "o-3", ""),
	}
	ctx, end := obs.StartPublish(context.Background(), msgs)
	if !trace.SpanContextFromContext(ctx).IsValid() {
		t.Error("StartPublish's context carries no span")
	}
	end(nil)
	spans := b.rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans ended, want 1", len(spans))
	}
	s := spans[0]
	if s.Name() != "send outbox.event.order" || s.SpanKind() != trace.SpanKindProducer || s.Parent().IsValid() {
		t.Errorf("span %q kind %v parent %v; want \"send outbox.event.order\", producer, a root", s.Name(), s.SpanKind(), s.Parent())
	}
	if s.Status().Code != codes.Unset {
		t.Errorf("status %v, want unset", s.Status())
	}
	wantAttrs(t, "span", s.Attributes(), map[attribute.Key]any{
		"messaging.system": "kafka", "messaging.operation.type": "send", "messaging.operation.name": "send",
		"messaging.batch.message_count": int64(3), "messaging.destination.name": "outbox.event.order",
		"messaging.message.id": nil, "error.type": nil,
	})
	links := s.Links()
	if len(links) != 2 || links[0].SpanContext.SpanID() != scA.SpanID() || links[1].SpanContext.SpanID() != scB.SpanID() ||
		links[0].SpanContext.TraceID() != scA.TraceID() {
		t.Fatalf("links %+v, want the spans of m-1 and m-3", links)
	}
	wantAttrs(t, "link 0", links[0].Attributes, map[attribute.Key]any{
		"messaging.message.id": "m-1", "messaging.kafka.message.key": "o-1", "messaging.destination.name": "outbox.event.order",
	})
	wantAttrs(t, "link 1", links[1].Attributes, map[attribute.Key]any{"messaging.message.id": "m-3"})
}

func TestObserverSingleMessageAndTopics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	route := func(m relay.Message) string { return "events." + m.AggregateType }
	obs := outboxotel.NewObserver(nil, outboxotel.WithPropagator(w3c), outboxotel.WithTracerProvider(b.tp), outboxotel.WithTopic(route))
	ctxA, _ := b.origin(t, "a")

	_, end := obs.StartPublish(context.Background(), []relay.Message{message(ctxA, "m-1", "o-1", "")})
	end(nil)
	_, end = obs.StartPublish(context.Background(), []relay.Message{message(ctxA, "m-2", "o-1", "own.topic"), message(ctxA, "m-3", "o-1", "")})
	end(nil)
	spans := b.rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	if spans[0].Name() != "send events.order" {
		t.Errorf("name %q, want the routed topic", spans[0].Name())
	}
	wantAttrs(t, "single", spans[0].Attributes(), map[attribute.Key]any{
		"messaging.message.id": "m-1", "messaging.kafka.message.key": "o-1", "messaging.destination.name": "events.order",
		"messaging.batch.message_count": int64(1),
	})
	if spans[1].Name() != "send" {
		t.Errorf("name %q, want \"send\" for two topics", spans[1].Name())
	}
	wantAttrs(t, "two topics", spans[1].Attributes(), map[attribute.Key]any{"messaging.destination.name": nil, "messaging.message.id": nil})
	if l := spans[1].Links(); len(l) != 2 || attrs(l[0].Attributes)["messaging.destination.name"].AsString() != "own.topic" {
		t.Errorf("links %+v, want the event's own topic on the first", l)
	}
}

func TestObserverErrorStatus(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		err    error
		typ    string
		failed any
	}{
		{"Batch", errors.New("broker unreachable"), outboxotel.ErrorTypeBatch, nil},
		{"Unavailable", fmt.Errorf("%w: topic authorization failed", relay.ErrUnavailable), outboxotel.ErrorTypeUnavailable, nil},
		{"Partial", relay.PublishErrors{nil, errors.New("too large"), errors.New("held back")}, outboxotel.ErrorTypePartial, int64(2)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			obs := outboxotel.NewObserver(nil, outboxotel.WithPropagator(w3c), outboxotel.WithTracerProvider(b.tp))
			ctx, _ := b.origin(t, "a")
			_, end := obs.StartPublish(context.Background(), []relay.Message{message(ctx, "m-1", "o-1", ""), message(ctx, "m-2", "o-1", ""), message(ctx, "m-3", "o-1", "")})
			end(tc.err)
			s := b.rec.Ended()[0]
			if s.Status().Code != codes.Error || !strings.Contains(s.Status().Description, tc.err.Error()) {
				t.Errorf("status %+v, want Error with %q", s.Status(), tc.err)
			}
			wantAttrs(t, tc.name, s.Attributes(), map[attribute.Key]any{"error.type": tc.typ, "outbox.publish.failed_count": tc.failed})
			if ev := s.Events(); len(ev) != 1 || ev[0].Name != "exception" {
				t.Errorf("events %+v, want one exception", ev)
			}
		})
	}
	t.Run("PublishErrorsAllNil", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		obs := outboxotel.NewObserver(nil, outboxotel.WithTracerProvider(b.tp))
		_, end := obs.StartPublish(context.Background(), make([]relay.Message, 2))
		end(relay.PublishErrors{nil, nil})
		if s := b.rec.Ended()[0]; s.Status().Code != codes.Unset {
			t.Errorf("status %+v, want unset", s.Status())
		}
	})
}

// TestObserverForwards: the wrapped Observer still gets its calls,
// PartitionMismatch and a nested StartPublish included.
func TestObserverForwards(t *testing.T) {
	t.Parallel()
	b := setup(t)
	next := &recordingObserver{}
	obs := outboxotel.NewObserver(next, outboxotel.WithTracerProvider(b.tp))
	var _ relay.PartitionObserver = obs
	var _ relay.PublishObserver = obs
	var _ relay.ReadinessObserver = obs
	obs.Published(relay.Message{}, time.Millisecond)
	mismatch := errors.New("mismatch")
	obs.PartitionMismatch(mismatch)
	unready := errors.New("unready")
	obs.Readiness(unready)
	obs.Readiness(nil)
	_, end := obs.StartPublish(context.Background(), []relay.Message{{MessageID: "m-1", AggregateType: "order", AggregateID: "o-1"}})
	end(nil)
	next.mu.Lock()
	defer next.mu.Unlock()
	if next.published != 1 || len(next.mismatches) != 1 || next.mismatches[0] != mismatch {
		t.Errorf("forwarded: %d published, mismatches %v", next.published, next.mismatches)
	}
	if len(next.readiness) != 2 || next.readiness[0] != unready || next.readiness[1] != nil {
		t.Errorf("forwarded readiness %v, want [unready <nil>] (outbox_relay_up behind the wrapper)", next.readiness)
	}
	if len(next.inner) != 1 || next.inner[0] != "send outbox.event.order" || len(next.ended) != 1 || next.ended[0] != nil {
		t.Errorf("nested StartPublish saw spans %v, ended %v; want it inside the send span, ended once", next.inner, next.ended)
	}
	// A wrapped Observer without the optional interfaces is fine too.
	plain := outboxotel.NewObserver(relay.NopObserver{})
	plain.PartitionMismatch(mismatch)
	plain.Readiness(unready)
	_, end = plain.StartPublish(context.Background(), nil)
	end(nil)
}

// TestExtract: the trace context and baggage injected at Emit come back
// through Extract from each broker's header shape (adapters as the
// package documentation shows them, on stand-in types: this module imports
// no broker client), and through ExtractMap.
func TestExtract(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, sc := b.origin(t, "handler")
	h := propagation.MapCarrier{}
	w3c.Inject(ctx, h)
	type kafkaHeader struct { // kgo.RecordHeader; sarama's has Key []byte
		Key   string
		Value []byte
	}
	kafka := []*kafkaHeader{nil, {Key: "outbox-message-id", Value: []byte("m-1")}}
	natsHeader := map[string][]string{"outbox-message-id": {"m-1"}} // nats.Header
	amqpTable := map[string]any{"outbox-message-id": "m-1"}         // amqp091.Table
	for k, v := range h {
		kafka = append(kafka, &kafkaHeader{Key: k, Value: []byte(v)})
		natsHeader[k] = []string{v}
		amqpTable[k] = v
	}
	opt := outboxotel.WithPropagator(w3c)
	bg := context.Background()
	for name, got := range map[string]context.Context{
		"kafka": outboxotel.Extract(bg, func(k string) string {
			for _, h := range kafka {
				if h != nil && h.Key == k {
					return string(h.Value)
				}
			}
			return ""
		}, opt),
		"nats": outboxotel.Extract(bg, func(k string) string {
			if v := natsHeader[k]; len(v) > 0 {
				return v[0]
			}
			return ""
		}, opt),
		"amqp": outboxotel.Extract(bg, func(k string) string {
			s, _ := amqpTable[k].(string)
			return s
		}, opt),
		"map": outboxotel.ExtractMap(bg, map[string]string(h), opt),
	} {
		rsc := trace.SpanContextFromContext(got)
		if !rsc.IsRemote() || rsc.TraceID() != sc.TraceID() || rsc.SpanID() != sc.SpanID() || !rsc.IsSampled() {
			t.Errorf("%s: extracted %+v, want remote %s/%s sampled", name, rsc, sc.TraceID(), sc.SpanID())
		}
		if v := baggage.FromContext(got).Member("tenant").Value(); v != "acme corp" {
			t.Errorf("%s: baggage tenant = %q, want %q", name, v, "acme corp")
		}
	}
	if outboxotel.Extract(bg, nil, opt) != bg || outboxotel.ExtractMap(bg, nil, opt) != bg {
		t.Error("nil headers changed the context")
	}
	for name, got := range map[string]context.Context{
		"Extract":    outboxotel.Extract(bg, func(string) string { return "" }, opt),
		"ExtractMap": outboxotel.ExtractMap(bg, map[string]string{"outbox-message-id": "m-1"}, opt),
		"garbage":    outboxotel.ExtractMap(bg, map[string]string{"traceparent": "00-zz", "baggage": "%%%"}, opt),
	} {
		if trace.SpanContextFromContext(got).IsValid() || baggage.FromContext(got).Len() != 0 {
			t.Errorf("%s: headers without trace context yielded %v", name, trace.SpanContextFromContext(got))
		}
	}
}

// TestCaptureCountsTowardRecordLimit: an event that fits
// Limits.MaxRecordBytes alone is refused at Emit, with ErrRecordTooLarge,
// once the captured trace headers push it over; untraced, it is accepted.
func TestCaptureCountsTowardRecordLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	traced, _ := b.origin(t, "handler")
	ev := emit.Event{ID: "m-1", AggregateType: "order", AggregateID: "o-1", Type: "order.paid", Payload: []byte(`{"a":1}`), ContentType: emit.DefaultContentType}
	limits := emit.Limits{MaxRecordBytes: emit.RecordSize(&ev) + 20} // room for far less than a traceparent
	capture := outboxotel.Capture(outboxotel.WithPropagator(w3c))
	for _, tc := range []struct {
		name string
		ctx  context.Context
		ok   bool
	}{{"Untraced", context.Background(), true}, {"Traced", traced, false}} {
		ctx := emit.NewContext(tc.ctx)
		batch := emit.FromContext(ctx).BeginWith(limits, capture)
		err := emit.Emit(ctx, ev)
		if tc.ok && err != nil || !tc.ok && !errors.Is(err, emit.ErrRecordTooLarge) {
			t.Errorf("%s: Emit = %v, want ok %v (else ErrRecordTooLarge)", tc.name, err, tc.ok)
		}
		if n := len(batch.Take()); tc.ok != (n == 1) {
			t.Errorf("%s: %d events buffered", tc.name, n)
		}
	}
}

// BenchmarkEmit is one emit.Emit into an in-memory batch (no database)
// inside a sampled span with baggage: without a Capture (off), and with
// Capture (on). The difference is what tracing adds to each Emit.
//
//	go test -run XXX -bench BenchmarkEmit -count 6 ./otel/
func BenchmarkEmit(b *testing.B) {
	tp := sdktrace.NewTracerProvider()
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	m, _ := baggage.NewMemberRaw("tenant", "acme")
	bg, _ := baggage.New(m)
	ctx, span := tp.Tracer("bench").Start(baggage.ContextWithBaggage(context.Background(), bg), "request")
	defer span.End()
	payload := []byte(`{"order_id":"o-000000","status":"paid","amount_cents":12345,"currency":"EUR","items":3}`)
	for _, v := range []struct {
		name    string
		capture emit.Capture
	}{{"off", nil}, {"on", outboxotel.Capture(outboxotel.WithPropagator(w3c))}} {
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			sctx := emit.NewContext(ctx)
			s := emit.FromContext(sctx)
			batch := s.BeginWith(emit.Limits{}, v.capture)
			n := 0
			for b.Loop() {
				if err := emit.Emit(sctx, emit.Event{AggregateType: "order", AggregateID: "o-1", Type: "order.paid", Payload: payload}); err != nil {
					b.Fatal(err)
				}
				if n++; n == 1000 {
					batch.Take()
					batch, n = s.BeginWith(emit.Limits{}, v.capture), 0
				}
			}
		})
	}
}

// BenchmarkStartPublish is the relay-side cost of one traced batch of 100
// messages, each carrying a captured trace context: StartPublish and end,
// with one span and 100 links (batch) or 100 spans (per_message).
//
//	go test -run XXX -bench BenchmarkStartPublish -count 6 ./otel/
func BenchmarkStartPublish(b *testing.B) {
	tp := sdktrace.NewTracerProvider()
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("bench").Start(context.Background(), "request")
	defer span.End()
	msgs := make([]relay.Message, 100)
	for i := range msgs {
		msgs[i] = message(ctx, "m-"+strconv.Itoa(i), "o-"+strconv.Itoa(i), "")
	}
	for _, v := range []struct {
		name string
		opts []outboxotel.Option
	}{{"batch", nil}, {"per_message", []outboxotel.Option{outboxotel.WithSpanPerMessage()}}} {
		b.Run(v.name, func(b *testing.B) {
			obs := outboxotel.NewObserver(nil, append(v.opts, outboxotel.WithPropagator(w3c), outboxotel.WithTracerProvider(tp))...)
			b.ReportAllocs()
			for b.Loop() {
				_, end := obs.StartPublish(context.Background(), msgs)
				end(nil)
			}
		})
	}
}

func TestObserverSpanPerMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	obs := outboxotel.NewObserver(nil, outboxotel.WithPropagator(w3c), outboxotel.WithTracerProvider(b.tp), outboxotel.WithSpanPerMessage())
	ctxA, scA := b.origin(t, "a")
	ctxB, scB := b.origin(t, "b")
	msgs := []relay.Message{
		message(ctxA, "m-1", "o-1", ""),
		message(context.Background(), "m-2", "o-2", "own.topic"),
		message(ctxB, "m-3", "o-3", ""),
	}
	ctx, end := obs.StartPublish(context.Background(), msgs)
	if trace.SpanContextFromContext(ctx).IsValid() {
		t.Error("Publish's context carries a span; want the relay's context unchanged")
	}
	end(relay.PublishErrors{nil, fmt.Errorf("%w: too large", relay.ErrPermanent), errors.New("timeout")})
	spans := b.rec.Ended()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3", len(spans))
	}
	byID := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byID[attrs(s.Attributes())["messaging.message.id"].AsString()] = s
	}
	s1, s2, s3 := byID["m-1"], byID["m-2"], byID["m-3"]
	if s1 == nil || s2 == nil || s3 == nil {
		t.Fatalf("spans by message ID %v", byID)
	}
	if s1.Parent().SpanID() != scA.SpanID() || s1.SpanContext().TraceID() != scA.TraceID() || s1.Status().Code != codes.Unset || s1.Name() != "send outbox.event.order" {
		t.Errorf("m-1: %q parent %v status %v; want a child of its origin, unset", s1.Name(), s1.Parent(), s1.Status())
	}
	wantAttrs(t, "m-1", s1.Attributes(), map[attribute.Key]any{
		"messaging.system": "kafka", "messaging.kafka.message.key": "o-1", "messaging.destination.name": "outbox.event.order",
		"messaging.operation.type": "send", "messaging.batch.message_count": nil,
	})
	if s2.Parent().IsValid() || s2.Status().Code != codes.Error || s2.Name() != "send own.topic" {
		t.Errorf("m-2: %q parent %v status %v; want a root with status Error", s2.Name(), s2.Parent(), s2.Status())
	}
	wantAttrs(t, "m-2", s2.Attributes(), map[attribute.Key]any{"error.type": outboxotel.ErrorTypePermanent})
	if s3.Parent().SpanID() != scB.SpanID() || s3.Status().Code != codes.Error {
		t.Errorf("m-3: parent %v status %v", s3.Parent(), s3.Status())
	}
	wantAttrs(t, "m-3", s3.Attributes(), map[attribute.Key]any{"error.type": outboxotel.ErrorTypeTransient})

	// A batch error fails every message's span.
	b.rec.Reset()
	_, end = obs.StartPublish(context.Background(), msgs[:2])
	end(errors.New("broker unreachable"))
	for _, s := range b.rec.Ended() {
		if s.Status().Code != codes.Error {
			t.Errorf("%s: status %v, want Error", s.Name(), s.Status())
		}
		wantAttrs(t, s.Name(), s.Attributes(), map[attribute.Key]any{"error.type": outboxotel.ErrorTypeBatch})
	}
	if n := len(b.rec.Ended()); n != 2 {
		t.Errorf("%d spans after the batch error, want 2", n)
	}
}
