package inboxredis_test

import (
	"context"
	"database/sql"
	"log"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	inboxredis "github.com/sqloutbox/outbox/inbox/redis"
)

// A billing service applies the order events the outbox relay publishes
// to Redis (relay/redis), each exactly once, with one runner of the group
// consuming at a time (run several for failover).
func ExampleRunner() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	db, err := sql.Open("pgx", "postgres://billing@127.0.0.1:5432/billing")
	if err != nil {
		log.Fatal(err)
	}
	in, err := inbox.New(inbox.Config{Dialect: driver.Postgres, Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	if err := in.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	r, err := inboxredis.NewRunner(inboxredis.Config{
		Client:  redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}),
		Streams: []string{"outbox.event.order"}, // redispub.DefaultStream of aggregate type order
		Group:   "billing",
		Inbox:   in,
		DB:      db,
		Handler: func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO invoices (order_id, event) VALUES ($1, $2)", m.AggregateID, m.Payload)
			return err
		},
		ContextFor: func(ctx context.Context, stream string, e redis.XMessage) context.Context {
			return ctx // with the otel module: outboxotel.Extract over e.Values
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil { // until SIGTERM
		log.Fatal(err)
	}
}
