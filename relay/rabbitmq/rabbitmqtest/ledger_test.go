package rabbitmqtest_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/outboxtest/publishertest"
	"github.com/sqloutbox/outbox/relay/rabbitmq"
	"github.com/sqloutbox/outbox/relay/rabbitmq/rabbitmqtest"
)

// ledgerSpace is a test's own exchange, a consumer of all of it ("#"), a
// publisher to it and a channel to publish past the publisher.
type ledgerSpace struct {
	ch   *amqp.Channel
	ex   string
	pub  *rabbitmq.Publisher
	cons *rabbitmqtest.Consumer
}

func newLedgerSpace(t *testing.T) *ledgerSpace {
	t.Helper()
	conn := dial(t)
	ch, ex := exchange(t, conn)
	c, err := rabbitmqtest.NewConsumer(conn, ex, "#")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	pub, err := rabbitmq.NewPublisher(rabbitmq.Config{URL: brokerURL(), Exchange: ex})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return &ledgerSpace{ch: ch, ex: ex, pub: pub, cons: c}
}

// direct publishes to the exchange past the publisher, with the outbox
// message ID header if msgID is not "". Messages of one channel are
// routed in the order published.
func (s *ledgerSpace) direct(t *testing.T, ctx context.Context, key, msgID string) {
	t.Helper()
	p := amqp.Publishing{Body: []byte(msgID)}
	if msgID != "" {
		p.Headers = amqp.Table{emit.HeaderMessageID: msgID}
	}
	if err := s.ch.PublishWithContext(ctx, s.ex, key, false, false, p); err != nil {
		t.Fatal(err)
	}
}

// TestCheck: a batch published through the publisher over three
// aggregates, plus a committed row never published (lost), one event
// published again (RabbitMQ delivers it twice: a duplicate), a record of
// no row (ghost) and one without a message ID.
func TestCheck(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	s := newLedgerSpace(t)
	msgs := publishertest.Messages("", 1, 9, 3) // agg-00, agg-02: order; agg-01: invoice
	if err := s.pub.Publish(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	if err := s.pub.Publish(ctx, msgs[1:2]); err != nil { // confirmed: routed before what follows
		t.Fatal(err)
	}
	s.direct(t, ctx, "other", "")
	s.direct(t, ctx, "other", "ghost") // last: once it is in, all is
	recs, err := s.cons.WaitForMessageIDs(ctx, "ghost")
	if err != nil {
		t.Fatal(err)
	}
	rows := append(outboxtest.Rows(msgs), outboxtest.Row{ID: 10, MessageID: "lost", AggregateType: "order", AggregateID: "agg-00"})
	want := outboxtest.Ledger{Committed: 10, Delivered: 9, Lost: []string{"lost"}, Ghosts: []string{"ghost"}, NoMessageID: 1, Duplicates: 1}
	l := rabbitmqtest.Check(rows, recs)
	if !reflect.DeepEqual(l, want) {
		t.Fatalf("Check =\n %+v, want\n %+v", l, want)
	}
	err = l.Err()
	if !errors.Is(err, outboxtest.ErrLost) || !errors.Is(err, outboxtest.ErrGhost) || errors.Is(err, outboxtest.ErrOrder) {
		t.Fatalf("Err = %v, want ErrLost and ErrGhost only", err)
	}
	if l := rabbitmqtest.Check(outboxtest.Rows(msgs), recs[:len(recs)-2]); l.Err() != nil || l.Duplicates != 1 {
		t.Fatalf("Check without the ghosts and the lost row = %+v, %v; want OK with the duplicate", l, l.Err())
	}
}

// TestCheckOrder: an aggregate's events delivered out of outbox-id order
// (published past the publisher) are an order violation; another
// aggregate's are not affected; a redelivery of the first is a duplicate,
// not a violation.
func TestCheckOrder(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	s := newLedgerSpace(t)
	rows := []outboxtest.Row{
		{ID: 1, MessageID: "m1", AggregateType: "order", AggregateID: "o-1"},
		{ID: 2, MessageID: "m2", AggregateType: "order", AggregateID: "o-1"},
		{ID: 3, MessageID: "m3", AggregateType: "order", AggregateID: "o-2"},
	}
	for _, id := range []string{"m2", "m3", "m1", "m2"} {
		s.direct(t, ctx, "order.x", id)
	}
	recs, err := s.cons.WaitForCount(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	l := rabbitmqtest.Check(rows, recs)
	want := outboxtest.Ledger{Committed: 3, Delivered: 3, Duplicates: 1, OrderViolations: []outboxtest.OrderViolation{{AggregateType: "order", AggregateID: "o-1", Got: 1, After: 2}}}
	if !reflect.DeepEqual(l, want) {
		t.Fatalf("Check =\n %+v, want\n %+v", l, want)
	}
	if err := l.Err(); !errors.Is(err, outboxtest.ErrOrder) || errors.Is(err, outboxtest.ErrLost) || errors.Is(err, outboxtest.ErrGhost) {
		t.Fatalf("Err = %v, want ErrOrder only", err)
	}
}

// TestCheckTakesDeliveryOrder without a broker: the order of recs is the
// order judged, nothing is sorted.
func TestCheckTakesDeliveryOrder(t *testing.T) {
	t.Parallel()
	rec := func(id string) rabbitmqtest.Record {
		return rabbitmqtest.Record{Headers: map[string]string{emit.HeaderMessageID: id}}
	}
	rows := []outboxtest.Row{{ID: 1, MessageID: "b", AggregateType: "t", AggregateID: "x"}, {ID: 2, MessageID: "a", AggregateType: "t", AggregateID: "x"}}
	if l := rabbitmqtest.Check(rows, []rabbitmqtest.Record{rec("b"), rec("a")}); l.Err() != nil {
		t.Fatalf("in order: %v", l.Err())
	}
	if l := rabbitmqtest.Check(rows, []rabbitmqtest.Record{rec("a"), rec("b")}); len(l.OrderViolations) != 1 {
		t.Fatalf("out of order: %+v", l)
	}
}
