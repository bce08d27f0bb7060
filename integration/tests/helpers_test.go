// Package tests holds the conformance suite: every behaviour runs against
// every target (PostgreSQL through lib/pq and pgx, MariaDB/MySQL, SQLite)
// with real servers, and, where a broker is involved, a real
// Kafka-protocol broker (kfake) spoken to by sarama.
package tests

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/integration/internal/ledger"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

// forEachTarget runs fn as a parallel subtest per target.
func forEachTarget(t *testing.T, fn func(t *testing.T, tg testdb.Target)) {
	t.Helper()
	for _, tg := range testdb.All {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, tg)
		})
	}
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// runningRelay is a relay started for a test.
type runningRelay struct {
	*relay.Relay
	done chan error
}

// startRelay starts a relay on e's table; it is stopped at cleanup.
func startRelay(t *testing.T, e *testdb.Env, pub relay.Publisher, mod func(*relay.Config)) *runningRelay {
	t.Helper()
	cfg := relay.Config{
		Publisher: pub, PollInterval: 50 * time.Millisecond, Logger: quietLogger(),
	}
	if mod != nil {
		mod(&cfg)
	}
	return startRelayOn(t, e, e.RelayDB, cfg)
}

// startRelayOn starts a relay with cfg on e's table through db; it is
// stopped at cleanup. Its Observer is wrapped in a outboxtest.OrderWatch, so
// the test fails if the relay reports an order violation (a message
// acknowledged after an earlier one of its aggregate failed in the same
// batch), unless it is one already (a test that provokes a violation
// brings its own, on a testing.TB of its own).
func startRelayOn(t *testing.T, e *testdb.Env, db *sql.DB, cfg relay.Config) *runningRelay {
	t.Helper()
	if _, ok := cfg.Observer.(*outboxtest.OrderWatch); !ok {
		cfg.Observer = outboxtest.WatchOrder(t, cfg.Observer) // checked at cleanup, after the stop below
	}
	r, err := relay.New(e.Outbox, db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rr := &runningRelay{Relay: r, done: make(chan error, 1)}
	go func() { rr.done <- r.Run(context.Background()) }()
	t.Cleanup(func() { rr.stop(t) })
	return rr
}

func (rr *runningRelay) stop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rr.Stop(ctx); err != nil {
		t.Errorf("relay stop: %v", err)
	}
	select {
	case err := <-rr.done:
		if err != nil {
			t.Errorf("relay run: %v", err)
		}
		rr.done <- nil // keep a second stop from blocking
	case <-ctx.Done():
		t.Errorf("relay did not return")
	}
}

// createOrders makes a business table "orders" in e's private schema.
func createOrders(t *testing.T, e *testdb.Env) {
	t.Helper()
	q := "CREATE TABLE " + e.Q("orders") + " (id VARCHAR(64) PRIMARY KEY, seq INTEGER NOT NULL)"
	if _, err := e.RelayDB.Exec(q); err != nil {
		t.Fatal(err)
	}
}

// inTx runs fn in a transaction begun with a fresh emit scope and commits
// (ledger.InTx).
func inTx(ctx context.Context, db *sql.DB, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return ledger.InTx(ctx, db, fn)
}

func ev(agg string, n int) outbox.Event {
	return outbox.Event{AggregateType: "order", AggregateID: agg, Type: "order.step", Payload: []byte(fmt.Sprintf(`{"n":%d}`, n))}
}

// rowCount counts outbox rows, optionally with a status.
func rowCount(t *testing.T, e *testdb.Env, where string) int {
	t.Helper()
	var n int
	q := "SELECT COUNT(*) FROM " + e.Table
	if where != "" {
		q += " WHERE " + where
	}
	if err := e.RelayDB.QueryRow(q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

var _ = driver.Postgres

// eventually polls cond until it holds or ctx ends (a condition with a
// deadline, not a sleep standing in for synchronisation).
func eventually(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	testdb.Eventually(t, ctx, what, cond)
}
