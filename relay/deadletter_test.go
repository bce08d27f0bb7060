package relay_test

import (
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/sqloutbox/outbox/relay"
)

// TestDeadLetterOperations: a dead event holds its aggregate; retry
// delivers it and then the events it held, in order; skip releases the
// aggregate and leaves the event failed; selectors are validated.
func TestDeadLetterOperations(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdbTarget) {
		var failing atomic.Bool
		failing.Store(true)
		b := setup(t, tg, func(c *relay.Config) { c.MaxAttempts = 2 })
		b.pub.FailWith(func(m relay.Message) error {
			if failing.Load() && (m.MessageID == "Q-1" || m.MessageID == "S-1") {
				return errors.New("broker refuses")
			}
			return nil
		})
		dl, err := relay.NewDeadLetters(b.e.Outbox, b.e.RelayDB)
		if err != nil {
			t.Fatal(err)
		}
		b.emit(t, event("Q", 1), event("Q", 2), event("Q", 3), event("S", 1), event("S", 2), event("T", 1))
		eventually(t, b.ctx, "two dead letters", func() bool {
			l, err := dl.List(b.ctx, relay.Selector{All: true}, 0)
			return err == nil && len(l) == 2
		})
		list, err := dl.List(b.ctx, relay.Selector{All: true}, 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range list {
			if !d.Held || d.Attempts != 2 || d.LastError == "" || d.DeadAt.IsZero() {
				t.Errorf("dead letter %+v: want held, 2 attempts, an error and a time", d)
			}
		}
		if got := order(b.pub.Messages(), "Q"); len(got) != 0 {
			t.Fatalf("held aggregate Q delivered %v", got)
		}
		failing.Store(false)

		// Skip S-1: S-2 flows, S-1 stays failed and no longer holds.
		n, err := dl.Skip(b.ctx, relay.Selector{MessageID: "S-1"})
		if err != nil || n != 1 {
			t.Fatalf("Skip = %d, %v", n, err)
		}
		if n, _ := dl.Skip(b.ctx, relay.Selector{MessageID: "S-1"}); n != 0 {
			t.Errorf("second Skip = %d, want 0", n)
		}
		if _, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "S")) == 1 }); err != nil {
			t.Fatal(err)
		}
		if s, _ := b.status(t, "S-1"); s != 2 {
			t.Errorf("skipped S-1 status %d, want 2", s)
		}
		if l, _ := dl.List(b.ctx, relay.Selector{MessageID: "S-1"}, 0); len(l) != 1 || l[0].Held {
			t.Errorf("skipped S-1 listed as %+v", l)
		}

		// Retry aggregate Q: Q-1 first, then the events it held.
		n, err = dl.Retry(b.ctx, relay.Selector{AggregateType: "acct", AggregateID: "Q"})
		if err != nil || n != 1 {
			t.Fatalf("Retry = %d, %v", n, err)
		}
		b.r.Notify()
		msgs, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "Q")) == 3 })
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(order(msgs, "Q")); got != "[Q-1 Q-2 Q-3]" {
			t.Errorf("Q delivered as %s", got)
		}
		if l, _ := dl.List(b.ctx, relay.Selector{All: true}, 0); len(l) != 1 || l[0].MessageID != "S-1" {
			t.Errorf("remaining dead letters %+v, want only S-1", l)
		}

		// By row ids: exactly the rows listed, and only while dead. S-1 is
		// dead (released); Q-2 is sent: one row moves.
		var s1, q2 int64
		if err := b.e.RelayDB.QueryRowContext(b.ctx, "SELECT id FROM "+b.e.Table+" WHERE message_id = 'S-1'").Scan(&s1); err != nil {
			t.Fatal(err)
		}
		if err := b.e.RelayDB.QueryRowContext(b.ctx, "SELECT id FROM "+b.e.Table+" WHERE message_id = 'Q-2'").Scan(&q2); err != nil {
			t.Fatal(err)
		}
		if l, err := dl.List(b.ctx, relay.Selector{IDs: []int64{s1, q2}}, 0); err != nil || len(l) != 1 || l[0].ID != s1 {
			t.Fatalf("List by ids = %+v, %v; want S-1 only", l, err)
		}
		if n, err := dl.Retry(b.ctx, relay.Selector{IDs: []int64{s1, q2}}); err != nil || n != 1 {
			t.Fatalf("Retry by ids = %d, %v; want 1", n, err)
		}
		b.r.Notify()
		if _, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "S")) == 2 }); err != nil {
			t.Fatal(err)
		}
		if l, _ := dl.List(b.ctx, relay.Selector{All: true}, 0); len(l) != 0 {
			t.Errorf("dead letters left after retrying S-1 by id: %+v", l)
		}

		tooMany := make([]int64, relay.MaxSelectorIDs+1)
		for _, bad := range []relay.Selector{{}, {MessageID: "x", All: true}, {AggregateType: "acct"}, {AggregateID: "Q", MessageID: "y"},
			{IDs: []int64{1}, All: true}, {IDs: tooMany}} {
			if _, err := dl.Retry(b.ctx, bad); !errors.Is(err, relay.ErrInvalidSelector) {
				t.Errorf("selector %+v: %v", bad, err)
			}
		}
	})
}

