package rabbitmq_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/internal/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/rabbitmq"
	"github.com/sqloutbox/outbox/relay/rabbitmq/rabbitmqtest"
)

// TestRelayEndToEnd: events committed on SQLite reach the queue through a
// running relay and this publisher, every one, each aggregate's first
// deliveries in commit order, payloads byte for byte, also across a broker
// outage in the middle (through the test's proxy): the relay backs off as
// a whole, the publisher reconnects, and duplicates (RabbitMQ does not
// dedupe) carry the same message ID.
func TestRelayEndToEnd(t *testing.T) {
	t.Parallel()
	const (
		txs  = 40
		per  = 5
		aggs = 8
	)
	s := newSpace(t, "#")
	proxy := startProxy(t)
	p := newPublisher(t, rabbitmq.Config{URL: viaProxy(t, proxy.Addr()), Exchange: s.Exchange})
	e := testdb.New(t, testdb.Target{Name: "sqlite", Dialect: driver.SQLite}, driver.Config{})
	watched := &failureWatch{Publisher: p, failed: make(chan struct{})}
	r, err := relay.New(e.Outbox, e.RelayDB, relay.Config{Publisher: watched, PublishTimeout: 2 * time.Second,
		RetryInitial: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond, PollInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 120*time.Second)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	})

	var rows []outboxtest.Row // in commit order: outbox ids increase with it
	var ids []string
	payload := map[string][]byte{}
	commit := func(tx int) {
		sctx := outbox.NewContext(ctx)
		dbtx, err := e.DB.BeginTx(sctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		for j := range per {
			agg := fmt.Sprintf("agg %d.#*", (tx*per+j)%aggs)
			id := fmt.Sprintf("e2e-%03d-%d", tx, j)
			pl := fmt.Appendf(nil, "{\"tx\": %d,\n\"j\":%d}", tx, j)
			if err := outbox.Emit(sctx, outbox.Event{ID: id, AggregateType: "order", AggregateID: agg, Type: "order.updated", Payload: pl}); err != nil {
				t.Fatal(err)
			}
			rows = append(rows, outboxtest.Row{ID: int64(len(rows) + 1), MessageID: id, AggregateType: "order", AggregateID: agg})
			ids = append(ids, id)
			payload[id] = pl
		}
		if err := dbtx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	for tx := range txs / 2 {
		commit(tx)
	}
	if _, err := s.wait(ctx, txs/2*per); err != nil {
		t.Fatal(err)
	}
	proxy.Refuse(true)
	for tx := txs / 2; tx < txs; tx++ {
		commit(tx)
	}
	select {
	case <-watched.failed:
	case <-ctx.Done():
		t.Fatal("the relay never failed a batch during the outage")
	}
	proxy.Refuse(false)
	// Wait until every event arrived at least once.
	ds, err := s.cons.WaitForMessageIDs(ctx, ids...)
	if err != nil {
		t.Fatal(err)
	}
	// Nothing lost, nothing else, each aggregate's first deliveries in
	// commit order; duplicates allowed.
	if err := rabbitmqtest.Check(rows, ds).Err(); err != nil {
		t.Error(err)
	}
	for _, d := range ds {
		id, _ := d.MessageID()
		if d.Delivery.MessageId != id {
			t.Errorf("%s: message-id property %q", id, d.Delivery.MessageId)
		}
		if !bytes.Equal(d.Payload, payload[id]) {
			t.Errorf("%s: payload %q, want %q", id, d.Payload, payload[id])
		}
		agg := d.Headers[emit.HeaderAggregateID]
		if d.RoutingKey != rabbitmq.DefaultRoutingKey(relay.Message{AggregateType: "order", AggregateID: agg}) {
			t.Errorf("%s: routing key %q", id, d.RoutingKey)
		}
	}
}

// failureWatch closes failed after the first Publish that returned an
// error.
type failureWatch struct {
	*rabbitmq.Publisher
	once   sync.Once
	failed chan struct{}
}

func (w *failureWatch) Publish(ctx context.Context, msgs []relay.Message) error {
	err := w.Publisher.Publish(ctx, msgs)
	if err != nil {
		w.once.Do(func() { close(w.failed) })
	}
	return err
}
