package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/relay"
)

// walDrainModes are part "waldrain"'s relays, in the order each run
// measures them: the polling relay (rows, claimed), the WAL source in
// table mode (rows, read from the slot), and in log-only mode
// (driver.Config.LogOnly: logical decoding messages, no rows).
var walDrainModes = []string{"table", "wal", "log"}

// walDrainEOSModes are part "waldrain"'s modes in the Kafka publisher's
// exactly-once mode, run only when -waldrain-modes names them: the
// polling relay (table_eos) and the WAL source with log-only writers
// (log_eos, where the relay writes each event to the table before it
// publishes the row).
var walDrainEOSModes = []string{"table_eos", "log_eos"}

// walDrainTxn is how many events each writer transaction of the backlog
// holds.
const walDrainTxn = 100

// WALDrainRun is one drain of part "waldrain".
type WALDrainRun struct {
	Mode         string  `json:"mode"`
	Run          int     `json:"run"`
	Events       int     `json:"events"`
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"events_per_sec"`
	// FromWAL and FromTable are the relay's counts by source
	// (relay.SourceObserver); TableRows the rows in the outbox table
	// after the drain (log-only mode: what the relay had to write there).
	FromWAL   int `json:"from_wal"`
	FromTable int `json:"from_table"`
	TableRows int `json:"table_rows"`
	// CPURelayMicros, CPUBrokerMicros and CPUPostgresMicros are CPU time
	// per event over the drain, in µs (as in DrainResult).
	CPURelayMicros    float64 `json:"cpu_relay_us_per_event"`
	CPUBrokerMicros   float64 `json:"cpu_broker_us_per_event"`
	CPUPostgresMicros float64 `json:"cpu_postgres_us_per_event"`
}

// WALDrainResult is part "waldrain" (issue 35's drain: log-only >= 200k
// events/s, table mode >= 120k): per mode the median run, and every run.
type WALDrainResult struct {
	Events  int                     `json:"events"`
	Medians map[string]*WALDrainRun `json:"medians"`
	Runs    []*WALDrainRun          `json:"runs"`
}

// runWALDrain runs part "waldrain" runs times, the modes interleaved per
// run: each writes a backlog of events (transactions of walDrainTxn
// events over aggs aggregates, through the driver) while no relay runs,
// the slot (wal, log) made first so that it keeps them, then starts one
// relay and times it until every event is acknowledged (and, with rows,
// marked sent).
func runWALDrain(ctx context.Context, db *database, ep endpoint, modes []string, events, aggs, batch, runs int, cpuprofile string, logf func(string, ...any)) (*WALDrainResult, error) {
	if db.dialect != driver.Postgres {
		return nil, errors.New("part waldrain needs PostgreSQL")
	}
	for _, m := range modes {
		if !slices.Contains(walDrainModes, m) && !slices.Contains(walDrainEOSModes, m) {
			return nil, fmt.Errorf("part waldrain: unknown mode %q (want %s)", m, strings.Join(append(slices.Clone(walDrainModes), walDrainEOSModes...), ","))
		}
	}
	res := &WALDrainResult{Events: events, Medians: map[string]*WALDrainRun{}}
	by := map[string][]*WALDrainRun{}
	for run := 1; run <= runs; run++ {
		for _, mode := range modes {
			logf("part waldrain: %d events, %s, run %d of %d", events, mode, run, runs)
			d, err := runWALDrainOnce(ctx, db, ep, mode, events, aggs, batch, run, cpuprofile)
			if err != nil {
				return nil, fmt.Errorf("waldrain (%s, run %d): %w", mode, run, err)
			}
			res.Runs = append(res.Runs, d)
			by[mode] = append(by[mode], d)
		}
	}
	for mode, rs := range by {
		vals := make([]WALDrainRun, len(rs))
		for i, r := range rs {
			vals[i] = *r
		}
		m := medianOf(vals)
		m.Run = 0
		res.Medians[mode] = &m
	}
	return res, nil
}

// sourceCounter counts the relay's messages by source.
type sourceCounter struct {
	observer
	wal, table atomic.Int64
}

func (o *sourceCounter) WALStreaming(bool, error) {}
func (o *sourceCounter) FromSource(s relay.Source, n int) {
	if s == relay.SourceWAL {
		o.wal.Add(int64(n))
		return
	}
	o.table.Add(int64(n))
}

func runWALDrainOnce(ctx context.Context, db *database, ep endpoint, mode string, events, aggs, batch, run int, cpuprofile string) (*WALDrainRun, error) {
	env, err := db.newOutbox(ctx, fmt.Sprintf("ob_waldrain_%s_%d", mode, run), 1)
	if err != nil {
		return nil, err
	}
	defer env.close()
	writer := env.app
	ob := env.ob
	if strings.HasSuffix(mode, "_eos") {
		k, ok := ep.(kafkaEndpoint)
		if !ok {
			return nil, fmt.Errorf("mode %s needs Kafka", mode)
		}
		ep = kafkaEOSEndpoint{k}
	}
	if mode == "log" || mode == "log_eos" {
		if ob, err = driver.New(driver.Config{Dialect: driver.Postgres, Table: env.table, LogOnly: true}); err != nil {
			return nil, err
		}
		c, err := db.raw()
		if err != nil {
			return nil, err
		}
		writer = sql.OpenDB(ob.WrapConnector(c))
		defer writer.Close()
	}
	cfg := relay.Config{BatchSize: batch, Logger: quietLogger}
	if mode != "table" && mode != "table_eos" {
		cfg.Source = relay.SourceWAL
		cfg.WAL = relay.WALConfig{DSN: db.dsn, Slot: "outbox_bench_" + randomHex(6)}
		if _, err := relay.CreateWAL(ctx, ob, db.admin, cfg.WAL); err != nil {
			return nil, err
		}
		defer func() {
			dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for dctx.Err() == nil {
				// The stopped relay's walsender may hold the slot a moment.
				if err := relay.DropWAL(dctx, ob, db.admin, cfg.WAL); err == nil || !errors.Is(err, relay.ErrWALUnavailable) {
					return
				}
				_, _ = db.admin.ExecContext(dctx, "SELECT pg_sleep(0.05)")
			}
		}()
	}
	if err := writeBacklog(ctx, writer, events, aggs); err != nil {
		return nil, err
	}
	rt, err := ep.open(ctx, "waldrain", false)
	if err != nil {
		return nil, err
	}
	defer rt.close()
	var published atomic.Int64
	done := make(chan struct{})
	var once sync.Once
	obs := &sourceCounter{observer: observer{published: func(relay.Message) {
		if published.Add(1) >= int64(events) {
			once.Do(func() { close(done) })
		}
	}}}
	cfg.Publisher, cfg.Observer = rt.pub, obs
	r, err := relay.New(ob, env.relay, cfg)
	if err != nil {
		return nil, err
	}
	if cpuprofile != "" {
		stop, err := startCPUProfile(cpuprofile + "." + mode)
		if err != nil {
			return nil, err
		}
		defer stop()
	}
	t, err := timeDrain(ctx, r, done, published.Load, events, env.relay, env.table)
	if err != nil {
		return nil, err
	}
	el := t.Elapsed
	relayCPU, brokerCPU, pgCPU := cpuPerEvent(t.From, t.To, events)
	d := &WALDrainRun{Mode: mode, Run: run, Events: events, Seconds: round2(el.Seconds()), EventsPerSec: round2(float64(events) / el.Seconds()),
		FromWAL: int(obs.wal.Load()), FromTable: int(obs.table.Load()), CPURelayMicros: relayCPU, CPUBrokerMicros: brokerCPU, CPUPostgresMicros: pgCPU}
	if err := env.relay.QueryRowContext(ctx, "SELECT count(*) FROM "+env.table).Scan(&d.TableRows); err != nil {
		return nil, err
	}
	return d, nil
}

// writeBacklog commits events through db's outbox driver, walDrainTxn per
// transaction, spread over aggs aggregates, from 4 writers.
func writeBacklog(ctx context.Context, db *sql.DB, events, aggs int) error {
	const writers = 4
	txns := (events + walDrainTxn - 1) / walDrainTxn
	var next atomic.Int64
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		go func() {
			for {
				t := int(next.Add(1)) - 1
				if t >= txns {
					errs <- nil
					return
				}
				tctx := outbox.NewContext(ctx)
				tx, err := db.BeginTx(tctx, nil)
				if err != nil {
					errs <- err
					return
				}
				for k := t * walDrainTxn; k < min((t+1)*walDrainTxn, events); k++ {
					if err := outbox.Emit(tctx, outbox.Event{ID: "w-" + strconv.Itoa(k), AggregateType: "order", AggregateID: "agg-" + strconv.Itoa(k%aggs),
						Type: "order.paid", ContentType: "application/json", Payload: payload}); err != nil {
						_ = tx.Rollback()
						errs <- err
						return
					}
				}
				if err := tx.Commit(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var first error
	for w := 0; w < writers; w++ {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}
