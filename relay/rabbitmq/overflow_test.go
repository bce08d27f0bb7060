package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/e2e"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/rabbitmq"
	"github.com/sqloutbox/outbox/relay/rabbitmq/rabbitmqtest"
)

// classLog is a relay.Observer that counts failures by class and
// dead letters.
type classLog struct {
	relay.NopObserver
	mu      sync.Mutex
	classes map[relay.ErrorClass]int
	first   map[relay.ErrorClass]error
	dead    int
}

func (o *classLog) Failed(_ relay.Message, class relay.ErrorClass, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.classes == nil {
		o.classes, o.first = map[relay.ErrorClass]int{}, map[relay.ErrorClass]error{}
	}
	o.classes[class]++
	if o.first[class] == nil {
		o.first[class] = err
	}
}

func (o *classLog) DeadLettered(relay.Message, error) {
	o.mu.Lock()
	o.dead++
	o.mu.Unlock()
}

// classCounts is what a classLog saw.
type classCounts struct {
	other       int   // failures that count an attempt (transient, permanent)
	otherErr    error // the error of one of those
	unavailable int   // failures of ClassUnavailable
	dead        int   // dead letters
}

func (o *classLog) counts() classCounts {
	o.mu.Lock()
	defer o.mu.Unlock()
	var c classCounts
	for class, n := range o.classes {
		switch class {
		case relay.ClassUnavailable:
			c.unavailable += n
		case relay.ClassBatch:
			// A batch failed whole (a confirm late on a loaded machine):
			// no attempt counted either.
		default:
			c.other += n
			c.otherErr = o.first[class]
		}
	}
	c.dead = o.dead
	return c
}

// TestFullQueueIsUnavailable: a queue bounded with x-max-length and
// x-overflow reject-publish, and no consumer: the broker nacks what does
// not fit. A full queue is the broker refusing for now, not the
// messages' fault: the relay counts no attempt, dead-letters nothing and
// backs off as a whole (OnUnavailable, failures of class unavailable
// only) while the queue holds exactly its limit; once a consumer drains
// the queue every event is delivered, each aggregate's in outbox id
// order, none lost, each sent with one counted attempt (the successful
// one). On every database target. REGRESSION: a nack was an ordinary
// per-message failure: each counted an attempt and the events were
// dead-lettered after MaxAttempts, their aggregates held.
func TestFullQueueIsUnavailable(t *testing.T) {
	t.Parallel()
	for _, tg := range testdb.All {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			testFullQueue(t, tg)
		})
	}
}

