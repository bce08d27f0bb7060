package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver/dsn"
	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
)

// t0 is the base time of the synthetic records in the check tests.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// fixture rows: order A has three events (ids 1, 2, 3), order B one (id 4).
var fixtureRows = []outboxRow{
	{ID: 1, MessageID: "m1", AggregateID: "A", EventType: eventCreated},
	{ID: 2, MessageID: "m2", AggregateID: "A", EventType: eventPaid},
	{ID: 3, MessageID: "m3", AggregateID: "A", EventType: eventShipped},
	{ID: 4, MessageID: "m4", AggregateID: "B", EventType: eventCreated},
}

// fixtureCommits: every event committed at t0 + its id in milliseconds.
func fixtureCommits() map[commitKey]time.Time {
	c := map[commitKey]time.Time{}
	for _, r := range fixtureRows {
		c[commitKey{r.AggregateID, r.EventType}] = t0.Add(time.Duration(r.ID) * time.Millisecond)
	}
	return c
}

// rec builds a consumed record of fixture row mid (or of an unknown ID),
// at the given partition offset, received latencyMS after its commit.
func rec(mid string, partition int32, offset int64, latencyMS int) consumedRecord {
	agg, typ, id := "X", "order.unknown", int64(0)
	for _, r := range fixtureRows {
		if r.MessageID == mid {
			agg, typ, id = r.AggregateID, r.EventType, r.ID
		}
	}
	return consumedRecord{
		Topic: topic, Partition: partition, Offset: offset, Key: []byte(agg),
		Headers: map[string]string{
			emit.HeaderMessageID:   mid,
			emit.HeaderAggregateID: agg,
			emit.HeaderEventType:   typ,
		},
		Received: t0.Add(time.Duration(id)*time.Millisecond + time.Duration(latencyMS)*time.Millisecond),
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	// A's records live on partition 0, B's on partition 1.
	clean := []consumedRecord{rec("m1", 0, 0, 2), rec("m4", 1, 0, 4), rec("m2", 0, 1, 3), rec("m3", 0, 2, 5)}
	noHeader := rec("m4", 1, 1, 1)
	delete(noHeader.Headers, emit.HeaderMessageID)

	tests := []struct {
		name string
		recs []consumedRecord
		want report // only the counted fields are compared
		lat  latency
		fail bool
	}{
		{
			name: "clean run",
			recs: clean,
			want: report{Emitted: 4, Delivered: 4},
			lat:  latency{P50: 3, P99: 5, Max: 5, Samples: 4},
		},
		{
			name: "one record withheld is lost",
			recs: []consumedRecord{rec("m1", 0, 0, 2), rec("m4", 1, 0, 4), rec("m3", 0, 2, 5)},
			want: report{Emitted: 4, Delivered: 3, Lost: 1},
			lat:  latency{P50: 4, P99: 5, Max: 5, Samples: 3},
			fail: true,
		},
		{
			name: "duplicate is counted, not a violation",
			// m2 re-sent after m3 (a relay crash between publish and mark-sent).
			recs: append(append([]consumedRecord(nil), clean...), rec("m2", 0, 3, 9)),
			want: report{Emitted: 4, Delivered: 4, Duplicates: 1},
			lat:  latency{P50: 3, P99: 5, Max: 5, Samples: 4},
		},
		{
			name: "out-of-order first delivery",
			// A's first deliveries by offset: 1, 3, 2.
			recs: []consumedRecord{rec("m1", 0, 0, 2), rec("m3", 0, 1, 3), rec("m2", 0, 2, 9), rec("m4", 1, 0, 4)},
			want: report{Emitted: 4, Delivered: 4, OrderViolations: 1},
			lat:  latency{P50: 3, P99: 9, Max: 9, Samples: 4},
			fail: true,
		},
		{
			name: "order is judged by offset, not by slice order",
			// Same as clean, received in another interleaving of partitions,
			// and partition 0's records listed out of offset order.
			recs: []consumedRecord{rec("m3", 0, 2, 5), rec("m4", 1, 0, 4), rec("m1", 0, 0, 2), rec("m2", 0, 1, 3)},
			want: report{Emitted: 4, Delivered: 4},
			lat:  latency{P50: 3, P99: 5, Max: 5, Samples: 4},
		},
		{
			name: "ghost",
			recs: append(append([]consumedRecord(nil), clean...), rec("never-committed", 2, 0, 1), rec("never-committed", 2, 1, 1)),
			want: report{Emitted: 4, Delivered: 4, Ghosts: 1, Duplicates: 1},
			lat:  latency{P50: 3, P99: 5, Max: 5, Samples: 4},
			fail: true,
		},
		{
			name: "record without a message ID is a ghost",
			recs: append(append([]consumedRecord(nil), clean...), noHeader),
			want: report{Emitted: 4, Delivered: 4, Ghosts: 1},
			lat:  latency{P50: 3, P99: 5, Max: 5, Samples: 4},
			fail: true,
		},
		{
			name: "nothing consumed",
			want: report{Emitted: 4, Lost: 4},
			fail: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := check(fixtureRows, tc.recs, fixtureCommits())
			counts := func(r report) [6]int {
				return [6]int{r.Emitted, r.Delivered, r.Duplicates, r.Lost, r.Ghosts, r.OrderViolations}
			}
			if counts(got) != counts(tc.want) {
				t.Errorf("emitted, delivered, duplicates, lost, ghosts, violations = %v, want %v", counts(got), counts(tc.want))
			}
			if got.LatencyMS != tc.lat {
				t.Errorf("latency = %+v, want %+v", got.LatencyMS, tc.lat)
			}
			if got.failed() != tc.fail || got.OK == tc.fail {
				t.Errorf("failed() = %t, OK = %t, want failed %t", got.failed(), got.OK, tc.fail)
			}
			if code := exitCode(got, nil); code != map[bool]int{false: 0, true: 1}[tc.fail] {
				t.Errorf("exitCode = %d", code)
			}
		})
	}
}

