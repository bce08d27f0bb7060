package tests

// Issue 11, item 4: misconfiguration is loud. The relay partition count is
// stored in the table (schema version 5; 4 on MySQL/MariaDB); writers and
// relays read it, a count that disagrees is refused, and a disagreement
// that appears while a relay runs is logged and exposed (metric, stats,
// Ready). Every error that ends Run is logged.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/metrics"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
)

// bareRow inserts a pending row in partition part with SQL of its own, as a
// writer of an older build or one told another partition count would.
func bareRow(t *testing.T, e *testdb.Env, id string, part int) {
	t.Helper()
	d, err := dialect.New(dialect.Name(e.Target.Dialect), e.Table)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.RelayDB.Exec(d.Insert(1), id, "order", id, "order.step", nil, part, "application/json", []byte(`{}`), nil); err != nil {
		t.Fatal(err)
	}
}

func leaseRows(t *testing.T, e *testdb.Env) int {
	t.Helper()
	var n int
	if err := e.RelayDB.QueryRow("SELECT COUNT(*) FROM " + e.Table + "_lease").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func mustExec(t *testing.T, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// gauge reads one gauge of reg (0 if absent).
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return 0
}

// TestRelayAtWrongTableLogsAndFails: a relay built for another table than
// the one the writers use (the README's old two-config setup let a relay
// stay at the default table) returns ErrSchemaMissing from Run and logs it
// at ERROR before returning, so "go r.Run(ctx)" is not silent; a second
// Run is refused and logged too.
func TestRelayAtWrongTableLogsAndFails(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{Table: "outbox_message"})
		ctx := testCtx(t, time.Minute)
		wrong, err := driver.New(driver.Config{Dialect: tg.Dialect, Table: e.Q("app_outbox_message")})
		if err != nil {
			t.Fatal(err)
		}
		var logs testdb.SyncBuffer
		r, err := relay.New(wrong, e.RelayDB, relay.Config{Publisher: outboxtest.NewPublisher(), Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		err = r.Run(ctx)
		if !errors.Is(err, driver.ErrSchemaMissing) {
			t.Fatalf("Run = %v, want ErrSchemaMissing", err)
		}
		out := logs.String()
		if !strings.Contains(out, `"level":"ERROR"`) || !strings.Contains(out, "app_outbox_message") || !strings.Contains(out, "outbox table is missing") {
			t.Errorf("the error ending Run was not logged at ERROR with the table:\n%s", out)
		}
		if !errors.Is(r.Ready(), relay.ErrNotRunning) {
			t.Errorf("Ready = %v, want ErrNotRunning", r.Ready())
		}
		if err := r.Run(ctx); !errors.Is(err, relay.ErrStopped) {
			t.Fatalf("second Run = %v, want ErrStopped", err)
		}
		if n := strings.Count(logs.String(), `"level":"ERROR"`); n != 2 {
			t.Errorf("%d ERROR lines after two failed Runs, want 2:\n%s", n, logs.String())
		}
	})
}

// TestWriterReadsStoredPartitionCount: a writer whose Outbox never
// migrated reads the stored count at its first commit and hashes with it;
// one told another count refuses to commit (ErrWriteEvents and
// ErrPartitionMismatch, nothing written), and its Check and Migrate say
// so too.
func TestWriterReadsStoredPartitionCount(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{Partitions: 16}) // a new table storing 16
		ctx := testCtx(t, time.Minute)
		for _, c := range []struct {
			name       string
			partitions int
			wantErr    error
		}{
			{"stored count", 0, nil},
			{"same count", 16, nil},
			{"default count", partition.DefaultCount, driver.ErrPartitionMismatch},
			{"more", 64, driver.ErrPartitionMismatch},
		} {
			t.Run(c.name, func(t *testing.T) {
				ob, db := e.OpenWriter(t, driver.Config{Partitions: c.partitions})
				agg := fmt.Sprintf("w-%s-%d", tg.Name, c.partitions)
				err := inTx(ctx, db, func(ctx context.Context, tx *sql.Tx) error { return outbox.Emit(ctx, ev(agg, 1)) })
				where := "aggregate_id = '" + agg + "'"
				if c.wantErr != nil {
					if !errors.Is(err, driver.ErrWriteEvents) || !errors.Is(err, c.wantErr) {
						t.Fatalf("commit = %v, want ErrWriteEvents and %v", err, c.wantErr)
					}
					if n := rowCount(t, e, where); n != 0 {
						t.Errorf("%d rows written by a refused commit", n)
					}
					if err := ob.Check(ctx, e.RelayDB); !errors.Is(err, c.wantErr) {
						t.Errorf("Check = %v, want %v", err, c.wantErr)
					}
					if err := ob.Migrate(ctx, e.RelayDB); !errors.Is(err, c.wantErr) {
						t.Errorf("Migrate = %v, want %v", err, c.wantErr)
					}
					return
				}
				if err != nil {
					t.Fatalf("commit: %v", err)
				}
				var part int
				if err := e.RelayDB.QueryRow("SELECT partition_key FROM " + e.Table + " WHERE " + where).Scan(&part); err != nil {
					t.Fatal(err)
				}
				if want := partition.Of("order", agg, 16); part != want {
					t.Errorf("row in partition %d, want %d (of the stored 16)", part, want)
				}
				if err := ob.Check(ctx, e.RelayDB); err != nil {
					t.Errorf("Check: %v", err)
				}
			})
		}
	})
}

