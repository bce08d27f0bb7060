package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
)

// TestMain lets the test binary serve as the bench's broker or relay child
// (startChildBroker and startChildRelay re-execute os.Args[0]).
func TestMain(m *testing.M) {
	maybeRunChild()
	os.Exit(m.Run())
}

func serverDSN(t *testing.T, env, def, drv string) string {
	t.Helper()
	dsn := os.Getenv(env)
	if dsn == "" {
		dsn = def
	}
	db, err := sql.Open(drv, dsn)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		err = db.PingContext(ctx)
		cancel()
		db.Close()
	}
	if err != nil {
		if os.Getenv("OUTBOX_TEST_REQUIRE") != "" {
			t.Fatalf("%s server required (OUTBOX_TEST_REQUIRE is set) but unavailable: %v", drv, err)
		}
		t.Skipf("SKIP: no server at %s (%v)", env, err)
	}
	return dsn
}

func TestSmoke(t *testing.T) {
	for _, tc := range []struct {
		name string
		dsn  func(t *testing.T) string
	}{
		{"sqlite", func(*testing.T) string { return "" }},
		{"postgres", func(t *testing.T) string {
			return serverDSN(t, "OUTBOX_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "pgx")
		}},
		{"mysql", func(t *testing.T) string {
			return serverDSN(t, "OUTBOX_TEST_MYSQL", "root@tcp(127.0.0.1:3306)/test", "mysql")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := tc.dsn(t)
			var out bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			// 8 writers, not 32: the servers are shared with other jobs
			// (PostgreSQL's max_connections).
			if err := run(ctx, []string{"-smoke", "-json", "-writers", "8", "-db", dsn}, &out); err != nil {
				t.Fatal(err)
			}
			checkResult(t, tc.name, out.Bytes())
		})
	}
}

func checkResult(t *testing.T, name string, raw []byte) {
	t.Helper()
	// Every expected field is present (decoded generically).
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, raw)
	}
	for _, k := range []string{"database", "broker", "cpus", "runs", "commit", "latency", "latency_standalone", "latency_seed",
		"latency_runs", "latency_standalone_runs", "latency_seed_runs", "drain", "drain_analyzed", "drain_runs", "history", "baseline", "burst", "burst_runs", "targets", "total_seconds"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	var r Result
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	if r.Database != name {
		t.Errorf("database = %q, want %q", r.Database, name)
	}
	if c := r.Commit; c == nil || len(c.Variants) < 4 {
		t.Fatalf("commit: %+v", r.Commit)
	}
	wantTrips := map[string]float64{}
	for _, v := range r.Commit.Variants {
		if v.MedianMicros <= 0 || v.N != r.Commit.Rounds || v.RoundTrips < 3 {
			t.Errorf("commit variant %+v", v)
		}
		wantTrips[v.Name] = v.RoundTrips
	}
	// begin + order INSERT + commit; the outbox adds one statement.
	if wantTrips["handwritten"] <= wantTrips["none"] || wantTrips["emit1"] <= wantTrips["none"] || wantTrips["emit10"] != wantTrips["emit1"] {
		t.Errorf("round trips: %v", wantTrips)
	}
	if r.Commit.RatioEmit1 <= 0 || r.Commit.RatioEmit10 <= 0 || r.Commit.Emit10VsMultirow <= 0 || r.Commit.MultirowVsHandwritten <= 0 {
		t.Errorf("commit ratios: %+v", r.Commit)
	}
	if r.Runs != 1 {
		t.Errorf("runs = %d, want 1 (-smoke)", r.Runs)
	}
	if (r.PGDriver == "pq") != (name == "postgres") {
		t.Errorf("pgdriver = %q on %s, want pq on postgres only", r.PGDriver, name)
	}
	checkBurst(t, "burst", r.Burst, 0, r.Runs)
	if len(r.BurstRuns) != r.Runs {
		t.Errorf("%d burst runs, want %d", len(r.BurstRuns), r.Runs)
	}
	for i, b := range r.BurstRuns {
		checkBurst(t, "burst_runs", b, i+1, 0)
	}
	checkDrain(t, name, "drain", r.Drain, variantNeverAnalyzed, 0, r.Runs)
	checkDrain(t, name, "drain_analyzed", r.DrainAnalyzed, variantAnalyzed, 0, r.Runs)
	if len(r.DrainRuns) != 2*r.Runs {
		t.Errorf("%d drain runs, want %d", len(r.DrainRuns), 2*r.Runs)
	}
	for i, d := range r.DrainRuns {
		variant := variantNeverAnalyzed
		if i%2 == 1 {
			variant = variantAnalyzed
		}
		checkDrain(t, name, "drain_runs", d, variant, i/2+1, 0)
	}
	if b := r.Baseline; b == nil || b.Sent <= 0 || b.EventsPerSec <= 0 {
		t.Errorf("baseline: %+v", r.Baseline)
	}
	if h := r.History; h == nil || len(h.Points) != 2 || h.Ratio <= 0 {
		t.Errorf("history: %+v", r.History)
	} else {
		for _, p := range h.Points {
			if p.Claims <= 0 || p.ClaimMedianMicros <= 0 || p.SeedClaimMedianMicros <= 0 {
				t.Errorf("history point %+v", p)
			}
		}
	}
	checkLatency(t, name, "latency", r.Latency, latencyRates, true, true, 0, r.Runs)
	checkLatency(t, name, "latency_standalone", r.LatencyStandalone, latencyRates, true, false, 0, r.Runs)
	checkLatency(t, name, "latency_seed", r.LatencySeed, seedRates, false, false, 0, r.Runs)
	for field, runs := range map[string][]*LatencyResult{"latency_runs": r.LatencyRuns, "latency_standalone_runs": r.LatencyStandaloneRuns, "latency_seed_runs": r.LatencySeedRuns} {
		if len(runs) != r.Runs {
			t.Errorf("%s: %d runs, want %d", field, len(runs), r.Runs)
		}
		for i, l := range runs {
			rates := latencyRates
			if field == "latency_seed_runs" {
				rates = seedRates
			}
			checkLatency(t, name, field, l, rates, field != "latency_seed_runs", field == "latency_runs", i+1, 0)
		}
	}
	if r.LatencySeed != nil && r.LatencySeed.Skipped == "" {
		t.Errorf("latency_seed does not say why 5000/s was not offered")
	}
	// commit 2, drain 2, in-process 3, standalone 2, history 1.
	if len(r.Targets) != 10 {
		t.Errorf("%d targets: %+v", len(r.Targets), r.Targets)
	}
	standalone := 0
	for _, tg := range r.Targets {
		if strings.HasPrefix(tg.Name, "in-process ") && name == "sqlite" {
			// The latency goals are PostgreSQL's and MariaDB's.
			if tg.Met != nil || !tg.Informational || tg.Got <= 0 {
				t.Errorf("target %+v on sqlite: want informational", tg)
			}
			continue
		}
		if !strings.HasPrefix(tg.Name, "standalone ") {
			if tg.Met == nil || tg.Informational {
				t.Errorf("target %+v: want met set, not informational", tg)
			}
			continue
		}
		standalone++
		// A target on PostgreSQL (NOTIFY); informational on MariaDB and
		// SQLite (adaptive poll).
		if pg := name == "postgres"; tg.Got <= 0 || (tg.Met != nil) != pg || tg.Informational == pg {
			t.Errorf("target %+v on %s", tg, name)
		}
	}
	if standalone != 2 {
		t.Errorf("%d standalone targets, want 2: %+v", standalone, r.Targets)
	}
}

