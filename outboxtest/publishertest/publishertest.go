// Package publishertest is the conformance suite of relay.Publisher: the
// behaviours the relay relies on, run against any publisher and its broker.
// Every publisher of this repository runs it (relay/kafka against an
// in-process Kafka broker, relay/nats against a NATS JetStream server);
// run it against your own Publisher too:
//
//	func TestConformance(t *testing.T) {
//		publishertest.Run(t, publishertest.Config{
//			New: func(t *testing.T) publishertest.Target {
//				p := mybroker.NewPublisher(...)          // a fresh publisher ...
//				t.Cleanup(func() { p.Close() })
//				return publishertest.Target{
//					Publisher: p,
//					Received:  func(ctx context.Context, n int) ([]publishertest.Record, error) { ... }, // ... and what reached its broker
//				}
//			},
//			Quirks: publishertest.Quirks{TooLargePayload: 2 << 20},
//		})
//	}
//
// What it checks (each a subtest of Run, each with its own Target):
//
//   - Batch: 200 messages over 20 aggregates in one Publish, then 40 more:
//     Publish returns nil, leaves its argument unchanged, every message
//     arrives exactly once with its payload and headers byte for byte
//     (the relay's emit.Header* headers, then the event's own), and each
//     aggregate's messages arrive in batch order, the second batch after
//     the first.
//   - Headers: values and IDs at the edges of what emit accepts (unicode,
//     inner spaces, separators, an empty value, a 4 KiB value, subject and
//     routing-key metacharacters in the aggregate ID) arrive unchanged.
//   - EmptyPayload: a nil and an empty payload both arrive as zero bytes.
//   - TooLarge (Quirks.TooLargePayload > 0): one message the broker refuses
//     as too large among 50 of one aggregate fails alone, wrapping
//     relay.ErrPermanent, inside relay.PublishErrors; the earlier ones are
//     acknowledged and delivered in order; the later ones either are too
//     (Quirks.HoldsBack false) or fail without wrapping ErrPermanent and
//     are not delivered (HoldsBack true), and then, sent again as the
//     relay's next batch, are delivered after the earlier ones; the
//     oversized message alone is still a per-message ErrPermanent, never a
//     whole-batch error.
//   - Unroutable (Target.Unroutable set): a batch whose every message has
//     no route fails as a whole (one error, not PublishErrors) wrapping
//     relay.ErrUnavailable, before its deadline; one unroutable message among
//     others fails alone, not permanently; the publisher keeps working.
//   - ContextDone: a cancelled context ends Publish with context.Canceled,
//     not PublishErrors.
//   - Empty: Publish of nil or an empty batch returns nil.
//   - CloseTwice (the Publisher has Close() error): Close after Publish
//     returns nil, a second Close returns nil, and so do two concurrent
//     Closes of another publisher.
//   - Outage (Target.Outage set): with the broker unreachable, Publish with
//     a 2 s deadline returns one error (not PublishErrors, not
//     ErrPermanent) by the deadline plus a second; if Outage returns a
//     restore function, the same batch published again after restoring is
//     acknowledged, and every aggregate's first deliveries follow its
//     outbox ids (duplicates only of the same message ID).
//
// The suite uses only messages Emit would accept (emit's validation) with
// aggregate types "order" and "invoice" and an empty Topic, so a Target's
// broker needs routes for those two aggregate types only.
package publishertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/relay"
)

// Record is one message as a consumer received it from the broker.
type Record struct {
	// Payload is the message body as received.
	Payload []byte
	// Headers are the message's headers as received, one value per name.
	Headers map[string]string
	// Raw is the broker client's own record (for example a
	// kafkatest.Record or a *nats.Msg), for Config.CheckRecord; the suite
	// does not look at it.
	Raw any
}

// Target is one publisher under test with what its broker received. New
// returns a fresh one for every subtest, with its own routes (topics,
// streams, subjects), so subtests run in parallel.
type Target struct {
	// Publisher is the publisher under test. If it has a Close() error
	// method, the CloseTwice subtest calls it; otherwise New's t.Cleanup
	// must release it.
	Publisher relay.Publisher
	// Received waits until at least n records published through Publisher
	// (in this Target) have reached a consumer, or ctx ends, and returns
	// every record received so far. Records of one aggregate must be in
	// the order a consumer of that aggregate sees them (Kafka: partition
	// offset order; JetStream: stream sequence order). Required.
	Received func(ctx context.Context, n int) ([]Record, error)
	// Unroutable, if set, changes a message so that the broker has no
	// route for it (a topic, stream or exchange that does not exist). Nil
	// skips the Unroutable subtest.
	Unroutable func(m *relay.Message)
	// Outage, if set, makes the broker unreachable for Publisher (close a
	// proxy in front of it, close an in-process broker). It may return a
	// function that makes the broker reachable again (the same data), or
	// nil if it cannot. Nil skips the Outage subtest.
	Outage func() (restore func())
}

