// Package e2e is the end-to-end scenario the broker publishers' tests
// share (relay/nats, relay/rabbitmq, relay/redis): events committed on
// SQLite reach a broker through a running relay and the publisher under
// test, across a broker outage in the middle.
//
// [Run] owns the mechanism: the database, the relay, the transactions,
// the outage and the waits. It asserts what holds for every broker (no
// committed event lost, no ghost, each aggregate's first deliveries in
// commit order, payloads byte for byte) and returns what a test needs for
// its broker's own assertions: how a duplicate is allowed (or not), the
// subject, routing key, stream or message property each record carries.
//
// [RunFaults] is the broker fault matrix of issue 21 the same tests share
// (faults.go): on every database target, a relay publishes while writers
// serialized per aggregate commit, a broker fault hits in the middle
// ([ResetMidPublish], [Unreachable], [Stall], [Revoked]), and the
// [FaultReport] judges first deliveries: nothing lost, no ghost, each
// aggregate in commit order, no order violation reported by the relay,
// nothing dead-lettered, duplicates bounded by what failed publishes
// left unresolved.
package e2e

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
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

// AggregateType is the aggregate type of every event [Run] commits; its
// events have type AggregateType+".updated".
const AggregateType = "order"

// Defaults of the [Config] sizes.
const (
	DefaultTxs        = 40
	DefaultPerTx      = 5
	DefaultAggregates = 8
)

// Config is one [Run]: the publisher under test, how to cut it off from
// its broker, and how to read back what the broker received. R is the
// broker kit's record type (natstest.Record and the others). Publisher,
// Outage, Restore, WaitForCount, WaitForAll, Check and Payload are
// required.
type Config[R any] struct {
	// Publisher is the publisher under test, connected to its broker
	// through a connection that Outage cuts.
	Publisher relay.Publisher
	// Outage cuts Publisher off from its broker (e.g. proxy.Refuse(true),
	// with proxy.CutAll() for a client that would otherwise keep its
	// connection); Restore ends the outage (proxy.Refuse(false)).
	Outage, Restore func()
	// WaitForCount returns the records once the broker holds at least n,
	// or ctx's error (a kit Consumer's WaitForCount).
	WaitForCount func(ctx context.Context, n int) ([]R, error)
	// WaitForAll returns the records once every one of ids arrived, or
	// ctx's error (a kit Consumer's WaitForMessageIDs). A broker that
	// stores each message ID once may wait for len(ids) records instead,
	// so that a duplicate shows as a lost event.
	WaitForAll func(ctx context.Context, ids ...string) ([]R, error)
	// Check is the kit's Check: the committed rows joined with the
	// records, in the order a consumer of one aggregate sees them.
	Check func(rows []outboxtest.Row, recs []R) outboxtest.Ledger
	// Payload returns a record's outbox message ID and payload.
	Payload func(R) (messageID string, payload []byte)

	// AggregateID names aggregate n, 0 <= n < Aggregates: characters the
	// broker's names treat specially belong in it. Nil: "agg n/ü".
	AggregateID func(n int) string
	// Headers are every event's headers (nil: none).
	Headers map[string]string
	// Txs transactions (an even number) of PerTx events each are
	// committed, spread round robin over Aggregates aggregates; zero:
	// DefaultTxs, DefaultPerTx, DefaultAggregates.
	Txs, PerTx, Aggregates int
}

// Result is what [Run] committed and what the broker received.
type Result[R any] struct {
	// Rows are the committed events in commit order (their outbox ids,
	// 1 upwards); IDs their message IDs in the same order.
	Rows []outboxtest.Row
	IDs  []string
	// Payloads maps each message ID to the payload committed with it.
	Payloads map[string][]byte
	// Records are the records WaitForAll returned.
	Records []R
	// Ledger is Check(Rows, Records). Run has reported Ledger.Err;
	// duplicates are the caller's to judge (Ledger.Duplicates).
	Ledger outboxtest.Ledger
}

