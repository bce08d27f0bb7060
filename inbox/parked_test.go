package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

func orderMsg(id, order string, offset int64) inbox.Message {
	return inbox.Message{ID: id, AggregateType: "order", AggregateID: order, Topic: "outbox.event.order", Partition: 1, Offset: offset,
		Key: []byte(order), Headers: map[string]string{"outbox-message-id": id, "bin": "a\x00\xffb"}, Payload: []byte(`{"id":"` + id + `"}` + "\x00\xff")}
}

// TestParkHoldRetry: a parked message holds its aggregate: the aggregate's
// later messages are stored held (not run) while other aggregates flow;
// ListParked shows them with their bytes; Retry runs them in order, stops
// at a failure (still parked, one more attempt) and later finishes; the
// messages are then duplicates.
func TestParkHoldRetry(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		b := setup(t, tg)
		first := orderMsg("o1-1", "o1", 10)
		if err := b.in.Park(b.ctx, b.db, first, errors.New("handler refused: \x00bad \xff utf8")); err != nil {
			t.Fatal(err)
		}
		// Parking again adds attempts and replaces the cause.
		if err := b.in.ParkAfter(b.ctx, b.db, first, errors.New("still refused"), 4); err != nil {
			t.Fatal(err)
		}
		for i, m := range []inbox.Message{orderMsg("o1-2", "o1", 11), orderMsg("o1-3", "o1", 12)} {
			out, err := b.in.Handle(b.ctx, b.db, m, func(context.Context, *sql.Tx) error {
				t.Fatalf("held message %d ran", i)
				return nil
			})
			must(t, out, err, inbox.Held)
		}
		// Redelivery of a held message: still Held, not run, not stored twice.
		out, err := b.in.Handle(b.ctx, b.db, orderMsg("o1-2", "o1", 11), func(context.Context, *sql.Tx) error {
			t.Fatal("held message ran")
			return nil
		})
		must(t, out, err, inbox.Held)
		// Another aggregate is not held.
		out, err = b.in.Handle(b.ctx, b.db, orderMsg("o2-1", "o2", 13), b.apply("shipping", "o2-1"))
		must(t, out, err, inbox.Applied)

		list, err := b.in.ListParked(b.ctx, b.db, inbox.ParkedFilter{AggregateType: "order", AggregateID: "o1"})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, p := range list {
			ids = append(ids, p.ID)
		}
		if !reflect.DeepEqual(ids, []string{"o1-1", "o1-2", "o1-3"}) {
			t.Fatalf("parked %v", ids)
		}
		p := list[0]
		if p.Held || p.Attempts != 5 || p.Cause != "still refused" || p.Consumer != "shipping" {
			t.Fatalf("parked head %+v", p)
		}
		if !reflect.DeepEqual(p.Message, first) {
			t.Fatalf("stored message\n%#v\nwant\n%#v", p.Message, first)
		}
		if !list[1].Held || !list[2].Held || p.ParkedAt.IsZero() || time.Since(p.StoredAt) > time.Hour {
			t.Fatalf("held flags or times: %+v", list)
		}
		// Times keep sub-second precision (MySQL: DATETIME(6), not
		// DATETIME) and follow the order things happened in.
		sub := false
		for i, q := range list {
			sub = sub || q.StoredAt.Nanosecond() != 0 || q.ParkedAt.Nanosecond() != 0
			if q.ParkedAt.Before(q.StoredAt) || i > 0 && q.StoredAt.Before(list[i-1].StoredAt) {
				t.Fatalf("times out of order: %+v", list)
			}
		}
		if !sub {
			t.Fatalf("no sub-second part in any stored time: %+v", list)
		}
		if one, err := b.in.ListParked(b.ctx, b.db, inbox.ParkedFilter{ID: "o1-3"}); err != nil || len(one) != 1 {
			t.Fatalf("ListParked by ID = %v, %v", one, err)
		}
		if none, err := b.in.ListParked(b.ctx, b.db, inbox.ParkedFilter{ID: "nope"}); err != nil || len(none) != 0 {
			t.Fatalf("ListParked of nothing = %v, %v; want empty, nil", none, err)
		}
		if lim, err := b.in.ListParked(b.ctx, b.db, inbox.ParkedFilter{Limit: 2}); err != nil || len(lim) != 2 {
			t.Fatalf("ListParked Limit 2 = %d rows, %v", len(lim), err)
		}

		// Retry: the second message fails: the first is applied, the second
		// parked (one more attempt), the third still held.
		var ran []string
		handler := func(failOn string) func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
			return func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
				if m.ID == failOn {
					return errors.New(m.ID + " refused again")
				}
				if want := orderMsg(m.ID, "o1", m.Offset); !reflect.DeepEqual(m, want) {
					t.Errorf("Retry gave\n%#v\nwant the stored message\n%#v", m, want)
				}
				ran = append(ran, m.ID)
				return b.apply("shipping", m.ID)(ctx, tx)
			}
		}
		n, err := b.in.Retry(b.ctx, b.db, inbox.ParkedFilter{AggregateType: "order", AggregateID: "o1"}, handler("o1-2"))
		if n != 1 || !errors.Is(err, inbox.ErrHandler) || !strings.Contains(err.Error(), "refused again") {
			t.Fatalf("Retry = %d, %v", n, err)
		}
		list, err = b.in.ListParked(b.ctx, b.db, inbox.ParkedFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 2 || list[0].ID != "o1-2" || list[0].Held || list[0].Attempts != 1 || list[1].ID != "o1-3" || !list[1].Held {
			t.Fatalf("after a failed retry: %+v", list)
		}
		// Still held: new messages of o1 are stored held.
		out, err = b.in.Handle(b.ctx, b.db, orderMsg("o1-4", "o1", 14), b.apply("shipping", "o1-4"))
		must(t, out, err, inbox.Held)

		// Retry by the ID of a held message runs its aggregate from the head.
		n, err = b.in.Retry(b.ctx, b.db, inbox.ParkedFilter{ID: "o1-3"}, handler(""))
		if err != nil || n != 3 {
			t.Fatalf("Retry = %d, %v", n, err)
		}
		if !reflect.DeepEqual(ran, []string{"o1-1", "o1-2", "o1-3", "o1-4"}) {
			t.Fatalf("ran %v", ran)
		}
		// The effects were applied in order.
		order := testdb.Column(t, b.ctx, b.db, fmt.Sprintf("SELECT id FROM %s WHERE id LIKE 'o1-%%' ORDER BY seq", b.effects))
		if !reflect.DeepEqual(order, []string{"o1-1", "o1-2", "o1-3", "o1-4"}) {
			t.Fatalf("effects in order %v", order)
		}
		for _, id := range []string{"o1-1", "o1-4"} {
			out, err := b.in.Handle(b.ctx, b.db, orderMsg(id, "o1", 0), func(context.Context, *sql.Tx) error {
				t.Fatal("retried message ran again")
				return nil
			})
			must(t, out, err, inbox.Duplicate)
		}
		// The aggregate flows again.
		out, err = b.in.Handle(b.ctx, b.db, orderMsg("o1-5", "o1", 15), b.apply("shipping", "o1-5"))
		must(t, out, err, inbox.Applied)
		if _, err := b.in.Retry(b.ctx, b.db, inbox.ParkedFilter{AggregateType: "order", AggregateID: "o1"}, handler("")); !errors.Is(err, inbox.ErrNothingMatched) {
			t.Fatalf("Retry of nothing = %v, want ErrNothingMatched", err)
		}
		// Park of a processed message changes nothing.
		if err := b.in.Park(b.ctx, b.db, orderMsg("o1-5", "o1", 15), errors.New("late")); err != nil {
			t.Fatal(err)
		}
		if list, _ := b.in.ListParked(b.ctx, b.db, inbox.ParkedFilter{}); len(list) != 0 {
			t.Fatalf("parked after all: %+v", list)
		}
		st := b.in.Stats()
		if st.Retried != 4 || st.Held != 4 || st.Parked != 2 {
			t.Fatalf("stats %+v", st)
		}
	})
}

