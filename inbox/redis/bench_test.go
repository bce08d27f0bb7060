package inboxredis_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	inboxredis "github.com/sqloutbox/outbox/inbox/redis"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// BenchmarkPreFilter measures messages/s through inbox.Handle on
// PostgreSQL (pgx, one connection, one message at a time: a partition's
// path) with and without the Redis pre-filter, for streams in which 0 %,
// 10 % and 50 % of the messages are redeliveries of messages already
// processed (and marked). The handler INSERTs one business row.
//
//	go test -run '^$' -bench PreFilter -count 5 ./inbox/redis/
func BenchmarkPreFilter(b *testing.B) {
	c := client(b, redisAddr())
	e := testdb.New(b, testdb.Target{Name: "pgx", Dialect: driver.Postgres}, driver.Config{})
	ctx := context.Background()
	db := e.RelayDB
	db.SetMaxOpenConns(1)
	p := prefix(b, c)
	if err := c.Ping(ctx).Err(); err != nil { // dial before the clock runs
		b.Fatal(err)
	}
	for _, dup := range []int{0, 10, 50} {
		for _, withFilter := range []bool{false, true} {
			name := fmt.Sprintf("dup=%d%%/table", dup)
			cfg := inbox.Config{Dialect: driver.Postgres, Table: e.Q(fmt.Sprintf("inbox_%d_%v", dup, withFilter)), Consumer: "bench"}
			if withFilter {
				name = fmt.Sprintf("dup=%d%%/redis", dup)
				f, err := inboxredis.New(c, inboxredis.WithPrefix(fmt.Sprintf("%s%d:", p, dup)))
				if err != nil {
					b.Fatal(err)
				}
				cfg.Filter = f
			}
			in, err := inbox.New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			if err := in.Migrate(ctx, db); err != nil {
				b.Fatal(err)
			}
			effects := e.Q(fmt.Sprintf("effects_%d_%v", dup, withFilter))
			if _, err := db.ExecContext(ctx, "CREATE TABLE "+effects+" (id VARCHAR(100) PRIMARY KEY)"); err != nil {
				b.Fatal(err)
			}
			insert := fmt.Sprintf("INSERT INTO %s (id) VALUES ($1)", effects)
			seq := 0
			b.Run(name, func(b *testing.B) {
				i := 0
				for b.Loop() {
					i++
					var id string
					// dup of every 100 messages are redeliveries of the
					// latest new message (processed before).
					if seq > 0 && i%100 < dup {
						id = fmt.Sprintf("m-%d", seq)
					} else {
						seq++
						id = fmt.Sprintf("m-%d", seq)
					}
					if _, err := in.Handle(ctx, db, inbox.Message{ID: id, AggregateType: "order", AggregateID: id}, func(ctx context.Context, tx *sql.Tx) error {
						_, err := tx.ExecContext(ctx, insert, id)
						return err
					}); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			})
		}
	}
}
