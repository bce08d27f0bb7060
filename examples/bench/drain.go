package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/handwritten"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// historyAggregates is how many aggregate IDs part 4's preloaded rows are
// spread over (the drain's: -drain-aggregates).
const historyAggregates = 256

// observer is a relay.Observer calling optional funcs.
type observer struct {
	claimed   func(n int, took time.Duration)
	published func(m relay.Message)
}

func (o *observer) Claimed(n int, took time.Duration) {
	if o.claimed != nil {
		o.claimed(n, took)
	}
}

func (o *observer) Published(m relay.Message, _ time.Duration) {
	if o.published != nil {
		o.published(m)
	}
}
func (o *observer) Failed(relay.Message, relay.ErrorClass, error) {}
func (o *observer) Retried(relay.Message, int, time.Duration)     {}
func (o *observer) DeadLettered(relay.Message, error)             {}
func (o *observer) Leases(int)                                    {}
func (o *observer) Up(bool)                                       {}

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// preload inserts n rows (pending, or sent history) into env's table with
// one set-based statement per chunk, spread over aggregates aggregate IDs
// whose relay partitions are computed in Go (partition.Of) and joined in
// from a helper table. It does not analyze the table (the drain's
// analyzed variant does, after it).
func preload(ctx context.Context, db *database, env *outboxEnv, n, aggregates int, sent bool, prefix string) error {
	agg := env.table + "_agg"
	if _, err := db.admin.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+agg+" (i INTEGER PRIMARY KEY, aggregate_id VARCHAR(64) NOT NULL, p INTEGER NOT NULL)"); err != nil {
		return fmt.Errorf("creating %s: %w", agg, err)
	}
	if err := db.conditionTables(ctx); err != nil {
		return err
	}
	var cnt int
	if err := db.admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+agg).Scan(&cnt); err != nil {
		return err
	}
	if cnt == 0 {
		var b strings.Builder
		b.WriteString("INSERT INTO " + agg + " (i, aggregate_id, p) VALUES ")
		for i := 0; i < aggregates; i++ {
			if i > 0 {
				b.WriteString(", ")
			}
			id := "agg-" + strconv.Itoa(i)
			fmt.Fprintf(&b, "(%d, '%s', %d)", i, id, partition.Of("order", id, partition.DefaultCount))
		}
		if _, err := db.admin.ExecContext(ctx, b.String()); err != nil {
			return fmt.Errorf("filling %s: %w", agg, err)
		}
	}
	now := handwritten.Now(db.dialect)
	status, attempts, sentAt := "0", "0", "NULL"
	if sent {
		status, attempts, sentAt = "1", "1", now
	}
	cols := "INSERT INTO " + env.table + " (message_id, aggregate_type, aggregate_id, event_type, partition_key, content_type, payload, status, attempts, created_at, updated_at, sent_at) "
	pl := "'" + string(payload) + "'"
	const chunk = 250_000
	for lo := 1; lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		var q string
		switch db.dialect {
		case driver.Postgres:
			q = cols + fmt.Sprintf("SELECT '%s' || g, 'order', a.aggregate_id, 'order.paid', a.p, 'application/json', %s::bytea, %s, %s, %s, %s, %s FROM generate_series(%d, %d) g JOIN %s a ON a.i = g %% %d",
				prefix, pl, status, attempts, now, now, sentAt, lo, hi, agg, aggregates)
		case driver.MySQL:
			q = cols + fmt.Sprintf("SELECT CONCAT('%s', seq), 'order', a.aggregate_id, 'order.paid', a.p, 'application/json', %s, %s, %s, %s, %s, %s FROM seq_%d_to_%d JOIN %s a ON a.i = seq %% %d ORDER BY seq",
				prefix, pl, status, attempts, now, now, sentAt, lo, hi, agg, aggregates)
		default:
			q = fmt.Sprintf("WITH RECURSIVE s(g) AS (SELECT %d UNION ALL SELECT g + 1 FROM s WHERE g < %d) ", lo, hi) + cols +
				fmt.Sprintf("SELECT '%s' || g, 'order', a.aggregate_id, 'order.paid', a.p, 'application/json', CAST(%s AS BLOB), %s, %s, %s, %s, %s FROM s JOIN %s a ON a.i = g %% %d",
					prefix, pl, status, attempts, now, now, sentAt, agg, aggregates)
		}
		if _, err := db.admin.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("preloading %s: %w", env.table, err)
		}
	}
	return nil
}