// TestSkip: Skip marks a parked message skipped (a redelivery is then a
// Duplicate) and releases its aggregate's held messages for Retry; filters
// that name nothing are refused.
func TestSkip(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		b := setup(t, tg)
		if err := b.in.Park(b.ctx, b.db, orderMsg("a-1", "a", 1), errors.New("poison")); err != nil {
			t.Fatal(err)
		}
		out, err := b.in.Handle(b.ctx, b.db, orderMsg("a-2", "a", 2), b.apply("shipping", "a-2"))
		must(t, out, err, inbox.Held)
		// A message without an aggregate holds nothing.
		if err := b.in.Park(b.ctx, b.db, msg("loose"), errors.New("poison")); err != nil {
			t.Fatal(err)
		}
		out, err = b.in.Handle(b.ctx, b.db, msg("loose-2"), b.apply("shipping", "loose-2"))
		must(t, out, err, inbox.Applied)

		for _, f := range []inbox.ParkedFilter{{}, {Limit: 5}} {
			if _, err := b.in.Skip(b.ctx, b.db, f); !errors.Is(err, inbox.ErrInvalidFilter) {
				t.Fatalf("Skip(%+v) = %v, want ErrInvalidFilter", f, err)
			}
			if _, err := b.in.Retry(b.ctx, b.db, f, b.applyMsg("shipping")); !errors.Is(err, inbox.ErrInvalidFilter) {
				t.Fatalf("Retry(%+v) = %v, want ErrInvalidFilter", f, err)
			}
		}
		if _, err := b.in.Skip(b.ctx, b.db, inbox.ParkedFilter{ID: "a-2"}); !errors.Is(err, inbox.ErrNothingMatched) {
			t.Fatalf("Skip of a held message = %v, want ErrNothingMatched (only parked messages are skipped)", err)
		}
		n, err := b.in.Skip(b.ctx, b.db, inbox.ParkedFilter{AggregateType: "order", AggregateID: "a"})
		if err != nil || n != 1 {
			t.Fatalf("Skip = %d, %v", n, err)
		}
		out, err = b.in.Handle(b.ctx, b.db, orderMsg("a-1", "a", 1), func(context.Context, *sql.Tx) error {
			t.Fatal("skipped message ran")
			return nil
		})
		must(t, out, err, inbox.Duplicate)
		n, err = b.in.Retry(b.ctx, b.db, inbox.ParkedFilter{AggregateType: "order", AggregateID: "a"}, b.applyMsg("shipping"))
		if err != nil || n != 1 {
			t.Fatalf("Retry after Skip = %d, %v", n, err)
		}
		n, err = b.in.Skip(b.ctx, b.db, inbox.ParkedFilter{All: true})
		if err != nil || n != 1 {
			t.Fatalf("Skip All = %d, %v", n, err)
		}
		if _, err := b.in.Skip(b.ctx, b.db, inbox.ParkedFilter{All: true}); !errors.Is(err, inbox.ErrNothingMatched) {
			t.Fatalf("Skip of nothing = %v", err)
		}
		if b.effectCount(t, "shipping", "a-2") != 1 || b.effectCount(t, "shipping", "a-1") != 0 {
			t.Fatal("wrong effects")
		}
	})
}

