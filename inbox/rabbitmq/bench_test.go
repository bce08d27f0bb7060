package inboxrabbitmq_test

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	inboxrabbitmq "github.com/sqloutbox/outbox/inbox/rabbitmq"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// BenchmarkRunner measures consumed events per second through the runner
// on PostgreSQL and MariaDB (interpolateParams=true): b.N messages over 64
// aggregates, already in the queue, applied through the inbox by one
// runner with 8 workers, each in its own transaction (dedupe row + one
// ledger insert), or with batch=64 up to 64 messages of a worker per
// transaction, timed from Run (the connection included) to the last ack.
//
//	go test -run '^$' -bench 'Runner' -benchtime 20000x -count 3 ./inbox/rabbitmq/
func BenchmarkRunner(b *testing.B) { ledgertest.ForBench(b, benchRunner) }

func benchRunner(b *testing.B, c *ledgertest.DB, batch int) {
	s := newSpace(b)
	s.declare(b)
	total := 64 * ((b.N + 63) / 64)
	ctx := testCtx(b, 10*time.Minute)
	// Publish in bulk: every message, then every confirm.
	var confirms []*amqp.DeferredConfirmation
	for seq := 1; seq <= total/64; seq++ {
		for a := 0; a < 64; a++ {
			agg := fmt.Sprintf("agg-%03d", a)
			dc, err := s.ch.PublishWithDeferredConfirmWithContext(ctx, s.exchange, "account."+agg, false, false, amqp.Publishing{
				Headers: amqp.Table{emit.HeaderMessageID: randomName("m-"), emit.HeaderAggregateType: "account",
					emit.HeaderAggregateID: agg}, DeliveryMode: amqp.Persistent, Body: []byte(fmt.Sprintf(`{"seq":%d}`, seq))})
			if err != nil {
				b.Fatal(err)
			}
			confirms = append(confirms, dc)
		}
	}
	for _, dc := range confirms {
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			b.Fatalf("confirm: %v %v", ok, err)
		}
	}
	r := newRunner(b, s, c, func(cfg *inboxrabbitmq.Config) { cfg.BatchSize = batch; cfg.Backoff = nil })
	b.ResetTimer()
	start := time.Now()
	run(b, r)
	testdb.Eventually(b, ctx, "every message acked", func() bool { return r.Stats().Acks >= int64(total) })
	el := time.Since(start)
	b.StopTimer()
	ledgertest.ReportRate(b, total, el)
	if st := r.Stats(); st.Applied != int64(total) {
		b.Fatalf("applied %d of %d", st.Applied, total)
	}
}
