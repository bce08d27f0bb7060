// Command quickstart is a small order service that shows the transactional
// outbox end to end, and checks the result against a real Kafka consumer.
//
// With no flags and no servers it runs entirely in-process: an embedded
// SQLite database (modernc.org/sqlite, a file in a temporary directory) and
// an in-process Kafka-protocol broker (franz-go's kfake).
//
//	go run ./examples/quickstart
//	go run ./examples/quickstart -json -db 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//	go run ./examples/quickstart -db 'root@tcp(127.0.0.1:3306)/test' -brokers localhost:9092
//
// What it demonstrates:
//
//   - Setup: driver.New binds the outbox table (outbox_quickstart); the
//     business *sql.DB is opened through ob.WrapConnector, and the relay gets
//     its own plain pool of two connections. Transaction code is unchanged.
//   - Domain code (type orders) never sees a *sql.Tx by type: it takes a tiny
//     repo interface, locks the order row (SELECT ... FOR UPDATE; BEGIN
//     IMMEDIATE on SQLite), moves the state machine created -> paid ->
//     shipped and calls outbox.Emit with the context it was given.
//   - Concurrency: -workers workers create, pay and ship -orders orders, each
//     step in its own transaction; a committed step enqueues the order's next
//     step for any worker.
//   - Delivery: the relay, woken right after each COMMIT (ob.Wakeup) with a
//     fallback poll (-poll), publishes to topic outbox.event.order (8
//     partitions, key = order ID) through the sarama publisher.
//   - The check: a kgo consumer reads the topic; consumed records are joined
//     with the outbox rows by message ID (header outbox-message-id), giving
//     emitted, delivered, duplicates (allowed: delivery is at least once),
//     lost, ghosts (records with no committed row), per-order order
//     violations, and latency from COMMIT returning to the consumer receiving
//     the record.
//
// Flags:
//
//	-db       "" (embedded SQLite), a postgres:// or postgresql:// URL (pgx), or a
//	          MySQL DSN (user@tcp(host:port)/db, user@unix(/sock)/db, mysql://...).
//	          A server database's quickstart tables are emptied at start.
//	-brokers  comma-separated Kafka bootstrap addresses; empty runs kfake in-process.
//	          The topic is created if missing; only records produced during the
//	          run are consumed.
//	-orders   orders to run through create, pay, ship (default 1000; 3 events each)
//	-workers  concurrent workers (default 16)
//	-poll     the relay's fallback poll interval (default 1s; the post-commit
//	          wake-up carries the latency, so -poll 1h changes nothing)
//	-timeout  how long to wait, after the last commit, for every event to be
//	          consumed (default 60s)
//	-json     print one JSON object instead of the summary
//	-progress interval of a progress line on stderr (default 1s; 0 disables)
//
// A flag value the run cannot use (-orders 0 or -5, -workers 0, a
// non-positive -poll or -timeout) is a usage error: exit status 2.
//
// The summary goes to stdout, logs to stderr. The exit status is 1 if an
// event was lost, a ghost was consumed, an order's events arrived out of
// order, or the run failed; 0 otherwise.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// topic is where order events go: kafka.DefaultTopic for aggregate type "order".
const topic = kafka.DefaultTopicPrefix + "order"

// topicPartitions is the partition count of topic when the quickstart
// creates it (in kfake, or on a real cluster where it is missing).
const topicPartitions = 8

// config is one run's settings: the flags, plus table names and a test hook.
type config struct {
	DB      string
	Brokers []string
	Orders  int
	Workers int
	Poll    time.Duration
	Timeout time.Duration
	JSON    bool

	// OutboxTable and OrderTable default to outbox_quickstart and
	// quickstart_order; tests sharing a server give each run its own.
	OutboxTable string
	OrderTable  string
	// Withhold is a test hook: consumed records for which it returns true
	// are withheld from the check, as if the consumer had never received
	// them. (Waiting for delivery still counts them, so a run with a
	// withheld record ends as soon as everything else arrived.)
	Withhold func(consumedRecord) bool
	// Logger receives the relay's and the quickstart's logs. Default: Warn
	// and above, as text, to stderr.
	Logger *slog.Logger
	// Progress, if set, receives a progress line every ProgressEvery
	// (default 1 s) while the run lasts: transactions committed, events
	// consumed.
	Progress      io.Writer
	ProgressEvery time.Duration
}

