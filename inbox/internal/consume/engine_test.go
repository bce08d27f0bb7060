package consume_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/consume"
	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

var pgx = testdb.Target{Name: "pgx", Dialect: driver.Postgres}

func fastRetry() backoff.BackOff { return backoff.NewConstantBackOff(time.Millisecond) }

// msg is aggregate agg's seq-th message.
func msg(agg string, seq int) inbox.Message {
	return inbox.Message{ID: fmt.Sprintf("%s-%d", agg, seq), AggregateType: "account", AggregateID: agg,
		Payload: []byte(fmt.Sprintf(`{"seq":%d}`, seq))}
}

// submit queues msgs on a pool of e and returns a counter of their acks.
func submit(t *testing.T, p *consume.Pool, msgs ...inbox.Message) *atomic.Int64 {
	t.Helper()
	var acks atomic.Int64
	for _, m := range msgs {
		if err := p.Submit(context.Background(), &consume.Delivery{Msg: m, Ack: func() { acks.Add(1) }}); err != nil {
			t.Fatal(err)
		}
	}
	return &acks
}

// TestSlowHandlerIsAFailedAttempt: a handler that outruns AttemptTimeout
// is a failed attempt of its own message, retried and parked, in a batch
// as alone, whether it honours its context (returns its error) or not
// (returns nil late, so the commit is refused); the other messages are
// applied and every delivery is acknowledged. (A batch that outran its
// deadline was retried whole, forever; a late nil was taken for an outage
// of the inbox and retried forever.)
func TestSlowHandlerIsAFailedAttempt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		batch  int
		honour bool
	}{
		{"alone/honours ctx", 0, true},
		{"alone/ignores ctx", 0, false},
		{"batch/honours ctx", 8, true},
		{"batch/ignores ctx", 8, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := ledgertest.NewDB(t, pgx)
			ctx := ledgertest.Context(t, 90*time.Second)
			ledger := ledgertest.LedgerHandler(pgx.Dialect, c.Ledger)
			var slowCalls atomic.Int64
			s := consume.Settings{Inbox: c.Inbox, DB: c.DB, MaxAttempts: 2, Backoff: fastRetry, BatchSize: tc.batch,
				AttemptTimeout: time.Second, RequestInterval: -1, Logger: ledgertest.QuietLogger(),
				Handler: func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
					if m.AggregateID == "a3" {
						slowCalls.Add(1)
						<-ctx.Done()
						if tc.honour {
							return ctx.Err()
						}
						return nil
					}
					return ledger(ctx, tx, m)
				}}.WithDefaults()
			e := consume.NewEngine(s, s.Logger, nil)
			p := e.NewPool(2, 64)
			t.Cleanup(p.Stop)
			var msgs []inbox.Message
			for a := range 8 {
				msgs = append(msgs, msg(fmt.Sprintf("a%d", a), 1))
			}
			acks := submit(t, p, msgs...)
			testdb.Eventually(t, ctx, "every delivery acknowledged", func() bool { return acks.Load() == 8 })
			if n := ledgertest.Count(t, c.DB, c.Ledger); n != 7 {
				t.Errorf("%d applied, want 7", n)
			}
			parked, err := c.Inbox.ListParked(ctx, c.DB, inbox.ParkedFilter{All: true})
			if err != nil {
				t.Fatal(err)
			}
			if len(parked) != 1 || parked[0].ID != "a3-1" || parked[0].Attempts != 2 {
				t.Errorf("parked %+v, want a3-1 after 2 attempts", parked)
			}
			// The slow handler ran for its 2 attempts (and, in a batch,
			// once more in the batch that outran its deadline and was then
			// handled message by message). Under load another message's
			// handler may outrun the deadline too, a failed attempt that
			// its retry then applies: a CI run counted 3 handler errors.
			want := int64(2)
			if tc.batch > 0 {
				want = 3
			}
			if n := slowCalls.Load(); n != want {
				t.Errorf("the slow handler ran %d times, want %d", n, want)
			}
			if cnt := e.Counters(); cnt.Parked != 1 || cnt.HandlerErrors < 2 {
				t.Errorf("counters %+v, want 1 parked after at least 2 failed attempts", cnt)
			}
		})
	}
}

// TestSkipAfterParkHealsAParkLeftByADeadProcess: with SkipAfterPark, a
// message parked by a process that died before skipping it holds its
// aggregate; the next message of the aggregate is stored Held, and the
// engine then skips the parked one, whose retry request applies the held
// one. (Before, the aggregate stayed held for good.)
func TestSkipAfterParkHealsAParkLeftByADeadProcess(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{0, 8} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			t.Parallel()
			testHeal(t, batch)
		})
	}
}

func testHeal(t *testing.T, batch int) {
	c := ledgertest.NewDB(t, pgx)
	ctx := ledgertest.Context(t, 60*time.Second)
	if err := c.Inbox.ParkAfter(ctx, c.DB, msg("x", 1), errors.New("boom"), 5); err != nil {
		t.Fatal(err)
	}
	s := consume.Settings{Inbox: c.Inbox, DB: c.DB, Backoff: fastRetry, OnFailure: inbox.SkipAfterPark, BatchSize: batch,
		RequestInterval: 20 * time.Millisecond, Logger: ledgertest.QuietLogger(),
		Handler: ledgertest.LedgerHandler(pgx.Dialect, c.Ledger)}.WithDefaults()
	e := consume.NewEngine(s, s.Logger, nil)
	p := e.NewPool(1, 4)
	t.Cleanup(p.Stop)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.ServeRequests(rctx)
	}()
	t.Cleanup(func() { stop(); <-done })
	acks := submit(t, p, msg("x", 2))
	testdb.Eventually(t, ctx, "the held message applied", func() bool {
		return acks.Load() == 1 && ledgertest.Count(t, c.DB, c.Ledger) == 1
	})
	if cnt := e.Counters(); cnt.Held != 1 {
		t.Errorf("counters %+v, want the message stored held first", cnt)
	}
	if parked, err := c.Inbox.ListParked(ctx, c.DB, inbox.ParkedFilter{All: true}); err != nil || len(parked) != 0 {
		t.Errorf("parked or held after healing: %+v %v", parked, err)
	}
}
