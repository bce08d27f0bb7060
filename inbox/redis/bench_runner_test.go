package inboxredis_test

import (
	"testing"
	"time"

	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	inboxredis "github.com/sqloutbox/outbox/inbox/redis"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// BenchmarkRunner measures consumed events per second through the runner
// on PostgreSQL and MariaDB (interpolateParams=true): b.N entries over 64
// aggregates, already in the stream, applied through the inbox by one
// runner with 8 workers, each in its own transaction (dedupe row + one
// ledger insert), or with batch=64 up to 64 entries of a worker per
// transaction, timed from Run (the lease and the group's creation
// included) to the last XACK.
//
//	go test -run '^$' -bench 'Runner' -benchtime 20000x -count 3 ./inbox/redis/
func BenchmarkRunner(b *testing.B) { ledgertest.ForBench(b, benchRunner) }

func benchRunner(b *testing.B, c *ledgertest.DB, batch int) {
	f := newFixture(b, 1)
	f.db = c
	total := 64 * ((b.N + 63) / 64)
	aggs := aggregates("agg-", 64)
	for from := 1; from <= total/64; from += 50 {
		f.publish(b, f.streams[0], aggs, from, min(from+49, total/64))
	}
	ctx := testCtx(b, 10*time.Minute)
	r := f.runner(b, func(cfg *inboxredis.Config) {
		cfg.BatchSize, cfg.Backoff = batch, nil
		cfg.Handler = ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger)
	})
	b.ResetTimer()
	start := time.Now()
	run(b, r)
	testdb.Eventually(b, ctx, "every entry acknowledged", func() bool { return r.Stats().Applied >= int64(total) && f.pending(b) == 0 })
	el := time.Since(start)
	b.StopTimer()
	ledgertest.ReportRate(b, total, el)
}
