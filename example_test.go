package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"modernc.org/sqlite"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

// payOrder is domain code: it sees a context, never a *sql.Tx.
func payOrder(ctx context.Context, id string) error {
	return outbox.Emit(ctx, outbox.Event{
		AggregateType: "order",
		AggregateID:   id,
		Type:          "order.paid",
		Payload:       []byte(`{"order_id":"` + id + `","amount_cents":1299}`),
	})
}

// Example shows the whole path on embedded SQLite: register the wrapped
// driver, migrate, run a relay, emit inside a transaction, commit.
func Example() {
	dir, _ := os.MkdirTemp("", "outbox-example-")
	defer os.RemoveAll(dir)
	dsn := "file:" + filepath.Join(dir, "app.db") + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate"

	ob, err := driver.Register("outbox-sqlite-example", &sqlite.Driver{}, driver.Config{Dialect: driver.SQLite})
	if err != nil {
		log.Fatal(err)
	}
	db, err := sql.Open("outbox-sqlite-example", dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // SQLite: one writer; the relay shares the pool
	ctx := context.Background()
	if err := ob.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}

	pub := outboxtest.NewPublisher() // relay/kafka.NewPublisher in production
	// Built from ob: its table, the partition count stored there, its wake-up.
	r, err := relay.New(ob, db, relay.Config{Publisher: pub})
	if err != nil {
		log.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func(ctx context.Context) { runErr <- r.Run(ctx) }(ctx) // Run logs the error that ends it, too
	defer func() {
		_ = r.Stop(ctx)
		if err := <-runErr; err != nil {
			log.Fatal(err)
		}
	}()

	// One unit of work: a fresh emit scope, BEGIN, domain code, COMMIT
	// (or ROLLBACK if it fails); by hand that is outbox.NewContext,
	// db.BeginTx, defer tx.Rollback() and tx.Commit().
	err = outbox.InTx(ctx, db, func(ctx context.Context, tx *sql.Tx) error {
		return payOrder(ctx, "o-42")
	})
	if err != nil {
		log.Fatal(err)
	}

	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	msgs, err := pub.WaitForCount(wctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(msgs[0].AggregateID, msgs[0].EventType, string(msgs[0].Payload))
	// Output: o-42 order.paid {"order_id":"o-42","amount_cents":1299}
}

// ExampleEmit_errors shows that Emit refuses bad input where it happens.
func ExampleEmit_errors() {
	ctx := outbox.NewContext(context.Background())
	err := outbox.Emit(ctx, outbox.Event{AggregateType: "order", AggregateID: "1", Type: "t", Payload: []byte(`{}`)})
	fmt.Println(errors.Is(err, outbox.ErrNoTransaction))
	// Output: true
}
