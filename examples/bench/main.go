// Command bench measures the outbox on PostgreSQL, MariaDB/MySQL or SQLite
// against the seed's hand-written outbox and polling relay, with an
// in-process Kafka-protocol broker (franz-go's kfake, run in a child
// process of the bench) or a real one (-brokers).
//
//	go run ./examples/bench                          # embedded SQLite
//	go run ./examples/bench -db 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//	go run ./examples/bench -db 'root@tcp(127.0.0.1:3306)/test' -json
//	go run ./examples/bench -smoke -json             # seconds; CI
//
// Parts (-only, comma separated): commit (1: commit overhead and round
// trips), latency (2: commit -> ack / -> consumer at offered loads),
// drain (3: drain throughput and peak RSS), history (4: claim cost with
// sent history), baseline (5: the seed's relay draining the same preload).
// Every run uses its own schema (PostgreSQL), database (MySQL) or file
// (SQLite), dropped at the end.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"
)

type options struct {
	db         string
	brokers    string
	json       bool
	rows       int
	history    int
	smoke      bool
	only       string
	cpuprofile string
	iters      int
	batch      int
	loadSecs   float64
	writers    int
	baseCap    time.Duration
}

// Result is the -json output: one object.
type Result struct {
	Database  string          `json:"database"`
	Broker    string          `json:"broker"`
	GoVersion string          `json:"go_version"`
	CPUs      int             `json:"cpus"`
	Smoke     bool            `json:"smoke"`
	Parts     []string        `json:"parts"`
	Commit    *CommitResult   `json:"commit,omitempty"`
	Latency   *LatencyResult  `json:"latency,omitempty"`
	Drain     *DrainResult    `json:"drain,omitempty"`
	History   *HistoryResult  `json:"history,omitempty"`
	Baseline  *BaselineResult `json:"baseline,omitempty"`
	Targets   []Target        `json:"targets"`
	TotalSecs float64         `json:"total_seconds"`
}

// Target is one of the targets, checked against this run.
type Target struct {
	Name string  `json:"name"`
	Want string  `json:"want"`
	Got  float64 `json:"got"`
	Met  bool    `json:"met"`
}

var allParts = []string{"commit", "latency", "drain", "history", "baseline"}

func main() {
	maybeRunBroker()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&o.db, "db", "", "database: empty = embedded SQLite temp file; a postgres:// URL; a MySQL DSN (user@tcp(host:port)/db)")
	fs.StringVar(&o.brokers, "brokers", "", "Kafka bootstrap brokers (comma separated); empty = in-process kfake broker in a child process")
	fs.BoolVar(&o.json, "json", false, "print one JSON object instead of tables")
	fs.IntVar(&o.rows, "rows", 100_000, "pending rows preloaded for the drain (part 3)")
	fs.IntVar(&o.history, "history", 1_000_000, "sent rows of history for part 4 (compared with 10,000)")
	fs.BoolVar(&o.smoke, "smoke", false, "tiny sizes, finishes in seconds (CI)")
	fs.StringVar(&o.only, "only", "", "comma list of parts: "+strings.Join(allParts, ","))
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile (pprof) of the drain to this file")
	fs.IntVar(&o.iters, "iters", 2000, "transactions per variant for part 1")
	fs.IntVar(&o.batch, "batch", 0, "relay BatchSize for the drain (0 = relay default)")
	fs.Float64Var(&o.loadSecs, "load-seconds", 5, "seconds per offered load in part 2")
	fs.IntVar(&o.writers, "writers", 16, "writer goroutines in part 2")
	fs.DurationVar(&o.baseCap, "baseline-cap", 10*time.Second, "how long the seed's relay drains in part 5")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.smoke {
		o.rows, o.history, o.iters, o.loadSecs, o.baseCap = 2_000, 20_000, 30, 0.5, time.Second
	}
	return o, nil
}