// TestSoak runs the soak mode for a few seconds on each database and
// checks every field (not the speed: the claim verdict is only checked to
// agree with the intervals).
func TestSoak(t *testing.T) {
	for _, tc := range []struct {
		name string
		dsn  func(t *testing.T) string
	}{
		{"sqlite", func(*testing.T) string { return "" }},
		{"postgres", func(t *testing.T) string {
			return serverDSN(t, "OUTBOX_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "pgx")
		}},
		{"mysql", func(t *testing.T) string {
			return serverDSN(t, "OUTBOX_TEST_MYSQL", "root@tcp(127.0.0.1:3306)/test", "mysql")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := tc.dsn(t)
			var out bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			args := []string{"-soak", "2s", "-soak-interval", "1s", "-writers", "8", "-json", "-db", dsn}
			if tc.name == "postgres" {
				args = append(args, "-nonotify") // the smoke covers the default
			}
			if err := run(ctx, args, &out); err != nil {
				t.Fatal(err)
			}
			var r Result
			if err := json.Unmarshal(out.Bytes(), &r); err != nil {
				t.Fatalf("%v\n%s", err, out.Bytes())
			}
			s := r.Soak
			if s == nil || !slices.Equal(r.Parts, []string{"soak"}) || s.Rate != 1000 || s.Writers != 8 || s.Seconds != 2 || s.IntervalSeconds != 1 || s.Events != 2000 || len(s.Intervals) != 2 ||
				s.RecvP50Ms <= 0 || s.RecvP99Ms < s.RecvP50Ms || s.RecvP999Ms < s.RecvP99Ms || s.RecvMaxMs < s.RecvP999Ms ||
				s.Claims <= 0 || s.ClaimMaxMs < s.ClaimP99Ms || s.ClaimP99Ms < s.ClaimP50Ms {
				t.Fatalf("soak: %+v", s)
			}
			if pg := tc.name == "postgres"; r.NoNotify != pg || strings.Contains(s.Relay, "without NOTIFY") != pg {
				t.Errorf("nonotify %v, relay %q on %s", r.NoNotify, s.Relay, tc.name)
			}
			checkTableState(t, tc.name, "soak before", s.TableState, variantNeverAnalyzed)
			events, under, worst := 0, true, 0.0
			for i, iv := range s.Intervals {
				events += iv.Events
				under = under && iv.Claims > 0 && iv.ClaimP99Ms < 1
				// An interval may have no claim: under load its events
				// can be claimed in the next (claims go by wall clock).
				worst = max(worst, iv.ClaimP99Ms)
				if iv.Index != i+1 || iv.EndSeconds != float64(i+1) || iv.Events != 1000 || iv.RecvP50Ms <= 0 || iv.RecvMaxMs < iv.RecvP999Ms ||
					iv.CommitP50Ms <= 0 || iv.Claims < 0 || iv.ClaimMaxMs < iv.ClaimP99Ms {
					t.Errorf("interval %+v", iv)
				}
				checkTableState(t, tc.name, "soak interval", iv.TableState, variantNeverAnalyzed)
			}
			if events != s.Events || under != s.ClaimP99Under1msEvery || worst != s.WorstClaimP99Ms {
				t.Errorf("soak summary %+v disagrees with its intervals", s)
			}
			if len(r.Targets) != 1 || r.Targets[0].Met == nil || *r.Targets[0].Met != s.ClaimP99Under1msEvery {
				t.Errorf("targets %+v", r.Targets)
			}
		})
	}
}

// checkDrain checks one drain result: a run (run > 0, with its table
// states) or a median of runs (runs > 0, without).
func checkDrain(t *testing.T, db, field string, d *DrainResult, variant string, run, runs int) {
	t.Helper()
	if d == nil || d.Variant != variant || d.Run != run || d.Runs != runs || d.Rows != 2000 || d.Aggregates != 100 || d.EventsPerSec <= 0 || d.Seconds <= 0 ||
		d.PeakRSSMB <= 0 || d.SpeedupBaseline <= 0 || d.Batches <= 0 || d.ClaimMedianMicros <= 0 || d.ClaimP99Micros < d.ClaimMedianMicros || d.ClaimMaxMicros < d.ClaimP99Micros {
		t.Errorf("%s: %+v", field, d)
		return
	}
	if run == 0 {
		if d.TableState != nil || d.TableStateAfter != nil {
			t.Errorf("%s: a median with table states: %+v", field, d)
		}
		return
	}
	checkTableState(t, db, field+" before", d.TableState, variant)
	checkTableState(t, db, field+" after", d.TableStateAfter, variant)
}

// checkTableState checks a table state read on db for variant.
func checkTableState(t *testing.T, db, what string, s *TableState, variant string) {
	t.Helper()
	if s == nil || s.Table == "" {
		t.Errorf("%s: no table state", what)
		return
	}
	switch db {
	case "postgres":
		if s.ServerAutovacuum == "" || !strings.Contains(s.RelOptions, "autovacuum_enabled=false") || s.LastAutoanalyze != nil ||
			(s.LastAnalyze != nil) != (variant == variantAnalyzed) || s.NLiveTup < 0 || s.NDeadTup < 0 || len(s.Relations) < 4 {
			t.Errorf("%s: %+v", what, s)
		}
		for _, rel := range s.Relations {
			if rel.Name == "" || rel.Bytes < 0 {
				t.Errorf("%s: relation %+v", what, rel)
			}
		}
	case "mysql":
		if s.HistoryListLength < 0 || len(s.Relations) != 1 || s.Relations[0].Bytes <= 0 {
			t.Errorf("%s: %+v", what, s)
		}
	default:
		if s.LastAnalyze != nil || s.ServerAutovacuum != "" || len(s.Relations) != 0 {
			t.Errorf("%s: %+v", what, s)
		}
	}
}

// checkBurst checks one burst result of a smoke run: a closed-loop point
// (offered 0) for each of the smoke's writer counts (4 and 8), every event
// measured, sane quantiles, and the relay's claims and Publishes timed.
func checkBurst(t *testing.T, field string, l *LatencyResult, run, runs int) {
	t.Helper()
	if l == nil || len(l.Points) != 2 || l.Relay == "" || l.Run != run || l.Runs != runs {
		t.Errorf("%s: %+v", field, l)
		return
	}
	for i, p := range l.Points {
		if p.Writers != []int{4, 8}[i] || p.OfferedPerSec != 0 || p.Events != 300 || p.AchievedPerSec <= 0 || p.CommitP50Ms <= 0 ||
			p.AckP50Ms <= 0 || p.AckP99Ms < p.AckP50Ms || p.RecvP50Ms <= 0 || p.RecvP99Ms < p.RecvP50Ms || p.RecvMaxMs < p.RecvP99Ms ||
			p.Claims == 0 || p.ClaimP50Ms <= 0 || p.PublishP50Ms <= 0 || p.PublishBatchAvg <= 0 {
			t.Errorf("%s point %d: %+v", field, i, p)
		}
	}
}

// checkLatency checks one latency result of a smoke run: one point per
// rate with every event measured, sane quantiles, and (withSeed) ratios
// against the seed's points at its rates.
func checkLatency(t *testing.T, db, field string, l *LatencyResult, rates []int, withSeed, withClaims bool, run, runs int) {
	t.Helper()
	if l == nil || len(l.Points) != len(rates) || l.Relay == "" || l.Writers != 8 || l.Seconds <= 0 || l.Run != run || l.Runs != runs {
		t.Errorf("%s: %+v", field, l)
		return
	}
	if run > 0 {
		checkTableState(t, db, field+" before", l.TableState, variantNeverAnalyzed)
		checkTableState(t, db, field+" after", l.TableStateAfter, variantNeverAnalyzed)
	} else if l.TableState != nil || l.TableStateAfter != nil {
		t.Errorf("%s: a median with table states", field)
	}
	for i, p := range l.Points {
		if p.OfferedPerSec != rates[i] || p.Events != int(float64(rates[i])*l.Seconds) || p.AchievedPerSec <= 0 || p.CommitP50Ms <= 0 ||
			p.AckP50Ms <= 0 || p.AckP99Ms < p.AckP50Ms || p.AckP999Ms < p.AckP99Ms || p.AckMaxMs < p.AckP999Ms ||
			p.RecvP50Ms <= 0 || p.RecvP99Ms < p.RecvP50Ms || p.RecvP999Ms < p.RecvP99Ms || p.RecvMaxMs < p.RecvP999Ms {
			t.Errorf("%s point %+v", field, p)
		}
		if claims := p.Claims > 0 && p.ClaimMaxMs > 0 && p.ClaimP99Ms >= p.ClaimP50Ms && p.ClaimMaxMs >= p.ClaimP99Ms; claims != withClaims {
			t.Errorf("%s point at %d/s: claims %v, want %v: %+v", field, p.OfferedPerSec, claims, withClaims, p)
		}
		seeded := withSeed && slices.Contains(seedRates, p.OfferedPerSec)
		if got := p.SeedRatioAckP50 > 0 && p.SeedRatioAckP99 > 0 && p.SeedRatioRecvP50 > 0 && p.SeedRatioRecvP99 > 0; got != seeded {
			t.Errorf("%s point at %d/s: seed ratios %v, want %v: %+v", field, p.OfferedPerSec, got, seeded, p)
		}
	}
}

// TestSmokeBrokers runs part "brokers" (-smoke sizes) on SQLite and, if
// it answers, PostgreSQL: every broker's drain and latency on the same
// database in one run. A broker whose server does not answer is reported
// as not measured; under CI=true (or OUTBOX_TEST_REQUIRE) that fails the
// test (CI has every server), elsewhere it is logged.
func TestSmokeBrokers(t *testing.T) {
	for _, tc := range []struct {
		name string
		dsn  func(t *testing.T) string
	}{
		{"sqlite", func(*testing.T) string { return "" }},
		{"postgres", func(t *testing.T) string {
			return serverDSN(t, "OUTBOX_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "pgx")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := tc.dsn(t)
			var out bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			args := []string{"-smoke", "-json", "-only", "brokers", "-writers", "8", "-db", dsn}
			for env, flag := range map[string]string{"OUTBOX_TEST_NATS": "-nats", "OUTBOX_TEST_RABBITMQ": "-amqp", "OUTBOX_TEST_REDIS": "-redis"} {
				if v := os.Getenv(env); v != "" {
					args = append(args, flag, v)
				}
			}
			if err := run(ctx, args, &out); err != nil {
				t.Fatal(err)
			}
			checkBrokers(t, tc.name, out.Bytes(), os.Getenv("CI") == "true" || os.Getenv("OUTBOX_TEST_REQUIRE") != "")
		})
	}
}

func checkBrokers(t *testing.T, name string, raw []byte, requireAll bool) {
	t.Helper()
	var r Result
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, raw)
	}
	if r.Database != name || !slices.Equal(r.Parts, []string{"brokers"}) {
		t.Errorf("database %q, parts %v", r.Database, r.Parts)
	}
	b := r.Brokers
	if b == nil {
		t.Fatalf("JSON lacks brokers:\n%s", raw)
	}
	names := checkBrokerResults(t, b, r.Runs, requireAll)
	if !slices.Equal(names, []string{"kafka", "nats", "rabbitmq", "redis"}) {
		t.Errorf("brokers %v, want kafka, nats, rabbitmq, redis", names)
	}
}