// TestRelayRefusesPartitionMismatchAtStart: Run refuses with
// ErrPartitionMismatch, logs it, reports it to the metrics and Ready, and
// leaves the lease table as it found it (a relay never resizes it; before,
// starting a relay with 16 partitions and then one with 32 silently grew
// it to 32).
func TestRelayRefusesPartitionMismatchAtStart(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name       string
		stored     int
		partitions int                           // the refused relay's driver.Config.Partitions
		prepare    func(*testing.T, *testdb.Env) // after a relay with the stored count ran and stopped
		wantLease  int
		wantInLog  string
	}{
		{"relay told another count (16, then 32)", 16, 32, nil, 16, "configured with 32 partitions, table"},
		{"relay told fewer (32, then 16)", 32, 16, nil, 32, "configured with 16 partitions"},
		{"lease table of another size", 32, 0, func(t *testing.T, e *testdb.Env) {
			mustExec(t, e.RelayDB, "DELETE FROM "+e.Table+"_lease WHERE partition_key >= 16")
		}, 16, "the lease table has 16 rows"},
		{"pending rows outside the count", 32, 0, func(t *testing.T, e *testdb.Env) {
			bareRow(t, e, "orphan-1", 40)
		}, 32, "1 pending rows are in partitions outside 0..31"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			forEachTarget(t, func(t *testing.T, tg testdb.Target) {
				e := testdb.New(t, tg, driver.Config{Partitions: c.stored})
				ctx := testCtx(t, time.Minute)
				first := startRelay(t, e, outboxtest.NewPublisher(), nil)
				eventually(t, ctx, "lease rows", func() bool { return leaseRows(t, e) == c.stored })
				first.stop(t)
				if c.prepare != nil {
					c.prepare(t, e)
				}
				ob, err := driver.New(driver.Config{Dialect: tg.Dialect, Table: e.Table, Partitions: c.partitions})
				if err != nil {
					t.Fatal(err)
				}
				reg := prometheus.NewRegistry()
				m, err := metrics.NewRelayMetrics(reg, ob)
				if err != nil {
					t.Fatal(err)
				}
				var logs testdb.SyncBuffer
				r, err := relay.New(ob, e.RelayDB, relay.Config{Publisher: outboxtest.NewPublisher(), Observer: m,
					Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
				if err != nil {
					t.Fatal(err)
				}
				if err := r.Run(ctx); !errors.Is(err, relay.ErrPartitionMismatch) {
					t.Fatalf("Run = %v, want ErrPartitionMismatch", err)
				}
				if err := r.Ready(); !errors.Is(err, relay.ErrPartitionMismatch) {
					t.Errorf("Ready = %v, want ErrPartitionMismatch", err)
				}
				if v := gauge(t, reg, metrics.MetricRelayPartitionMismatch); v != 1 {
					t.Errorf("%s = %v, want 1", metrics.MetricRelayPartitionMismatch, v)
				}
				if out := logs.String(); !strings.Contains(out, `"level":"ERROR"`) || !strings.Contains(out, c.wantInLog) {
					t.Errorf("log lacks an ERROR with %q:\n%s", c.wantInLog, out)
				}
				if n := leaseRows(t, e); n != c.wantLease {
					t.Errorf("lease table has %d rows after the refused start, want %d (never resized)", n, c.wantLease)
				}
			})
		})
	}
}

