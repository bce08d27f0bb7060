package redistest_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/outboxtest/publishertest"
	"github.com/sqloutbox/outbox/relay"
	redispub "github.com/sqloutbox/outbox/relay/redis"
	"github.com/sqloutbox/outbox/relay/redis/redistest"
)

// ledgerSpace is a test's own key prefix, a client, a publisher routing
// into it and a consumer of the order and invoice streams.
type ledgerSpace struct {
	cl             *redis.Client
	order, invoice string
	pub            *redispub.Publisher
	cons           *redistest.Consumer
}

func newLedgerSpace(t *testing.T) *ledgerSpace {
	t.Helper()
	o := options(t)
	cl := redis.NewClient(o)
	t.Cleanup(func() { _ = cl.Close() })
	prefix := redistest.UniqueName("ledger:") + ":"
	t.Cleanup(func() { _, _ = redistest.DeleteKeys(context.Background(), cl, prefix+"*") })
	pub, err := redispub.NewPublisher(redispub.Config{Client: cl,
		Stream: func(m relay.Message) string { return prefix + redispub.DefaultStream(m) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	s := &ledgerSpace{cl: cl, order: prefix + "outbox.event.order", invoice: prefix + "outbox.event.invoice", pub: pub}
	if s.cons, err = redistest.NewConsumer(o, s.order, s.invoice); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.cons.Close)
	return s
}

// direct XADDs an entry to stream past the publisher, with the outbox
// message ID field if msgID is not "", at entry ID id ("*": the server's).
func (s *ledgerSpace) direct(t *testing.T, ctx context.Context, stream, id, msgID string) {
	t.Helper()
	vals := []any{redispub.PayloadField, msgID}
	if msgID != "" {
		vals = append(vals, emit.HeaderMessageID, msgID)
	}
	if err := s.cl.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: id, Values: vals}).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestCheck: batches published through the publisher into two streams
// (order over two aggregates, invoice over one), plus a committed row
// never published (lost), one event published again (Redis stores it
// twice: a duplicate), a record of no row (ghost) and one without a
// message ID. The ledger is the same whatever order the records are given
// in (per stream, entry IDs decide).
func TestCheck(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	s := newLedgerSpace(t)
	msgs := publishertest.Messages("", 1, 9, 3) // agg-00, agg-02: order; agg-01: invoice
	if err := s.pub.Publish(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	if err := s.pub.Publish(ctx, msgs[1:2]); err != nil {
		t.Fatal(err)
	}
	s.direct(t, ctx, s.order, "*", "")
	s.direct(t, ctx, s.invoice, "*", "ghost")
	recs, err := s.cons.WaitForCount(ctx, 12)
	if err != nil {
		t.Fatal(err)
	}
	rows := append(outboxtest.Rows(msgs), outboxtest.Row{ID: 10, MessageID: "lost", AggregateType: "order", AggregateID: "agg-00"})
	want := outboxtest.Ledger{Committed: 10, Delivered: 9, Lost: []string{"lost"}, Ghosts: []string{"ghost"}, NoMessageID: 1, Duplicates: 1}
	l := redistest.Check(rows, recs)
	if !reflect.DeepEqual(l, want) {
		t.Fatalf("Check =\n %+v, want\n %+v", l, want)
	}
	reversed := slices.Clone(recs)
	slices.Reverse(reversed)
	if got := redistest.Check(rows, reversed); !reflect.DeepEqual(got, want) {
		t.Fatalf("Check of the records reversed =\n %+v, want\n %+v", got, want)
	}
	err = l.Err()
	if !errors.Is(err, outboxtest.ErrLost) || !errors.Is(err, outboxtest.ErrGhost) || errors.Is(err, outboxtest.ErrOrder) {
		t.Fatalf("Err = %v, want ErrLost and ErrGhost only", err)
	}
	var ours []redistest.Record
	for _, r := range recs {
		if id, ok := r.MessageID(); ok && id != "ghost" {
			ours = append(ours, r)
		}
	}
	if l := redistest.Check(outboxtest.Rows(msgs), ours); l.Err() != nil || l.Duplicates != 1 {
		t.Fatalf("Check without the ghosts and the lost row = %+v, %v; want OK with the duplicate", l, l.Err())
	}
}

// TestCheckOrder: entries at explicit IDs. 9-0 comes before 10-0 (as
// numbers, not as strings), so order/o-1's m1, m2 are in order; o-2's m4
// at 10-1 before its m3 at 11-0 is a violation. Given in any order.
func TestCheckOrder(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	s := newLedgerSpace(t)
	rows := []outboxtest.Row{
		{ID: 1, MessageID: "m1", AggregateType: "order", AggregateID: "o-1"},
		{ID: 2, MessageID: "m2", AggregateType: "order", AggregateID: "o-1"},
		{ID: 3, MessageID: "m3", AggregateType: "order", AggregateID: "o-2"},
		{ID: 4, MessageID: "m4", AggregateType: "order", AggregateID: "o-2"},
	}
	for _, e := range []struct{ id, msg string }{{"9-0", "m1"}, {"10-0", "m2"}, {"10-1", "m4"}, {"11-0", "m3"}} {
		s.direct(t, ctx, s.order, e.id, e.msg)
	}
	recs, err := s.cons.WaitForMessageIDs(ctx, "m1", "m2", "m3", "m4")
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(recs)
	l := redistest.Check(rows, recs)
	want := outboxtest.Ledger{Committed: 4, Delivered: 4, OrderViolations: []outboxtest.OrderViolation{{AggregateType: "order", AggregateID: "o-2", Got: 3, After: 4}}}
	if !reflect.DeepEqual(l, want) {
		t.Fatalf("Check =\n %+v, want\n %+v", l, want)
	}
	if err := l.Err(); !errors.Is(err, outboxtest.ErrOrder) || errors.Is(err, outboxtest.ErrLost) || errors.Is(err, outboxtest.ErrGhost) {
		t.Fatalf("Err = %v, want ErrOrder only", err)
	}
}

// TestCheckSortsEntryIDs without a server: per stream, numerically by ms
// and then seq; IDs not of Redis's form after the valid ones, by string.
func TestCheckSortsEntryIDs(t *testing.T) {
	t.Parallel()
	rec := func(stream, id, msg string) redistest.Record {
		return redistest.Record{Stream: stream, ID: id, Headers: map[string]string{emit.HeaderMessageID: msg}}
	}
	var rows []outboxtest.Row
	for i, m := range []string{"a", "b", "c", "d", "e", "f"} {
		rows = append(rows, outboxtest.Row{ID: int64(i + 1), MessageID: m, AggregateType: "t", AggregateID: "x"})
	}
	rows = append(rows, outboxtest.Row{ID: 1, MessageID: "other", AggregateType: "u", AggregateID: "x"})
	recs := []redistest.Record{
		rec("s", "zz", "f"), rec("s", "100-2", "d"), rec("s", "bad", "e"), rec("s", "100-10", "d"),
		rec("s2", "1-0", "other"), rec("s", "9-0", "a"), rec("s", "100-1", "c"), rec("s", "99-5", "b"),
	}
	l := redistest.Check(rows, recs)
	if want := (outboxtest.Ledger{Committed: 7, Delivered: 7, Duplicates: 1}); !reflect.DeepEqual(l, want) {
		t.Fatalf("Check = %+v, want %+v", l, want)
	}
	if recs[0].ID != "zz" {
		t.Fatal("Check modified recs")
	}
}