// checkBrokerResults checks the results of part "brokers" (or
// "exactlyonce", which runs the same measurements) at -smoke sizes with 8
// writers, and returns the brokers' names in order.
func checkBrokerResults(t *testing.T, b *BrokersResult, runs int, requireAll bool) []string {
	t.Helper()
	if b.Rows != 2_000 || b.Aggregates != 100 || b.OfferedPerSec != 1000 || b.Seconds <= 0 || b.Writers != 8 {
		t.Errorf("brokers: %+v", b)
	}
	var names []string
	for _, br := range b.Brokers {
		names = append(names, br.Broker)
		if br.Setup == "" {
			t.Errorf("%s: no setup", br.Broker)
		}
		if !br.Measured {
			if br.NotMeasured == "" || br.Drain != nil || br.Latency != nil {
				t.Errorf("%s: not measured without a reason, or with figures: %+v", br.Broker, br)
			}
			if requireAll {
				t.Errorf("%s NOT MEASURED under CI=true: %s", br.Broker, br.NotMeasured)
			} else {
				t.Logf("%s NOT MEASURED (its server is not here): %s", br.Broker, br.NotMeasured)
			}
			continue
		}
		if len(br.DrainRuns) != runs || len(br.LatencyRuns) != runs {
			t.Errorf("%s: %d drain and %d latency runs, want %d", br.Broker, len(br.DrainRuns), len(br.LatencyRuns), runs)
		}
		if d := br.Drain; d == nil || d.Rows != b.Rows || d.EventsPerSec <= 0 || d.Seconds <= 0 || d.Variant != variantNeverAnalyzed {
			t.Errorf("%s: drain %+v", br.Broker, br.Drain)
		}
		l := br.Latency
		if l == nil || len(l.Points) != 1 {
			t.Errorf("%s: latency %+v", br.Broker, l)
			continue
		}
		p := l.Points[0]
		if p.OfferedPerSec != 1000 || p.Events <= 0 || p.AchievedPerSec <= 0 ||
			p.RecvP50Ms <= 0 || p.RecvP99Ms < p.RecvP50Ms || p.RecvP999Ms < p.RecvP99Ms || p.RecvMaxMs < p.RecvP999Ms ||
			p.AckP50Ms <= 0 || p.AckP50Ms > p.RecvMaxMs {
			t.Errorf("%s: latency point %+v", br.Broker, p)
		}
	}
	return names
}