// Quirks are what a broker does differently, as data.
type Quirks struct {
	// TooLargePayload is a payload size in bytes that the Target's broker
	// refuses as too large while it accepts payloads of 1 KiB. 0 skips the
	// TooLarge subtest.
	TooLargePayload int
	// HoldsBack says that once a message fails, Publish fails the later
	// messages of its aggregate in the batch without sending them (what
	// the relay itself does on the next batch; JetStream's publisher does
	// it within the batch). False: the later messages may be acknowledged
	// (a Kafka producer does not stop them).
	HoldsBack bool
}

// Config is what Run needs.
type Config struct {
	// New returns a fresh Target for one subtest. It registers its own
	// cleanup with t. Required.
	New func(t *testing.T) Target
	// Quirks of the broker; the zero value is a broker without them.
	Quirks Quirks
	// CheckRecord, if set, is called for every record the suite matched to
	// the message it was published from, for broker-specific checks (key,
	// partition, subject).
	CheckRecord func(t *testing.T, r Record, m relay.Message)
	// Timeout bounds each subtest's waits. Default 60 s.
	Timeout time.Duration
}

// Run runs the conformance suite against cfg as parallel subtests of t.
func Run(t *testing.T, cfg Config) {
	t.Helper()
	if cfg.New == nil {
		t.Fatal("publishertest: Config.New is required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 60 * time.Second
	}
	s := &suite{cfg: cfg}
	for _, c := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"Batch", s.batch},
		{"Headers", s.headers},
		{"EmptyPayload", s.emptyPayload},
		{"TooLarge", s.tooLarge},
		{"Unroutable", s.unroutable},
		{"ContextDone", s.contextDone},
		{"Empty", s.empty},
		{"CloseTwice", s.closeTwice},
		{"Outage", s.outage},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t)
		})
	}
}

type suite struct{ cfg Config }

func (s *suite) target(t *testing.T) Target {
	t.Helper()
	tg := s.cfg.New(t)
	if tg.Publisher == nil || tg.Received == nil {
		t.Fatal("publishertest: Target.Publisher and Target.Received are required")
	}
	return tg
}

func (s *suite) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), s.cfg.Timeout)
	t.Cleanup(cancel)
	return ctx
}

// Messages builds n messages over aggs aggregates, outbox ids from
// firstID: even aggregates are "order", odd ones "invoice"; payloads
// alternate JSON (with spacing to keep) and raw bytes (NUL, 0xff); every
// third message has no headers of its own. Exported for publishers' own
// tests.
func Messages(prefix string, firstID int64, n, aggs int) []relay.Message {
	msgs := make([]relay.Message, n)
	for i := range msgs {
		a := i % aggs
		m := relay.Message{
			ID:            firstID + int64(i),
			MessageID:     fmt.Sprintf("%smsg-%04d", prefix, i),
			AggregateType: "order",
			AggregateID:   fmt.Sprintf("agg-%02d", a),
			EventType:     "order.updated",
			Partition:     a,
			Epoch:         int64(7 + a),
		}
		if a%2 == 1 {
			m.AggregateType = "invoice"
			m.EventType = "invoice.updated"
		}
		if i%2 == 0 {
			m.ContentType = emit.DefaultContentType
			m.Payload = fmt.Appendf(nil, "{\"seq\" : %d,\n \"agg\":%q}", i, m.AggregateID)
		} else {
			m.ContentType = "application/octet-stream"
			m.Payload = []byte{0x00, byte(i), 0xff, 0xfe, 'x', 0x00}
		}
		if i%3 != 0 {
			m.Headers = map[string]string{"trace-id": fmt.Sprintf("%032x", i), "seq": strconv.Itoa(i), "empty": ""}
		}
		msgs[i] = m
	}
	return msgs
}

// RecordsOf converts recs, in order, with conv: what a consumer of a
// broker kit received, as Record, e.g. RecordsOf(recs,
// natstest.Record.PublisherRecord). The kits' PublisherRecords call it.
func RecordsOf[R any](recs []R, conv func(R) Record) []Record {
	out := make([]Record, len(recs))
	for i, r := range recs {
		out[i] = conv(r)
	}
	return out
}