// validate rejects settings run cannot honour (negative counts and
// durations; zero keeps the defaults of withDefaults).
func (c config) validate() error {
	switch {
	case c.Orders < 0:
		return fmt.Errorf("-orders must be at least 1, got %d", c.Orders)
	case c.Workers < 0:
		return fmt.Errorf("-workers must be at least 1, got %d", c.Workers)
	case c.Poll < 0:
		return fmt.Errorf("-poll must be positive, got %s", c.Poll)
	case c.Timeout < 0:
		return fmt.Errorf("-timeout must be positive, got %s", c.Timeout)
	case c.ProgressEvery < 0:
		return fmt.Errorf("-progress must be positive, or 0 to disable it, got %s", c.ProgressEvery)
	}
	return nil
}

// validateFlags checks the command line's values, where, unlike a zero
// config field, 0 is never "the default": -orders 0, -workers 0, -poll 0
// and -timeout 0 are usage errors.
func validateFlags(c config) error {
	switch {
	case c.Orders < 1:
		return fmt.Errorf("-orders must be at least 1, got %d", c.Orders)
	case c.Workers < 1:
		return fmt.Errorf("-workers must be at least 1, got %d", c.Workers)
	case c.Poll <= 0:
		return fmt.Errorf("-poll must be positive, got %s", c.Poll)
	case c.Timeout <= 0:
		return fmt.Errorf("-timeout must be positive, got %s", c.Timeout)
	}
	return c.validate()
}

func (c config) withDefaults() config {
	if c.OutboxTable == "" {
		c.OutboxTable = "outbox_quickstart"
	}
	if c.OrderTable == "" {
		c.OrderTable = "quickstart_order"
	}
	if c.Workers == 0 {
		c.Workers = 16
	}
	if c.Poll <= 0 {
		c.Poll = relay.DefaultPollInterval
	}
	if c.Timeout <= 0 {
		c.Timeout = 60 * time.Second
	}
	if c.ProgressEvery == 0 {
		c.ProgressEvery = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return c
}

func main() {
	os.Exit(mainArgs(os.Args[1:], os.Stdout, os.Stderr))
}

// mainArgs runs the quickstart with command line args and returns the
// exit code: 2 for a bad flag value, with the usage on stderr.
func mainArgs(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("quickstart", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg, err := parseFlags(fs, args)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "quickstart:", err)
			fs.Usage()
		}
		return 2
	}
	if cfg.ProgressEvery > 0 { // -progress 0: no progress writer, so no line
		cfg.Progress = stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	rep, err := run(ctx, cfg, stdout)
	stop()
	if err != nil {
		fmt.Fprintln(stderr, "quickstart:", err)
	}
	return exitCode(rep, err)
}

// parseFlags parses args into a config, rejecting values run cannot use.
func parseFlags(fs *flag.FlagSet, args []string) (config, error) {
	var cfg config
	var brokers string
	flag := fs
	flag.StringVar(&cfg.DB, "db", "", "database: empty for embedded SQLite, a postgres:// URL, or a MySQL DSN (user@tcp(host:port)/db or mysql://...)")
	flag.StringVar(&brokers, "brokers", "", "comma-separated Kafka bootstrap addresses; empty runs an in-process broker (kfake)")
	flag.IntVar(&cfg.Orders, "orders", 1000, "orders to create, pay and ship (3 events each)")
	flag.IntVar(&cfg.Workers, "workers", 16, "concurrent workers")
	flag.DurationVar(&cfg.Poll, "poll", time.Second, "relay fallback poll interval")
	flag.DurationVar(&cfg.Timeout, "timeout", 60*time.Second, "how long to wait after the last commit for every event to be consumed")
	flag.BoolVar(&cfg.JSON, "json", false, "print one JSON object instead of the summary")
	flag.DurationVar(&cfg.ProgressEvery, "progress", time.Second, "interval of the progress line on stderr; 0 disables it")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, b := range strings.Split(brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			cfg.Brokers = append(cfg.Brokers, b)
		}
	}
	if err := validateFlags(config{Orders: cfg.Orders, Workers: cfg.Workers, Poll: cfg.Poll, Timeout: cfg.Timeout, ProgressEvery: cfg.ProgressEvery}); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// run executes the whole quickstart and writes the summary (or JSON) to