// TestSmokeExactlyOnce runs part "exactlyonce" (-smoke sizes) on SQLite:
// the Kafka publisher's default mode and its exactly-once mode, each
// drained and measured at 1,000 events/s, the latter read at
// read_committed.
func TestSmokeExactlyOnce(t *testing.T) {
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := run(ctx, []string{"-smoke", "-json", "-only", "exactlyonce", "-writers", "8"}, &out); err != nil {
		t.Fatal(err)
	}
	var r Result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out.Bytes())
	}
	if r.ExactlyOnce == nil || r.Brokers != nil || !slices.Equal(r.Parts, []string{"exactlyonce"}) {
		t.Fatalf("parts %v, exactly_once %v:\n%s", r.Parts, r.ExactlyOnce, out.Bytes())
	}
	if names := checkBrokerResults(t, r.ExactlyOnce, r.Runs, true); !slices.Equal(names, []string{"kafka", "kafka_eos"}) {
		t.Errorf("modes %v, want kafka, kafka_eos", names)
	}
}

// TestBrokersNotReachable: a broker whose server does not answer is
// reported as not measured, with the reason and no figures, and said on
// the warning channel; the run does not fail.
func TestBrokersNotReachable(t *testing.T) {
	t.Parallel()
	var warned []string
	res, err := runBrokers(t.Context(), nil, []endpoint{natsEndpoint{"nats://127.0.0.1:1"}, rabbitEndpoint{"amqp://guest:guest@127.0.0.1:1/"}, redisEndpoint{"127.0.0.1:1"}},
		100, 10, 0, brokersRate, time.Second, 1, 1, "", func(s string) { warned = append(warned, s) })
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Brokers) != 3 {
		t.Fatalf("brokers %+v", res.Brokers)
	}
	for i, br := range res.Brokers {
		if br.Measured || !strings.HasPrefix(br.NotMeasured, "not reachable") || br.Drain != nil || br.Latency != nil || br.DrainRuns != nil {
			t.Errorf("%+v", br)
		}
		if i >= len(warned) || !strings.HasPrefix(warned[i], "NOT MEASURED: "+br.Broker) {
			t.Errorf("warnings %q", warned)
		}
	}
	var out bytes.Buffer
	printTables(&out, &Result{Brokers: res})
	if strings.Count(out.String(), "NOT MEASURED") != 6 {
		t.Errorf("table:\n%s", out.String())
	}
}

// TestSmokeHandover runs part "handover" (-smoke sizes) on SQLite: one
// relay alone, then a second joining during the load, each measured, the
// second's takeover time reported and the target listed.
func TestSmokeHandover(t *testing.T) {
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := run(ctx, []string{"-smoke", "-json", "-only", "handover", "-writers", "8"}, &out); err != nil {
		t.Fatal(err)
	}
	var r Result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out.Bytes())
	}
	h := r.Handover
	if h == nil || len(h.Runs) != 2*r.Runs || h.Steady == nil || h.Join == nil || h.JoinTakeoverMs <= 0 {
		t.Fatalf("handover %+v:\n%s", h, out.Bytes())
	}
	for _, l := range h.Runs {
		if len(l.Points) != 1 || l.Points[0].Events == 0 || l.Points[0].RecvP99Ms <= 0 {
			t.Errorf("run %+v", l)
		}
	}
	found := false
	for _, tg := range r.Targets {
		found = found || strings.Contains(tg.Name, "while a second relay joins")
	}
	if !found {
		t.Errorf("no handover target in %+v", r.Targets)
	}
}
