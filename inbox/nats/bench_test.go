package inboxnats_test

import (
	"testing"
	"time"

	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	inboxnats "github.com/sqloutbox/outbox/inbox/nats"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// BenchmarkRunner measures consumed events per second through the runner
// on PostgreSQL and MariaDB (interpolateParams=true): b.N messages over 64
// aggregates, already in the stream, applied through the inbox by one
// runner with 8 workers, each in its own transaction (dedupe row + one
// ledger insert), or with batch=64 up to 64 messages of a worker per
// transaction, timed from Run (the lease and the consumer's creation
// included) to the last ack.
//
//	go test -run '^$' -bench 'Runner' -benchtime 20000x -count 3 ./inbox/nats/
func BenchmarkRunner(b *testing.B) { ledgertest.ForBench(b, benchRunner) }

func benchRunner(b *testing.B, c *ledgertest.DB, batch int) {
	s := newSpace(b)
	total := 64 * ((b.N + 63) / 64)
	s.publish(b, 64, 1, total/64)
	ctx := testCtx(b, 10*time.Minute)
	r := newRunner(b, s, c, func(cfg *inboxnats.Config) { cfg.BatchSize = batch; cfg.Backoff = nil })
	b.ResetTimer()
	start := time.Now()
	runRunner(b, r)
	testdb.Eventually(b, ctx, "every message acked", func() bool { return r.Stats().Acks >= int64(total) })
	el := time.Since(start)
	b.StopTimer()
	ledgertest.ReportRate(b, total, el)
	if st := r.Stats(); st.Applied != int64(total) {
		b.Fatalf("applied %d of %d", st.Applied, total)
	}
}
