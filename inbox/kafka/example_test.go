package inboxkafka_test

import (
	"context"
	"database/sql"
	"log"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	inboxkafka "github.com/sqloutbox/outbox/inbox/kafka"
)

// A billing service applies the order events the outbox relay publishes,
// each exactly once, with metrics and the trace continued from Emit.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://billing@127.0.0.1:5432/billing")
	if err != nil {
		log.Fatal(err)
	}
	metrics, err := inboxkafka.NewMetrics(prometheus.DefaultRegisterer, "billing")
	if err != nil {
		log.Fatal(err)
	}
	// The metrics observe the inbox (outcomes) and the runner (lag).
	in, err := inbox.New(inbox.Config{Dialect: driver.Postgres, Consumer: "billing", Observer: metrics})
	if err != nil {
		log.Fatal(err)
	}
	if err := in.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	r, err := inboxkafka.NewRunner(inboxkafka.Config{
		Brokers: []string{"127.0.0.1:9092"},
		Group:   "billing",
		Topics:  []string{"outbox.event.order"},
		Inbox:   in,
		DB:      db,
		Handler: func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO invoices (order_id, event) VALUES ($1, $2)", m.AggregateID, m.Payload)
			return err
		},
		Observer: metrics,
		ContextFor: func(ctx context.Context, rec *kgo.Record) context.Context {
			return ctx // with the otel module: outboxotel.Extract over rec.Headers
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil { // until ctx is cancelled
		log.Fatal(err)
	}
}