// WantHeaders returns the headers a consumer must receive for m: the
// relay's emit.Header* headers, then m.Headers.
func WantHeaders(m relay.Message) map[string]string {
	want := map[string]string{
		emit.HeaderMessageID:     m.MessageID,
		emit.HeaderEventType:     m.EventType,
		emit.HeaderAggregateType: m.AggregateType,
		emit.HeaderAggregateID:   m.AggregateID,
		emit.HeaderContentType:   m.ContentType,
		emit.HeaderPartition:     strconv.Itoa(m.Partition),
		emit.HeaderEpoch:         strconv.FormatInt(m.Epoch, 10),
	}
	maps.Copy(want, m.Headers)
	return want
}

// check compares every message with the one record carrying its message
// ID (payload, headers, CheckRecord) and every aggregate's records with
// msgs' order. Records of message IDs not in msgs are errors.
func (s *suite) check(t *testing.T, recs []Record, msgs []relay.Message) {
	t.Helper()
	byID := map[string]Record{}
	for _, r := range recs {
		id := r.Headers[emit.HeaderMessageID]
		if _, dup := byID[id]; dup {
			t.Errorf("message %q received twice", id)
		}
		byID[id] = r
	}
	known := map[string]bool{}
	for _, m := range msgs {
		known[m.MessageID] = true
		r, ok := byID[m.MessageID]
		if !ok {
			t.Errorf("%s not received", m.MessageID)
			continue
		}
		if !bytes.Equal(r.Payload, m.Payload) {
			t.Errorf("%s: payload %q, want %q", m.MessageID, r.Payload, m.Payload)
		}
		if want := WantHeaders(m); !maps.Equal(r.Headers, want) {
			t.Errorf("%s: headers %q, want %q", m.MessageID, r.Headers, want)
		}
		if s.cfg.CheckRecord != nil {
			s.cfg.CheckRecord(t, r, m)
		}
	}
	for id := range byID {
		if !known[id] {
			t.Errorf("received %q, which was not published (or should have failed)", id)
		}
	}
	checkOrder(t, recs, msgs)
}

type aggregate struct{ typ, id string }

// checkOrder: per aggregate, the message IDs of recs (first delivery of
// each) are those of msgs, in msgs' order.
func checkOrder(t *testing.T, recs []Record, msgs []relay.Message) {
	t.Helper()
	want := map[aggregate][]string{}
	for _, m := range msgs {
		a := aggregate{m.AggregateType, m.AggregateID}
		want[a] = append(want[a], m.MessageID)
	}
	got := map[aggregate][]string{}
	seen := map[string]bool{}
	for _, r := range recs {
		id := r.Headers[emit.HeaderMessageID]
		if seen[id] {
			continue
		}
		seen[id] = true
		a := aggregate{r.Headers[emit.HeaderAggregateType], r.Headers[emit.HeaderAggregateID]}
		got[a] = append(got[a], id)
	}
	for a, w := range want {
		if !slices.Equal(got[a], w) {
			t.Errorf("aggregate %s/%s received in order %v, want %v", a.typ, a.id, got[a], w)
		}
	}
}

func (s *suite) receive(ctx context.Context, t *testing.T, tg Target, n int) []Record {
	t.Helper()
	recs, err := tg.Received(ctx, n)
	if err != nil {
		t.Fatalf("waiting for %d records: %v (got %d)", n, err, len(recs))
	}
	return recs
}

// receiveEach waits until every message of msgs was received at least
// once: a batch re-sent after an outage may deliver some twice, and
// those duplicates must not end the wait before the last first copy.
func (s *suite) receiveEach(ctx context.Context, t *testing.T, tg Target, msgs []relay.Message) []Record {
	t.Helper()
	want := map[string]bool{}
	for _, m := range msgs {
		want[m.MessageID] = true
	}
	n := len(msgs)
	for {
		recs := s.receive(ctx, t, tg, n)
		got := map[string]bool{}
		for _, r := range recs {
			if id := r.Headers[emit.HeaderMessageID]; want[id] {
				got[id] = true
			}
		}
		if len(got) == len(want) {
			return recs
		}
		n = len(recs) + len(want) - len(got)
	}
}

func asPublishErrors(err error) (relay.PublishErrors, bool) {
	var pe relay.PublishErrors
	ok := errors.As(err, &pe)
	return pe, ok
}

