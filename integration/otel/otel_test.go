// Package outboxotel_test runs outboxotel end to end: a traced HTTP
// request, Emit, COMMIT on each real database, the relay's publish to the
// in-process Kafka broker, and a franz-go consumer continuing the trace.
// It lives in the integration module so that the otel module's users do
// not download kfake.
package outboxotel_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	outboxotel "github.com/sqloutbox/outbox/otel"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

const topic = "outbox.event.order"

var w3c = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// bundle is one test's tracer, database, broker, publisher and relay.
type bundle struct {
	rec    *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	e      *testdb.Env
	broker *kafkatest.Broker
	ctx    context.Context
}

// setup builds a traced outbox on tg with a private broker (configs: its
// broker configs) and starts a relay publishing to it. The broker is
// closed before the relay starts if closed is set.
func setup(t *testing.T, tg testdb.Target, configs map[string]string, closed bool, obsOpts ...outboxotel.Option) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	broker, err := kafkatest.Start(kafkatest.Topics(1, topic), kafkatest.BrokerConfigs(configs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	pub, err := kafka.NewPublisher(kafka.Config{Brokers: broker.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	if closed {
		broker.Close()
	}
	e := testdb.New(t, tg, driver.Config{Capture: outboxotel.Capture(outboxotel.WithPropagator(w3c))})
	r, err := relay.New(e.Outbox, e.RelayDB, relay.Config{
		Publisher: pub, PollInterval: 20 * time.Millisecond, PublishTimeout: time.Second,
		RetryInitial: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond, Wakeup: e.Outbox.Wakeup(),
		Observer: outboxtest.WatchOrder(t, outboxotel.NewObserver(nil, append([]outboxotel.Option{outboxotel.WithPropagator(w3c), outboxotel.WithTracerProvider(tp)}, obsOpts...)...)),
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		sctx, c := context.WithTimeout(context.Background(), 10*time.Second)
		defer c()
		if err := r.Stop(sctx); err != nil {
			t.Errorf("relay stop: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("relay run: %v", err)
		}
	})
	return &bundle{rec: rec, tp: tp, tracer: tp.Tracer("test"), e: e, broker: broker, ctx: ctx}
}

// serverSpan is what otelhttp's handler does: extract the caller's
// context from the request and run next inside a server span.
func (b *bundle) serverSpan(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := w3c.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := b.tracer.Start(ctx, r.Method+" "+r.URL.Path, trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// orders is the application handler: one transaction emitting one event
// whose payload is the request body.
func (b *bundle) orders(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, err := b.e.DB.BeginTx(ctx, nil)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer func() { _ = tx.Rollback() }()
	id := r.URL.Query().Get("id")
	body := r.URL.Query().Get("body")
	if body == "" {
		body = `{"status":"paid"}`
	}
	if err := outbox.Emit(ctx, outbox.Event{ID: "msg-" + id, AggregateType: "order", AggregateID: id, Type: "order.paid", Payload: []byte(body)}); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err := tx.Commit(); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// request sends POST /orders?id=... from a client span carrying baggage
// tenant and user, and returns the client span's context.
func (b *bundle) request(t *testing.T, srv *httptest.Server, id, body string) trace.SpanContext {
	t.Helper()
	m1, _ := baggage.NewMemberRaw("tenant", "acme corp")
	m2, _ := baggage.NewMemberRaw("user", "42")
	bg, err := baggage.New(m1, m2)
	if err != nil {
		t.Fatal(err)
	}
	ctx, span := b.tracer.Start(baggage.ContextWithBaggage(b.ctx, bg), "client", trace.WithSpanKind(trace.SpanKindClient))
	defer span.End()
	u := srv.URL + "/orders?id=" + id
	if body != "" {
		u += "&body=" + body
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	w3c.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("POST %s: %s", u, resp.Status)
	}
	return span.SpanContext()
}

func (b *bundle) server(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(b.serverSpan(outbox.Middleware(http.HandlerFunc(b.orders))))
	t.Cleanup(srv.Close)
	return srv
}

// waitSpan waits for an ended span matching pick.
func (b *bundle) waitSpan(t *testing.T, what string, pick func(sdktrace.ReadOnlySpan) bool) sdktrace.ReadOnlySpan {
	t.Helper()
	var found sdktrace.ReadOnlySpan
	testdb.Eventually(t, b.ctx, what, func() bool {
		for _, s := range b.rec.Ended() {
			if pick(s) {
				found = s
				return true
			}
		}
		return false
	})
	return found
}

func attrs(kvs []attribute.KeyValue) map[attribute.Key]any {
	m := make(map[attribute.Key]any, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv.Value.AsInterface()
	}
	return m
}

func wantAttrs(t *testing.T, what string, got []attribute.KeyValue, want map[attribute.Key]any) {
	t.Helper()
	m := attrs(got)
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s: %s = %v, want %v", what, k, m[k], v)
		}
	}
}

// TestTraceEndToEnd: one trace from an HTTP client span, through the
// server span and outbox.Middleware's handler, Emit and COMMIT, the relay's
// publish span (linked to the server span) and the broker, to a franz-go
// consumer whose span, started from Extract over the record's headers, is a child of the
// server span; baggage arrives intact.
func TestTraceEndToEnd(t *testing.T) {
	t.Parallel()
	for _, tg := range testdb.All {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tg, nil, false)
			srv := b.server(t)
			client := b.request(t, srv, "o-1", "")

			serverSpan := b.waitSpan(t, "the server span", func(s sdktrace.ReadOnlySpan) bool { return s.SpanKind() == trace.SpanKindServer })
			if serverSpan.SpanContext().TraceID() != client.TraceID() || serverSpan.Parent().SpanID() != client.SpanID() {
				t.Fatalf("server span %v parent %v, want a child of the client span %v", serverSpan.SpanContext(), serverSpan.Parent(), client)
			}
			origin := serverSpan.SpanContext()

			// The relay's publish span.
			send := b.waitSpan(t, "the publish span", func(s sdktrace.ReadOnlySpan) bool { return s.SpanKind() == trace.SpanKindProducer })
			if send.Name() != "send "+topic || send.Status().Code != codes.Unset {
				t.Errorf("publish span %q status %+v, want %q, unset", send.Name(), send.Status(), "send "+topic)
			}
			wantAttrs(t, "publish span", send.Attributes(), map[attribute.Key]any{
				"messaging.system": "kafka", "messaging.operation.type": "send", "messaging.destination.name": topic,
				"messaging.batch.message_count": int64(1), "messaging.message.id": "msg-o-1", "messaging.kafka.message.key": "o-1",
			})
			links := send.Links()
			if len(links) != 1 || links[0].SpanContext.TraceID() != origin.TraceID() || links[0].SpanContext.SpanID() != origin.SpanID() {
				t.Fatalf("publish span links %+v, want one to the server span %v", links, origin)
			}
			wantAttrs(t, "link", links[0].Attributes, map[attribute.Key]any{
				"messaging.message.id": "msg-o-1", "messaging.kafka.message.key": "o-1", "messaging.destination.name": topic,
			})

			// The consumer.
			rec := consumeOne(t, b, "msg-o-1")
			headers := map[string]string{}
			for _, h := range rec.Headers {
				headers[h.Key] = string(h.Value)
			}
			wantTP := fmt.Sprintf("00-%s-%s-01", origin.TraceID(), origin.SpanID())
			hb, err := baggage.Parse(headers["baggage"])
			if headers["traceparent"] != wantTP || err != nil || hb.Len() != 2 || hb.Member("tenant").Value() != "acme corp" || hb.Member("user").Value() != "42" {
				t.Errorf("record headers %v (baggage: %v), want traceparent %s and the request's baggage", headers, err, wantTP)
			}
			cctx := outboxotel.Extract(b.ctx, franzHeader(rec), outboxotel.WithPropagator(w3c))
			_, span := b.tracer.Start(cctx, "process "+topic, trace.WithSpanKind(trace.SpanKindConsumer))
			span.End()
			cs := b.waitSpan(t, "the consumer span", func(s sdktrace.ReadOnlySpan) bool { return s.SpanKind() == trace.SpanKindConsumer })
			if cs.SpanContext().TraceID() != client.TraceID() || cs.Parent().SpanID() != origin.SpanID() || !cs.Parent().IsRemote() {
				t.Errorf("consumer span %v parent %v, want a child of the server span %v in the client's trace", cs.SpanContext(), cs.Parent(), origin)
			}
			bg := baggage.FromContext(cctx)
			if bg.Len() != 2 || bg.Member("tenant").Value() != "acme corp" || bg.Member("user").Value() != "42" {
				t.Errorf("consumer baggage %q, want tenant=acme corp and user=42", bg.String())
			}

			// The same record through sarama.
			msg := consumeSarama(t, b, "msg-o-1")
			sctx := outboxotel.Extract(b.ctx, saramaHeader(msg), outboxotel.WithPropagator(w3c))
			if ssc := trace.SpanContextFromContext(sctx); ssc.TraceID() != origin.TraceID() || ssc.SpanID() != origin.SpanID() || !ssc.IsRemote() {
				t.Errorf("sarama: extracted %v, want the server span %v", ssc, origin)
			}
			if sb := baggage.FromContext(sctx); sb.Member("tenant").Value() != "acme corp" || sb.Member("user").Value() != "42" {
				t.Errorf("sarama: baggage %q", sb.String())
			}
		})
	}
}

// TestTraceSpanPerMessage: with WithSpanPerMessage the relay's publish
// span is a child of the server span, in the request's trace, as is the
// consumer's span: siblings.
func TestTraceSpanPerMessage(t *testing.T) {
	t.Parallel()
	b := setup(t, testdb.All[0], nil, false, outboxotel.WithSpanPerMessage())
	client := b.request(t, b.server(t), "o-1", "")
	origin := b.waitSpan(t, "the server span", func(s sdktrace.ReadOnlySpan) bool { return s.SpanKind() == trace.SpanKindServer }).SpanContext()
	send := b.waitSpan(t, "the publish span", func(s sdktrace.ReadOnlySpan) bool { return s.SpanKind() == trace.SpanKindProducer })
	if send.SpanContext().TraceID() != client.TraceID() || send.Parent().SpanID() != origin.SpanID() || len(send.Links()) != 0 {
		t.Errorf("publish span %v parent %v links %d; want a child of the server span %v in the client's trace", send.SpanContext(), send.Parent(), len(send.Links()), origin)
	}
	wantAttrs(t, "publish span", send.Attributes(), map[attribute.Key]any{
		"messaging.system": "kafka", "messaging.destination.name": topic, "messaging.message.id": "msg-o-1", "messaging.kafka.message.key": "o-1",
	})
	rec := consumeOne(t, b, "msg-o-1")
	cctx := outboxotel.Extract(b.ctx, franzHeader(rec), outboxotel.WithPropagator(w3c))
	if sc := trace.SpanContextFromContext(cctx); sc.SpanID() != origin.SpanID() || sc.TraceID() != client.TraceID() {
		t.Errorf("consumer context %v, want the server span %v", sc, origin)
	}
}

// franzHeader is the adapter of outboxotel's package documentation: a
// lookup of a franz-go record's headers for outboxotel.Extract.
func franzHeader(rec *kgo.Record) func(string) string {
	return func(k string) string {
		for _, h := range rec.Headers {
			if h.Key == k {
				return string(h.Value)
			}
		}
		return ""
	}
}

// saramaHeader is franzHeader for a sarama message (whose headers may hold
// nil entries).
func saramaHeader(msg *sarama.ConsumerMessage) func(string) string {
	return func(k string) string {
		for _, h := range msg.Headers {
			if h != nil && string(h.Key) == k {
				return string(h.Value)
			}
		}
		return ""
	}
}

// TestDefaultTopic: outboxotel names a destination as relay/kafka routes it
// (it copies the rule so as not to import relay/kafka and sarama).
func TestDefaultTopic(t *testing.T) {
	t.Parallel()
	if outboxotel.DefaultTopicPrefix != kafka.DefaultTopicPrefix {
		t.Errorf("outboxotel.DefaultTopicPrefix %q, relay/kafka's %q", outboxotel.DefaultTopicPrefix, kafka.DefaultTopicPrefix)
	}
	for _, m := range []relay.Message{{}, {AggregateType: "order"}, {AggregateType: "order", Topic: "own"}} {
		if got, want := outboxotel.DefaultTopic(m), kafka.DefaultTopic(m); got != want {
			t.Errorf("DefaultTopic(%+v) = %q, relay/kafka's %q", m, got, want)
		}
	}
}

// consumeOne reads the topic with a franz-go client until the record of
// messageID arrives.
func consumeOne(t *testing.T, b *bundle, messageID string) *kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.broker.Addrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for {
		fs := cl.PollFetches(b.ctx)
		if b.ctx.Err() != nil {
			t.Fatalf("record %s not consumed: %v", messageID, b.ctx.Err())
		}
		var found *kgo.Record
		fs.EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == "outbox-message-id" && string(h.Value) == messageID {
					found = r
				}
			}
		})
		if found != nil {
			return found
		}
	}
}

