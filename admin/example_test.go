package admin_test

import (
	"context"
	"database/sql"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/sqloutbox/outbox/admin"
	"github.com/sqloutbox/outbox/driver"
)

// An application mounts the admin page under /ops/outbox/ on its own
// mux, with a small pool of its own and the token from the environment.
func ExampleNew() {
	ctx := context.Background()
	ob, err := driver.New(driver.Config{Dialect: driver.Postgres})
	if err != nil {
		log.Fatal(err)
	}
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	db.SetMaxOpenConns(2) // the page never starves the application
	h, err := admin.New(admin.Config{
		Outbox: ob,
		DB:     db,
		Token:  os.Getenv("OUTBOX_ADMIN_TOKEN"), // at least 16 bytes
		Prefix: "/ops/outbox/",
	})
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = h.Run(ctx, 10*time.Second) }() // the throughput chart's readings
	mux := http.NewServeMux()
	mux.Handle("/ops/outbox/", h)
	log.Fatal(http.ListenAndServe("127.0.0.1:8090", mux))
}