func (s *suite) batch(t *testing.T) {
	tg := s.target(t)
	ctx := s.ctx(t)
	msgs := Messages("b-", 1000, 200, 20)
	snapshot := slices.Clone(msgs)
	for i := range snapshot {
		snapshot[i].Payload = slices.Clone(msgs[i].Payload)
		snapshot[i].Headers = maps.Clone(msgs[i].Headers)
	}
	if err := tg.Publisher.Publish(ctx, msgs); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if !reflect.DeepEqual(msgs, snapshot) {
		t.Error("Publish modified the messages")
	}
	s.check(t, s.receive(ctx, t, tg, len(msgs)), msgs)

	// A second batch on the same publisher continues every aggregate's
	// order after the first.
	more := Messages("b2-", 2000, 40, 20)
	if err := tg.Publisher.Publish(ctx, more); err != nil {
		t.Fatalf("second Publish: %v", err)
	}
	all := append(slices.Clone(msgs), more...)
	s.check(t, s.receive(ctx, t, tg, len(all)), all)
}

func (s *suite) headers(t *testing.T) {
	tg := s.target(t)
	ctx := s.ctx(t)
	base := relay.Message{AggregateType: "order", EventType: "order.noted", ContentType: "text/plain; charset=utf-8", Payload: []byte("x")}
	ids := []string{"plain", "with space", "dots.and*stars>", "hash#tag", "ünïcødé-€", "slash/colon:semi;", "%25percent%", "_", strings.Repeat("L", 200)}
	msgs := make([]relay.Message, 0, len(ids)*2)
	for i, id := range ids {
		m := base
		m.ID = int64(i + 1)
		m.MessageID = fmt.Sprintf("h-%d", i)
		m.AggregateID = id
		m.EventType = "order.noted " + id
		m.Partition = i
		m.Epoch = 1 << 40
		m.Headers = map[string]string{
			"traceparent":  "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"tracestate":   "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
			"inner-spaces": "a  b\tc: d",
			"unicode":      "grüße, 世界 ✓",
			"separators":   `"quoted" (p) <a>, b=c; d@e [f] {g} \h /i ?j`,
			"empty":        "",
			"Mixed-Case":   "Case Kept",
			"long":         strings.Repeat("v", 4096),
		}
		msgs = append(msgs, m)
	}
	// A second message per aggregate, for order.
	for i, id := range ids {
		m := base
		m.ID = int64(100 + i)
		m.MessageID = fmt.Sprintf("h2-%d", i)
		m.AggregateID = id
		msgs = append(msgs, m)
	}
	if err := tg.Publisher.Publish(ctx, msgs); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	s.check(t, s.receive(ctx, t, tg, len(msgs)), msgs)
}

