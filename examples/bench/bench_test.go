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
			if err := run(ctx, []string{"-smoke", "-json", "-db", dsn}, &out); err != nil {
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
	for _, k := range []string{"database", "broker", "cpus", "commit", "latency", "latency_standalone", "latency_seed", "drain", "history", "baseline", "targets", "total_seconds"} {
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
	if d := r.Drain; d == nil || d.Rows != 2000 || d.EventsPerSec <= 0 || d.Seconds <= 0 || d.PeakRSSMB <= 0 || d.SpeedupBaseline <= 0 {
		t.Errorf("drain: %+v", r.Drain)
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
	checkLatency(t, "latency", r.Latency, latencyRates, true)
	checkLatency(t, "latency_standalone", r.LatencyStandalone, latencyRates, true)
	checkLatency(t, "latency_seed", r.LatencySeed, seedRates, false)
	if r.LatencySeed != nil && r.LatencySeed.Skipped == "" {
		t.Errorf("latency_seed does not say why 5000/s was not offered")
	}
	if len(r.Targets) != 8 {
		t.Errorf("%d targets: %+v", len(r.Targets), r.Targets)
	}
	standalone := 0
	for _, tg := range r.Targets {
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

// checkLatency checks one latency result of a smoke run: one point per
// rate with every event measured, sane quantiles, and (withSeed) ratios
// against the seed's points at its rates.
func checkLatency(t *testing.T, field string, l *LatencyResult, rates []int, withSeed bool) {
	t.Helper()
	if l == nil || len(l.Points) != len(rates) || l.Relay == "" || l.Writers <= 0 || l.Seconds <= 0 {
		t.Errorf("%s: %+v", field, l)
		return
	}
	for i, p := range l.Points {
		if p.OfferedPerSec != rates[i] || p.Events != int(float64(rates[i])*l.Seconds) || p.AchievedPerSec <= 0 || p.CommitP50Ms <= 0 ||
			p.AckP50Ms <= 0 || p.AckP99Ms < p.AckP50Ms || p.AckP999Ms < p.AckP99Ms ||
			p.RecvP50Ms <= 0 || p.RecvP99Ms < p.RecvP50Ms || p.RecvP999Ms < p.RecvP99Ms {
			t.Errorf("%s point %+v", field, p)
		}
		seeded := withSeed && slices.Contains(seedRates, p.OfferedPerSec)
		if got := p.SeedRatioAckP50 > 0 && p.SeedRatioAckP99 > 0 && p.SeedRatioRecvP50 > 0 && p.SeedRatioRecvP99 > 0; got != seeded {
			t.Errorf("%s point at %d/s: seed ratios %v, want %v: %+v", field, p.OfferedPerSec, got, seeded, p)
		}
	}
}