// consumeSarama reads partition 0 of the topic with sarama until the
// record of messageID arrives.
func consumeSarama(t *testing.T, b *bundle, messageID string) *sarama.ConsumerMessage {
	t.Helper()
	c, err := sarama.NewConsumer(b.broker.Addrs(), sarama.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pc, err := c.ConsumePartition(topic, 0, sarama.OffsetOldest)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	for {
		select {
		case m := <-pc.Messages():
			for _, h := range m.Headers {
				if string(h.Key) == "outbox-message-id" && string(h.Value) == messageID {
					return m
				}
			}
		case err := <-pc.Errors():
			t.Fatalf("sarama: %v", err)
		case <-b.ctx.Done():
			t.Fatalf("record %s not consumed through sarama: %v", messageID, b.ctx.Err())
		}
	}
}

// TestTracePublishFailure: a failed publish gives the publish span an
// Error status: a record the broker refuses (partial failure, the message
// dead-lettered as permanent) and an unreachable broker (the batch failed
// as a whole); either span is still linked to the originating server span.
func TestTracePublishFailure(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		configs map[string]string
		closed  bool
		body    string
		typ     string
	}{
		{"RecordRefused", map[string]string{"message.max.bytes": "2000"}, false, `"` + strings.Repeat("x", 3000) + `"`, outboxotel.ErrorTypePartial},
		{"BrokerGone", nil, true, "", outboxotel.ErrorTypeBatch},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, testdb.All[0], tc.configs, tc.closed)
			srv := b.server(t)
			b.request(t, srv, "o-1", tc.body)
			origin := b.waitSpan(t, "the server span", func(s sdktrace.ReadOnlySpan) bool { return s.SpanKind() == trace.SpanKindServer }).SpanContext()
			send := b.waitSpan(t, "a failed publish span", func(s sdktrace.ReadOnlySpan) bool {
				return s.SpanKind() == trace.SpanKindProducer && s.Status().Code == codes.Error
			})
			wantAttrs(t, "publish span", send.Attributes(), map[attribute.Key]any{"error.type": tc.typ, "messaging.message.id": "msg-o-1"})
			if tc.typ == outboxotel.ErrorTypePartial {
				wantAttrs(t, "publish span", send.Attributes(), map[attribute.Key]any{"outbox.publish.failed_count": int64(1)})
			}
			if ev := send.Events(); len(ev) == 0 || ev[0].Name != "exception" {
				t.Errorf("publish span events %+v, want the error recorded", ev)
			}
			if l := send.Links(); len(l) != 1 || l[0].SpanContext.SpanID() != origin.SpanID() {
				t.Errorf("links %+v, want one to the server span", l)
			}
		})
	}
}