// stdout. It returns the report, and an error if the run itself failed
// (setup, a transaction that failed for good, the relay stopping); a run
// that completed but lost events returns a failing report and no error.
func run(ctx context.Context, cfg config, stdout io.Writer) (rep report, err error) {
	if err := cfg.validate(); err != nil {
		return rep, err
	}
	cfg = cfg.withDefaults()
	log := cfg.Logger.With("component", "quickstart")
	start := time.Now()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	// Database: the wrapped pool for business code, a plain one for the relay.
	db, err := openDatabase(cfg.DB, cfg.OutboxTable)
	if err != nil {
		return rep, err
	}
	defer db.close()
	setupCtx, setupCancel := context.WithTimeout(ctx, 30*time.Second)
	defer setupCancel()
	if err := db.prepare(setupCtx, cfg.OrderTable); err != nil {
		return rep, err
	}

	// Kafka: an in-process broker unless -brokers names one, and a consumer
	// that starts before the first commit.
	brokers, brokerLabel := cfg.Brokers, "kfake (in-process)"
	var consumer *kafkatest.Consumer
	if len(brokers) == 0 {
		b, err := kafkatest.Start(kafkatest.Topics(topicPartitions, topic))
		if err != nil {
			return rep, err
		}
		defer b.Close()
		brokers = b.Addrs()
		if consumer, err = kafkatest.NewConsumer(brokers, []string{topic}); err != nil {
			return rep, err
		}
	} else {
		brokerLabel = strings.Join(brokers, ",")
		if err := kafkatest.CreateTopic(setupCtx, brokers, topic, topicPartitions); err != nil {
			return rep, err
		}
		// A real topic may hold earlier runs' records: consume only what is
		// produced from now on (they would otherwise count as ghosts).
		ends, err := kafkatest.EndOffsets(setupCtx, brokers, topic)
		if err != nil {
			return rep, err
		}
		if consumer, err = kafkatest.NewConsumerAt(brokers, map[string]map[int32]int64{topic: ends}); err != nil {
			return rep, err
		}
	}
	defer consumer.Close()

	kpub, err := kafka.NewPublisher(kafka.Config{Brokers: brokers})
	if err != nil {
		return rep, err
	}
	defer kpub.Close()
	pub := newTimedPublisher(kpub) // only measures; see timing.go

	// The relay: woken after every commit that wrote events, polling as a
	// fallback, on its own small pool.
	r, err := relay.New(db.ob, db.relay, relay.Config{ // db.ob: the writers' Outbox, so the same table and partitions
		Publisher:    pub,
		PollInterval: cfg.Poll,
		Logger:       cfg.Logger,
	})
	if err != nil {
		return rep, err
	}
	relayDone := make(chan struct{})
	go func() {
		defer close(relayDone)
		if err := r.Run(ctx); err != nil {
			cancel(fmt.Errorf("relay: %w", err))
		}
	}()
	stopRelay := func() {
		stopCtx, stopCancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer stopCancel()
		if err := r.Stop(stopCtx); err != nil {
			log.Warn("relay did not stop in time", "error", err)
		}
		<-relayDone
	}
	defer func() {
		select {
		case <-relayDone:
		default:
			stopRelay()
		}
	}()

	// The workload: every order created, paid and shipped by concurrent workers.
	runID := make([]byte, 4)
	_, _ = rand.Read(runID)
	ids := make([]string, cfg.Orders)
	amounts := make([]int64, cfg.Orders)
	for i := range ids {
		ids[i] = fmt.Sprintf("ord-%s-%05d", hex.EncodeToString(runID), i)
		amounts[i] = 500 + int64(i*7919%99500)
	}
	w := &workload{db: db.app, orders: newOrders(db.dialect, cfg.OrderTable)}
	if cfg.Progress != nil && cfg.ProgressEvery > 0 {
		progressDone := make(chan struct{})
		progressStop := make(chan struct{})
		go func() {
			defer close(progressDone)
			showProgress(cfg.Progress, cfg.ProgressEvery, progressStop, 3*cfg.Orders, w, consumer)
		}()
		defer func() { close(progressStop); <-progressDone }()
	}
	workStart := time.Now()
	if err := w.run(ctx, ids, amounts, cfg.Workers); err != nil {
		if cause := context.Cause(ctx); cause != nil {
			err = cause
		}
		return rep, fmt.Errorf("workload: %w", err)
	}
	workDone := time.Now()

	// Wait until every message ID in the outbox table was consumed.
	readCtx, readCancel := context.WithTimeout(ctx, 30*time.Second)
	rows, err := db.readOutbox(readCtx)
	readCancel()
	if err != nil {
		return rep, err
	}
	want := make(map[string]bool, len(rows))
	for _, row := range rows {
		want[row.MessageID] = true
	}
	missing, next := len(want), 0
	waitCtx, waitCancel := context.WithTimeout(ctx, cfg.Timeout)
	_, werr := consumer.Wait(waitCtx, func(recs []consumedRecord) bool {
		for ; next < len(recs); next++ {
			if mid := recs[next].Headers[emit.HeaderMessageID]; want[mid] {
				want[mid] = false
				missing--
			}
		}
		return missing == 0
	})
	waitCancel()
	if cause := context.Cause(ctx); cause != nil {
		return rep, cause // the relay failed, or the caller gave up
	}
	timedOut := werr != nil
	if timedOut {
		log.Warn("not every event was consumed in time", "missing", missing, "timeout", cfg.Timeout.String())
	}

	stopRelay()
	consumer.Close()
	recs := consumer.Records()
	if cfg.Withhold != nil {
		kept := recs[:0:0]
		for _, rec := range recs {
			if !cfg.Withhold(rec) {
				kept = append(kept, rec)
			}
		}
		recs = kept
	}

	w.mu.Lock()
	commits := w.commits
	w.mu.Unlock()
	rep = check(rows, recs, commits)
	rep.Dialect, rep.Broker, rep.Orders, rep.Workers = db.label, brokerLabel, cfg.Orders, cfg.Workers
	rep.Transactions, rep.Retries = int(w.txns.Load()), int(w.retries.Load())
	rep.PickupMS, rep.PublishMS, rep.RelayBatches = pub.breakdown(rows, commits)
	rep.WorkloadMS = ms(workDone.Sub(workStart))
	for _, at := range commits {
		if rep.firstCommit.IsZero() || at.Before(rep.firstCommit) {
			rep.firstCommit = at
		}
		if at.After(rep.lastCommit) {
			rep.lastCommit = at
		}
	}
	if !rep.lastDelivery.IsZero() && !rep.firstCommit.IsZero() {
		span := rep.lastDelivery.Sub(rep.firstCommit)
		rep.RelayMS = ms(span)
		rep.DrainMS = ms(max(0, rep.lastDelivery.Sub(rep.lastCommit)))
		if span > 0 {
			rep.EventsPerSec = float64(int(float64(rep.Delivered)/span.Seconds()*10)) / 10
		}
	}
	rep.TimedOut = timedOut
	rep.WallMS = ms(time.Since(start))
	return rep, write(stdout, rep, cfg.JSON)
}

