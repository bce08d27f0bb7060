package redispub_test

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
	redispub "github.com/sqloutbox/outbox/relay/redis"
	"github.com/sqloutbox/outbox/relay/redis/redistest"
)

// TestRelayEndToEnd: events committed on SQLite reach the stream through
// a running relay and this publisher, every one, each aggregate's in
// commit order, payloads byte for byte, also across a server outage in
// the middle (through the test's proxy): the relay backs off as a whole
// and re-sends. Redis does not deduplicate, so an entry may be stored
// twice; each aggregate's first deliveries are in commit order.
func TestRelayEndToEnd(t *testing.T) {
	t.Parallel()
	const (
		txs  = 40
		per  = 5
		aggs = 8
	)
	s := newSpace(t)
	proxy := startProxy(t)
	p := newPublisher(t, redispub.Config{Client: connect(t, proxy.Addr()), Stream: s.Stream})
	cons := s.consume(t, "order", "invoice")
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
			agg := fmt.Sprintf("agg %d/ü", (tx*per+j)%aggs)
			id := fmt.Sprintf("e2e-%03d-%d", tx, j)
			pl := fmt.Appendf(nil, "{\"tx\": %d,\n\"j\":%d}", tx, j)
			if err := outbox.Emit(sctx, outbox.Event{ID: id, AggregateType: "order", AggregateID: agg, Type: "order.updated",
				Payload: pl, Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}); err != nil {
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
	if _, err := cons.WaitForCount(ctx, txs/2*per); err != nil {
		t.Fatal(err)
	}
	proxy.Refuse(true)
	proxy.CutAll()
	for tx := txs / 2; tx < txs; tx++ {
		commit(tx)
	}
	select {
	case <-watched.failed:
	case <-ctx.Done():
		t.Fatal("the relay never failed a batch during the outage")
	}
	proxy.Refuse(false)
	xs, err := cons.WaitForMessageIDs(ctx, ids...)
	if err != nil {
		t.Fatal(err)
	}
	if keys, err := s.c.Keys(ctx, s.Prefix+"*").Result(); err != nil || len(keys) != 1 || keys[0] != s.Prefix+"outbox.event.order" {
		t.Errorf("keys under the prefix: %q, %v; want the order stream only", keys, err)
	}
	// Nothing lost, nothing else, each aggregate's first deliveries in
	// commit order (entry ID order); duplicates (a re-send after the
	// outage) allowed.
	if err := redistest.Check(rows, xs).Err(); err != nil {
		t.Error(err)
	}
	for _, x := range xs {
		if x.Values[emit.HeaderAggregateType] != "order" || x.Stream != s.Prefix+"outbox.event.order" {
			t.Errorf("entry %v in the wrong stream", x.Values)
		}
		id, _ := x.Values[emit.HeaderMessageID].(string)
		if pl, _ := x.Values[redispub.PayloadField].(string); !bytes.Equal([]byte(pl), payload[id]) {
			t.Errorf("%s: payload %q, want %q", id, pl, payload[id])
		}
	}
}

// failureWatch closes failed after the first Publish that returned an
// error.
type failureWatch struct {
	*redispub.Publisher
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