func (s *suite) emptyPayload(t *testing.T) {
	tg := s.target(t)
	ctx := s.ctx(t)
	msgs := []relay.Message{
		{ID: 1, MessageID: "empty-slice", AggregateType: "order", AggregateID: "a", EventType: "order.ping",
			ContentType: "application/octet-stream", Payload: []byte{}},
		{ID: 2, MessageID: "nil-slice", AggregateType: "order", AggregateID: "a", EventType: "order.ping",
			ContentType: "application/octet-stream", Payload: nil},
	}
	if err := tg.Publisher.Publish(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	recs := s.receive(ctx, t, tg, len(msgs))
	for _, r := range recs {
		if len(r.Payload) != 0 {
			t.Errorf("%s: payload %q, want empty", r.Headers[emit.HeaderMessageID], r.Payload)
		}
	}
	checkOrder(t, recs, msgs)
}

func (s *suite) tooLarge(t *testing.T) {
	if s.cfg.Quirks.TooLargePayload <= 0 {
		t.Skip("Quirks.TooLargePayload not set")
	}
	const bigAt = 25
	tg := s.target(t)
	ctx := s.ctx(t)
	msgs := make([]relay.Message, 51)
	for i := range msgs {
		msgs[i] = relay.Message{ID: int64(i + 1), MessageID: fmt.Sprintf("m-%02d", i), AggregateType: "order",
			AggregateID: "the-aggregate", EventType: "order.updated", ContentType: "application/octet-stream",
			Payload: []byte(strconv.Itoa(i))}
	}
	// Another aggregate in the same batch is not affected.
	other := relay.Message{ID: 100, MessageID: "other", AggregateType: "invoice", AggregateID: "another",
		EventType: "invoice.updated", ContentType: "application/octet-stream", Payload: []byte("o")}
	msgs = append(msgs, other)
	msgs[bigAt].Payload = bytes.Repeat([]byte("x"), s.cfg.Quirks.TooLargePayload)

	err := tg.Publisher.Publish(ctx, msgs)
	pe, ok := asPublishErrors(err)
	if !ok {
		t.Fatalf("Publish = %v, want relay.PublishErrors", err)
	}
	if len(pe) != len(msgs) {
		t.Fatalf("PublishErrors has %d entries, want %d", len(pe), len(msgs))
	}
	var want []relay.Message
	for i, e := range pe {
		later := i > bigAt && i < 51
		switch {
		case i == bigAt && !errors.Is(e, relay.ErrPermanent):
			t.Errorf("oversized message %d: %v, want an error wrapping relay.ErrPermanent", i, e)
		case i == bigAt:
		case later && s.cfg.Quirks.HoldsBack && e == nil:
			t.Errorf("message %d after the failed one of its aggregate was acknowledged (Quirks.HoldsBack)", i)
		case later && s.cfg.Quirks.HoldsBack && errors.Is(e, relay.ErrPermanent):
			t.Errorf("held-back message %d failed permanently: %v", i, e)
		case later && s.cfg.Quirks.HoldsBack:
		case e != nil:
			t.Errorf("message %d failed: %v", i, e)
		default:
			want = append(want, msgs[i])
		}
	}
	recs := s.receive(ctx, t, tg, len(want))
	s.check(t, recs, want)

	// A batch of only the oversized message is still a per-message
	// (permanent) failure, not a whole-batch transient one, so the relay
	// dead-letters it instead of backing off forever.
	err = tg.Publisher.Publish(ctx, msgs[bigAt:bigAt+1])
	if pe, ok := asPublishErrors(err); !ok || len(pe) != 1 || !errors.Is(pe[0], relay.ErrPermanent) {
		t.Errorf("Publish of the oversized message alone = %v, want PublishErrors{ErrPermanent}", err)
	}
	if !s.cfg.Quirks.HoldsBack {
		return
	}
	// The relay dead-letters the oversized message and sends the held-back
	// ones in its next batch: they follow the earlier ones.
	if err := tg.Publisher.Publish(ctx, msgs[bigAt+1:51]); err != nil {
		t.Fatalf("Publish of the held-back messages: %v", err)
	}
	all := append(slices.Clone(msgs[:bigAt]), msgs[bigAt+1:]...)
	s.check(t, s.receive(ctx, t, tg, len(all)), all)
}

// routed returns n small messages over 3 aggregates.
func routed(prefix string, n int) []relay.Message {
	msgs := make([]relay.Message, n)
	for i := range msgs {
		msgs[i] = relay.Message{ID: int64(i + 1), MessageID: fmt.Sprintf("%s-%d", prefix, i), AggregateType: "order",
			AggregateID: fmt.Sprintf("a-%d", i%3), EventType: "e", ContentType: emit.DefaultContentType,
			Payload: []byte(`{}`)}
	}
	return msgs
}

func (s *suite) unroutable(t *testing.T) {
	tg := s.target(t)
	if tg.Unroutable == nil {
		t.Skip("Target.Unroutable not set")
	}
	ctx := s.ctx(t)
	all := routed("u", 3)
	for i := range all {
		tg.Unroutable(&all[i])
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err := tg.Publisher.Publish(short, all)
	switch {
	case err == nil:
		t.Fatal("Publish without a route succeeded")
	case errors.Is(err, relay.ErrPermanent):
		t.Errorf("missing route reported as permanent: %v", err)
	case short.Err() != nil:
		t.Errorf("Publish returned only at its deadline: %v", err)
	case !errors.Is(err, relay.ErrUnavailable):
		t.Errorf("Publish = %v, want an error wrapping relay.ErrUnavailable", err)
	}
	if pe, ok := asPublishErrors(err); ok {
		t.Errorf("whole-batch failure reported as PublishErrors %v", pe)
	}

	// One of several: that one fails, not permanently; the others pass.
	msgs := routed("v", 4)
	tg.Unroutable(&msgs[2]) // aggregate a-2: no later message of it
	err = tg.Publisher.Publish(ctx, msgs)
	pe, ok := asPublishErrors(err)
	if !ok || len(pe) != 4 {
		t.Fatalf("Publish = %v, want PublishErrors of 4", err)
	}
	for i, e := range pe {
		if (i == 2) != (e != nil) {
			t.Errorf("entry %d: %v", i, e)
		}
	}
	if errors.Is(pe[2], relay.ErrPermanent) {
		t.Errorf("missing route is not permanent: %v", pe[2])
	}
	// The publisher still works.
	ok3 := routed("w", 3)
	if err := tg.Publisher.Publish(ctx, ok3); err != nil {
		t.Errorf("Publish with a route afterwards: %v", err)
	}
	s.check(t, s.receive(ctx, t, tg, 6), append([]relay.Message{msgs[0], msgs[1], msgs[3]}, ok3...))
}

func (s *suite) contextDone(t *testing.T) {
	tg := s.target(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := tg.Publisher.Publish(ctx, routed("c", 5))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Publish with a cancelled context = %v, want context.Canceled", err)
	}
	if _, ok := asPublishErrors(err); ok {
		t.Errorf("cancelled Publish returned PublishErrors: %v", err)
	}
}

func (s *suite) empty(t *testing.T) {
	tg := s.target(t)
	ctx := s.ctx(t)
	if err := tg.Publisher.Publish(ctx, nil); err != nil {
		t.Errorf("Publish(nil) = %v", err)
	}
	if err := tg.Publisher.Publish(ctx, []relay.Message{}); err != nil {
		t.Errorf("Publish(empty) = %v", err)
	}
}

type closer interface{ Close() error }

// closeWithin closes c, failing if Close takes longer than d.
func closeWithin(c closer, d time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- c.Close() }()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		return fmt.Errorf("publishertest: Close did not return within %s", d)
	}
}

