// Command orderservice is a realistic outbox user: an order service over
// net/http on PostgreSQL or MySQL (SQLite for a local try). A middleware
// (outbox.Middleware) gives each request an emit scope; handlers begin
// ordinary transactions and call domain functions that emit events; the
// wrapped driver writes them at COMMIT; a relay publishes them to Kafka.
//
//	go run ./examples/orderservice -db 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable' -brokers localhost:9092
//
// Without Kafka, run `go run ./cmd/outbox dev-broker --topic outbox.event.order` first:
// it serves 127.0.0.1:9092 until interrupted. Then:
//
//	curl -XPOST localhost:8080/orders -d '{"id":"o-1","amount_cents":1299}'
//	curl -XPOST localhost:8080/orders/o-1/pay
//
// With -relay=false the service only writes; run the standalone relay
// (`outbox relay`) beside it, as docker-compose.yml does. The consumer in
// ./consumer reads the events back and dedupes them by message ID.
package main

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"modernc.org/sqlite"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/driver/dsn"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

func main() {
	dsn := flag.String("db", os.Getenv("ORDERS_DSN"), "postgres:// URL, MySQL DSN (user@tcp(host:port)/db), or empty for a local SQLite file")
	brokers := flag.String("brokers", os.Getenv("KAFKA_BROKERS"), "comma-separated Kafka brokers (required with -relay)")
	addr := flag.String("addr", ":8080", "HTTP listen address")
	runRelay := flag.Bool("relay", true, "run the relay in this process (false: use the standalone `outbox relay`)")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(*dsn, *brokers, *addr, *runRelay, log); err != nil {
		log.Error("orderservice failed", "error", err)
		os.Exit(1)
	}
}

// openDB wraps the right driver for source (-db) and returns the application's DB
// (through the outbox wrapper) and the relay's own small pool.
func openDB(source string) (*driver.Outbox, *sql.DB, *sql.DB, error) {
	var d driver.Dialect
	var conn sqldriver.Connector
	switch {
	case strings.HasPrefix(source, "postgres://"), strings.HasPrefix(source, "postgresql://"):
		cfg, err := pgx.ParseConfig(source)
		if err != nil {
			return nil, nil, nil, err
		}
		d, conn = driver.Postgres, stdlib.GetConnector(*cfg)
	case strings.Contains(source, "@tcp(") || strings.Contains(source, "@unix("):
		cfg, err := mysql.ParseDSN(source)
		if err != nil {
			return nil, nil, nil, err
		}
		c, err := mysql.NewConnector(cfg)
		if err != nil {
			return nil, nil, nil, err
		}
		d, conn = driver.MySQL, c
	case source == "":
		d = driver.SQLite
	default:
		return nil, nil, nil, fmt.Errorf("unrecognised -db: want a postgres:// URL or a MySQL DSN")
	}
	ob, err := driver.New(driver.Config{Dialect: d})
	if err != nil {
		return nil, nil, nil, err
	}
	if d == driver.SQLite {
		c, err := ob.Wrap(&sqlite.Driver{}).(sqldriver.DriverContext).OpenConnector(dsn.SQLite("orders.db", nil))
		if err != nil {
			return nil, nil, nil, err
		}
		db := sql.OpenDB(c)
		db.SetMaxOpenConns(1)
		return ob, db, db, nil
	}
	app := sql.OpenDB(ob.WrapConnector(conn))
	relayDB := sql.OpenDB(conn)
	relayDB.SetMaxOpenConns(2)
	return ob, app, relayDB, nil
}

func run(dsn, brokers, addr string, runRelay bool, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	ob, db, relayDB, err := openDB(dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := ob.Migrate(ctx, db); err != nil {
		return err
	}
	svc := newService(db, ob.Config().Dialect)
	if err := svc.migrate(ctx); err != nil {
		return err
	}
	if runRelay {
		if brokers == "" {
			return errors.New("-brokers is required with -relay")
		}
		pub, err := kafka.NewPublisher(kafka.Config{Brokers: strings.Split(brokers, ",")})
		if err != nil {
			return err
		}
		defer pub.Close()
		r, err := relay.New(ob, relayDB, relay.Config{Publisher: pub, Logger: log})
		if err != nil {
			return err
		}
		go func() {
			if err := r.Run(ctx); err != nil { // also logged by Run
				stop()
			}
		}()
	}
	srv := &http.Server{Addr: addr, Handler: svc.handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("orderservice listening", "addr", addr, "dialect", ob.Config().Dialect, "relay", runRelay)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