// TestSkipDeadPolicy: with SkipDead the aggregate moves on by itself.
func TestSkipDeadPolicy(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdbTarget) {
		b := setup(t, tg, func(c *relay.Config) { c.MaxAttempts = 1; c.DeadLetterPolicy = relay.SkipDead })
		b.pub.FailWith(func(m relay.Message) error {
			if m.MessageID == "R-1" {
				return errors.New("refused")
			}
			return nil
		})
		b.emit(t, event("R", 1), event("R", 2))
		msgs, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "R")) == 1 })
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(order(msgs, "R")); got != "[R-2]" {
			t.Errorf("R delivered as %s", got)
		}
		if s, _ := b.status(t, "R-1"); s != 2 {
			t.Errorf("R-1 status %d, want 2", s)
		}
	})
}

func TestNewDeadLettersValidates(t *testing.T) {
	t.Parallel()
	if _, err := relay.NewDeadLetters(nil, &sql.DB{}); !errors.Is(err, relay.ErrInvalidConfig) {
		t.Errorf("nil outbox: %v", err)
	}
	if _, err := relay.NewDeadLetters(sqliteOutbox(t), nil); !errors.Is(err, relay.ErrInvalidConfig) {
		t.Errorf("nil db: %v", err)
	}
}

// TestDeadLetterPending: an event whose route is unroutable (ErrUnavailable:
// no attempt is counted, it stays pending for ever) is dead-lettered by
// an operator. Under HoldAggregate it then holds its aggregate like any
// dead letter, and a retry delivers it before the events it held; under
// SkipDead the aggregate goes on. Rows no longer pending (sent, already
// dead) are left alone; ListPending with All lists every pending event.
func TestDeadLetterPending(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdbTarget) {
		var unroutable atomic.Bool
		var refused atomic.Int64
		unroutable.Store(true)
		b := setup(t, tg, nil)
		b.pub.FailWith(func(m relay.Message) error {
			if unroutable.Load() && (m.MessageID == "U-1" || m.MessageID == "W-1") {
				refused.Add(1)
				return fmt.Errorf("%w: no stream binds subject fu.nowhere", relay.ErrUnavailable)
			}
			return nil
		})
		dl, err := relay.NewDeadLetters(b.e.Outbox, b.e.RelayDB)
		if err != nil {
			t.Fatal(err)
		}
		b.emit(t, event("U", 1), event("U", 2), event("V", 1), event("W", 1), event("W", 2))
		if _, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "V")) == 1 }); err != nil {
			t.Fatal(err)
		}
		eventually(t, b.ctx, "the unroutable events refused", func() bool { return refused.Load() >= 2 })
		eventually(t, b.ctx, "V-1 marked sent", func() bool { s, _ := b.status(t, "V-1"); return s == 1 })

		// All: every pending event, oldest first, at most the limit (V-1
		// is sent).
		for _, c := range []struct {
			limit int
			want  []string
		}{{0, []string{"U-1", "U-2", "W-1", "W-2"}}, {3, []string{"U-1", "U-2", "W-1"}}} {
			l, err := dl.ListPending(b.ctx, relay.Selector{All: true}, c.limit)
			var got []string
			for _, p := range l {
				got = append(got, p.MessageID)
			}
			if err != nil || !slices.Equal(got, c.want) {
				t.Errorf("ListPending(All, %d) = %v, %v; want %v", c.limit, got, err, c.want)
			}
		}
		if _, err := dl.ListPending(b.ctx, relay.Selector{All: true, MessageID: "U-1"}, 0); !errors.Is(err, relay.ErrInvalidSelector) {
			t.Errorf("ListPending(All and a message ID) = %v, want ErrInvalidSelector", err)
		}
		if _, err := dl.DeadLetterPending(b.ctx, nil, relay.HoldAggregate, "x"); !errors.Is(err, relay.ErrInvalidSelector) {
			t.Errorf("DeadLetterPending(no ids) = %v, want ErrInvalidSelector", err)
		}
		pu, err := dl.ListPending(b.ctx, relay.Selector{AggregateType: "acct", AggregateID: "U"}, 0)
		if err != nil || len(pu) != 2 || pu[0].MessageID != "U-1" || pu[1].MessageID != "U-2" || pu[0].Attempts != 0 || pu[0].CreatedAt.IsZero() {
			t.Fatalf("ListPending(U) = %+v, %v; want U-1, U-2 with no attempts", pu, err)
		}
		if l, err := dl.ListPending(b.ctx, relay.Selector{MessageID: "V-1"}, 0); err != nil || len(l) != 0 {
			t.Errorf("ListPending(sent V-1) = %+v, %v; want none", l, err)
		}

		// Hold: U-1 dead, holding U-2.
		n, err := dl.DeadLetterPending(b.ctx, []int64{pu[0].ID}, relay.HoldAggregate, "dead-lettered by the test")
		if err != nil || n != 1 {
			t.Fatalf("DeadLetterPending(U-1) = %d, %v", n, err)
		}
		if n, err := dl.DeadLetterPending(b.ctx, []int64{pu[0].ID}, relay.HoldAggregate, "again"); err != nil || n != 0 {
			t.Errorf("second DeadLetterPending(U-1) = %d, %v; want 0", n, err)
		}
		if s, a := b.status(t, "U-1"); s != 2 || a != 0 {
			t.Errorf("U-1: status %d, %d attempts; want dead, 0 attempts", s, a)
		}
		d, err := dl.List(b.ctx, relay.Selector{MessageID: "U-1"}, 0)
		if err != nil || len(d) != 1 || !d[0].Held || d[0].LastError != "dead-lettered by the test" {
			t.Errorf("dead letter U-1 = %+v, %v; want held, with the reason", d, err)
		}

		// Release: W-1 dead, W-2 flows.
		pw, err := dl.ListPending(b.ctx, relay.Selector{MessageID: "W-1"}, 0)
		if err != nil || len(pw) != 1 {
			t.Fatalf("ListPending(W-1) = %+v, %v", pw, err)
		}
		// The sent V-1's id beside it is left alone.
		var v1 int64
		if err := b.e.RelayDB.QueryRow("SELECT id FROM "+b.e.Table+" WHERE message_id = "+b.e.Placeholder(1), "V-1").Scan(&v1); err != nil {
			t.Fatal(err)
		}
		if n, err := dl.DeadLetterPending(b.ctx, []int64{pw[0].ID, v1}, relay.SkipDead, "skipped by the test"); err != nil || n != 1 {
			t.Fatalf("DeadLetterPending(W-1, sent V-1) = %d, %v; want 1", n, err)
		}
		if s, _ := b.status(t, "V-1"); s != 1 {
			t.Errorf("sent V-1 has status %d after DeadLetterPending, want still sent", s)
		}
		b.r.Notify()
		msgs, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "W")) == 1 })
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(order(msgs, "W")); got != "[W-2]" {
			t.Errorf("W delivered as %s, want [W-2]", got)
		}
		if got := order(msgs, "U"); len(got) != 0 {
			t.Errorf("held aggregate U delivered %v", got)
		}

		// The route fixed, a retry delivers U-1, then U-2.
		unroutable.Store(false)
		if n, err := dl.Retry(b.ctx, relay.Selector{MessageID: "U-1"}); err != nil || n != 1 {
			t.Fatalf("Retry(U-1) = %d, %v", n, err)
		}
		b.r.Notify()
		msgs, err = b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "U")) == 2 })
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(order(msgs, "U")); got != "[U-1 U-2]" {
			t.Errorf("U delivered as %s", got)
		}
	})
}
