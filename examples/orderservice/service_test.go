package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// TestHappyPath: orders created and paid over HTTP are published by the
// relay, and the inbox consumer ships each paid order exactly once even
// when every record is delivered twice.
func TestHappyPath(t *testing.T) {
	t.Parallel()
	for _, tg := range []struct {
		Name    string
		Dialect driver.Dialect
	}{{"postgres", driver.Postgres}, {"mysql", driver.MySQL}, {"sqlite", driver.SQLite}} {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			broker, err := kafkatest.Start(kafkatest.Topics(4, "outbox.event.order"))
			if err != nil {
				t.Fatal(err)
			}
			defer broker.Close()
			e := newTestEnv(t, tg.Dialect)
			db := e.db
			svc := newService(db, tg.Dialect)
			if err := svc.migrate(ctx); err != nil {
				t.Fatal(err)
			}
			pub, err := kafka.NewPublisher(kafka.Config{Brokers: broker.Addrs()})
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			r, err := relay.New(e.ob, e.relayDB, relay.Config{Publisher: pub, Observer: outboxtest.WatchOrder(t, nil),
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			runErr := make(chan error, 1)
			go func() { runErr <- r.Run(ctx) }()
			defer func() {
				_ = r.Stop(context.Background())
				if err := <-runErr; err != nil {
					t.Errorf("relay: %v", err)
				}
			}()
			srv := httptest.NewServer(svc.handler())
			defer srv.Close()

			post := func(path, body string, want int) {
				t.Helper()
				resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Fatalf("POST %s: %d %s, want %d", path, resp.StatusCode, b, want)
				}
			}
			const n = 20
			for i := 0; i < n; i++ {
				post("/orders", fmt.Sprintf(`{"id":"o-%d","amount_cents":%d}`, i, 100+i), http.StatusCreated)
				post(fmt.Sprintf("/orders/o-%d/pay", i), "", http.StatusOK)
			}
			post("/orders/o-0/pay", "", http.StatusConflict)
			post("/orders/nope/pay", "", http.StatusNotFound)
			post("/orders", `{"id":""}`, http.StatusBadRequest)
			resp, err := http.Get(srv.URL + "/orders/o-3")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !bytes.Contains(body, []byte(`"status":"paid"`)) {
				t.Errorf("GET /orders/o-3 = %s", body)
			}

			cons, err := kafkatest.NewConsumer(broker.Addrs(), []string{"outbox.event.order"})
			if err != nil {
				t.Fatal(err)
			}
			defer cons.Close()
			recs, err := cons.WaitForCount(ctx, 2*n)
			if err != nil {
				t.Fatal(err)
			}
			in, err := inbox.New(inbox.Config{Dialect: tg.Dialect, Table: "shipping_inbox", Consumer: "shipping"})
			if err != nil {
				t.Fatal(err)
			}
			if err := in.Migrate(ctx, db); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, "CREATE TABLE shipment (order_id VARCHAR(64) PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			ph := "?"
			if tg.Dialect == driver.Postgres {
				ph = "$1"
			}
			dups := 0
			for pass := 0; pass < 2; pass++ { // every record delivered twice
				for _, rec := range recs {
					msg := inbox.Message{ID: rec.Headers[emit.HeaderMessageID], AggregateType: rec.Headers[emit.HeaderAggregateType],
						AggregateID: rec.Headers[emit.HeaderAggregateID], Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Key: rec.Key, Headers: rec.Headers, Payload: rec.Value}
					out, err := in.Handle(ctx, db, msg, func(ctx context.Context, tx *sql.Tx) error {
						if rec.Headers[emit.HeaderEventType] != "order.paid" {
							return nil
						}
						_, err := tx.ExecContext(ctx, "INSERT INTO shipment (order_id) VALUES ("+ph+")", string(rec.Key))
						return err
					})
					if err != nil {
						t.Fatal(err)
					}
					if out == inbox.Duplicate {
						dups++
					}
				}
			}
			var shipped int
			if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM shipment").Scan(&shipped); err != nil {
				t.Fatal(err)
			}
			if shipped != n || dups != 2*n {
				t.Fatalf("shipped %d (want %d), %d duplicates skipped (want %d)", shipped, n, dups, 2*n)
			}
		})
	}
}
