package kafkatest

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/outboxtest"
)

func rec(topic string, part int32, off int64, msgID string) Record {
	h := map[string]string{}
	if msgID != "" {
		h[emit.HeaderMessageID] = msgID
	}
	return Record{Topic: topic, Partition: part, Offset: off, Headers: h}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	rows := []Row{
		{ID: 1, MessageID: "m1", AggregateType: "order", AggregateID: "a"},
		{ID: 2, MessageID: "m2", AggregateType: "order", AggregateID: "a"},
		{ID: 3, MessageID: "m3", AggregateType: "order", AggregateID: "b"},
		{ID: 4, MessageID: "m4", AggregateType: "order", AggregateID: "b"},
		{ID: 5, MessageID: "m5", AggregateType: "user", AggregateID: "a"},
	}
	for _, tc := range []struct {
		name  string
		recs  []Record
		want  Ledger
		wants []error
	}{{
		name: "AllDeliveredInOrder",
		recs: []Record{rec("t", 0, 0, "m1"), rec("t", 0, 1, "m2"), rec("t", 1, 0, "m3"), rec("t", 1, 1, "m4"), rec("u", 0, 0, "m5")},
		want: Ledger{Committed: 5, Delivered: 5},
	}, {
		name: "ReceiveOrderDoesNotMatterOffsetsDo",
		recs: []Record{rec("u", 0, 0, "m5"), rec("t", 1, 1, "m4"), rec("t", 0, 1, "m2"), rec("t", 1, 0, "m3"), rec("t", 0, 0, "m1")},
		want: Ledger{Committed: 5, Delivered: 5},
	}, {
		name: "DuplicatesAreCountedNotFailed",
		recs: []Record{rec("t", 0, 0, "m1"), rec("t", 0, 1, "m2"), rec("t", 0, 2, "m1"), rec("t", 1, 0, "m3"), rec("t", 1, 1, "m4"), rec("u", 0, 0, "m5")},
		want: Ledger{Committed: 5, Delivered: 5, Duplicates: 1},
	}, {
		name:  "LostAndGhosts",
		recs:  []Record{rec("t", 0, 0, "m1"), rec("t", 0, 1, "x"), rec("t", 0, 2, "x"), rec("t", 0, 3, ""), rec("u", 0, 0, "m5")},
		want:  Ledger{Committed: 5, Delivered: 2, Lost: []string{"m2", "m3", "m4"}, Ghosts: []string{"x"}, NoMessageID: 1, Duplicates: 1},
		wants: []error{ErrLost, ErrGhost},
	}, {
		name: "OrderBrokenWithinAnAggregateOnly",
		// m2 before m1 (aggregate order/a); user/a (m5) is another
		// aggregate although its ID is the same.
		recs:  []Record{rec("t", 0, 0, "m2"), rec("t", 0, 1, "m1"), rec("t", 1, 0, "m3"), rec("t", 1, 1, "m4"), rec("t", 0, 2, "m5")},
		want:  Ledger{Committed: 5, Delivered: 5, OrderViolations: []OrderViolation{{AggregateType: "order", AggregateID: "a", Got: 1, After: 2}}},
		wants: []error{ErrOrder},
	}, {
		name: "ARedeliveryIsNotAViolation",
		recs: []Record{rec("t", 0, 0, "m1"), rec("t", 0, 1, "m2"), rec("t", 0, 2, "m1"), rec("t", 1, 0, "m3"), rec("t", 1, 1, "m4"), rec("u", 0, 0, "m5")},
		want: Ledger{Committed: 5, Delivered: 5, Duplicates: 1},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := Check(rows, tc.recs)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Check =\n %+v, want\n %+v", got, tc.want)
			}
			err := got.Err()
			if (err == nil) != (len(tc.wants) == 0) || got.OK() != (err == nil) {
				t.Fatalf("Err = %v, OK = %v, want errors %v", err, got.OK(), tc.wants)
			}
			for _, w := range tc.wants {
				if !errors.Is(err, w) {
					t.Errorf("Err = %v, does not match %v", err, w)
				}
			}
		})
	}
}

func TestCheckNamesAFewIDs(t *testing.T) {
	t.Parallel()
	var rows []Row
	for i := range 8 {
		rows = append(rows, Row{ID: int64(i + 1), MessageID: string(rune('a' + i)), AggregateType: "t", AggregateID: "x"})
	}
	err := Check(rows, nil).Err()
	const want = "outboxtest: committed events not delivered: 8 of 8 (a, b, c, d, e, and 3 more)"
	if err == nil || err.Error() != want {
		t.Fatalf("Err = %v, want %q", err, want)
	}
}

func TestWaitForMessageIDs(t *testing.T) {
	t.Parallel()
	const topic = "kafkatest.ids"
	b, err := Start(Topics(2, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	c, err := NewConsumer(b.Addrs(), []string{topic})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	record := func(id string) *kgo.Record {
		return &kgo.Record{Topic: topic, Key: []byte(id), Value: []byte(id), Headers: []kgo.RecordHeader{{Key: emit.HeaderMessageID, Value: []byte(id)}}}
	}
	produce(t, b.Addrs(), record("a"), record("b"), record("a"), &kgo.Record{Topic: topic, Value: []byte("no id")})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	recs, err := c.WaitForMessageIDs(ctx, "a", "b")
	if err != nil {
		t.Fatal(err)
	}
	by := ByMessageID(recs)
	if len(by["b"]) != 1 {
		t.Fatalf("ByMessageID[b] = %v, want one record", by["b"])
	}
	if _, err := c.WaitForCount(ctx, 4); err != nil {
		t.Fatal(err)
	}
	by = ByMessageID(c.Records())
	if len(by) != 2 || len(by["a"]) != 2 {
		t.Fatalf("ByMessageID = %v, want a twice and b once, the record without an ID left out", by)
	}

	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelShort()
	_, err = c.WaitForMessageIDs(short, "a", "nosuch")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitForMessageIDs(nosuch) = %v, want a deadline error", err)
	}
	if want := "kafkatest: 1 of 2 message IDs not received"; err.Error()[:len(want)] != want {
		t.Fatalf("error %q, want it to start with %q", err, want)
	}
}

// TestLedgerIsOutboxtests: the kit's names are outboxtest's types and
// sentinel values, so code written against either compiles and matches.
func TestLedgerIsOutboxtests(t *testing.T) {
	t.Parallel()
	var l outboxtest.Ledger = Check([]Row{{ID: 1, MessageID: "m1"}}, []Record{rec("t", 0, 0, "x"), rec("t", 0, 1, "")})
	var _ []OrderViolation = l.OrderViolations
	err := l.Err()
	for _, w := range []error{ErrLost, ErrGhost, outboxtest.ErrLost, outboxtest.ErrGhost} {
		if !errors.Is(err, w) {
			t.Errorf("Err = %v, does not match %v", err, w)
		}
	}
	if ErrOrder != outboxtest.ErrOrder {
		t.Error("ErrOrder is not outboxtest.ErrOrder")
	}
}