// TestPartitionMismatchDetectedWhileRunning: rows in a partition no relay
// can own, and a lease table that stops matching the stored count, are
// detected by a running relay (logged at ERROR, outbox_relay_partition_
// mismatch = 1, Ready fails, ReadStats and the stats collector show them)
// while the partitions it owns keep flowing; once fixed, it clears.
func TestPartitionMismatchDetectedWhileRunning(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{})
		ctx := testCtx(t, 2*time.Minute)
		reg := prometheus.NewRegistry()
		m, err := metrics.NewRelayMetrics(reg, e.Outbox)
		if err != nil {
			t.Fatal(err)
		}
		if err := reg.Register(metrics.NewStatsCollector(e.Outbox, e.RelayDB, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		var logs testdb.SyncBuffer
		pub := outboxtest.NewPublisher()
		r := startRelay(t, e, pub, func(c *relay.Config) {
			c.Observer = m
			c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
			c.LeaseTTL = time.Second // heartbeat (and lease check) every 250 ms
			c.PartitionCheckInterval = 100 * time.Millisecond
		})
		eventually(t, ctx, "relay ready", func() bool { return r.Ready() == nil })
		mismatched := func() bool { return errors.Is(r.Ready(), relay.ErrPartitionMismatch) }

		// A row no relay can own.
		bareRow(t, e, "orphan-1", 40)
		eventually(t, ctx, "out-of-range row detected", mismatched)
		if v := gauge(t, reg, metrics.MetricRelayPartitionMismatch); v != 1 {
			t.Errorf("%s = %v, want 1", metrics.MetricRelayPartitionMismatch, v)
		}
		if v := gauge(t, reg, metrics.MetricOutOfRangePending); v != 1 {
			t.Errorf("%s = %v, want 1", metrics.MetricOutOfRangePending, v)
		}
		if v := gauge(t, reg, metrics.MetricPartitionMismatch); v != 1 {
			t.Errorf("%s = %v, want 1", metrics.MetricPartitionMismatch, v)
		}
		st, err := relay.ReadStats(ctx, e.Outbox, e.RelayDB)
		if err != nil {
			t.Fatal(err)
		}
		if st.PartitionCount != partition.DefaultCount || st.OutOfRange != 1 || !errors.Is(st.Mismatch(), relay.ErrPartitionMismatch) {
			t.Errorf("stats: count %d, out of range %d, mismatch %v; want 32, 1, ErrPartitionMismatch", st.PartitionCount, st.OutOfRange, st.Mismatch())
		}
		if out := logs.String(); !strings.Contains(out, "relay partition mismatch") || !strings.Contains(out, "1 pending rows are in partitions outside 0..31") {
			t.Errorf("mismatch not logged:\n%s", out)
		}
		// The partitions the relay owns keep flowing meanwhile.
		if err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error {
			return outbox.Emit(ctx, outbox.Event{ID: "in-range-1", AggregateType: "order", AggregateID: "a", Type: "t", Payload: []byte(`{}`)})
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := pub.WaitForIDs(ctx, "in-range-1"); err != nil {
			t.Fatal(err)
		}
		mustExec(t, e.RelayDB, "DELETE FROM "+e.Table+" WHERE message_id = 'orphan-1'")
		eventually(t, ctx, "out-of-range row cleared", func() bool { return r.Ready() == nil })
		if v := gauge(t, reg, metrics.MetricRelayPartitionMismatch); v != 0 {
			t.Errorf("%s = %v after the fix, want 0", metrics.MetricRelayPartitionMismatch, v)
		}

		// A lease table that no longer matches the stored count.
		mustExec(t, e.RelayDB, "INSERT INTO "+e.Table+"_lease (partition_key, epoch) VALUES (32, 0)")
		eventually(t, ctx, "lease table mismatch detected", mismatched)
		if !strings.Contains(r.Ready().Error(), "the lease table has 33 rows") {
			t.Errorf("Ready = %v, want the lease table named", r.Ready())
		}
		if n := leaseRows(t, e); n != 33 {
			t.Errorf("the relay changed the lease table to %d rows", n)
		}
		mustExec(t, e.RelayDB, "DELETE FROM "+e.Table+"_lease WHERE partition_key = 32")
		eventually(t, ctx, "lease table mismatch cleared", func() bool { return r.Ready() == nil })
		if out := logs.String(); !strings.Contains(out, "relay partition mismatch cleared") {
			t.Errorf("clearing not logged:\n%s", out)
		}
	})
}