func TestExitCodeOnError(t *testing.T) {
	t.Parallel()
	if exitCode(report{Emitted: 1, Delivered: 1, OK: true}, fmt.Errorf("boom")) != 1 {
		t.Error("a failed run must exit 1")
	}
	if exitCode(report{Emitted: 3, Delivered: 3, Duplicates: 2}, nil) != 0 {
		t.Error("duplicates alone must not fail the run")
	}
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	got := summarize(ds)
	if want := (latency{P50: 50, P99: 99, Max: 100, Samples: 100}); got != want {
		t.Fatalf("summarize(1..100 ms) = %+v, want %+v", got, want)
	}
	if got := summarize(nil); got != (latency{}) {
		t.Fatalf("summarize(nil) = %+v", got)
	}
}

func TestOpenDatabaseRefusesUnknownDSN(t *testing.T) {
	t.Parallel()
	if _, err := openDatabase("sqlserver://x", "outbox_quickstart"); err == nil {
		t.Error("openDatabase accepted an unknown DSN")
	}
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// assertClean fails t unless rep shows every event delivered once or more,
// nothing lost, no ghost and no order violation.
func assertClean(t *testing.T, rep report, orders int) {
	t.Helper()
	if rep.Emitted != 3*orders || rep.Delivered != rep.Emitted || rep.Lost != 0 || rep.Ghosts != 0 ||
		rep.OrderViolations != 0 || rep.TimedOut || !rep.OK || exitCode(rep, nil) != 0 {
		t.Fatalf("want a clean run of %d events, got %+v", 3*orders, rep)
	}
	if rep.LatencyMS.Samples != rep.Delivered {
		t.Errorf("latency samples %d, want one per delivered event (%d)", rep.LatencyMS.Samples, rep.Delivered)
	}
	if rep.Transactions != rep.Emitted {
		t.Errorf("transactions %d, want %d", rep.Transactions, rep.Emitted)
	}
}

func TestRunSQLite(t *testing.T) {
	t.Parallel()
	const orders = 50
	var out bytes.Buffer
	rep, err := run(t.Context(), config{Orders: orders, Workers: 8, Timeout: 30 * time.Second, JSON: true, Logger: testLogger(t)}, &out)
	if err != nil {
		t.Fatal(err)
	}
	assertClean(t, rep, orders)
	if rep.Dialect != "sqlite" || rep.Orders != orders {
		t.Errorf("dialect %q orders %d", rep.Dialect, rep.Orders)
	}
	// The JSON output is one object with the documented keys.
	var obj map[string]any
	if err := json.Unmarshal(out.Bytes(), &obj); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out.String())
	}
	for _, k := range []string{"emitted", "delivered", "duplicates", "lost", "ghosts", "order_violations", "latency_ms", "dialect", "orders"} {
		if _, ok := obj[k]; !ok {
			t.Errorf("JSON output lacks %q: %s", k, out.String())
		}
	}
	lat, _ := obj["latency_ms"].(map[string]any)
	for _, k := range []string{"p50", "p99", "max"} {
		if _, ok := lat[k]; !ok {
			t.Errorf("latency_ms lacks %q", k)
		}
	}
	t.Logf("%s", out.String())
}

