package outboxtest_test

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	rows := []outboxtest.Row{
		{ID: 1, MessageID: "m1", AggregateType: "order", AggregateID: "a"},
		{ID: 2, MessageID: "m2", AggregateType: "order", AggregateID: "a"},
		{ID: 3, MessageID: "m3", AggregateType: "order", AggregateID: "b"},
		{ID: 4, MessageID: "m4", AggregateType: "order", AggregateID: "b"},
		{ID: 5, MessageID: "m5", AggregateType: "user", AggregateID: "a"},
	}
	for _, tc := range []struct {
		name  string
		ids   []string
		want  outboxtest.Ledger
		wants []error
	}{{
		name: "AllDeliveredInOrder",
		ids:  []string{"m1", "m2", "m3", "m4", "m5"},
		want: outboxtest.Ledger{Committed: 5, Delivered: 5},
	}, {
		name: "AggregatesMayInterleave",
		ids:  []string{"m5", "m3", "m1", "m4", "m2"},
		want: outboxtest.Ledger{Committed: 5, Delivered: 5},
	}, {
		name: "DuplicatesAreCountedNotFailed",
		ids:  []string{"m1", "m2", "m1", "m3", "m4", "m5", "m5"},
		want: outboxtest.Ledger{Committed: 5, Delivered: 5, Duplicates: 2},
	}, {
		name:  "LostAndGhosts",
		ids:   []string{"m1", "x", "x", "", "m5"},
		want:  outboxtest.Ledger{Committed: 5, Delivered: 2, Lost: []string{"m2", "m3", "m4"}, Ghosts: []string{"x"}, NoMessageID: 1, Duplicates: 1},
		wants: []error{outboxtest.ErrLost, outboxtest.ErrGhost},
	}, {
		name:  "OnlyRecordsWithoutAMessageIDAreGhostsToo",
		ids:   []string{"m1", "m2", "m3", "m4", "m5", "", ""},
		want:  outboxtest.Ledger{Committed: 5, Delivered: 5, NoMessageID: 2},
		wants: []error{outboxtest.ErrGhost},
	}, {
		name: "OrderBrokenWithinAnAggregateOnly",
		// m2 before m1 (aggregate order/a); user/a (m5) is another
		// aggregate although its ID is the same.
		ids:   []string{"m5", "m2", "m1", "m3", "m4"},
		want:  outboxtest.Ledger{Committed: 5, Delivered: 5, OrderViolations: []outboxtest.OrderViolation{{AggregateType: "order", AggregateID: "a", Got: 1, After: 2}}},
		wants: []error{outboxtest.ErrOrder},
	}, {
		name: "ARedeliveryIsNotAViolation",
		ids:  []string{"m1", "m2", "m1", "m3", "m4", "m5"},
		want: outboxtest.Ledger{Committed: 5, Delivered: 5, Duplicates: 1},
	}, {
		name: "ViolationsSortedAndAfterIsTheHighestSoFar",
		// b: m4 then m3 (3 after 4); a: m2, then m1 (1 after 2).
		ids: []string{"m4", "m2", "m3", "m1", "m5"},
		want: outboxtest.Ledger{Committed: 5, Delivered: 5, OrderViolations: []outboxtest.OrderViolation{
			{AggregateType: "order", AggregateID: "a", Got: 1, After: 2},
			{AggregateType: "order", AggregateID: "b", Got: 3, After: 4},
		}},
		wants: []error{outboxtest.ErrOrder},
	}, {
		name:  "EverythingAtOnce",
		ids:   []string{"m2", "m1", "m1", "ghost", ""},
		want:  outboxtest.Ledger{Committed: 5, Delivered: 2, Lost: []string{"m3", "m4", "m5"}, Ghosts: []string{"ghost"}, NoMessageID: 1, Duplicates: 1, OrderViolations: []outboxtest.OrderViolation{{AggregateType: "order", AggregateID: "a", Got: 1, After: 2}}},
		wants: []error{outboxtest.ErrLost, outboxtest.ErrGhost, outboxtest.ErrOrder},
	}, {
		name:  "NothingDelivered",
		want:  outboxtest.Ledger{Committed: 5, Lost: []string{"m1", "m2", "m3", "m4", "m5"}},
		wants: []error{outboxtest.ErrLost},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ids := append([]string(nil), tc.ids...)
			got := outboxtest.Check(rows, ids)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Check =\n %+v, want\n %+v", got, tc.want)
			}
			if !reflect.DeepEqual(ids, tc.ids) {
				t.Errorf("Check modified its argument: %v", ids)
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

func TestCheckNoRows(t *testing.T) {
	t.Parallel()
	if l := outboxtest.Check(nil, nil); !reflect.DeepEqual(l, outboxtest.Ledger{}) || l.Err() != nil {
		t.Fatalf("Check(nil, nil) = %+v, %v; want the zero Ledger and no error", l, l.Err())
	}
}

func TestCheckLastDuplicateRowWins(t *testing.T) {
	t.Parallel()
	rows := []outboxtest.Row{
		{ID: 1, MessageID: "m", AggregateType: "order", AggregateID: "a"},
		{ID: 9, MessageID: "m", AggregateType: "order", AggregateID: "b"},
		{ID: 2, MessageID: "n", AggregateType: "order", AggregateID: "b"},
	}
	// Were the first row to win, m (a) and n (b) would not share an
	// aggregate and there would be no violation.
	l := outboxtest.Check(rows, []string{"m", "n"})
	want := outboxtest.Ledger{Committed: 2, Delivered: 2, OrderViolations: []outboxtest.OrderViolation{{AggregateType: "order", AggregateID: "b", Got: 2, After: 9}}}
	if !reflect.DeepEqual(l, want) {
		t.Fatalf("Check = %+v, want %+v", l, want)
	}
}

func TestCheckNamesAFewIDs(t *testing.T) {
	t.Parallel()
	var rows []outboxtest.Row
	var ghosts []string
	for i := range 8 {
		rows = append(rows, outboxtest.Row{ID: int64(i + 1), MessageID: string(rune('a' + i)), AggregateType: "t", AggregateID: "x"})
		ghosts = append(ghosts, fmt.Sprintf("g%d", i))
	}
	err := outboxtest.Check(rows, nil).Err()
	const want = "outboxtest: committed events not delivered: 8 of 8 (a, b, c, d, e, and 3 more)"
	if err == nil || err.Error() != want {
		t.Fatalf("Err = %v, want %q", err, want)
	}
	err = outboxtest.Check(nil, append(ghosts, "")).Err()
	const wantGhosts = "outboxtest: records of events that were not committed: 9 (1 without a message ID; g0, g1, g2, g3, g4, and 3 more)"
	if err == nil || err.Error() != wantGhosts {
		t.Fatalf("Err = %v, want %q", err, wantGhosts)
	}
	err = outboxtest.Check(rows[:2], []string{"b", "a"}).Err()
	const wantOrder = "outboxtest: aggregate order broken: 1 (t/x: id 1 after 2)"
	if err == nil || err.Error() != wantOrder {
		t.Fatalf("Err = %v, want %q", err, wantOrder)
	}
}

func TestMessageIDs(t *testing.T) {
	t.Parallel()
	type rec struct {
		id string
		ok bool
	}
	got := outboxtest.MessageIDs([]rec{{"a", true}, {"", false}, {"x", false}, {"b", true}}, func(r rec) (string, bool) { return r.id, r.ok })
	if want := []string{"a", "", "", "b"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("MessageIDs = %q, want %q", got, want)
	}
	if got := outboxtest.MessageIDs(nil, func(rec) (string, bool) { return "", false }); len(got) != 0 {
		t.Fatalf("MessageIDs(nil) = %q", got)
	}
}

// ExampleCheck: rows read back from the outbox table, the message IDs of
// what a consumer received in the order it received them.
func ExampleCheck() {
	rows := []outboxtest.Row{
		{ID: 1, MessageID: "m1", AggregateType: "order", AggregateID: "o-1"},
		{ID: 2, MessageID: "m2", AggregateType: "order", AggregateID: "o-1"},
		{ID: 3, MessageID: "m3", AggregateType: "order", AggregateID: "o-2"},
	}
	l := outboxtest.Check(rows, []string{"m2", "m1", "m1", "x"})
	fmt.Println("delivered:", l.Delivered, "lost:", l.Lost, "ghosts:", l.Ghosts, "duplicates:", l.Duplicates)
	fmt.Println(l.Err())
	// Output:
	// delivered: 2 lost: [m3] ghosts: [x] duplicates: 1
	// outboxtest: committed events not delivered: 1 of 3 (m3)
	// outboxtest: records of events that were not committed: 1 (0 without a message ID; x)
	// outboxtest: aggregate order broken: 1 (order/o-1: id 1 after 2)
}

func TestRows(t *testing.T) {
	t.Parallel()
	got := outboxtest.Rows([]relay.Message{{ID: 7, MessageID: "m", AggregateType: "order", AggregateID: "o-1", EventType: "x", Payload: []byte("p")}})
	if want := []outboxtest.Row{{ID: 7, MessageID: "m", AggregateType: "order", AggregateID: "o-1"}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Rows = %+v, want %+v", got, want)
	}
}

func TestByMessageID(t *testing.T) {
	t.Parallel()
	type rec struct {
		id string
		n  int
	}
	id := func(r rec) (string, bool) { return r.id, r.id != "" }
	got := outboxtest.ByMessageID([]rec{{"a", 1}, {"", 2}, {"b", 3}, {"a", 4}}, id)
	if want := map[string][]rec{"a": {{"a", 1}, {"a", 4}}, "b": {{"b", 3}}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("ByMessageID = %v, want %v", got, want)
	}
	if got := outboxtest.ByMessageID(nil, id); len(got) != 0 {
		t.Fatalf("ByMessageID(nil) = %v", got)
	}
}
