package tests

import (
	"context"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

func TestSmoke(t *testing.T) {
	for _, tg := range testdb.All {
		t.Run(tg.Name, func(t *testing.T) {
			e := testdb.New(t, tg, driver.Config{})
			pub := outboxtest.NewPublisher()
			r, err := relay.New(e.RelayDB, relay.Config{Dialect: tg.Dialect, Table: e.Table, Publisher: pub, Wakeup: e.Outbox.Wakeup(), PollInterval: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			done := make(chan error)
			go func() { done <- r.Run(ctx) }()
			sctx := outbox.NewContext(ctx)
			tx, err := e.DB.BeginTx(sctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 3; i++ {
				if err := outbox.Emit(sctx, outbox.Event{AggregateType: "order", AggregateID: "1", Type: "x", Payload: []byte(`{"b":1, "a":2}`), Headers: map[string]string{"h": "v"}}); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			msgs, err := pub.WaitForCount(ctx, 3)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%+v", msgs[0])
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}