// Run commits cfg.Txs transactions of cfg.PerTx events each on SQLite
// while a relay publishes with cfg.Publisher: the first half, then waits
// until the broker holds them (WaitForCount); calls cfg.Outage and
// commits the second half; waits until the relay reported a failed
// Publish; calls cfg.Restore and waits for every message ID
// (WaitForAll). Every wait ends with ctx, which bounds the whole run: a
// wait that ends so, or a relay that never failed during the outage,
// fails the test (Fatal).
//
// It then reports as test errors the Check ledger's error (a lost event,
// a ghost, an aggregate out of commit order) and every record whose
// payload differs from the one committed with its message ID. The caller
// asserts the rest from the [Result]: duplicates (Ledger.Duplicates) and
// what its broker puts on each record. The relay stops when the test
// ends; a Run error other than cancellation fails the test.
func Run[R any](ctx context.Context, t *testing.T, cfg Config[R]) Result[R] {
	t.Helper()
	if cfg.Publisher == nil || cfg.Outage == nil || cfg.Restore == nil || cfg.WaitForCount == nil ||
		cfg.WaitForAll == nil || cfg.Check == nil || cfg.Payload == nil {
		t.Fatal("e2e: Config needs Publisher, Outage, Restore, WaitForCount, WaitForAll, Check and Payload")
	}
	txs, per, aggs := orDefault(cfg.Txs, DefaultTxs), orDefault(cfg.PerTx, DefaultPerTx), orDefault(cfg.Aggregates, DefaultAggregates)
	if txs%2 != 0 {
		t.Fatalf("e2e: Txs %d is odd", txs)
	}
	aggregateID := cfg.AggregateID
	if aggregateID == nil {
		aggregateID = func(n int) string { return fmt.Sprintf("agg %d/ü", n) }
	}

	e := testdb.New(t, testdb.Target{Name: "sqlite", Dialect: driver.SQLite}, driver.Config{})
	watched, failed := watch(cfg.Publisher)
	r, err := relay.New(e.Outbox, e.RelayDB, relay.Config{Publisher: watched, PublishTimeout: 2 * time.Second,
		RetryInitial: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond, PollInterval: 100 * time.Millisecond,
		Observer: outboxtest.WatchOrder(t, nil)}) // checked at cleanup, after the stop below
	if err != nil {
		t.Fatal(err)
	}
	RunRelay(t, ctx, r)

	res := Result[R]{Payloads: map[string][]byte{}}
	commit := func(tx int) {
		sctx := outbox.NewContext(ctx)
		dbtx, err := e.DB.BeginTx(sctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		for j := range per {
			agg := aggregateID((tx*per + j) % aggs)
			id := fmt.Sprintf("e2e-%03d-%d", tx, j)
			pl := fmt.Appendf(nil, "{\"tx\": %d,\n\"j\":%d}", tx, j)
			if err := outbox.Emit(sctx, outbox.Event{ID: id, AggregateType: AggregateType, AggregateID: agg,
				Type: AggregateType + ".updated", Payload: pl, Headers: cfg.Headers}); err != nil {
				t.Fatal(err)
			}
			// In commit order: outbox ids increase with it.
			res.Rows = append(res.Rows, outboxtest.Row{ID: int64(len(res.Rows) + 1), MessageID: id, AggregateType: AggregateType, AggregateID: agg})
			res.IDs = append(res.IDs, id)
			res.Payloads[id] = pl
		}
		if err := dbtx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	for tx := range txs / 2 {
		commit(tx)
	}
	if _, err := cfg.WaitForCount(ctx, txs/2*per); err != nil {
		t.Fatal(err)
	}
	cfg.Outage()
	for tx := txs / 2; tx < txs; tx++ {
		commit(tx)
	}
	// Let the relay fail against the outage at least once, then restore.
	select {
	case <-failed:
	case <-ctx.Done():
		t.Fatal("the relay never failed a batch during the outage")
	}
	cfg.Restore()
	if res.Records, err = cfg.WaitForAll(ctx, res.IDs...); err != nil {
		t.Fatal(err)
	}

	// Nothing lost, nothing else, each aggregate's first deliveries in
	// commit order; duplicates are the caller's.
	res.Ledger = cfg.Check(res.Rows, res.Records)
	if err := res.Ledger.Err(); err != nil {
		t.Error(err)
	}
	for _, rec := range res.Records {
		id, pl := cfg.Payload(rec)
		if !bytes.Equal(pl, res.Payloads[id]) {
			t.Errorf("%s: payload %q, want %q", id, pl, res.Payloads[id])
		}
	}
	return res
}

func orDefault(n, def int) int {
	if n == 0 {
		return def
	}
	return n
}

// watch wraps p in a failureWatch and returns it with its channel.
func watch(p relay.Publisher) (relay.Publisher, <-chan struct{}) {
	w := &failureWatch{Publisher: p, failed: make(chan struct{})}
	return withHealth(w, p), w.failed
}

// withHealth returns w, a wrapper of p, as a relay.HealthChecker with p's
// Healthy if p is one, so that the relay probes the broker as it would p
// itself.
func withHealth(w, p relay.Publisher) relay.Publisher {
	if hc, ok := p.(relay.HealthChecker); ok {
		return struct {
			relay.Publisher
			relay.HealthChecker
		}{w, hc}
	}
	return w
}

// failureWatch closes failed after the first Publish that returned an
// error.
type failureWatch struct {
	relay.Publisher
	once   sync.Once
	failed chan struct{}
}

// Unwrap implements relay.PublisherWrapper.
func (w *failureWatch) Unwrap() relay.Publisher { return w.Publisher }

func (w *failureWatch) Publish(ctx context.Context, msgs []relay.Message) error {
	err := w.Publisher.Publish(ctx, msgs)
	if err != nil {
		w.once.Do(func() { close(w.failed) })
	}
	return err
}

// RunRelay runs r in the background until t ends: its cleanup cancels
// Run's context (derived from ctx) and fails t if Run returned anything
// but that cancellation.
func RunRelay(t testing.TB, ctx context.Context, r *relay.Relay) {
	t.Helper()
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	})
}