// write prints rep as one JSON object or as a readable summary.
func write(w io.Writer, rep report, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(rep)
	}
	result := "OK: every committed event was delivered, in order per order, and nothing else"
	if rep.failed() {
		result = "FAILED: lost events, ghosts or order violations (see above)"
	}
	_, err := fmt.Fprintf(w, `outbox quickstart
  database          %s
  broker            %s
  orders            %d (%d workers, %d transactions, %d retried)
  emitted           %d events (outbox rows)
  delivered         %d distinct message IDs consumed
  duplicates        %d (at-least-once; consumers dedupe by message ID)
  lost              %d
  ghosts            %d
  order violations  %d
  latency           p50 %.2f ms, p99 %.2f ms, max %.2f ms (COMMIT returned -> consumer received; %d events)
    relay pickup    p50 %.2f ms, p99 %.2f ms (COMMIT returned -> relay's Publish call)
    publish         p50 %.2f ms, p99 %.2f ms (Publish call -> all acknowledged; %d batches)
  workload          %.0f ms
  relay             %.0f ms first commit -> last delivery, %.0f events/s; last delivery %.0f ms after last commit
  timed out         %t
  wall time         %.0f ms
  result            %s
`,
		rep.Dialect, rep.Broker, rep.Orders, rep.Workers, rep.Transactions, rep.Retries,
		rep.Emitted, rep.Delivered, rep.Duplicates, rep.Lost, rep.Ghosts, rep.OrderViolations,
		rep.LatencyMS.P50, rep.LatencyMS.P99, rep.LatencyMS.Max, rep.LatencyMS.Samples,
		rep.PickupMS.P50, rep.PickupMS.P99, rep.PublishMS.P50, rep.PublishMS.P99, rep.RelayBatches,
		rep.WorkloadMS, rep.RelayMS, rep.EventsPerSec, rep.DrainMS, rep.TimedOut, rep.WallMS, result)
	return err
}

// showProgress writes a line every interval until stop is closed:
// transactions committed out of total, events consumed.
func showProgress(out io.Writer, every time.Duration, stop <-chan struct{}, total int, w *workload, c *kafkatest.Consumer) {
	start := time.Now()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		txns := w.txns.Load()
		consumed := len(c.Records())
		fmt.Fprintf(out, "quickstart: %6s  transactions %d/%d (%.0f%%)  events consumed %d\n",
			time.Since(start).Round(100*time.Millisecond), txns, total, 100*float64(txns)/float64(max(total, 1)), consumed)
	}
}