// TestMigrateStoresPartitionCount: upgrading from the previous schema
// version stores the lease table's size if relays ran, else the configured
// count (default 32); until then this build's writers and relays refuse the
// table as outdated.
func TestMigrateStoresPartitionCount(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name       string
		leases     int // lease rows left by the previous version's relays
		partitions int // driver.Config.Partitions at Migrate
		want       int
		wantErr    error
	}{
		{"relays ran with 16", 16, 0, 16, nil},
		{"relays ran with 64, configured 64", 64, 64, 64, nil},
		{"relays ran with 16, configured 8", 16, 8, 16, driver.ErrPartitionMismatch},
		{"no relay ran, configured 8", 0, 8, 8, nil},
		{"no relay ran, default", 0, 0, partition.DefaultCount, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			forEachTarget(t, func(t *testing.T, tg testdb.Target) {
				e := testdb.New(t, tg, driver.Config{})
				ctx := testCtx(t, time.Minute)
				d, err := dialect.New(dialect.Name(tg.Dialect), e.Table)
				if err != nil {
					t.Fatal(err)
				}
				// Back to the previous version: no meta table, and the
				// lease rows its relays created.
				// (PostgreSQL's version 6, and the relay mode version on
				// every dialect, come after the meta table's and are
				// applied again with it.)
				latest, meta := d.LatestVersion(), migrationVersion(d, "meta")
				mustExec(t, e.RelayDB, "DROP TABLE "+e.Table+"_meta")
				mustExec(t, e.RelayDB, "ALTER TABLE "+e.Table+"_relay DROP COLUMN mode") // the relay mode version comes after meta on every dialect
				mustExec(t, e.RelayDB, d.Bind("DELETE FROM "+e.Table+"_migrations WHERE version >= ?"), meta)
				if c.leases > 0 {
					args := make([]any, c.leases)
					for i := range args {
						args[i] = i
					}
					mustExec(t, e.RelayDB, d.LeaseInit(c.leases), args...)
				}
				cfg := driver.Config{Dialect: tg.Dialect, Table: e.Table, Partitions: c.partitions}
				if v, l, err := driver.SchemaVersion(ctx, e.RelayDB, cfg); err != nil || v != meta-1 || l != latest {
					t.Fatalf("SchemaVersion = %d, %d, %v; want %d, %d", v, l, err, meta-1, latest)
				}
				// This build refuses the old schema loudly.
				fresh, db := e.OpenWriter(t, driver.Config{})
				if err := fresh.Check(ctx, e.RelayDB); !errors.Is(err, driver.ErrSchemaOutdated) {
					t.Errorf("Check before Migrate = %v, want ErrSchemaOutdated", err)
				}
				if _, err := fresh.PartitionCount(ctx, e.RelayDB); !errors.Is(err, driver.ErrSchemaOutdated) {
					t.Errorf("PartitionCount before Migrate = %v, want ErrSchemaOutdated", err)
				}
				if err := inTx(ctx, db, func(ctx context.Context, tx *sql.Tx) error { return outbox.Emit(ctx, ev("u", 1)) }); !errors.Is(err, driver.ErrWriteEvents) {
					t.Errorf("commit before Migrate = %v, want ErrWriteEvents", err)
				}
				r, err := relay.New(fresh, e.RelayDB, relay.Config{Publisher: outboxtest.NewPublisher(), Logger: quietLogger()})
				if err != nil {
					t.Fatal(err)
				}
				if err := r.Run(ctx); !errors.Is(err, driver.ErrSchemaOutdated) {
					t.Errorf("relay before Migrate = %v, want ErrSchemaOutdated", err)
				}

				err = driver.Migrate(ctx, e.RelayDB, cfg)
				if c.wantErr != nil {
					if !errors.Is(err, c.wantErr) {
						t.Fatalf("Migrate = %v, want %v", err, c.wantErr)
					}
				} else if err != nil {
					t.Fatal(err)
				}
				if v, _, err := driver.SchemaVersion(ctx, e.RelayDB, cfg); err != nil || v != latest {
					t.Fatalf("after Migrate: version %d, %v; want %d", v, err, latest)
				}
				if got, err := fresh.PartitionCount(ctx, e.RelayDB); err != nil || got != c.want {
					t.Errorf("stored count = %d, %v; want %d", got, err, c.want)
				}
				if err := driver.Migrate(ctx, e.RelayDB, driver.Config{Dialect: tg.Dialect, Table: e.Table}); err != nil {
					t.Errorf("second Migrate: %v", err)
				}
				if got, _ := fresh.PartitionCount(ctx, e.RelayDB); got != c.want {
					t.Errorf("a second Migrate changed the stored count to %d", got)
				}
			})
		})
	}
}
