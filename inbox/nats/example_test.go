package inboxnats_test

import (
	"context"
	"database/sql"
	"log"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	inboxnats "github.com/sqloutbox/outbox/inbox/nats"
)

// A billing service applies the order events the outbox relay publishes
// into the stream OUTBOX, each exactly once and in order per order. Run
// it on as many instances as you like: one consumes, the others take over
// when it stops or dies.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://billing@127.0.0.1:5432/billing")
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect("nats://127.0.0.1:4222", nats.MaxReconnects(-1))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	in, err := inbox.New(inbox.Config{Dialect: driver.Postgres, Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	if err := in.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	r, err := inboxnats.NewRunner(inboxnats.Config{
		Conn:          nc,
		Stream:        "OUTBOX",
		Durable:       "billing",
		FilterSubject: "outbox.event.order.>",
		Inbox:         in,
		DB:            db,
		Handler: func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO invoices (order_id, event) VALUES ($1, $2)", m.AggregateID, m.Payload)
			return err
		},
		ContextFor: func(ctx context.Context, msg jetstream.Msg) context.Context {
			return ctx // with the otel module: outboxotel.Extract(ctx, msg.Headers().Get)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil { // until ctx is cancelled
		log.Fatal(err)
	}
}
