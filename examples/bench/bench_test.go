package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
)

// TestMain lets the test binary serve as the bench's broker child
// (startChildBroker re-executes os.Args[0]).
func TestMain(m *testing.M) {
	maybeRunBroker()
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
	for _, k := range []string{"database", "broker", "cpus", "commit", "latency", "drain", "history", "baseline", "targets", "total_seconds"} {
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
	if r.Commit.RatioEmit1 <= 0 || r.Commit.RatioEmit10 <= 0 {
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
	if l := r.Latency; l == nil || len(l.Points) != 3 {
		t.Errorf("latency: %+v", r.Latency)
	} else {
		for _, p := range l.Points {
			if p.Events <= 0 || p.AchievedPerSec <= 0 || p.AckP50Ms <= 0 || p.RecvP50Ms <= 0 || p.AckP99Ms < p.AckP50Ms || p.RecvP999Ms < p.RecvP99Ms {
				t.Errorf("latency point %+v", p)
			}
		}
	}
	if len(r.Targets) != 6 {
		t.Errorf("targets: %+v", r.Targets)
	}
}