func run(ctx context.Context, args []string, out io.Writer) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	parts := allParts
	if o.only != "" {
		parts = nil
		for _, p := range strings.Split(o.only, ",") {
			p = strings.TrimSpace(p)
			ok := false
			for _, a := range allParts {
				ok = ok || a == p
			}
			if !ok {
				return fmt.Errorf("-only: unknown part %q (want %s)", p, strings.Join(allParts, ","))
			}
			parts = append(parts, p)
		}
	}
	want := map[string]bool{}
	for _, p := range parts {
		want[p] = true
	}
	began := time.Now()
	db, err := openDatabase(ctx, o.db)
	if err != nil {
		return err
	}
	defer db.close()
	res := &Result{Database: db.label, GoVersion: runtime.Version(), CPUs: runtime.NumCPU(), Smoke: o.smoke, Parts: parts}
	var brokers []string
	if o.brokers != "" {
		brokers = strings.Split(o.brokers, ",")
		res.Broker = "external " + o.brokers
	} else {
		b, err := startChildBroker()
		if err != nil {
			return err
		}
		defer b.Close()
		brokers = b.addrs
		res.Broker = "kfake (child process)"
	}
	logf := func(format string, a ...any) {
		if !o.json {
			fmt.Fprintf(os.Stderr, "bench: "+format+"\n", a...)
		}
	}
	if want["commit"] {
		logf("part 1: commit overhead, %d transactions per variant", o.iters)
		if res.Commit, err = runCommit(ctx, db, o.iters); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
	}
	if want["drain"] {
		logf("part 3: drain of %d preloaded rows", o.rows)
		if res.Drain, err = runDrain(ctx, db, brokers, o.rows, o.batch, o.cpuprofile); err != nil {
			return fmt.Errorf("drain: %w", err)
		}
	}
	if want["baseline"] {
		rows := min(o.rows, 50_000)
		logf("part 5: seed relay on %d preloaded rows, at most %s", rows, o.baseCap)
		if res.Baseline, err = runBaseline(ctx, db, brokers, rows, o.baseCap); err != nil {
			return fmt.Errorf("baseline: %w", err)
		}
		if res.Drain != nil && res.Baseline.EventsPerSec > 0 {
			res.Drain.BaselinePerSec = res.Baseline.EventsPerSec
			res.Drain.SpeedupBaseline = ratio(res.Drain.EventsPerSec, res.Baseline.EventsPerSec)
		}
	}
	if want["history"] {
		sizes := []int{10_000, o.history}
		if o.smoke {
			sizes = []int{1_000, o.history}
		}
		pend := 10_000
		if o.smoke {
			pend = 1_000
		}
		logf("part 4: claim cost with %v sent rows", sizes)
		if res.History, err = runHistory(ctx, db, brokers, sizes, pend); err != nil {
			return fmt.Errorf("history: %w", err)
		}
	}
	if want["latency"] {
		rates := []int{100, 1000, 5000}
		logf("part 2: latency at %v events/s, %.1f s each", rates, o.loadSecs)
		if res.Latency, err = runLatency(ctx, db, brokers, rates, time.Duration(o.loadSecs*float64(time.Second)), o.writers); err != nil {
			return fmt.Errorf("latency: %w", err)
		}
	}
	res.Targets = targets(res)
	res.TotalSecs = round2(time.Since(began).Seconds())
	if o.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	printTables(out, res)
	return nil
}

func targets(r *Result) []Target {
	var ts []Target
	if r.Commit != nil {
		ts = append(ts,
			Target{"commit: Emit(1) / hand-written INSERT (c/b)", "<= 1.10", r.Commit.RatioEmit1, r.Commit.RatioEmit1 <= 1.10},
			Target{"commit: Emit(10) / hand-written INSERT (d/b)", "<= 1.25", r.Commit.RatioEmit10, r.Commit.RatioEmit10 <= 1.25})
	}
	if r.Drain != nil {
		ts = append(ts, Target{"drain events/s, one relay (PostgreSQL target)", ">= 50000", r.Drain.EventsPerSec, r.Drain.EventsPerSec >= 50000})
	}
	if r.Latency != nil {
		for _, p := range r.Latency.Points {
			if p.OfferedPerSec == 1000 {
				ts = append(ts,
					Target{"commit->ack p50 ms at 1,000/s", "<= 2", p.AckP50Ms, p.AckP50Ms <= 2},
					Target{"commit->ack p99 ms at 1,000/s", "<= 10", p.AckP99Ms, p.AckP99Ms <= 10})
			}
		}
	}
	if r.History != nil {
		ts = append(ts, Target{"claim time, most history / 10k", "<= 2", r.History.Ratio, r.History.Ratio <= 2})
	}
	return ts
}