func TestRunWithheldRecordIsLost(t *testing.T) {
	t.Parallel()
	const orders = 20
	withheld := 0
	cfg := config{
		Orders: orders, Workers: 4, Timeout: 30 * time.Second, Logger: testLogger(t),
		// Withhold order 7's order.paid: the consumer "never receives" it.
		Withhold: func(r consumedRecord) bool {
			if strings.HasSuffix(r.Headers[emit.HeaderAggregateID], "-00007") && r.Headers[emit.HeaderEventType] == eventPaid {
				withheld++
				return true
			}
			return false
		},
	}
	var out bytes.Buffer
	rep, err := run(t.Context(), cfg, &out)
	if err != nil {
		t.Fatal(err)
	}
	if withheld < 1 {
		t.Fatal("the filter withheld nothing")
	}
	if rep.Lost != 1 || rep.Delivered != rep.Emitted-1 || rep.Emitted != 3*orders {
		t.Fatalf("lost %d delivered %d emitted %d, want lost 1 of %d", rep.Lost, rep.Delivered, rep.Emitted, 3*orders)
	}
	if rep.Ghosts != 0 || rep.OrderViolations != 0 {
		t.Errorf("ghosts %d violations %d, want 0 (a withheld record breaks no order)", rep.Ghosts, rep.OrderViolations)
	}
	if rep.OK || exitCode(rep, err) != 1 {
		t.Errorf("OK %t exitCode %d, want a failing run", rep.OK, exitCode(rep, err))
	}
	if !strings.Contains(out.String(), "FAILED") {
		t.Errorf("summary does not say FAILED:\n%s", out.String())
	}
}

// serverDSN returns the DSN of a reachable test server (env var or the
// local default), or skips t (fails it if OUTBOX_TEST_REQUIRE is set).
func serverDSN(t *testing.T, env, def, sqlDriver, sqlDSN string) string {
	t.Helper()
	dsn := os.Getenv(env)
	if dsn == "" {
		dsn = def
	}
	if sqlDSN == "" {
		sqlDSN = dsn
	}
	db, err := sql.Open(sqlDriver, sqlDSN)
	if err == nil {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		err = db.PingContext(ctx)
		cancel()
		db.Close()
	}
	if err != nil {
		if os.Getenv("OUTBOX_TEST_REQUIRE") != "" {
			t.Fatalf("%s required (OUTBOX_TEST_REQUIRE is set) but unreachable: %v", dsn, err)
		}
		t.Skipf("no server at %s (%v); set %s", dsn, err, env)
	}
	return dsn
}

// runOnServer runs the quickstart on a shared server with tables of its
// own, dropped afterwards.
func runOnServer(t *testing.T, dsn, sqlDriver, sqlDSN string) {
	suffix := make([]byte, 5)
	_, _ = rand.Read(suffix)
	outboxTable := "qs_outbox_" + hex.EncodeToString(suffix)
	orderTable := "qs_order_" + hex.EncodeToString(suffix)
	t.Cleanup(func() {
		db, err := sql.Open(sqlDriver, sqlDSN)
		if err != nil {
			return
		}
		defer db.Close()
		for _, tbl := range []string{orderTable, outboxTable, outboxTable + "_migrations", outboxTable + "_lease", outboxTable + "_relay", outboxTable + "_archive"} {
			if _, err := db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tbl); err != nil {
				t.Logf("dropping %s: %v", tbl, err)
			}
		}
	})
	const orders = 50
	var out bytes.Buffer
	rep, err := run(t.Context(), config{
		DB: dsn, Orders: orders, Workers: 8, Timeout: 30 * time.Second, Logger: testLogger(t),
		OutboxTable: outboxTable, OrderTable: orderTable,
	}, &out)
	if err != nil {
		t.Fatal(err)
	}
	assertClean(t, rep, orders)
	t.Logf("%s", out.String())
}

