package metrics_test

import (
	"context"
	"database/sql"
	"log"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/metrics"
	"github.com/sqloutbox/outbox/relay"
)

// Example wires a relay's metrics and the table statistics into a
// registry served on /metrics.
func Example() {
	var (
		ctx     context.Context // the service's lifetime
		ob      *driver.Outbox  // from driver.Register or driver.New
		relayDB *sql.DB         // the relay's own small pool
		pub     relay.Publisher // for example kafka.NewPublisher
	)
	reg := prometheus.NewRegistry()
	m, err := metrics.NewRelayMetrics(reg, ob)
	if err != nil {
		log.Fatal(err)
	}
	reg.MustRegister(metrics.NewStatsCollector(ob, relayDB, 5*time.Second))
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	r, err := relay.New(ob, relayDB, relay.Config{Publisher: pub, Observer: m})
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		if err := r.Run(ctx); err != nil { // Run logs it too
			log.Fatal(err)
		}
	}()
}
