package rabbitmqtest_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/relay/rabbitmq/rabbitmqtest"
)

// brokerURL is the broker the tests use: $OUTBOX_TEST_RABBITMQ or the
// local one.
func brokerURL() string {
	if url := os.Getenv("OUTBOX_TEST_RABBITMQ"); url != "" {
		return url
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

func dial(t *testing.T) *amqp.Connection {
	t.Helper()
	url := brokerURL()
	conn, err := amqp.Dial(url)
	if err != nil {
		if os.Getenv("OUTBOX_TEST_REQUIRE") != "" {
			t.Fatalf("RabbitMQ at %s: %v", url, err)
		}
		t.Skipf("RabbitMQ not available: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// exchange opens a channel on conn and declares the test's own exchange
// on it, deleted when the test ends.
func exchange(t *testing.T, conn *amqp.Connection) (*amqp.Channel, string) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	ex, err := rabbitmqtest.DeclareExchange(ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.ExchangeDelete(ex, false, false) })
	return ch, ex
}

// TestConsumer: only what the binding routes arrives, in order, headers
// as strings (another type formatted); Wait ends with ctx's error; Close
// deletes the queue and is safe twice.
func TestConsumer(t *testing.T) {
	t.Parallel()
	conn := dial(t)
	ch, ex := exchange(t, conn)
	c, err := rabbitmqtest.NewConsumer(conn, ex, "order.#")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	before := time.Now()
	for _, p := range []struct{ key, id string }{{"order.1", "a"}, {"invoice.1", "x"}, {"order.2", "b"}} {
		if err := ch.PublishWithContext(ctx, ex, p.key, false, false, amqp.Publishing{Body: []byte(p.id),
			Headers: amqp.Table{emit.HeaderMessageID: p.id, "n": int32(7)}}); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := c.WaitForMessageIDs(ctx, "a", "b")
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].RoutingKey != "order.1" || recs[1].RoutingKey != "order.2" || recs[0].Exchange != ex {
		t.Fatalf("records %+v", recs)
	}
	for _, r := range recs {
		if id, _ := r.MessageID(); string(r.Payload) != id || r.Headers["n"] != "<int32 7>" || r.Received.Before(before) {
			t.Errorf("record %+v", r)
		}
		if pr := r.PublisherRecord(); pr.Headers["n"] != "<int32 7>" || pr.Raw.(rabbitmqtest.Record).RoutingKey != r.RoutingKey {
			t.Errorf("PublisherRecord %+v", pr)
		}
	}
	short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
	defer stop()
	if got, err := c.WaitForCount(short, 3); !errors.Is(err, context.DeadlineExceeded) || len(got) != 2 {
		t.Errorf("WaitForCount(3) = %d records, %v; want 2 and the deadline", len(got), err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	probe, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := probe.QueueDeclarePassive(c.Queue(), false, false, false, false, nil); err == nil {
		t.Errorf("queue %s still exists after Close", c.Queue())
	}
	if _, err := rabbitmqtest.NewConsumer(conn, "outboxtest.ex.missing-"+rabbitmqtest.UniqueName(""), "#"); err == nil {
		t.Error("NewConsumer on a missing exchange = nil error")
	}
}

// TestConsumeQueue: a queue the test declared (with arguments) and filled
// before anything consumed it is consumed from its head, in order; Close
// deletes it; a missing queue is the broker's error.
func TestConsumeQueue(t *testing.T) {
	t.Parallel()
	conn := dial(t)
	ch, ex := exchange(t, conn)
	q := rabbitmqtest.UniqueName("outboxtest.q.")
	if _, err := ch.QueueDeclare(q, false, false, false, false, amqp.Table{"x-max-length": int32(2), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = ch.QueueDelete(q, false, false, false) })
	if err := ch.QueueBind(q, "#", ex, false, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	pub, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		dc, err := pub.PublishWithDeferredConfirmWithContext(ctx, ex, "k", false, false, amqp.Publishing{Body: []byte(id),
			Headers: amqp.Table{emit.HeaderMessageID: id}})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(ctx); !ok || err != nil { // confirmed: in the queue
			t.Fatalf("publishing %s: acked %v, %v", id, ok, err)
		}
	}
	if st, err := ch.QueueDeclarePassive(q, false, false, false, false, nil); err != nil || st.Messages != 2 {
		t.Fatalf("queue holds %d messages (%v), want 2", st.Messages, err)
	}
	c, err := rabbitmqtest.ConsumeQueue(conn, q)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := c.WaitForMessageIDs(ctx, "a", "b")
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || string(recs[0].Payload) != "a" || string(recs[1].Payload) != "b" || c.Queue() != q {
		t.Fatalf("records %+v", recs)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	probe, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := probe.QueueDeclarePassive(q, false, false, false, false, nil); err == nil {
		t.Errorf("queue %s still exists after Close", q)
	}
	if _, err := rabbitmqtest.ConsumeQueue(conn, "outboxtest.q.missing-"+rabbitmqtest.UniqueName("")); err == nil {
		t.Error("ConsumeQueue of a missing queue = nil error")
	}
}
