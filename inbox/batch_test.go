package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// TestHandleBatch: the batch's outcomes, case by case, on every target.
// Each case starts on a fresh table; want lists, per message, the outcome
// ("applied", "duplicate", "held", "" for none), "err" for a handler
// error, "invalid" for ErrInvalidMessage; then the caller's Handle of each
// message without an outcome must give after[i], and each message's
// effect must exist exactly once where applied.
func TestHandleBatch(t *testing.T) {
	t.Parallel()
	type tc struct {
		name   string
		before func(t *testing.T, b *bundle)
		msgs   []inbox.Message
		fail   string // the handler fails for this ID
		want   []string
		after  []string // Handle's outcome for each message the batch left
	}
	cases := []tc{
		{name: "AllNew", msgs: []inbox.Message{orderMsg("a-1", "a", 1), orderMsg("b-1", "b", 2), msg("loose"), orderMsg("a-2", "a", 3)},
			want: []string{"applied", "applied", "applied", "applied"}},
		{name: "Replay", before: func(t *testing.T, b *bundle) {
			for _, id := range []string{"a-1", "b-1"} {
				out, err := b.in.Handle(b.ctx, b.db, orderMsg(id, id[:1], 1), b.apply("shipping", id))
				must(t, out, err, inbox.Applied)
			}
		}, msgs: []inbox.Message{orderMsg("a-1", "a", 1), orderMsg("b-1", "b", 2), orderMsg("a-2", "a", 3)},
			want: []string{"duplicate", "duplicate", "applied"}},
		{name: "FailureMidBatch", msgs: []inbox.Message{orderMsg("a-1", "a", 1), orderMsg("b-1", "b", 2), orderMsg("a-2", "a", 3), orderMsg("b-2", "b", 4), msg("loose")},
			fail: "a-1", want: []string{"err", "applied", "", "applied", "applied"}, after: []string{"applied", "", "applied", "", ""}},
		{name: "HeldAggregate", before: func(t *testing.T, b *bundle) {
			if err := b.in.Park(b.ctx, b.db, orderMsg("x-1", "x", 1), errors.New("poison")); err != nil {
				t.Fatal(err)
			}
		}, msgs: []inbox.Message{orderMsg("x-2", "x", 2), orderMsg("y-1", "y", 3), orderMsg("x-3", "x", 4)},
			want: []string{"", "applied", ""}, after: []string{"held", "", "held"}},
		{name: "RedeliveredHeld", before: func(t *testing.T, b *bundle) {
			if err := b.in.Park(b.ctx, b.db, orderMsg("x-1", "x", 1), errors.New("poison")); err != nil {
				t.Fatal(err)
			}
		}, msgs: []inbox.Message{orderMsg("x-1", "x", 1), orderMsg("z-1", "z", 2)},
			want: []string{"", "applied"}, after: []string{"held", ""}},
		{name: "SameMessageTwice", msgs: []inbox.Message{orderMsg("d-1", "d", 1), orderMsg("d-1", "d", 1), orderMsg("e-1", "e", 2)},
			want: []string{"applied", "", "applied"}, after: []string{"", "duplicate", ""}},
		{name: "InvalidMessage", msgs: []inbox.Message{orderMsg("f-1", "f", 1), {ID: ""}, orderMsg("f-2", "f", 2)},
			want: []string{"applied", "invalid", "applied"}},
	}
	forEach(t, func(t *testing.T, tg testdb.Target) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				b := setup(t, tg)
				if c.before != nil {
					c.before(t, b)
				}
				inBatch := true
				calls := map[string]int{}
				h := func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
					if inBatch {
						calls[m.ID]++
					}
					if err := b.applyMsg("shipping")(ctx, tx, m); err != nil {
						return err
					}
					if inBatch && m.ID == c.fail {
						return errors.New("fails after its effect")
					}
					return nil
				}
				res, err := b.in.HandleBatch(b.ctx, b.db, c.msgs, h)
				if err != nil {
					t.Fatal(err)
				}
				for i, r := range res {
					got := ""
					switch {
					case r.Outcome != 0:
						got = r.Outcome.String()
					case errors.Is(r.Err, inbox.ErrHandler):
						got = "err"
					case errors.Is(r.Err, inbox.ErrInvalidMessage):
						got = "invalid"
					case r.Err != nil:
						t.Fatalf("message %d: %v", i, r.Err)
					}
					if got != c.want[i] {
						t.Fatalf("message %d (%s): %q, want %q (all: %+v)", i, c.msgs[i].ID, got, c.want[i], res)
					}
				}
				inBatch = false
				if c.fail != "" && calls[c.fail] != 1 {
					t.Fatalf("the failing handler ran %d times in the batch, want 1 (its error is reused when the batch runs again with savepoints)", calls[c.fail])
				}
				for i, m := range c.msgs {
					if c.after == nil || c.after[i] == "" {
						continue
					}
					out, err := b.in.Handle(b.ctx, b.db, m, func(ctx context.Context, tx *sql.Tx) error { return h(ctx, tx, m) })
					if err != nil || out.String() != c.after[i] {
						t.Fatalf("Handle(%s) after the batch = %v, %v; want %s", m.ID, out, err, c.after[i])
					}
				}
				for _, m := range c.msgs {
					if m.ID == "" {
						continue
					}
					want := 0
					if n := b.inboxCount(t, "message_id = "+b.ph(1)+" AND status = 1", m.ID); n == 1 {
						want = 1
					}
					if n := b.effectCount(t, "shipping", m.ID); n != want {
						t.Fatalf("%s: %d effects, %d processed rows", m.ID, n, want)
					}
				}
			})
		}
	})
}

// TestHandleBatchLimits: an empty batch and one over MaxBatch are refused
// before anything is written.
func TestHandleBatchLimits(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		b := setup(t, tg)
		big := make([]inbox.Message, inbox.MaxBatch+1)
		for i := range big {
			big[i] = msg(fmt.Sprintf("m-%d", i))
		}
		for _, msgs := range [][]inbox.Message{nil, big} {
			if _, err := b.in.HandleBatch(b.ctx, b.db, msgs, b.applyMsg("shipping")); !errors.Is(err, inbox.ErrInvalidConfig) {
				t.Fatalf("%d messages: %v, want ErrInvalidConfig", len(msgs), err)
			}
		}
		res, err := b.in.HandleBatch(b.ctx, b.db, big[:inbox.MaxBatch], b.applyMsg("shipping"))
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if r.Outcome != inbox.Applied {
				t.Fatalf("message %d: %+v", i, r)
			}
		}
		if n := b.inboxCount(t, ""); n != inbox.MaxBatch {
			t.Fatalf("%d rows, want %d", n, inbox.MaxBatch)
		}
	})
}
