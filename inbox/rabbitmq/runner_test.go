package inboxrabbitmq_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	inboxrabbitmq "github.com/sqloutbox/outbox/inbox/rabbitmq"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

var (
	pgx   = testdb.Target{Name: "pgx", Dialect: driver.Postgres}
	maria = testdb.Target{Name: "mysql", Dialect: driver.MySQL}
)

// brokerURL is the broker the tests use: $OUTBOX_TEST_RABBITMQ or the
// local one.
func brokerURL() string {
	if url := os.Getenv("OUTBOX_TEST_RABBITMQ"); url != "" {
		return url
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// space is a test's own exchange and queue name (the runner declares the
// queue and binds it with "#"), deleted at cleanup.
type space struct {
	conn     *amqp.Connection
	ch       *amqp.Channel
	exchange string
	queue    string
}

func newSpace(t testing.TB) *space {
	t.Helper()
	conn, err := amqp.Dial(brokerURL())
	if err != nil {
		if os.Getenv("OUTBOX_TEST_REQUIRE") != "" {
			t.Fatalf("RabbitMQ: %v", err)
		}
		t.Skipf("RabbitMQ not available: %v", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	s := &space{conn: conn, ch: ch, exchange: randomName("inboxtest.ex."), queue: randomName("inboxtest.q.")}
	if err := ch.ExchangeDeclare(s.exchange, amqp.ExchangeTopic, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(s.queue, false, false, false)
		_ = ch.ExchangeDelete(s.exchange, false, false)
		_ = conn.Close()
	})
	return s
}

func (s *space) bindings() []inboxrabbitmq.Binding {
	return []inboxrabbitmq.Binding{{Exchange: s.exchange, Key: "#"}}
}

// declare declares the queue as the runner does and binds it, so that
// messages published before a runner starts are kept.
func (s *space) declare(t testing.TB) {
	t.Helper()
	if _, err := s.ch.QueueDeclare(s.queue, true, false, false, false, amqp.Table{inboxrabbitmq.ArgSingleActiveConsumer: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.ch.QueueBind(s.queue, "#", s.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
}

// publish publishes one message per (aggregate, seq), seq 1..n for each of
// aggregates aggregates, interleaved, with the relay's headers, waiting
// for every confirm; it returns the last seq per aggregate.
func (s *space) publish(t testing.TB, aggregates, from, to int) map[string]int {
	t.Helper()
	want := map[string]int{}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for seq := from; seq <= to; seq++ {
		for a := 0; a < aggregates; a++ {
			agg := fmt.Sprintf("agg-%03d", a)
			c, err := s.ch.PublishWithDeferredConfirmWithContext(ctx, s.exchange, "account."+agg, false, false, amqp.Publishing{
				Headers: amqp.Table{emit.HeaderMessageID: randomName("m-"), emit.HeaderAggregateType: "account",
					emit.HeaderAggregateID: agg, emit.HeaderEventType: "account.step"},
				DeliveryMode: amqp.Persistent, Body: []byte(fmt.Sprintf(`{"seq":%d}`, seq))})
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := c.WaitContext(ctx); err != nil || !ok {
				t.Fatalf("confirm: %v %v", ok, err)
			}
			want[agg] = seq
		}
	}
	return want
}

func fastRetry() backoff.BackOff { return backoff.NewConstantBackOff(time.Millisecond) }

func newRunner(t testing.TB, s *space, c *ledgertest.DB, mod func(*inboxrabbitmq.Config)) *inboxrabbitmq.Runner {
	t.Helper()
	cfg := inboxrabbitmq.Config{URL: brokerURL(), Queue: s.queue, Bindings: s.bindings(), Inbox: c.Inbox, DB: c.DB,
		Handler: ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger), Backoff: fastRetry, Logger: ledgertest.QuietLogger()}
	if mod != nil {
		mod(&cfg)
	}
	r, err := inboxrabbitmq.NewRunner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// run runs r until the test ends or stop is called.
func run(t testing.TB, r *inboxrabbitmq.Runner) (stop func()) { return ledgertest.Serve(t, r.Run) }

func testCtx(t testing.TB, d time.Duration) context.Context { return ledgertest.Context(t, d) }

var batchSizes = []int{0, 8}

func TestNewRunnerRejectsBadConfig(t *testing.T) {
	t.Parallel()
	in, err := inbox.New(inbox.Config{Dialect: driver.Postgres, Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	ok := inboxrabbitmq.Config{URL: "amqp://127.0.0.1:1/", Queue: "q", Inbox: in, DB: &sql.DB{},
		Handler: func(context.Context, *sql.Tx, inbox.Message) error { return nil }}
	for name, mod := range map[string]func(*inboxrabbitmq.Config){
		"NoURL":         func(c *inboxrabbitmq.Config) { c.URL = "" },
		"NoQueue":       func(c *inboxrabbitmq.Config) { c.Queue = "" },
		"NoInbox":       func(c *inboxrabbitmq.Config) { c.Inbox = nil },
		"NoDB":          func(c *inboxrabbitmq.Config) { c.DB = nil },
		"NoHandler":     func(c *inboxrabbitmq.Config) { c.Handler = nil },
		"NegativeTries": func(c *inboxrabbitmq.Config) { c.MaxAttempts = -1 },
		"Workers":       func(c *inboxrabbitmq.Config) { c.Workers = -1 },
		"Prefetch":      func(c *inboxrabbitmq.Config) { c.Prefetch = -1 },
		"Policy":        func(c *inboxrabbitmq.Config) { c.OnFailure = 7 },
		"BatchSize":     func(c *inboxrabbitmq.Config) { c.BatchSize = inbox.MaxBatch + 1 },
		"BatchPrefetch": func(c *inboxrabbitmq.Config) { c.BatchSize, c.Prefetch = 16, 8 },
		"BatchLinger":   func(c *inboxrabbitmq.Config) { c.BatchLinger = -time.Millisecond },
		"SACOverridden": func(c *inboxrabbitmq.Config) {
			c.QueueArgs = amqp.Table{inboxrabbitmq.ArgSingleActiveConsumer: false}
		},
	} {
		cfg := ok
		mod(&cfg)
		if _, err := inboxrabbitmq.NewRunner(cfg); !errors.Is(err, inboxrabbitmq.ErrInvalidConfig) {
			t.Errorf("%s: err %v, want ErrInvalidConfig", name, err)
		}
	}
	r, err := inboxrabbitmq.NewRunner(ok)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = r.Run(ctx)
	if err := r.Run(ctx); !errors.Is(err, inboxrabbitmq.ErrStarted) {
		t.Errorf("second Run: %v, want ErrStarted", err)
	}
}

// TestRunRefuses: without the inbox table Run returns ErrSchemaMissing
// before connecting; a queue that exists without single active consumer
// is refused with ErrQueue (it would lose the order).
func TestRunRefuses(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	c := ledgertest.NewDB(t, pgx)
	ctx := testCtx(t, 60*time.Second)

	bare, err := inbox.New(inbox.Config{Dialect: driver.Postgres, Table: c.Env.Q("missing"), Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	r := newRunner(t, s, c, func(cfg *inboxrabbitmq.Config) { cfg.Inbox = bare })
	if err := r.Run(ctx); !errors.Is(err, inbox.ErrSchemaMissing) {
		t.Errorf("Run without the inbox table: %v, want ErrSchemaMissing", err)
	}
	if st := r.Stats(); st.Connections != 0 {
		t.Errorf("connected %d times before refusing", st.Connections)
	}

	if _, err := s.ch.QueueDeclare(s.queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	r = newRunner(t, s, c, nil)
	start := time.Now()
	err = r.Run(ctx)
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("Run took %s to refuse the queue", took)
	}
	if !errors.Is(err, inboxrabbitmq.ErrQueue) || !strings.Contains(err.Error(), "PRECONDITION_FAILED") ||
		!strings.Contains(err.Error(), "delete it and let the runner declare it") {
		t.Errorf("Run on a queue without %s: %v, want ErrQueue with the broker's 406 and what to do", inboxrabbitmq.ArgSingleActiveConsumer, err)
	}

	// A binding to an exchange that does not exist: 404, and what to do.
	other := newSpace(t)
	r = newRunner(t, other, c, func(cfg *inboxrabbitmq.Config) {
		cfg.Bindings = []inboxrabbitmq.Binding{{Exchange: other.exchange + ".missing", Key: "#"}}
	})
	err = r.Run(ctx)
	if !errors.Is(err, inboxrabbitmq.ErrQueue) || !strings.Contains(err.Error(), "NOT_FOUND") ||
		!strings.Contains(err.Error(), "declare the exchange first") {
		t.Errorf("Run bound to a missing exchange: %v, want ErrQueue with the broker's 404 and what to do", err)
	}
}

// TestRunnerAppliesInOrder: 12 aggregates × 25 messages, published before
// and while the runner runs, applied exactly once in order per aggregate,
// every delivery acked and the queue empty after Run returned.
func TestRunnerAppliesInOrder(t *testing.T) {
	t.Parallel()
	for _, tg := range []testdb.Target{pgx, maria} {
		for _, batch := range batchSizes {
			t.Run(fmt.Sprintf("%s/batch=%d", tg.Name, batch), func(t *testing.T) {
				t.Parallel()
				s := newSpace(t)
				s.declare(t)
				c := ledgertest.NewDB(t, tg)
				ctx := testCtx(t, 90*time.Second)
				want := s.publish(t, 12, 1, 10)
				r := newRunner(t, s, c, func(cfg *inboxrabbitmq.Config) { cfg.BatchSize = batch; cfg.Workers = 4 })
				stop := run(t, r)
				for k, v := range s.publish(t, 12, 11, 25) {
					want[k] = v
				}
				total := 12 * 25
				testdb.Eventually(t, ctx, "all applied", func() bool { return ledgertest.Count(t, c.DB, c.Ledger) >= total })
				testdb.Eventually(t, ctx, "all acked", func() bool { return r.Stats().Acks >= int64(total) })
				stop()
				if probs := ledgertest.Check(ledgertest.Read(t, c.DB, c.Ledger), want); len(probs) > 0 {
					t.Fatalf("ledger: %v", probs)
				}
				st := r.Stats()
				if st.Applied != int64(total) || st.Acks != int64(total) {
					t.Errorf("stats %+v, want %d applied and acked", st, total)
				}
				if batch > 0 && st.Batches == 0 {
					t.Errorf("BatchSize %d: no batch transaction", batch)
				}
				q, err := s.ch.QueueDeclarePassive(s.queue, true, false, false, false, amqp.Table{inboxrabbitmq.ArgSingleActiveConsumer: true})
				if err != nil {
					t.Fatal(err)
				}
				if q.Messages != 0 {
					t.Errorf("%d messages left in the queue (ready), want 0", q.Messages)
				}
			})
		}
	}
}

// failing fails every attempt of the messages of agg with seq 2.
func failing(c *ledgertest.DB, agg string, calls *atomic.Int64) inboxrabbitmq.Handler {
	h := ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger)
	return func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
		if m.AggregateID == agg && strings.Contains(string(m.Payload), `"seq":2}`) {
			calls.Add(1)
			return errors.New("boom")
		}
		return h(ctx, tx, m)
	}
}

// TestRunnerRetriesThenParks: a message failing every attempt is tried
// MaxAttempts times and parked; with ParkAndHold its aggregate's later
// messages are held (not applied) while the others go on; with
// SkipAfterPark they are applied. Every delivery is acked either way.
func TestRunnerRetriesThenParks(t *testing.T) {
	t.Parallel()
	for _, policy := range []inboxrabbitmq.FailurePolicy{inboxrabbitmq.ParkAndHold, inboxrabbitmq.SkipAfterPark} {
		for _, batch := range batchSizes {
			t.Run(fmt.Sprintf("policy=%d/batch=%d", policy, batch), func(t *testing.T) {
				t.Parallel()
				s := newSpace(t)
				s.declare(t)
				c := ledgertest.NewDB(t, pgx)
				ctx := testCtx(t, 90*time.Second)
				s.publish(t, 3, 1, 5)
				var calls atomic.Int64
				var failed atomic.Int64
				r := newRunner(t, s, c, func(cfg *inboxrabbitmq.Config) {
					cfg.BatchSize, cfg.MaxAttempts, cfg.OnFailure = batch, 3, policy
					cfg.Handler = failing(c, "agg-001", &calls)
					cfg.Observer = &recorder{failed: &failed}
				})
				stop := run(t, r)
				testdb.Eventually(t, ctx, "all acked", func() bool { return r.Stats().Acks >= 15 })
				stop()
				st := r.Stats()
				if st.Parked != 1 || calls.Load() != 3 || failed.Load() != 3 {
					t.Errorf("parked %d after %d calls (%d failed attempts observed), want 1 after 3", st.Parked, calls.Load(), failed.Load())
				}
				rows := ledgertest.Read(t, c.DB, c.Ledger)
				per := map[string]int{}
				for _, row := range rows {
					per[row.Agg]++
				}
				wantFailing := 1 // seq 1; 3..5 held
				if policy == inboxrabbitmq.SkipAfterPark {
					wantFailing = 4 // all but seq 2
				}
				if per["agg-000"] != 5 || per["agg-002"] != 5 || per["agg-001"] != wantFailing {
					t.Errorf("applied per aggregate %v, want 5, %d, 5", per, wantFailing)
				}
				if policy == inboxrabbitmq.ParkAndHold && st.Held != 3 {
					t.Errorf("held %d, want 3", st.Held)
				}
			})
		}
	}
}

type recorder struct {
	failed *atomic.Int64
	mu     sync.Mutex
	res    []inboxrabbitmq.Result
}

func (r *recorder) Processed(res inboxrabbitmq.Result) {
	r.mu.Lock()
	r.res = append(r.res, res)
	r.mu.Unlock()
}

func (r *recorder) AttemptFailed(string, string, int, error) {
	if r.failed != nil {
		r.failed.Add(1)
	}
}

func (r *recorder) results() []inboxrabbitmq.Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]inboxrabbitmq.Result(nil), r.res...)
}

// TestDiedAfterStoreBeforeAck: a consumer that stored a message's outcome
// through the inbox and died before its ack (its connection closed: the
// broker requeues the delivery) leaves it to the runner, which gets it
// redelivered and recognises it as a duplicate: one ledger row.
func TestDiedAfterStoreBeforeAck(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	s.declare(t)
	c := ledgertest.NewDB(t, pgx)
	ctx := testCtx(t, 60*time.Second)
	s.publish(t, 1, 1, 1)

	conn, err := amqp.Dial(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(s.queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var d amqp.Delivery
	select {
	case d = <-ds:
	case <-ctx.Done():
		t.Fatal("no delivery")
	}
	h := ledgertest.LedgerHandler(driver.Postgres, c.Ledger)
	if o, err := c.Inbox.Handle(ctx, c.DB, inboxrabbitmq.Message(d), func(ctx context.Context, tx *sql.Tx) error {
		return h(ctx, tx, inboxrabbitmq.Message(d))
	}); err != nil || o != inbox.Applied {
		t.Fatalf("Handle: %v %v", o, err)
	}
	_ = conn.Close() // died before the ack

	rec := &recorder{}
	r := newRunner(t, s, c, func(cfg *inboxrabbitmq.Config) { cfg.Observer = rec })
	run(t, r)
	testdb.Eventually(t, ctx, "redelivery acked", func() bool { return r.Stats().Acks == 1 })
	res := rec.results()
	if len(res) != 1 || res[0].Outcome != inbox.Duplicate || !res[0].Redelivered || res[0].MessageID != inboxrabbitmq.Message(d).ID {
		t.Errorf("results %+v, want the redelivered message as a duplicate", res)
	}
	if n := ledgertest.Count(t, c.DB, c.Ledger); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}
}

// TestSingleActiveConsumerFailover: of two runners on one queue only the
// first consumes; when it stops, the second takes over, and the ledger
// stays exactly once and in order.
func TestSingleActiveConsumerFailover(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	s.declare(t)
	c := ledgertest.NewDB(t, pgx)
	ctx := testCtx(t, 90*time.Second)
	want := s.publish(t, 6, 1, 10)
	a := newRunner(t, s, c, nil)
	stopA := run(t, a)
	testdb.Eventually(t, ctx, "first runner consuming", func() bool { return a.Stats().Acks > 0 })
	b := newRunner(t, s, c, nil)
	run(t, b)
	testdb.Eventually(t, ctx, "second runner connected", func() bool { return b.Stats().Connections > 0 })
	for k, v := range s.publish(t, 6, 11, 20) {
		want[k] = v
	}
	testdb.Eventually(t, ctx, "first half applied", func() bool { return ledgertest.Count(t, c.DB, c.Ledger) >= 60 })
	if st := b.Stats(); st.Acks != 0 {
		t.Errorf("the standby runner acked %d deliveries while the first was active", st.Acks)
	}
	stopA()
	for k, v := range s.publish(t, 6, 21, 30) {
		want[k] = v
	}
	testdb.Eventually(t, ctx, "all applied", func() bool { return ledgertest.Count(t, c.DB, c.Ledger) >= 180 })
	if b.Stats().Acks == 0 {
		t.Error("the second runner took nothing over")
	}
	if probs := ledgertest.Check(ledgertest.Read(t, c.DB, c.Ledger), want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
}

type traceKey struct{}

// TestContextForGetsTheDelivery: each handler's context carries what
// ContextFor derived from its own delivery, one at a time and in batches.
func TestContextForGetsTheDelivery(t *testing.T) {
	t.Parallel()
	for _, batch := range batchSizes {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			t.Parallel()
			s := newSpace(t)
			s.declare(t)
			c := ledgertest.NewDB(t, pgx)
			ctx := testCtx(t, 60*time.Second)
			s.publish(t, 3, 1, 3)
			var mu sync.Mutex
			bad := 0
			seen := 0
			r := newRunner(t, s, c, func(cfg *inboxrabbitmq.Config) {
				cfg.BatchSize = batch
				cfg.ContextFor = func(ctx context.Context, d *amqp.Delivery) context.Context {
					return context.WithValue(ctx, traceKey{}, d.Headers[emit.HeaderMessageID])
				}
				cfg.Handler = func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
					mu.Lock()
					defer mu.Unlock()
					seen++
					if ctx.Value(traceKey{}) != m.ID {
						bad++
					}
					return nil
				}
			})
			run(t, r)
			testdb.Eventually(t, ctx, "all acked", func() bool { return r.Stats().Acks >= 9 })
			mu.Lock()
			defer mu.Unlock()
			if bad != 0 || seen < 9 {
				t.Errorf("%d of %d handlers had another delivery's context", bad, seen)
			}
		})
	}
}

// TestGracefulHandoverKeepsOrder: the active runner stops (its context
// cancelled) while a handler runs and later deliveries of the aggregate
// wait in its workers; a standby runner is registered, and more messages
// arrive meanwhile. The standby must get nothing before the stopping
// runner's channel closes and requeues what it had not handled: then it
// applies the rest in order. (With the consumer cancelled at once, the
// standby became active and applied the new messages before the
// requeued ones.)
func TestGracefulHandoverKeepsOrder(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	s.declare(t)
	c := ledgertest.NewDB(t, pgx)
	ctx := testCtx(t, 90*time.Second)
	want := s.publish(t, 1, 1, 20)
	entered, release := make(chan struct{}), make(chan struct{})
	ledger := ledgertest.LedgerHandler(pgx.Dialect, c.Ledger)
	a := newRunner(t, s, c, func(cfg *inboxrabbitmq.Config) {
		cfg.Handler = func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
			if strings.Contains(string(m.Payload), `"seq":1}`) {
				close(entered)
				<-release
			}
			return ledger(ctx, tx, m)
		}
	})
	stopA := run(t, a)
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("the first handler did not start")
	}
	b := newRunner(t, s, c, nil)
	run(t, b)
	consumers := func() (ready, consumers int) {
		q, err := s.ch.QueueDeclarePassive(s.queue, true, false, false, false, amqp.Table{inboxrabbitmq.ArgSingleActiveConsumer: true})
		if err != nil {
			t.Fatal(err)
		}
		return q.Messages, q.Consumers
	}
	testdb.Eventually(t, ctx, "the standby registered", func() bool { _, n := consumers(); return n == 2 })
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		stopA()
	}()
	for k, v := range s.publish(t, 1, 21, 40) {
		want[k] = v
	}
	testdb.Eventually(t, ctx, "the new messages delivered", func() bool { r, _ := consumers(); return r == 0 })
	close(release)
	<-stopped
	testdb.Eventually(t, ctx, "all applied", func() bool { return ledgertest.Count(t, c.DB, c.Ledger) >= 40 })
	if probs := ledgertest.Check(ledgertest.Read(t, c.DB, c.Ledger), want); len(probs) > 0 {
		t.Fatalf("ledger after a graceful handover: %v", probs)
	}
}
