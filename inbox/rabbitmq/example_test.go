package inboxrabbitmq_test

import (
	"context"
	"database/sql"
	"log"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	inboxrabbitmq "github.com/sqloutbox/outbox/inbox/rabbitmq"
)

// A consumer of the relay's messages on RabbitMQ: the queue "billing"
// receives the order events of the exchange "outbox.event" (the relay's default); each is applied
// once, in order per order, whatever the redeliveries.
func Example() {
	var db *sql.DB // the consumer's database, with the inbox table migrated
	in, err := inbox.New(inbox.Config{Dialect: driver.Postgres, Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	r, err := inboxrabbitmq.NewRunner(inboxrabbitmq.Config{
		URL:      "amqp://guest:guest@127.0.0.1:5672/",
		Queue:    "billing",
		Bindings: []inboxrabbitmq.Binding{{Exchange: "outbox.event", Key: "order.*"}},
		Inbox:    in,
		DB:       db,
		Handler: func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
			_, err := tx.ExecContext(ctx, "UPDATE invoices SET paid = true WHERE order_id = $1", m.AggregateID)
			return err
		},
		BatchSize: 32,
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = r // r.Run(ctx) consumes until ctx is cancelled
}
