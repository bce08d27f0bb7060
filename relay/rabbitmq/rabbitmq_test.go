package rabbitmq_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
	"github.com/sqloutbox/outbox/internal/testkit/privateserver"
	"github.com/sqloutbox/outbox/outboxtest/publishertest"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/rabbitmq"
	"github.com/sqloutbox/outbox/relay/rabbitmq/rabbitmqtest"
)

var (
	_ relay.Publisher     = (*rabbitmq.Publisher)(nil)
	_ relay.HealthChecker = (*rabbitmq.Publisher)(nil)
)

// brokerURL is the RabbitMQ the tests use.
func brokerURL() string {
	if u := os.Getenv("OUTBOX_TEST_RABBITMQ"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// viaProxy returns brokerURL with its host replaced by addr.
func viaProxy(t *testing.T, addr string) string {
	t.Helper()
	u, err := amqp.ParseURI(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("amqp://%s:%s@%s/%s", u.Username, u.Password, addr, u.Vhost)
}

func brokerAddr(t *testing.T) string {
	t.Helper()
	u, err := amqp.ParseURI(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s:%d", u.Host, u.Port)
}

func unique() string { return rabbitmqtest.UniqueName("") }

func testCtx(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// admin connects directly (skipping the test if the broker does not
// answer, failing with OUTBOX_TEST_REQUIRE=1) and returns a channel.
func admin(t testing.TB) (*amqp.Connection, *amqp.Channel) {
	t.Helper()
	conn, err := amqp.Dial(brokerURL())
	if err != nil {
		if os.Getenv("OUTBOX_TEST_REQUIRE") != "" {
			t.Fatalf("RabbitMQ at %s: %v", brokerURL(), err)
		}
		t.Skipf("RabbitMQ not available: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return conn, ch
}

// space is one test's own topic exchange and queue (bound with binding,
// rabbitmqtest's consumer), deleted when the test ends.
type space struct {
	Exchange string
	Queue    string
	ch       *amqp.Channel
	cons     *rabbitmqtest.Consumer
}

func newSpace(t *testing.T, binding string) *space {
	t.Helper()
	conn, ch := admin(t)
	ex, err := rabbitmqtest.DeclareExchange(ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.ExchangeDelete(ex, false, false) })
	cons, err := rabbitmqtest.NewConsumer(conn, ex, binding)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cons.Close(); err != nil {
			t.Error(err)
		}
	})
	return &space{Exchange: ex, Queue: cons.Queue(), ch: ch, cons: cons}
}

// wait returns the deliveries once there are at least n, or what there is
// and ctx's error.
func (s *space) wait(ctx context.Context, n int) ([]rabbitmqtest.Record, error) {
	return s.cons.WaitForCount(ctx, n)
}

func newPublisher(t *testing.T, cfg rabbitmq.Config) *rabbitmq.Publisher {
	t.Helper()
	p, err := rabbitmq.NewPublisher(cfg)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func startProxy(t *testing.T) *faultproxy.Proxy {
	t.Helper()
	proxy, err := faultproxy.Start(brokerAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	return proxy
}

// TestConformance runs the shared publisher suite against RabbitMQ, each
// subtest with its own exchange and queue (bound "#") and its own
// connection through its own TCP proxy. RabbitMQ's quirks: the publisher
// holds an aggregate back (HoldsBack); the too-large limit is the
// publisher's MaxMessageBytes (10,000 here; the broker's max_message_size
// is server-wide); an exchange that does not exist is the missing route.
func TestConformance(t *testing.T) {
	t.Parallel()
	publishertest.Run(t, publishertest.Config{
		New: func(t *testing.T) publishertest.Target {
			s := newSpace(t, "#")
			proxy := startProxy(t)
			p := newPublisher(t, rabbitmq.Config{URL: viaProxy(t, proxy.Addr()), Exchange: s.Exchange, MaxMessageBytes: 10_000})
			return publishertest.Target{
				Publisher: p,
				Received: func(ctx context.Context, n int) ([]publishertest.Record, error) {
					ds, err := s.wait(ctx, n)
					return rabbitmqtest.PublisherRecords(ds), err
				},
				Unroutable: func(m *relay.Message) { m.Topic = "outboxtest.missing." + unique() },
				Outage: func() func() {
					proxy.Refuse(true)
					return func() { proxy.Refuse(false) }
				},
			}
		},
		Quirks: publishertest.Quirks{TooLargePayload: 20_000, HoldsBack: true},
		CheckRecord: func(t *testing.T, r publishertest.Record, m relay.Message) {
			t.Helper()
			d := r.Raw.(rabbitmqtest.Record).Delivery
			if d.MessageId != m.MessageID || d.Type != m.EventType || d.ContentType != m.ContentType {
				t.Errorf("%s: properties message-id %q type %q content-type %q", m.MessageID, d.MessageId, d.Type, d.ContentType)
			}
			if d.DeliveryMode != amqp.Persistent {
				t.Errorf("%s: delivery mode %d, want persistent", m.MessageID, d.DeliveryMode)
			}
			if want := rabbitmq.DefaultRoutingKey(m); d.RoutingKey != want {
				t.Errorf("%s: routing key %q, want %q", m.MessageID, d.RoutingKey, want)
			}
		},
	})
}

func TestRoutingKey(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"o-17": "o-17", "": "%", "a.b": "a%2Eb", "*": "%2A", "#": "%23", "a b": "a%20b", "%": "%25", "ü": "%C3%BC",
	} {
		if got := rabbitmq.RoutingToken(in); got != want {
			t.Errorf("RoutingToken(%q) = %q, want %q", in, got, want)
		}
	}
	if got := rabbitmq.DefaultRoutingKey(relay.Message{AggregateType: "order", AggregateID: "eu.42"}); got != "order.eu%2E42" {
		t.Errorf("DefaultRoutingKey = %q", got)
	}
	long := strings.Repeat("ü", 100) // 200 bytes, 600 encoded
	k1 := rabbitmq.DefaultRoutingKey(relay.Message{AggregateType: "order", AggregateID: long})
	k2 := rabbitmq.DefaultRoutingKey(relay.Message{AggregateType: "order", AggregateID: long + "x"})
	if len(k1) > rabbitmq.MaxRoutingKeyBytes || !strings.HasPrefix(k1, "order.~") || k1 == k2 {
		t.Errorf("long IDs: keys %q and %q", k1, k2)
	}
	longType := strings.Repeat("t", 200)
	k3 := rabbitmq.DefaultRoutingKey(relay.Message{AggregateType: longType, AggregateID: long})
	if len(k3) > rabbitmq.MaxRoutingKeyBytes || !strings.HasPrefix(k3, longType+".~") {
		t.Errorf("long type and ID: key %q", k3)
	}
}

func TestNewPublisherConfigErrors(t *testing.T) {
	t.Parallel()
	for _, cfg := range []rabbitmq.Config{{}, {URL: "http://x"}, {URL: brokerURL(), MaxInFlight: -1}, {URL: brokerURL(), MaxMessageBytes: -1}} {
		if p, err := rabbitmq.NewPublisher(cfg); !errors.Is(err, rabbitmq.ErrConfig) || p != nil {
			t.Errorf("NewPublisher(%+v) = %v, %v; want ErrConfig", cfg, p, err)
		}
	}
}

// TestBadCredentials: refused credentials are relay.ErrUnavailable (a
// configuration mistake, never the messages' fault).
func TestBadCredentials(t *testing.T) {
	t.Parallel()
	admin(t) // skip without a broker
	u, err := amqp.ParseURI(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Password = "wrong-" + unique()
	_, err = rabbitmq.NewPublisher(rabbitmq.Config{URL: u.String()})
	if !errors.Is(err, relay.ErrUnavailable) {
		t.Errorf("NewPublisher with a wrong password = %v, want ErrUnavailable", err)
	}
}

func msgs(n, aggs int) []relay.Message {
	out := make([]relay.Message, n)
	for i := range out {
		typ := "order"
		if i%aggs%2 == 1 {
			typ = "invoice"
		}
		out[i] = relay.Message{ID: int64(i + 1), MessageID: fmt.Sprintf("m-%03d-%s", i, unique()), AggregateType: typ,
			AggregateID: fmt.Sprintf("a-%d", i%aggs), EventType: typ + ".updated", ContentType: "application/octet-stream",
			Payload: []byte{byte(i)}}
	}
	return out
}

// TestNoRoute: with only "order.#" bound, invoice messages are returned
// (mandatory): each fails with relay.ErrUnavailable and ErrReturned, the
// order messages are confirmed and delivered; a batch of only unroutable
// messages is one error wrapping ErrUnavailable.
func TestNoRoute(t *testing.T) {
	t.Parallel()
	s := newSpace(t, "order.#")
	p := newPublisher(t, rabbitmq.Config{URL: brokerURL(), Exchange: s.Exchange})
	ctx := testCtx(t, 30*time.Second)
	batch := msgs(8, 2) // a-0 order, a-1 invoice, alternating
	err := p.Publish(ctx, batch)
	var pe relay.PublishErrors
	if !errors.As(err, &pe) || len(pe) != len(batch) {
		t.Fatalf("Publish = %v, want PublishErrors", err)
	}
	for i, e := range pe {
		switch {
		case batch[i].AggregateType == "order" && e != nil:
			t.Errorf("order message %d: %v", i, e)
		case i == 1 && !(errors.Is(e, relay.ErrUnavailable) && errors.Is(e, rabbitmq.ErrReturned)):
			t.Errorf("first invoice message: %v, want ErrUnavailable and ErrReturned", e)
		case batch[i].AggregateType == "invoice" && i > 1 && !errors.Is(e, rabbitmq.ErrHeldBack):
			t.Errorf("later invoice message %d: %v, want ErrHeldBack", i, e)
		}
	}
	if _, err := s.wait(ctx, 4); err != nil {
		t.Fatal(err)
	}
	invoices := msgs(2, 1)
	for i := range invoices {
		invoices[i].AggregateType = "invoice"
	}
	err = p.Publish(ctx, invoices)
	if errors.As(err, &pe) || !errors.Is(err, relay.ErrUnavailable) {
		t.Errorf("Publish of only unroutable messages = %v, want one error wrapping ErrUnavailable", err)
	}
}

// TestExchangeDeletedUnderThePublisher: the exchange vanishes after the
// publisher checked it: the broker closes the publishing channel (404);
// the messages fail with relay.ErrUnavailable, not permanently; the next
// Publish checks again (one error, ErrUnavailable); once the exchange is
// back the publisher works again on a new channel.
func TestExchangeDeletedUnderThePublisher(t *testing.T) {
	t.Parallel()
	s := newSpace(t, "#")
	p := newPublisher(t, rabbitmq.Config{URL: brokerURL(), Exchange: s.Exchange})
	ctx := testCtx(t, 30*time.Second)
	if err := p.Publish(ctx, msgs(3, 3)); err != nil {
		t.Fatal(err)
	}
	if err := s.ch.ExchangeDelete(s.Exchange, false, false); err != nil {
		t.Fatal(err)
	}
	err := p.Publish(ctx, msgs(3, 3))
	if err == nil || !errors.Is(err, relay.ErrUnavailable) || errors.Is(err, relay.ErrPermanent) {
		t.Errorf("Publish after the exchange was deleted = %v, want ErrUnavailable", err)
	}
	err = p.Publish(ctx, msgs(3, 3))
	var pe relay.PublishErrors
	if errors.As(err, &pe) || !errors.Is(err, relay.ErrUnavailable) {
		t.Errorf("second Publish = %v, want one error wrapping ErrUnavailable", err)
	}
	if err := s.ch.ExchangeDeclare(s.Exchange, amqp.ExchangeTopic, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.ch.QueueBind(s.Queue, "#", s.Exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	last := msgs(3, 3)
	if err := p.Publish(ctx, last); err != nil {
		t.Fatalf("Publish with the exchange back: %v", err)
	}
	ds, err := s.wait(ctx, 6)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range last {
		found := false
		for _, d := range ds {
			found = found || d.Delivery.MessageId == m.MessageID
		}
		if !found {
			t.Errorf("%s not delivered", m.MessageID)
		}
	}
}

// TestHealthy: nil while connected; an error while the broker is
// unreachable (through the test's proxy); nil again after, reconnected.
func TestHealthy(t *testing.T) {
	t.Parallel()
	s := newSpace(t, "#")
	proxy := startProxy(t)
	p := newPublisher(t, rabbitmq.Config{URL: viaProxy(t, proxy.Addr()), Exchange: s.Exchange})
	ctx := testCtx(t, 30*time.Second)
	if err := p.Healthy(ctx); err != nil {
		t.Fatalf("Healthy: %v", err)
	}
	proxy.Refuse(true)
	if err := p.Healthy(ctx); err == nil {
		t.Error("Healthy with the broker unreachable = nil")
	}
	proxy.Refuse(false)
	if err := p.Healthy(ctx); err != nil {
		t.Errorf("Healthy after the broker came back: %v", err)
	}
	// And publishing works on the new connection.
	batch := msgs(2, 2)
	if err := p.Publish(ctx, batch); err != nil {
		t.Fatal(err)
	}
	ds, err := s.wait(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		id := d.Headers[emit.HeaderMessageID]
		if (id != batch[0].MessageID || !bytes.Equal(d.Payload, batch[0].Payload)) && (id != batch[1].MessageID || !bytes.Equal(d.Payload, batch[1].Payload)) {
			t.Errorf("delivered %q %v", d.Payload, d.Headers)
		}
	}
}

// TestStalledBroker: the connection stays open but nothing comes back
// (the proxy drops every byte): Publish returns one error for the batch
// wrapping context.DeadlineExceeded by its deadline, and so does the next
// one (opening a channel on the stalled connection honours ctx too); once
// the broker answers again (a fresh connection) the batch is confirmed and
// every message delivered.
func TestStalledBroker(t *testing.T) {
	t.Parallel()
	s := newSpace(t, "#")
	proxy := startProxy(t)
	p := newPublisher(t, rabbitmq.Config{URL: viaProxy(t, proxy.Addr()), Exchange: s.Exchange})
	batch := msgs(20, 5)
	proxy.Stall(true)
	for try := range 2 {
		const deadline = time.Second
		short, cancel := context.WithTimeout(t.Context(), deadline)
		start := time.Now()
		err := p.Publish(short, batch)
		elapsed := time.Since(start)
		cancel()
		var pe relay.PublishErrors
		if err == nil || errors.As(err, &pe) || errors.Is(err, relay.ErrPermanent) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("try %d: Publish with the broker stalled = %v, want one error wrapping context.DeadlineExceeded", try, err)
		}
		if elapsed > deadline+time.Second {
			t.Errorf("try %d: Publish returned after %s with a %s deadline", try, elapsed, deadline)
		}
	}
	proxy.Stall(false)
	proxy.CutAll()
	ctx := testCtx(t, 60*time.Second)
	for {
		try, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := p.Publish(try, batch)
		cancel()
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("Publish after the stall: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	ds, err := s.wait(ctx, len(batch))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, d := range ds {
		seen[d.Delivery.MessageId] = true
	}
	for _, m := range batch {
		if !seen[m.MessageID] {
			t.Errorf("%s not delivered", m.MessageID)
		}
	}
}

// TestWriteRefused: a user (created for this test under a unique name,
// removed at cleanup) that may not write to the exchange gets
// relay.ErrUnavailable for the batch (access refused is a configuration
// mistake: no attempt counted, nothing dead-lettered), never ErrPermanent.
func TestWriteRefused(t *testing.T) {
	t.Parallel()
	s := newSpace(t, "#")
	user, pass := "outboxtest-"+unique(), unique()
	u, err := amqp.ParseURI(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	vhost := u.Vhost
	if vhost == "" {
		vhost = "/"
	}
	privateserver.RabbitMQUser(t, user, pass)                                        // removed when the test ends
	privateserver.Rabbitmqctl(t, "set_permissions", "-p", vhost, user, "", "", ".*") // configure none, write none, read all
	u.Username, u.Password = user, pass
	p := newPublisher(t, rabbitmq.Config{URL: u.String(), Exchange: s.Exchange})
	err = p.Publish(testCtx(t, 30*time.Second), msgs(3, 3))
	var pe relay.PublishErrors
	if err == nil || errors.As(err, &pe) || !errors.Is(err, relay.ErrUnavailable) || errors.Is(err, relay.ErrPermanent) {
		t.Errorf("Publish without write permission = %v, want one error wrapping ErrUnavailable", err)
	}
	if err != nil && !strings.Contains(err.Error(), "rabbitmqctl set_permissions") {
		t.Errorf("Publish without write permission = %v, want it to name what to grant (rabbitmqctl set_permissions)", err)
	}
	t.Logf("Publish without write permission: %v", err)
}

// TestReturnedDuplicateMessageID: two messages of one batch with the same
// message ID, one unroutable (returned) and one routable, on different
// aggregates. The return names only the message ID, so whichever confirm
// is handled first took it: the routable copy could fail and, worse, the
// returned one be reported acknowledged though no queue holds it.
func TestReturnedDuplicateMessageID(t *testing.T) {
	t.Parallel()
	s := newSpace(t, "order.#")
	p := newPublisher(t, rabbitmq.Config{URL: brokerURL(), Exchange: s.Exchange})
	ctx := testCtx(t, 60*time.Second)
	const pairs = 64
	var batch []relay.Message
	for i := range pairs {
		id := fmt.Sprintf("dup-%03d-%s", i, unique())
		for _, typ := range []string{"invoice", "order"} { // invoice: no binding, returned
			batch = append(batch, relay.Message{ID: int64(len(batch) + 1), MessageID: id, AggregateType: typ,
				AggregateID: fmt.Sprintf("a-%d", i), EventType: typ + ".updated", Payload: []byte{byte(i)}})
		}
	}
	err := p.Publish(ctx, batch)
	var pe relay.PublishErrors
	if !errors.As(err, &pe) || len(pe) != len(batch) {
		t.Fatalf("Publish = %v, want PublishErrors", err)
	}
	for i, e := range pe {
		if batch[i].AggregateType == "invoice" && e == nil {
			t.Errorf("message %d (%s, unroutable, returned) reported acknowledged", i, batch[i].MessageID)
		}
		if batch[i].AggregateType == "order" && e != nil {
			t.Errorf("message %d (%s, routed) failed: %v", i, batch[i].MessageID, e)
		}
	}
}
