// Command consumer reads the order service's events from Kafka and ships
// paid orders exactly once despite at-least-once delivery: each record's
// effect and its message ID (header outbox-message-id) are committed in
// one database transaction through package inbox
// (github.com/sqloutbox/outbox/inbox), and the Kafka offset is committed only
// after that.
//
//	go run ./examples/orderservice/consumer -db 'postgres://...' -brokers localhost:9092
package main

import (
	"context"
	"database/sql"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/inbox"
)

func main() {
	dsn := flag.String("db", os.Getenv("SHIPPING_DSN"), "PostgreSQL URL of the shipping database")
	brokers := flag.String("brokers", os.Getenv("KAFKA_BROKERS"), "comma-separated Kafka brokers")
	topic := flag.String("topic", "outbox.event.order", "topic to consume")
	group := flag.String("group", "shipping", "consumer group")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(*dsn, *brokers, *topic, *group, log); err != nil {
		log.Error("consumer failed", "error", err)
		os.Exit(1)
	}
}

// Ship is the business effect of an order.paid event: one shipment row.
func Ship(ctx context.Context, tx *sql.Tx, orderID string) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO shipment (order_id) VALUES ($1)", orderID)
	return err
}

func run(dsn, brokers, topic, group string, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	in, err := inbox.New(inbox.Config{Dialect: driver.Postgres, Table: "shipping_inbox", Consumer: group, Logger: log})
	if err != nil {
		return err
	}
	if err := in.Migrate(ctx, db); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS shipment (order_id VARCHAR(64) PRIMARY KEY)"); err != nil {
		return err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic), kgo.DisableAutoCommit())
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var failed error
		fetches.EachRecord(func(r *kgo.Record) {
			if failed != nil {
				return
			}
			msg := Message(r)
			out, err := in.Handle(ctx, db, msg, func(ctx context.Context, tx *sql.Tx) error {
				if msg.Headers[emit.HeaderEventType] == "order.paid" {
					return Ship(ctx, tx, string(r.Key))
				}
				return nil
			})
			if err != nil {
				failed = err
				return
			}
			log.Info("event", "message_id", msg.ID, "type", msg.Headers[emit.HeaderEventType], "outcome", out.String())
		})
		if failed != nil {
			return failed // offsets not committed: redelivered after restart, deduped then
		}
		if err := cl.CommitUncommittedOffsets(ctx); err != nil {
			return err
		}
	}
}

// Message is a Kafka record as the inbox sees it: the outbox's message ID
// and aggregate headers, where it came from, and its bytes.
func Message(r *kgo.Record) inbox.Message {
	h := make(map[string]string, len(r.Headers))
	for _, kv := range r.Headers {
		h[kv.Key] = string(kv.Value)
	}
	return inbox.Message{
		ID:            h[emit.HeaderMessageID],
		AggregateType: h[emit.HeaderAggregateType],
		AggregateID:   h[emit.HeaderAggregateID],
		Topic:         r.Topic,
		Partition:     r.Partition,
		Offset:        r.Offset,
		Key:           r.Key,
		Headers:       h,
		Payload:       r.Value,
	}
}