// TestTraceHeadersCountTowardLimit: on each database, an event that fits
// Limits.MaxRecordBytes without trace headers is refused at Emit
// (ErrRecordTooLarge, the transaction still usable) when the captured
// traceparent and baggage push it over, and no row is written for it.
func TestTraceHeadersCountTowardLimit(t *testing.T) {
	t.Parallel()
	for _, tg := range testdb.All {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			ev := outbox.Event{ID: "near", AggregateType: "order", AggregateID: "o-1", Type: "order.paid", Payload: []byte(`{"a":1}`), ContentType: emit.DefaultContentType}
			limit := emit.RecordSize(&ev) + 40 // a traceparent alone needs 55 + 11 + framing
			e := testdb.New(t, tg, driver.Config{Capture: outboxotel.Capture(outboxotel.WithPropagator(w3c)), Limits: outbox.Limits{MaxRecordBytes: limit}})
			tp := sdktrace.NewTracerProvider()
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ctx, span := tp.Tracer("test").Start(ctx, "handler")
			defer span.End()

			ctx = outbox.NewContext(ctx)
			tx, err := e.DB.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := outbox.Emit(ctx, ev); !errors.Is(err, outbox.ErrRecordTooLarge) {
				t.Fatalf("traced Emit = %v, want ErrRecordTooLarge", err)
			}
			if err := tx.Commit(); err != nil { // still usable after the refusal
				t.Fatal(err)
			}
			// One transaction at a time: SQLite's pool has one connection.
			untraced := outbox.NewContext(context.Background())
			utx, err := e.DB.BeginTx(untraced, nil)
			if err != nil {
				t.Fatal(err)
			}
			other := ev
			other.ID = "untraced"
			if err := outbox.Emit(untraced, other); err != nil {
				t.Fatalf("untraced Emit = %v, want accepted", err)
			}
			if err := utx.Commit(); err != nil {
				t.Fatal(err)
			}
			ids := testdb.Column(t, ctx, e.RelayDB, "SELECT message_id FROM "+e.Table)
			if len(ids) != 1 || ids[0] != "untraced" {
				t.Errorf("rows %v, want only the untraced event", ids)
			}
		})
	}
}