func testFullQueue(t *testing.T, tg testdb.Target) {
	const (
		limit      = 5 // x-max-length
		aggregates = 4
		perAgg     = 6 // 24 events, 19 over the limit
	)
	ctx := testCtx(t, 180*time.Second)
	conn, ch := admin(t)
	ex, err := rabbitmqtest.DeclareExchange(ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.ExchangeDelete(ex, false, false) })
	q := rabbitmqtest.UniqueName("outboxtest.q.full.")
	if _, err := ch.QueueDeclare(q, false, false, false, false,
		amqp.Table{"x-max-length": int32(limit), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = ch.QueueDelete(q, false, false, false) })
	if err := ch.QueueBind(q, "order.*", ex, false, nil); err != nil {
		t.Fatal(err)
	}

	e := testdb.New(t, tg, driver.Config{})
	obs := &classLog{}
	var mu sync.Mutex
	var unavailable []error
	r, err := relay.New(e.Outbox, e.RelayDB, relay.Config{
		Publisher: newPublisher(t, rabbitmq.Config{URL: brokerURL(), Exchange: ex}),
		// Fast retries and few attempts: a nack counted as an attempt
		// dead-letters within a second.
		PollInterval: 50 * time.Millisecond, RetryInitial: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond,
		MaxAttempts: 3, PublishTimeout: 10 * time.Second, Observer: obs,
		OnUnavailable: func(err error) {
			mu.Lock()
			unavailable = append(unavailable, err)
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	e2e.RunRelay(t, ctx, r)

	// Commit the events, each transaction one round over the aggregates.
	var ids []string
	for n := range perAgg {
		sctx := outbox.NewContext(ctx)
		tx, err := e.DB.BeginTx(sctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		for a := range aggregates {
			id := fmt.Sprintf("full-%d-%d-%s", a, n, unique())
			if err := outbox.Emit(sctx, outbox.Event{ID: id, AggregateType: "order", AggregateID: fmt.Sprintf("o-%d.#*", a),
				Type: "order.updated", Payload: fmt.Appendf(nil, `{"a":%d,"n":%d}`, a, n)}); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}

	// The queue fills up and the broker nacks the rest: wait until the
	// relay has reported the route unavailable a few times (it backs off
	// between), or dead-lettered something.
	testdb.Eventually(t, ctx, "the relay reporting the full queue", func() bool {
		c := obs.counts()
		mu.Lock()
		n := len(unavailable)
		mu.Unlock()
		return n >= 3 && c.unavailable >= 3 || c.dead > 0
	})
	counted := testdb.Column(t, ctx, e.RelayDB, "SELECT message_id FROM "+e.Table+" WHERE status = 2 OR ("+e.IsPending()+" AND attempts > 0)")
	if c := obs.counts(); c.other > 0 || c.dead > 0 || len(counted) > 0 {
		t.Fatalf("with the queue full: %d failures counting an attempt (one: %v), %d unavailable, "+
			"%d dead letters, %d rows dead-lettered or pending with attempts counted; want only unavailable, no attempt",
			c.other, c.otherErr, c.unavailable, c.dead, len(counted))
	}
	mu.Lock()
	first := unavailable[0]
	mu.Unlock()
	if !errors.Is(first, relay.ErrUnavailable) || !errors.Is(first, rabbitmq.ErrNacked) {
		t.Errorf("OnUnavailable got %v, want ErrUnavailable wrapping ErrNacked", first)
	}
	if st, err := ch.QueueDeclarePassive(q, false, false, false, false, nil); err != nil || st.Messages != limit {
		t.Errorf("the full queue holds %d messages (%v), want %d", st.Messages, err, limit)
	}

	// A consumer drains the queue; the relay, backing off, retries.
	cons, err := rabbitmqtest.ConsumeQueue(conn, q)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cons.Close() })
	recs, err := cons.WaitForMessageIDs(ctx, ids...)
	if err != nil {
		t.Fatal(err)
	}
	l := rabbitmqtest.Check(outboxRows(t, ctx, e), recs)
	if err := l.Err(); err != nil {
		t.Error(err)
	}
	if l.Committed != len(ids) || l.Delivered != len(ids) {
		t.Errorf("ledger %+v, want %d committed and delivered", l, len(ids))
	}
	t.Logf("%d events through a queue of %d: %d duplicates, %d unavailable reports", len(ids), limit, l.Duplicates, len(unavailable))
	testdb.Eventually(t, ctx, "every row marked sent", func() bool {
		return len(testdb.Column(t, ctx, e.RelayDB, "SELECT message_id FROM "+e.Table+" WHERE NOT ("+e.IsSent()+")")) == 0
	})
	if extra := testdb.Column(t, ctx, e.RelayDB, "SELECT message_id FROM "+e.Table+" WHERE attempts <> 0"); len(extra) > 0 {
		t.Errorf("%d rows sent with a failed attempt counted: %v", len(extra), extra)
	}
	if c := obs.counts(); c.other > 0 || c.dead > 0 {
		t.Errorf("%d failures counting an attempt (one: %v), %d dead letters", c.other, c.otherErr, c.dead)
	}
}

// outboxRows reads e's outbox rows back, in outbox id order, for the
// ledger.
func outboxRows(t *testing.T, ctx context.Context, e *testdb.Env) []outboxtest.Row {
	t.Helper()
	rs, err := e.RelayDB.QueryContext(ctx, "SELECT id, message_id, aggregate_type, aggregate_id FROM "+e.Table+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var rows []outboxtest.Row
	for rs.Next() {
		var r outboxtest.Row
		if err := rs.Scan(&r.ID, &r.MessageID, &r.AggregateType, &r.AggregateID); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, r)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return rows
}

// TestFullQueuePublish: the publisher alone against a queue with room for
// 2 (x-overflow reject-publish): of five aggregates' messages two are
// confirmed and three nacked, each nack wrapping relay.ErrUnavailable and
// ErrNacked, never ErrPermanent; a batch refused whole is one error
// wrapping relay.ErrUnavailable. REGRESSION: a nack was an ordinary
// failure (an attempt counted each time).
func TestFullQueuePublish(t *testing.T) {
	t.Parallel()
	_, ch := admin(t)
	ex, err := rabbitmqtest.DeclareExchange(ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.ExchangeDelete(ex, false, false) })
	q := rabbitmqtest.UniqueName("outboxtest.q.full.")
	if _, err := ch.QueueDeclare(q, false, false, false, false, amqp.Table{"x-max-length": int32(2), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = ch.QueueDelete(q, false, false, false) })
	if err := ch.QueueBind(q, "#", ex, false, nil); err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, rabbitmq.Config{URL: brokerURL(), Exchange: ex})
	ctx := testCtx(t, 30*time.Second)

	batch := msgs(5, 5)
	err = p.Publish(ctx, batch)
	var pe relay.PublishErrors
	if !errors.As(err, &pe) || len(pe) != len(batch) {
		t.Fatalf("Publish into a queue with room for 2 of 5 = %v, want PublishErrors of 5", err)
	}
	stored, refused := 0, 0
	for i, e := range pe {
		switch {
		case e == nil:
			stored++
		case errors.Is(e, relay.ErrUnavailable) && errors.Is(e, rabbitmq.ErrNacked) && !errors.Is(e, relay.ErrPermanent):
			refused++
		default:
			t.Errorf("entry %d = %v, want nil or ErrUnavailable wrapping ErrNacked", i, e)
		}
	}
	if stored != 2 || refused != 3 {
		t.Errorf("%d confirmed, %d nacked as unavailable; want 2 and 3", stored, refused)
	}
	err = p.Publish(ctx, msgs(3, 3))
	if err == nil || errors.As(err, &pe) || !errors.Is(err, relay.ErrUnavailable) || errors.Is(err, relay.ErrPermanent) {
		t.Errorf("Publish into the full queue = %v, want one error wrapping ErrUnavailable", err)
	}
}