// pending counts the table's pending rows: its pending set (schema
// version 9 on PostgreSQL, 8 on SQLite, 6 on MySQL/MariaDB).
func pending(ctx context.Context, db *sql.DB, table string) (int, error) {
	var n int
	err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table+"_pending").Scan(&n)
	return n, err
}

// topicFor creates the run's topic "outbox-bench-<name>" (8 partitions).
func topicFor(ctx context.Context, brokers []string, name string) (string, error) {
	topic := "outbox-bench-" + name
	return topic, kafkatest.CreateTopic(ctx, brokers, topic, 8)
}

// publisherFor creates a topic (topicFor) and a publisher to it.
func publisherFor(ctx context.Context, brokers []string, name string) (*kafka.Publisher, error) {
	topic, err := topicFor(ctx, brokers, name)
	if err != nil {
		return nil, err
	}
	return newPublisher(brokers, topic)
}

// DrainResult is part 3: one run of one variant, or (Runs > 0) the
// medians of a variant's runs, each figure on its own.
type DrainResult struct {
	// Variant is never_analyzed (the table as the preload left it) or
	// analyzed (ANALYZE right after the preload).
	Variant string `json:"variant"`
	// Run is this run's number (1...), 0 in a median; Runs the number of
	// runs a median is of.
	Run          int     `json:"run,omitempty"`
	Runs         int     `json:"runs,omitempty"`
	Rows         int     `json:"rows"`
	Aggregates   int     `json:"aggregates"`
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"events_per_sec"`
	// PeakRSSMB is VmHWM of the bench process, reset (clear_refs) just
	// before the drain: the relay, its pools and the publisher. The
	// broker runs in a child process unless -brokers is given; on SQLite
	// the database engine is in-process and counted too.
	PeakRSSMB float64 `json:"peak_rss_mb"`
	// CPURelayMicros and CPUPostgresMicros are CPU time per event over
	// the drain, in µs, from /proc's clock ticks (cpuPerEvent): the bench
	// process (the relay and its publisher), and every PostgreSQL
	// process; CPUBrokerMicros the bench's child processes' (the Kafka
	// broker it started; 0 with -brokers). 0 where /proc is unreadable
	// and, for PostgreSQL, on another dialect or machine.
	CPURelayMicros    float64 `json:"cpu_relay_us_per_event"`
	CPUBrokerMicros   float64 `json:"cpu_broker_us_per_event"`
	CPUPostgresMicros float64 `json:"cpu_postgres_us_per_event"`
	RSSReset          bool    `json:"rss_reset"`
	BatchSize         int     `json:"batch_size"`
	PreloadSeconds    float64 `json:"preload_seconds"`
	// Batches is the number of non-empty claims; ClaimMedianMicros their
	// median duration; CycleMillis the mean wall time per batch.
	Batches           int     `json:"batches"`
	ClaimMedianMicros float64 `json:"claim_median_us"`
	ClaimP99Micros    float64 `json:"claim_p99_us"`
	ClaimMaxMicros    float64 `json:"claim_max_us"`
	CycleMillis       float64 `json:"cycle_ms"`
	BaselinePerSec    float64 `json:"baseline_events_per_sec,omitempty"`
	SpeedupBaseline   float64 `json:"speedup_vs_baseline,omitempty"`
	// TableState is the table right before the relay started (asserted
	// for the variant: tableState); TableStateAfter once it was drained.
	// Absent in a median.
	TableState      *TableState `json:"table_state,omitempty"`
	TableStateAfter *TableState `json:"table_state_after,omitempty"`
}

// runDrain measures part 3, one run of one variant on a table of its own:
// rows pending rows over aggs aggregates, one relay, events/s until the
// table has no pending row, and the relay's peak RSS.
//
// The publisher is ep's, to a route of its own, without a consumer;
// tag ("" or e.g. "_nats") names the table apart from other brokers'.
func runDrain(ctx context.Context, db *database, ep endpoint, rows, aggs, batch int, cpuprofile, variant string, run int, tag string) (*DrainResult, error) {
	name := "ob_drain_na"
	if variant == variantAnalyzed {
		name = "ob_drain_an"
	}
	env, err := db.newOutbox(ctx, fmt.Sprintf("%s%s_%d", name, tag, run), 1)
	if err != nil {
		return nil, err
	}
	defer env.close()
	t0 := time.Now()
	if err := preload(ctx, db, env, rows, aggs, false, "d-"); err != nil {
		return nil, err
	}
	if variant == variantAnalyzed {
		if err := analyze(ctx, db, env.table); err != nil {
			return nil, err
		}
	}
	res := &DrainResult{Variant: variant, Run: run, Rows: rows, Aggregates: aggs, BatchSize: batch, PreloadSeconds: round2(time.Since(t0).Seconds())}
	if res.TableState, err = db.tableState(ctx, env.table, variant); err != nil {
		return nil, err
	}
	rt, err := ep.open(ctx, "drain", false)
	if err != nil {
		return nil, err
	}
	defer rt.close()
	pub := rt.pub
	var published atomic.Int64
	done := make(chan struct{})
	var once sync.Once
	var cmu sync.Mutex
	var claims []time.Duration
	obs := &observer{
		claimed: func(n int, took time.Duration) {
			if n > 0 {
				cmu.Lock()
				claims = append(claims, took)
				cmu.Unlock()
			}
		},
		published: func(relay.Message) {
			if published.Add(1) >= int64(rows) {
				once.Do(func() { close(done) })
			}
		}}
	cfg, dropSlot := db.withSource(env, relay.Config{Publisher: pub,
		BatchSize: batch, Observer: obs, Logger: quietLogger})
	defer dropSlot()
	r, err := relay.New(env.ob, env.relay, cfg)
	if err != nil {
		return nil, err
	}
	res.RSSReset = resetPeakRSS()
	if cpuprofile != "" {
		stop, err := startCPUProfile(cpuprofile)
		if err != nil {
			return nil, err
		}
		defer stop()
	}
	t, err := timeDrain(ctx, r, done, published.Load, rows, env.relay, env.table)
	if err != nil {
		return nil, err
	}
	el := t.Elapsed
	res.CPURelayMicros, res.CPUBrokerMicros, res.CPUPostgresMicros = cpuPerEvent(t.From, t.To, rows)
	res.Seconds = round2(el.Seconds())
	res.EventsPerSec = round2(float64(rows) / el.Seconds())
	res.PeakRSSMB = peakRSSMB()
	cmu.Lock()
	res.Batches = len(claims)
	res.ClaimMedianMicros = micros(quantile(claims, 0.5))
	res.ClaimP99Micros = micros(quantile(claims, 0.99))
	res.ClaimMaxMicros = micros(quantile(claims, 1))
	cmu.Unlock()
	if res.Batches > 0 {
		res.CycleMillis = round2(el.Seconds() * 1000 / float64(res.Batches))
	}
	if res.TableStateAfter, err = db.tableState(ctx, env.table, ""); err != nil {
		return nil, err
	}
	return res, nil
}

// resetPeakRSS resets VmHWM (Linux >= 4.0: "5" > /proc/self/clear_refs).
func resetPeakRSS() bool {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}

// peakRSSMB reads VmHWM from /proc/self/status, in MiB (0 where unavailable).
func peakRSSMB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return round2(kb / 1024)
		}
	}
	return 0
}

// startCPUProfile starts a CPU profile into path; stop ends it and closes
// the file.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}