func TestRunPostgres(t *testing.T) {
	t.Parallel()
	dsn := serverDSN(t, "OUTBOX_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "pgx", "")
	runOnServer(t, dsn, "pgx", dsn)
}

func TestRunMySQL(t *testing.T) {
	t.Parallel()
	server := os.Getenv("OUTBOX_TEST_MYSQL")
	if server == "" {
		server = "root@tcp(127.0.0.1:3306)/test"
	}
	mc, err := dsn.MySQLConfig(server)
	if err != nil {
		t.Fatal(err)
	}
	plain := mc.FormatDSN()
	server = serverDSN(t, "OUTBOX_TEST_MYSQL", server, "mysql", plain)
	runOnServer(t, server, "mysql", plain)
}

// TestRunExternalBrokers exercises the -brokers path (topic created if
// missing, consumption from the end offsets taken at start) against a
// separately started broker, twice: the second run must not count the
// first run's records as ghosts.
func TestRunExternalBrokers(t *testing.T) {
	t.Parallel()
	b, err := kafkatest.Start() // no seeded topic: run creates it
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const orders = 10
	for i := range 2 {
		var out bytes.Buffer
		rep, err := run(t.Context(), config{Brokers: b.Addrs(), Orders: orders, Workers: 4, Timeout: 30 * time.Second, Logger: testLogger(t)}, &out)
		if err != nil {
			t.Fatalf("run %d: %v", i+1, err)
		}
		assertClean(t, rep, orders)
		if rep.Broker != strings.Join(b.Addrs(), ",") {
			t.Errorf("broker %q", rep.Broker)
		}
	}
}

// TestOrdersStateMachine drives the domain code directly on SQLite: only
// created -> paid -> shipped is allowed, and a refused step emits nothing.
func TestOrdersStateMachine(t *testing.T) {
	t.Parallel()
	db, err := openDatabase("", "outbox_quickstart")
	if err != nil {
		t.Fatal(err)
	}
	defer db.close()
	ctx := t.Context()
	if err := db.prepare(ctx, "quickstart_order"); err != nil {
		t.Fatal(err)
	}
	o := newOrders(db.dialect, "quickstart_order")
	step := func(fn func(context.Context, repo) error) error {
		sctx := outbox.NewContext(ctx)
		tx, err := db.app.BeginTx(sctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := fn(sctx, tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	pay := func(ctx context.Context, r repo) error { return o.Pay(ctx, r, "o1") }
	ship := func(ctx context.Context, r repo) error { return o.Ship(ctx, r, "o1") }
	create := func(ctx context.Context, r repo) error { return o.Create(ctx, r, "o1", 1234) }

	if err := step(pay); !errors.Is(err, errTransition) {
		t.Fatalf("pay before create: %v, want errTransition", err)
	}
	if err := step(create); err != nil {
		t.Fatal(err)
	}
	if err := step(create); err == nil {
		t.Fatal("second create succeeded")
	}
	if err := step(ship); !errors.Is(err, errTransition) {
		t.Fatalf("ship before pay: %v, want errTransition", err)
	}
	if err := step(pay); err != nil {
		t.Fatal(err)
	}
	if err := step(pay); !errors.Is(err, errTransition) {
		t.Fatalf("second pay: %v, want errTransition", err)
	}
	if err := step(ship); err != nil {
		t.Fatal(err)
	}
	rows, err := db.readOutbox(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, r := range rows {
		types = append(types, r.EventType)
	}
	if want := []string{eventCreated, eventPaid, eventShipped}; !slices.Equal(types, want) {
		t.Fatalf("outbox holds %v, want %v", types, want)
	}
	var payload string
	if err := db.relay.QueryRowContext(ctx, "SELECT CAST(payload AS TEXT) FROM outbox_quickstart WHERE id = ?", rows[2].ID).Scan(&payload); err != nil {
		t.Fatal(err)
	}
	if want := `{"order_id":"o1","status":"shipped","amount_cents":1234}`; payload != want {
		t.Errorf("payload %s, want %s", payload, want)
	}
}
