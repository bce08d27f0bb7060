package outboxotel_test

import (
	"context"
	"strconv"
	"testing"

	"go.opentelemetry.io/otel/baggage"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	outboxotel "github.com/sqloutbox/outbox/otel"
)

var benchPayload = []byte(`{"order_id":"o-000000","status":"paid","amount_cents":12345,"currency":"EUR","items":3}`)

// BenchmarkCommit is driver's BenchmarkCommit emit1 and emit10 (BeginTx,
// one INSERT into an orders table, 1 or 10 Emit, Commit, on one
// connection) with tracing: every transaction runs inside a sampled span
// (recorded by an SDK TracerProvider without exporter) carrying two
// baggage members, and
//
//   - emit1, emit10: no driver.Config.Capture (tracing off for the outbox:
//     what every user who does not configure it pays);
//
//   - emit1_traced, emit10_traced: Capture: outboxotel.Capture with the W3C
//     trace context and baggage propagators (traceparent and baggage,
//     about 90 bytes per event, injected, validated, written and read).
//
//     go test -run XXX -bench 'Commit/(pq|sqlite)/' -count 6 ./integration/otel/
func BenchmarkCommit(b *testing.B) {
	for _, tg := range testdb.All {
		b.Run(tg.Name, func(b *testing.B) {
			for _, v := range []string{"emit1", "emit1_traced", "emit10", "emit10_traced"} {
				b.Run(v, func(b *testing.B) { benchCommit(b, tg, v) })
			}
		})
	}
}

func benchCommit(b *testing.B, tg testdb.Target, variant string) {
	var cfg driver.Config
	traced := variant == "emit1_traced" || variant == "emit10_traced"
	if traced {
		cfg.Capture = outboxotel.Capture(outboxotel.WithPropagator(w3c))
	}
	events := 1
	if variant == "emit10" || variant == "emit10_traced" {
		events = 10
	}
	e := testdb.New(b, tg, cfg)
	e.DB.SetMaxOpenConns(1)
	orders := e.Q("bench_orders")
	ctx := context.Background()
	if _, err := e.RelayDB.ExecContext(ctx, "CREATE TABLE "+orders+
		" (id VARCHAR(64) PRIMARY KEY, status VARCHAR(16) NOT NULL, amount_cents BIGINT NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	ins := "INSERT INTO " + orders + " (id, status, amount_cents) VALUES (" + e.Placeholder(1) + ", 'paid', " + e.Placeholder(2) + ")"

	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	m1, _ := baggage.NewMemberRaw("tenant", "acme")
	m2, _ := baggage.NewMemberRaw("user", "42")
	bg, err := baggage.New(m1, m2)
	if err != nil {
		b.Fatal(err)
	}
	ctx, span := tp.Tracer("bench").Start(baggage.ContextWithBaggage(ctx, bg), "request")
	defer span.End()

	i := 0
	b.ReportAllocs()
	for b.Loop() {
		i++
		id := "o-" + strconv.Itoa(i)
		tctx := outbox.NewContext(ctx)
		tx, err := e.DB.BeginTx(tctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := tx.ExecContext(tctx, ins, id, int64(i)); err != nil {
			b.Fatal(err)
		}
		for range events {
			if err := outbox.Emit(tctx, outbox.Event{AggregateType: "order", AggregateID: id, Type: "order.paid", Payload: benchPayload}); err != nil {
				b.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	var n int
	if err := e.RelayDB.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+e.Table+" WHERE headers IS NOT NULL").Scan(&n); err != nil {
		b.Fatal(err)
	}
	if traced != (n == i*events) || !traced && n != 0 {
		b.Fatalf("%s: %d of %d rows carry headers", variant, n, i*events)
	}
}
