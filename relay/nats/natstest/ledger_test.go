package natstest_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/outboxtest/publishertest"
	"github.com/sqloutbox/outbox/relay"
	natspub "github.com/sqloutbox/outbox/relay/nats"
	"github.com/sqloutbox/outbox/relay/nats/natstest"
)

// ledgerSpace is a test's own stream (prefix.>), a publisher routing into
// it and a consumer of it.
type ledgerSpace struct {
	js     jetstream.JetStream
	prefix string
	pub    *natspub.Publisher
	cons   *natstest.Consumer
}

func newLedgerSpace(t *testing.T, ctx context.Context) *ledgerSpace {
	t.Helper()
	js := jetStream(t)
	prefix := natstest.UniqueName("ledger-")
	s, err := natstest.CreateStream(ctx, js, []string{prefix + ".>"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Delete(context.Background()) })
	pub, err := natspub.NewPublisher(natspub.Config{Conn: js.Conn(),
		Subject: func(m relay.Message) string { return prefix + "." + natspub.DefaultSubject(m) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	c, err := natstest.NewConsumer(ctx, js, s.Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &ledgerSpace{js: js, prefix: prefix, pub: pub, cons: c}
}

// direct publishes to the stream past the publisher: the outbox message
// ID header if msgID is not "", Nats-Msg-Id natsID if not "".
func (s *ledgerSpace) direct(t *testing.T, ctx context.Context, subject, msgID, natsID string) {
	t.Helper()
	m := nats.NewMsg(s.prefix + "." + subject)
	m.Data = []byte(msgID)
	if msgID != "" {
		m.Header.Set(emit.HeaderMessageID, msgID)
	}
	if natsID != "" {
		m.Header.Set(jetstream.MsgIDHeader, natsID)
	}
	if _, err := s.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
}

// TestCheck: a batch published through the publisher over three
// aggregates, plus a committed row never published (lost), a record of
// no row (ghost), one without a message ID, the same event stored a
// second time (duplicate) and sent again by the publisher within the
// duplicate window (not stored, so not a duplicate). The ledger is the
// same whatever order the records are given in (stream sequence decides).
func TestCheck(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	s := newLedgerSpace(t, ctx)
	msgs := publishertest.Messages("", 1, 9, 3) // agg-00, agg-02: order; agg-01: invoice
	if err := s.pub.Publish(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	if err := s.pub.Publish(ctx, msgs[1:2]); err != nil { // deduplicated by Nats-Msg-Id
		t.Fatal(err)
	}
	s.direct(t, ctx, "outbox.event.order.agg-00", msgs[0].MessageID, "again") // stored twice
	s.direct(t, ctx, "other", "", "")
	s.direct(t, ctx, "other", "ghost", "") // last: once it is in, all is
	recs, err := s.cons.WaitForMessageIDs(ctx, "ghost")
	if err != nil {
		t.Fatal(err)
	}
	rows := append(outboxtest.Rows(msgs), outboxtest.Row{ID: 10, MessageID: "lost", AggregateType: "order", AggregateID: "agg-00"})
	want := outboxtest.Ledger{Committed: 10, Delivered: 9, Lost: []string{"lost"}, Ghosts: []string{"ghost"}, NoMessageID: 1, Duplicates: 1}
	l := natstest.Check(rows, recs)
	if !reflect.DeepEqual(l, want) {
		t.Fatalf("Check =\n %+v, want\n %+v", l, want)
	}
	reversed := slices.Clone(recs)
	slices.Reverse(reversed)
	if got := natstest.Check(rows, reversed); !reflect.DeepEqual(got, want) {
		t.Fatalf("Check of the records reversed =\n %+v, want\n %+v", got, want)
	}
	err = l.Err()
	if !errors.Is(err, outboxtest.ErrLost) || !errors.Is(err, outboxtest.ErrGhost) || errors.Is(err, outboxtest.ErrOrder) {
		t.Fatalf("Err = %v, want ErrLost and ErrGhost only", err)
	}
	if l := natstest.Check(outboxtest.Rows(msgs), recs[:len(recs)-2]); l.Err() != nil || l.Duplicates != 1 {
		t.Fatalf("Check without the ghosts and the lost row = %+v, %v; want OK with the duplicate", l, l.Err())
	}
}

// TestCheckOrder: an aggregate's events stored out of outbox-id order
// (published past the publisher) are an order violation; another
// aggregate's are not affected.
func TestCheckOrder(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	s := newLedgerSpace(t, ctx)
	rows := []outboxtest.Row{
		{ID: 1, MessageID: "m1", AggregateType: "order", AggregateID: "o-1"},
		{ID: 2, MessageID: "m2", AggregateType: "order", AggregateID: "o-1"},
		{ID: 3, MessageID: "m3", AggregateType: "order", AggregateID: "o-2"},
	}
	for _, id := range []string{"m2", "m3", "m1"} {
		s.direct(t, ctx, "x", id, id)
	}
	recs, err := s.cons.WaitForMessageIDs(ctx, "m1", "m2", "m3")
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(recs) // given in any order: the sequence decides
	l := natstest.Check(rows, recs)
	want := outboxtest.Ledger{Committed: 3, Delivered: 3, OrderViolations: []outboxtest.OrderViolation{{AggregateType: "order", AggregateID: "o-1", Got: 1, After: 2}}}
	if !reflect.DeepEqual(l, want) {
		t.Fatalf("Check =\n %+v, want\n %+v", l, want)
	}
	if err := l.Err(); !errors.Is(err, outboxtest.ErrOrder) || errors.Is(err, outboxtest.ErrLost) || errors.Is(err, outboxtest.ErrGhost) {
		t.Fatalf("Err = %v, want ErrOrder only", err)
	}
}

// TestCheckSortsBySequence without a server: records of two streams given
// together keep each stream's own order.
func TestCheckSortsBySequence(t *testing.T) {
	t.Parallel()
	rec := func(seq uint64, id string) natstest.Record {
		return natstest.Record{Sequence: seq, Headers: map[string]string{emit.HeaderMessageID: id}}
	}
	rows := []outboxtest.Row{
		{ID: 1, MessageID: "a1", AggregateType: "a", AggregateID: "1"},
		{ID: 2, MessageID: "a2", AggregateType: "a", AggregateID: "1"},
		{ID: 3, MessageID: "b1", AggregateType: "b", AggregateID: "1"},
		{ID: 4, MessageID: "b2", AggregateType: "b", AggregateID: "1"},
	}
	recs := []natstest.Record{rec(7, "b2"), rec(2, "a2"), rec(1, "a1"), rec(6, "b1"), rec(2, "a2")}
	l := natstest.Check(rows, recs)
	if want := (outboxtest.Ledger{Committed: 4, Delivered: 4, Duplicates: 1}); !reflect.DeepEqual(l, want) {
		t.Fatalf("Check = %+v, want %+v", l, want)
	}
	if recs[0].Sequence != 7 {
		t.Fatal("Check modified recs")
	}
}
