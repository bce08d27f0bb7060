package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/internal/testkit/e2e"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

var errOutage = errors.New("outage")

// memory is the Config of outboxtest's in-memory publisher p, the outage
// being p failing every message.
func memory(p *outboxtest.Publisher) e2e.Config[relay.Message] {
	return e2e.Config[relay.Message]{
		Publisher:    p,
		Outage:       func() { p.FailWith(func(relay.Message) error { return errOutage }) },
		Restore:      func() { p.FailWith(nil) },
		WaitForCount: p.WaitForCount,
		WaitForAll:   p.WaitForIDs,
		Check: func(rows []outboxtest.Row, msgs []relay.Message) outboxtest.Ledger {
			ids := make([]string, len(msgs))
			for i, m := range msgs {
				ids[i] = m.MessageID
			}
			return outboxtest.Check(rows, ids)
		},
		Payload: func(m relay.Message) (string, []byte) { return m.MessageID, m.Payload },
	}
}

// TestRun runs the scenario against outboxtest's in-memory publisher, the
// outage being that publisher failing every message: every event arrives
// (an in-memory publisher has no duplicates), with its headers, and the
// Result holds the rows in commit order.
func TestRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	cfg := memory(outboxtest.NewPublisher())
	var outages int
	outage := cfg.Outage
	cfg.Outage = func() { outages++; outage() }
	cfg.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	res := e2e.Run(ctx, t, cfg)
	if outages != 1 {
		t.Errorf("Outage called %d times", outages)
	}
	n := e2e.DefaultTxs * e2e.DefaultPerTx
	if len(res.Rows) != n || len(res.IDs) != n || len(res.Payloads) != n {
		t.Fatalf("%d rows, %d IDs, %d payloads; want %d", len(res.Rows), len(res.IDs), len(res.Payloads), n)
	}
	aggs := map[string]bool{}
	for i, r := range res.Rows {
		if r.ID != int64(i+1) || r.MessageID != res.IDs[i] || r.AggregateType != e2e.AggregateType {
			t.Errorf("row %d: %+v, ID %s", i, r, res.IDs[i])
		}
		aggs[r.AggregateID] = true
	}
	if len(aggs) != e2e.DefaultAggregates || !aggs["agg 0/ü"] {
		t.Errorf("aggregates %v", aggs)
	}
	if l := res.Ledger; l.Committed != n || l.Delivered != n || l.Duplicates != 0 {
		t.Errorf("ledger %+v", l)
	}
	for _, m := range res.Records {
		if m.Headers["traceparent"] != cfg.Headers["traceparent"] {
			t.Errorf("%s: headers %v", m.MessageID, m.Headers)
		}
	}
}

// TestRunSizes: the sizes and the aggregate names are the Config's.
func TestRunSizes(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	cfg := memory(outboxtest.NewPublisher())
	cfg.AggregateID = func(n int) string { return fmt.Sprintf("a.%d.#*", n) }
	cfg.Txs, cfg.PerTx, cfg.Aggregates = 4, 3, 2
	res := e2e.Run(ctx, t, cfg)
	got := map[string]int{}
	for _, r := range res.Rows {
		got[r.AggregateID]++
	}
	if len(res.Rows) != 12 || got["a.0.#*"] != 6 || got["a.1.#*"] != 6 {
		t.Errorf("rows per aggregate %v (%d rows)", got, len(res.Rows))
	}
}
