package natspub_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/internal/faultproxy"
	"github.com/sqloutbox/outbox/internal/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
	natspub "github.com/sqloutbox/outbox/relay/nats"
	"github.com/sqloutbox/outbox/relay/nats/natstest"
)

// TestRelayEndToEnd: events committed on SQLite reach the stream through
// a running relay and this publisher, every one, each aggregate's in
// commit order, payloads byte for byte, also across a broker outage in the
// middle (through the test's proxy): the relay backs off as a whole and
// re-sends, and the stream holds each event once (Nats-Msg-Id dedupes what
// the outage left unacknowledged but stored).
func TestRelayEndToEnd(t *testing.T) {
	t.Parallel()
	const (
		txs  = 40
		per  = 5
		aggs = 8
	)
	s := newSpace(t, 0)
	proxy, err := faultproxy.Start(strings.TrimPrefix(serverURL(), "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	nc := connect(t, "nats://"+proxy.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	p := newPublisher(t, natspub.Config{Conn: nc, Subject: s.Subject})
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
	cons := s.consume(t)

	var rows []outboxtest.Row // in commit order: outbox ids increase with it
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
	for tx := txs / 2; tx < txs; tx++ {
		commit(tx)
	}
	// Let the relay fail against the outage at least once, then restore.
	select {
	case <-watched.failed:
	case <-ctx.Done():
		t.Fatal("the relay never failed a batch during the outage")
	}
	proxy.Refuse(false)
	recs, err := cons.WaitForCount(ctx, txs*per)
	if err != nil {
		t.Fatal(err)
	}
	// Every event stored, none twice, nothing else, each aggregate's in
	// commit order (stream sequence order).
	l := natstest.Check(rows, recs)
	if err := l.Err(); err != nil {
		t.Error(err)
	}
	if l.Duplicates != 0 {
		t.Errorf("%d events stored twice", l.Duplicates)
	}
	for _, m := range recs {
		id, _ := m.MessageID()
		if !bytes.Equal(m.Payload, payload[id]) {
			t.Errorf("%s: payload %q, want %q", id, m.Payload, payload[id])
		}
		agg := m.Headers[emit.HeaderAggregateID]
		if m.Subject != s.Prefix+".outbox.event.order."+natspub.SubjectToken(agg) {
			t.Errorf("%s: subject %q", id, m.Subject)
		}
	}
}

// failureWatch closes failed after the first Publish that returned an
// error.
type failureWatch struct {
	*natspub.Publisher
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