// TestRetention: only processed and skipped rows older than the window go,
// in batches; recent, parked and held rows, and other consumers' rows, stay.
func TestRetention(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		b := setup(t, tg)
		billing := b.inbox(t, "billing")
		nop := func(context.Context, *sql.Tx) error { return nil }
		const old = 25
		for i := 0; i < old; i++ {
			for _, in := range []*inbox.Inbox{b.in, billing} {
				if _, err := in.Handle(b.ctx, b.db, msg(fmt.Sprintf("old-%d", i)), nop); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := b.in.Park(b.ctx, b.db, orderMsg("p-1", "p", 1), errors.New("x")); err != nil {
			t.Fatal(err)
		}
		if out, err := b.in.Handle(b.ctx, b.db, orderMsg("p-2", "p", 2), nop); err != nil || out != inbox.Held {
			t.Fatal(out, err)
		}
		if err := b.in.Park(b.ctx, b.db, orderMsg("s-1", "s", 1), errors.New("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := b.in.Skip(b.ctx, b.db, inbox.ParkedFilter{ID: "s-1"}); err != nil {
			t.Fatal(err)
		}
		// Age everything by two days (the database's own clock arithmetic
		// stays the retention's).
		age := map[string]string{
			"postgres": "UPDATE %s SET processed_at = processed_at - INTERVAL '2 days', created_at = created_at - INTERVAL '2 days'",
			"mysql":    "UPDATE %s SET processed_at = processed_at - INTERVAL 2 DAY, created_at = created_at - INTERVAL 2 DAY",
			"sqlite":   "UPDATE %s SET processed_at = processed_at - 172800000000, created_at = created_at - 172800000000",
		}[string(tg.Dialect)]
		if _, err := b.db.ExecContext(b.ctx, fmt.Sprintf(age, b.e.Q("inbox_message"))); err != nil {
			t.Fatal(err)
		}
		if _, err := b.in.Handle(b.ctx, b.db, msg("recent"), nop); err != nil {
			t.Fatal(err)
		}
		if _, err := b.in.Retention(b.db, inbox.RetentionConfig{BatchSize: 5000}); !errors.Is(err, inbox.ErrInvalidConfig) {
			t.Fatalf("BatchSize 5000: %v", err)
		}
		r, err := b.in.Retention(b.db, inbox.RetentionConfig{Window: 24 * time.Hour, BatchSize: 7})
		if err != nil {
			t.Fatal(err)
		}
		n, err := r.RunOnce(b.ctx)
		if err != nil || n != old+1 {
			t.Fatalf("RunOnce = %d, %v; want %d (old processed and the skipped row)", n, err, old+1)
		}
		left := testdb.Column(t, b.ctx, b.db, fmt.Sprintf("SELECT message_id FROM %s WHERE consumer = 'shipping' ORDER BY id", b.e.Q("inbox_message")))
		if !reflect.DeepEqual(left, []string{"p-1", "p-2", "recent"}) {
			t.Fatalf("left %v", left)
		}
		if n := b.inboxCount(t, "consumer = 'billing'"); n != old {
			t.Fatalf("billing rows %d, want %d (another consumer's window)", n, old)
		}
		if n, err := r.RunOnce(b.ctx); err != nil || n != 0 {
			t.Fatalf("second RunOnce = %d, %v", n, err)
		}
		// Run returns nil once its context ends.
		done, stop := context.WithCancel(b.ctx)
		stop()
		if err := r.Run(done); err != nil {
			t.Fatalf("Run = %v", err)
		}
		// A replay older than the window applies again (documented).
		out, err := b.in.Handle(b.ctx, b.db, msg("old-1"), nop)
		must(t, out, err, inbox.Applied)
	})
}

// TestConcurrentRetry: two Retry calls on one aggregate at once (two
// operators) apply each stored message once, in order: the row lock in
// each message's transaction decides who runs it.
func TestConcurrentRetry(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		b := setup(t, tg)
		if err := b.in.Park(b.ctx, b.db, orderMsg("r-0", "r", 0), errors.New("x")); err != nil {
			t.Fatal(err)
		}
		const n = 20
		for i := 1; i < n; i++ {
			out, err := b.in.Handle(b.ctx, b.db, orderMsg(fmt.Sprintf("r-%d", i), "r", int64(i)), b.apply("shipping", "never"))
			must(t, out, err, inbox.Held)
		}
		var ids []string
		for _, p := range mustList(t, b) {
			ids = append(ids, p.ID)
		}
		fn := b.applyMsg("shipping")
		errs := make(chan error, 2)
		counts := make(chan int, 2)
		for g := 0; g < 2; g++ {
			go func() {
				k, err := b.in.Retry(b.ctx, b.db, inbox.ParkedFilter{AggregateType: "order", AggregateID: "r"}, fn)
				if errors.Is(err, inbox.ErrNothingMatched) {
					err = nil // the other one finished first
				}
				counts <- k
				errs <- err
			}()
		}
		total := 0
		for g := 0; g < 2; g++ {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
			total += <-counts
		}
		if total != n {
			t.Fatalf("applied %d, want %d", total, n)
		}
		order := testdb.Column(t, b.ctx, b.db, fmt.Sprintf("SELECT id FROM %s WHERE id LIKE 'r-%%' ORDER BY seq", b.effects))
		if !reflect.DeepEqual(order, ids) {
			t.Fatalf("effects %v, want %v once each, in order", order, ids)
		}
	})
}

