package relay_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

// Drain benchmark shape: every op drains benchDrainRows pending rows,
// committed benchDrainPerTx per transaction, spread over
// benchDrainAggregates aggregates.
const (
	benchDrainRows       = 10_000
	benchDrainPerTx      = 1_000
	benchDrainAggregates = 256
)

var benchDrainPayload = []byte(`{"order_id":"o-000000","status":"paid","amount_cents":12345,"currency":"EUR","items":3}`)

// drainCounter is a relay.Observer that counts acknowledged messages,
// closes done once want of them were published, and closes up and down
// when Run reports the relay up (schema checked, leases taken) and down
// (stopped, the last mark-sent recorded).
type drainCounter struct {
	want           int64
	n              atomic.Int64
	done, up, down chan struct{}
	doneOnce       sync.Once
}

func newDrainCounter(want int) *drainCounter {
	return &drainCounter{want: int64(want), done: make(chan struct{}), up: make(chan struct{}), down: make(chan struct{})}
}

func (o *drainCounter) Published(relay.Message, time.Duration) {
	if o.n.Add(1) == o.want {
		o.doneOnce.Do(func() { close(o.done) })
	}
}

// Up is called once with true and once with false per Run.
func (o *drainCounter) Up(up bool) {
	if up {
		close(o.up)
	} else {
		close(o.down)
	}
}
func (o *drainCounter) Claimed(int, time.Duration)                    {}
func (o *drainCounter) Failed(relay.Message, relay.ErrorClass, error) {}
func (o *drainCounter) Retried(relay.Message, int, time.Duration)     {}
func (o *drainCounter) DeadLettered(relay.Message, error)             {}
func (o *drainCounter) Leases(int)                                    {}

// BenchmarkRelayDrain measures the relay's claim, publish, mark-sent cycle:
// each op drains benchDrainRows pending rows with a fresh relay over an
// in-memory outboxtest.Publisher and default settings. Timer stopped: the
// table is emptied, the rows are preloaded (written by the driver's own
// commit hook, benchDrainPerTx events per transaction) and the relay is
// started (schema check, lease acquisition). Timed: from Observer.Up(true)
// until every row was acknowledged and, after Stop, the last batch's
// mark-sent was recorded (Observer.Up(false)); the op then checks that no
// row is left pending.
//
// The relay runs on its own pool of the target's driver (lib/pq for pq,
// pgx for pgx), at most two connections; on SQLite it shares the one
// connection with the writers, as the README recommends.
//
//	go test -run XXX -bench RelayDrain -count 6 ./relay/
func BenchmarkRelayDrain(b *testing.B) {
	for _, tg := range testdb.All {
		b.Run(tg.Name, func(b *testing.B) { benchDrain(b, tg) })
	}
}

func benchDrain(b *testing.B, tg testdb.Target) {
	e := testdb.New(b, tg, driver.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rdb := e.RelayDB
	if tg.Name == "pq" {
		db, err := sql.Open("postgres", e.DSN)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { db.Close() })
		db.SetMaxOpenConns(2)
		rdb = db
	}
	empty := "DELETE FROM " + e.Table
	switch tg.Dialect {
	case driver.Postgres:
		empty = "TRUNCATE " + e.Table
	case driver.MySQL:
		empty = "TRUNCATE TABLE " + e.Table
	}
	aggs := make([]string, benchDrainAggregates)
	for i := range aggs {
		aggs[i] = fmt.Sprintf("agg-%d", i)
	}
	preload := func() {
		for k := 0; k < benchDrainRows; k += benchDrainPerTx {
			tctx := outbox.NewContext(ctx)
			tx, err := e.DB.BeginTx(tctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			for j := k; j < min(k+benchDrainPerTx, benchDrainRows); j++ {
				ev := outbox.Event{AggregateType: "order", AggregateID: aggs[j%len(aggs)], Type: "order.paid", Payload: benchDrainPayload}
				if err := outbox.Emit(tctx, ev); err != nil {
					b.Fatal(err)
				}
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
		}
	}

	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		if _, err := rdb.ExecContext(ctx, empty); err != nil {
			b.Fatalf("emptying %s: %v", e.Table, err)
		}
		preload()
		obs := newDrainCounter(benchDrainRows)
		r, err := relay.New(e.Outbox, rdb, relay.Config{Publisher: outboxtest.NewPublisher(),
			Observer: obs, Logger: quiet()})
		if err != nil {
			b.Fatal(err)
		}
		run := make(chan error, 1)
		go func() { run <- r.Run(ctx) }()
		select {
		case <-obs.up:
		case err := <-run:
			b.Fatalf("relay did not start: %v", err)
		}
		b.StartTimer()
		select {
		case <-obs.done:
		case err := <-run:
			b.Fatalf("relay stopped after %d of %d messages: %v", obs.n.Load(), benchDrainRows, err)
		case <-ctx.Done():
			b.Fatalf("drain timed out after %d of %d messages", obs.n.Load(), benchDrainRows)
		}
		stopped := make(chan error, 1)
		go func() { stopped <- r.Stop(ctx) }()
		<-obs.down
		b.StopTimer()
		if err := <-stopped; err != nil {
			b.Fatalf("stop: %v", err)
		}
		if err := <-run; err != nil {
			b.Fatalf("run: %v", err)
		}

		var pending int
		if err := rdb.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+testdb.PendingTable(e.Table)).Scan(&pending); err != nil {
			b.Fatal(err)
		}
		if pending != 0 || obs.n.Load() != benchDrainRows {
			b.Fatalf("after the drain: %d rows pending, %d published, want 0 and %d", pending, obs.n.Load(), benchDrainRows)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(benchDrainRows)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