func printTables(out io.Writer, r *Result) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	defer w.Flush()
	fmt.Fprintf(w, "database %s, broker %s, %s, %d CPUs, %.1f s\n\n", r.Database, r.Broker, r.GoVersion, r.CPUs, r.TotalSecs)
	if c := r.Commit; c != nil {
		fmt.Fprintf(w, "1. commit overhead (%d rounds)\tmedian µs\tp99 µs\tround trips\t\n", c.Rounds)
		for _, v := range c.Variants {
			fmt.Fprintf(w, "%s\t%.1f\t%.1f\t%.2f\t\n", v.Name, v.MedianMicros, v.P99Micros, v.RoundTrips)
		}
		fmt.Fprintf(w, "emit1/handwritten (c/b)\t%.2fx\t\t%.2fx\t\n", c.RatioEmit1, c.RoundTripsRatio1)
		fmt.Fprintf(w, "emit10/handwritten (d/b)\t%.2fx\t\t%.2fx\t\n", c.RatioEmit10, c.RoundTripsRatio10)
		fmt.Fprintf(w, "emit10/handwritten10\t%.2fx\t\t\t\n\n", c.Emit10VsHandwritten10)
	}
	if l := r.Latency; l != nil {
		fmt.Fprintf(w, "2. latency, in-process relay (ms)\tachieved/s\tack p50\tp99\tp99.9\trecv p50\tp99\tp99.9\tcommit p50\t\n")
		for _, p := range l.Points {
			fmt.Fprintf(w, "%d/s\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", p.OfferedPerSec, p.AchievedPerSec,
				p.AckP50Ms, p.AckP99Ms, p.AckP999Ms, p.RecvP50Ms, p.RecvP99Ms, p.RecvP999Ms, p.CommitP50Ms)
		}
		fmt.Fprintln(w)
	}
	if d := r.Drain; d != nil {
		fmt.Fprintf(w, "3. drain\trows\tseconds\tevents/s\tpeak RSS MiB\tvs seed\tbatches\tclaim p50 µs\tms/batch\t\n")
		fmt.Fprintf(w, "relay\t%d\t%.2f\t%.0f\t%.1f\t%.1fx\t%d\t%.0f\t%.2f\t\n", d.Rows, d.Seconds, d.EventsPerSec, d.PeakRSSMB, d.SpeedupBaseline, d.Batches, d.ClaimMedianMicros, d.CycleMillis)
	}
	if b := r.Baseline; b != nil {
		fmt.Fprintf(w, "5. seed relay\t%d sent\t%.2f\t%.0f\t\t1.0x\t\n\n", b.Sent, b.Seconds, b.EventsPerSec)
	} else if r.Drain != nil {
		fmt.Fprintln(w)
	}
	if h := r.History; h != nil {
		fmt.Fprintf(w, "4. history (%d pending)\tclaim median µs\tp99 µs\tclaims\tseed claim µs\t\n", h.Pending)
		for _, p := range h.Points {
			fmt.Fprintf(w, "%d sent\t%.1f\t%.1f\t%d\t%.1f\t\n", p.SentRows, p.ClaimMedianMicros, p.ClaimP99Micros, p.Claims, p.SeedClaimMedianMicros)
		}
		fmt.Fprintf(w, "ratio\t%.2fx\t\t\t%.2fx\t\n\n", h.Ratio, h.SeedRatio)
	}
	fmt.Fprintf(w, "target\twant\tgot\tmet\t\n")
	for _, t := range r.Targets {
		fmt.Fprintf(w, "%s\t%s\t%.2f\t%v\t\n", t.Name, t.Want, t.Got, t.Met)
	}
}
