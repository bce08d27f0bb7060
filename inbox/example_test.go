package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
)

// The common path: a message delivered twice is applied once.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", filepath.Join(dir, "shipping.db"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // SQLite: one writer
	in, err := inbox.New(inbox.Config{Dialect: driver.SQLite, Consumer: "shipping"})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := in.Migrate(ctx, db); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE shipment (order_id TEXT PRIMARY KEY)"); err != nil {
		fmt.Println(err)
		return
	}
	msg := inbox.Message{ID: "4b0e6f1c-order-42-paid", AggregateType: "order", AggregateID: "42"}
	for delivery := 1; delivery <= 2; delivery++ {
		out, err := in.Handle(ctx, db, msg, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO shipment (order_id) VALUES (?)", msg.AggregateID)
			return err
		})
		fmt.Println("delivery", delivery, out, err)
	}
	var n int
	_ = db.QueryRowContext(ctx, "SELECT COUNT(*) FROM shipment").Scan(&n)
	fmt.Println("shipments:", n)
	// Output:
	// delivery 1 applied <nil>
	// delivery 2 duplicate <nil>
	// shipments: 1
}
