package inboxkafka_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	inboxkafka "github.com/sqloutbox/outbox/inbox/kafka"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// BenchmarkRunner measures consumed events per second through the runner
// on PostgreSQL and MariaDB: b.N records (already in the topic, spread over
// aggregates) applied through the inbox by one runner, each in its own
// transaction (dedupe row + one ledger insert), or with batch=64 up to 64
// records of a partition per transaction (Config.BatchSize), timed from
// Run (the group join included, tens of milliseconds) to the last outcome
// stored. mysql-interpolate: MariaDB through go-sql-driver with
// interpolateParams=true.
//
//	go test -run '^$' -bench 'Runner/pgx/partitions=8' -benchtime 20000x -count 3 ./inbox/kafka/
func BenchmarkRunner(b *testing.B) {
	for _, tg := range []testdb.Target{pgx, {Name: "mysql", Dialect: driver.MySQL}, {Name: "mysql-interpolate", Dialect: driver.MySQL}} {
		for _, parts := range []int32{1, 8} {
			for _, batch := range []int{0, inbox.MaxBatch} {
				name := fmt.Sprintf("%s/partitions=%d", tg.Name, parts)
				if batch > 0 {
					name += fmt.Sprintf("/batch=%d", batch)
				}
				b.Run(name, func(b *testing.B) { benchRunner(b, tg, parts, batch, false) })
				b.Run(name+"/replay", func(b *testing.B) { benchRunner(b, tg, parts, batch, true) })
			}
		}
	}
}

// replay: the records were applied before (by another group on the same
// inbox consumer, untimed); every one is a Duplicate, no handler runs.
func benchRunner(b *testing.B, tg testdb.Target, parts int32, batch int, replay bool) {
	br, topic := startBroker(b, parts)
	c := ledgertest.NewDB(b, tg)
	if tg.Name == "mysql-interpolate" {
		c.Interpolate(b)
	}
	produce(b, br.Addrs(), topic, 64, (b.N+63)/64)
	total := int64(64 * ((b.N + 63) / 64))
	ctx := testCtx(b, 10*time.Minute)
	mk := func() *inboxkafka.Runner {
		return newRunner(b, br.Addrs(), randomName("g-"), topic, c, func(cfg *inboxkafka.Config) {
			cfg.CommitInterval = inboxkafka.DefaultCommitInterval
			cfg.BatchSize = batch
		})
	}
	if replay {
		first := mk()
		stop := runRunner(b, first)
		testdb.Eventually(b, ctx, "every record applied", func() bool { return first.Stats().Applied >= total })
		stop()
	}
	r := mk()
	b.ResetTimer()
	start := time.Now()
	runRunner(b, r)
	testdb.Eventually(b, ctx, "every record stored", func() bool { st := r.Stats(); return st.Applied+st.Duplicates >= total })
	el := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(total)/el.Seconds(), "events/s")
}