func mustList(t *testing.T, b *bundle) []inbox.Parked {
	t.Helper()
	list, err := b.in.ListParked(b.ctx, b.db, inbox.ParkedFilter{})
	if err != nil {
		t.Fatal(err)
	}
	return list
}

// TestConsumersAndPendingRequests: Consumers counts each consumer's
// parked and held messages (not its processed ones); PendingRequests
// lists a consumer's retry requests, oldest first, until they are served.
func TestConsumersAndPendingRequests(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		b := setup(t, tg)
		billing := b.inbox(t, "billing")
		if err := b.in.Park(b.ctx, b.db, orderMsg("a-1", "a", 1), errors.New("poison")); err != nil {
			t.Fatal(err)
		}
		out, err := b.in.Handle(b.ctx, b.db, orderMsg("a-2", "a", 2), b.apply("shipping", "a-2"))
		must(t, out, err, inbox.Held)
		out, err = b.in.Handle(b.ctx, b.db, orderMsg("b-1", "b", 3), b.apply("shipping", "b-1"))
		must(t, out, err, inbox.Applied)
		if err := billing.Park(b.ctx, b.db, orderMsg("c-1", "c", 1), errors.New("poison")); err != nil {
			t.Fatal(err)
		}
		cfg := b.in.Config()
		cs, err := inbox.Consumers(b.ctx, b.db, cfg)
		want := []inbox.ConsumerParked{{Consumer: "billing", Parked: 1}, {Consumer: "shipping", Parked: 1, Held: 1}}
		if err != nil || fmt.Sprint(cs) != fmt.Sprint(want) {
			t.Fatalf("Consumers = %+v, %v; want %+v", cs, err, want)
		}
		if _, err := inbox.Consumers(b.ctx, b.db, inbox.Config{Dialect: cfg.Dialect, Table: b.e.Q("no_such_inbox")}); !errors.Is(err, inbox.ErrSchemaMissing) {
			t.Errorf("Consumers of a missing table = %v, want ErrSchemaMissing", err)
		}

		if reqs, err := b.in.PendingRequests(b.ctx, b.db); err != nil || len(reqs) != 0 {
			t.Fatalf("PendingRequests before any = %+v, %v", reqs, err)
		}
		if _, err := b.in.RequestRetry(b.ctx, b.db, inbox.ParkedFilter{AggregateType: "order", AggregateID: "a"}); err != nil {
			t.Fatal(err)
		}
		reqs, err := b.in.PendingRequests(b.ctx, b.db)
		if err != nil || len(reqs) != 1 || reqs[0].AggregateID != "a" || reqs[0].RequestedAt.IsZero() {
			t.Fatalf("PendingRequests = %+v, %v; want aggregate a", reqs, err)
		}
		if others, err := billing.PendingRequests(b.ctx, b.db); err != nil || len(others) != 0 {
			t.Errorf("another consumer's PendingRequests = %+v, %v", others, err)
		}
		if _, err := b.in.ServeRequests(b.ctx, b.db, b.applyMsg("shipping")); err != nil {
			t.Fatal(err)
		}
		if reqs, err := b.in.PendingRequests(b.ctx, b.db); err != nil || len(reqs) != 0 {
			t.Fatalf("PendingRequests after serving = %+v, %v", reqs, err)
		}
	})
}