func (s *suite) closeTwice(t *testing.T) {
	tg := s.target(t)
	c, ok := tg.Publisher.(closer)
	if !ok {
		t.Skip("the Publisher has no Close() error method")
	}
	if err := tg.Publisher.Publish(s.ctx(t), routed("cl", 2)); err != nil {
		t.Fatal(err)
	}
	if err := closeWithin(c, 30*time.Second); err != nil {
		t.Fatalf("first Close: %v", err)
	}
	if err := closeWithin(c, 5*time.Second); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	c2, ok := s.target(t).Publisher.(closer)
	if !ok {
		t.Fatal("the second Target's Publisher has no Close")
	}
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- closeWithin(c2, 30*time.Second) }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Close: %v", err)
		}
	}
}

func (s *suite) outage(t *testing.T) {
	tg := s.target(t)
	if tg.Outage == nil {
		t.Skip("Target.Outage not set")
	}
	ctx := s.ctx(t)
	before := routed("o", 3)
	if err := tg.Publisher.Publish(ctx, before); err != nil {
		t.Fatalf("Publish while the broker is up: %v", err)
	}
	restore := tg.Outage()

	const deadline = 2 * time.Second
	during := routed("p", 10)
	for i := range during {
		during[i].ID += 100
	}
	short, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	start := time.Now()
	err := tg.Publisher.Publish(short, during)
	elapsed := time.Since(start)
	if err == nil {
		t.Fatal("Publish with the broker unreachable succeeded")
	}
	t.Logf("Publish during the outage, after %s: %v", elapsed.Round(time.Millisecond), err)
	if pe, ok := asPublishErrors(err); ok {
		t.Errorf("broker outage reported as PublishErrors %v, want one error for the batch", pe)
	}
	if errors.Is(err, relay.ErrPermanent) {
		t.Errorf("broker outage reported as permanent: %v", err)
	}
	if elapsed > deadline+time.Second {
		t.Errorf("Publish returned %v after a %v deadline", elapsed, deadline)
	}
	if restore == nil {
		return
	}
	restore()
	// The relay re-sends the whole batch (the same ids) until it is
	// acknowledged; so does this loop, each try with its own deadline.
	for {
		try, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = tg.Publisher.Publish(try, during)
		cancel()
		if err == nil {
			break
		}
		// Pace the retries as the relay's backoff would.
		select {
		case <-ctx.Done():
			t.Fatalf("Publish after the broker came back: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	all := append(slices.Clone(before), during...)
	recs := s.receiveEach(ctx, t, tg, all)
	checkOrder(t, recs, all)
	ids := map[string]bool{}
	for _, m := range all {
		ids[m.MessageID] = true
	}
	for _, r := range recs {
		if !ids[r.Headers[emit.HeaderMessageID]] {
			t.Errorf("received %q, which was never published", r.Headers[emit.HeaderMessageID])
		}
	}
}
