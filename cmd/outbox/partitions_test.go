package main

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
)

// TestMigratePartitions: `migrate apply --partitions` stores the count of
// a new table, reports it, and refuses (exit 1) a different count later;
// `migrate print --partitions` renders it into the DDL.
func TestMigratePartitions(t *testing.T) {
	t.Parallel()
	tg := sqliteTarget(t)
	base := []string{"--dsn", tg.dsn, "--table", "outbox_message"}
	r := expect(t, cli(t, append(base, "--json", "migrate", "apply", "--partitions", "16")...), 0)
	var out struct {
		Partitions int `json:"partitions"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.Partitions != 16 {
		t.Fatalf("migrate apply --partitions 16: %v %v", err, r)
	}
	r = expect(t, cli(t, append(base, "migrate", "apply")...), 0)
	if !strings.Contains(r.stdout, "16 relay partitions") {
		t.Errorf("second apply: %v", r)
	}
	r = expect(t, cli(t, append(base, "migrate", "apply", "--partitions", "8")...), exitRuntime)
	if !strings.Contains(r.stderr, "configured with 8 partitions") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("apply with another count: %v", r)
	}
	r = expect(t, cli(t, "migrate", "print", "--dialect", "postgres", "--partitions", "12"), 0)
	if !strings.Contains(r.stdout, "ELSE 12 END") {
		t.Errorf("print --partitions 12 does not store 12:\n%s", r.stdout)
	}
}

// TestRelayPartitionsFlagMismatch: `outbox relay --partitions 16` on a table
// that stores 32 refuses to start (exit 1, one line) before contacting the
// brokers, instead of leaving half the partitions unrelayed.
func TestRelayPartitionsFlagMismatch(t *testing.T) {
	t.Parallel()
	tg := sqliteTarget(t)
	tg.migrate(t, "outbox_message")
	r := expect(t, cli(t, "--dsn", tg.dsn, "relay", "--brokers", freeAddr(t), "--http", "", "--partitions", "16"), exitRuntime)
	if !strings.Contains(r.stderr, "relay partition count differs") || !strings.Contains(r.stderr, "configured with 16 partitions, table outbox_message stores 32") {
		t.Errorf("--partitions 16 on a 32-partition table: %v", r)
	}
}

// TestRelayReadyzReportsPartitionMismatch: while `outbox relay` runs, a
// pending row in a partition no relay can own turns /readyz to 503 with the
// reason, sets outbox_relay_partition_mismatch and the table gauges, is
// logged at ERROR and shown by `outbox stats`; removing it makes the relay
// ready again.
func TestRelayReadyzReportsPartitionMismatch(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg dbTarget) {
		broker, err := kafkatest.Start(kafkatest.Topics(8, "outbox.event.order"))
		if err != nil {
			t.Fatal(err)
		}
		defer broker.Close()
		table := randomTable()
		tg.migrate(t, table)
		addr := freeAddr(t)
		base := "http://" + addr
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		runCtx, stop := context.WithCancel(ctx)
		defer stop()
		var stdout, stderr testdb.SyncBuffer
		exited := make(chan int, 1)
		go func() {
			exited <- run(runCtx, []string{"--dsn", tg.dsn, "--table", table, "relay",
				"--brokers", strings.Join(broker.Addrs(), ","), "--http", addr, "--poll", "100ms",
				"--lease-ttl", "1s", "--partition-check", "100ms", "--drain-timeout", "10s"}, &stdout, &stderr)
		}()
		waitFor := func(what string, cond func() bool) {
			t.Helper()
			waitForRelay(t, ctx, exited, &stderr, what, cond)
		}
		waitFor("/readyz 200", func() bool { code, _ := get(ctx, base+"/readyz"); return code == http.StatusOK })

		db := tg.plainDB(t)
		d, err := dialect.New(dialect.Name(tg.dialect), table)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(d.Insert(1), "orphan-1", "order", "o", "t", nil, 40, "application/json", []byte(`{}`), nil); err != nil {
			t.Fatal(err)
		}
		var body string
		waitFor("/readyz 503", func() bool {
			var code int
			code, body = get(ctx, base+"/readyz")
			return code == http.StatusServiceUnavailable
		})
		if !strings.Contains(body, "relay partition count differs") || !strings.Contains(body, "1 pending rows are in partitions outside 0..31") {
			t.Errorf("/readyz body: %q", body)
		}
		_, metrics := get(ctx, base+"/metrics")
		for _, re := range []string{
			`(?m)^outbox_relay_partition_mismatch\{[^}]*\} 1$`,
			`(?m)^outbox_out_of_range_pending_events\{[^}]*\} 1$`,
			`(?m)^outbox_partition_mismatch\{[^}]*\} 1$`,
			`(?m)^outbox_partitions\{[^}]*\} 32$`,
		} {
			if !regexp.MustCompile(re).MatchString(metrics) {
				t.Errorf("/metrics does not match %s", re)
			}
		}
		if logs := stderr.String(); !strings.Contains(logs, `"level":"ERROR","msg":"relay partition mismatch`) {
			t.Errorf("mismatch not logged at ERROR:\n%s", logs)
		}
		r := expect(t, cli(t, "--dsn", tg.dsn, "--table", table, "stats"), 0)
		if !strings.Contains(r.stdout, "PARTITION MISMATCH:") || !strings.Contains(r.stdout, "32 stored") {
			t.Errorf("stats: %v", r)
		}
		if _, err := db.Exec("DELETE FROM " + table + " WHERE message_id = 'orphan-1'"); err != nil {
			t.Fatal(err)
		}
		waitFor("/readyz 200 again", func() bool { code, _ := get(ctx, base+"/readyz"); return code == http.StatusOK })
		stop()
		select {
		case code := <-exited:
			if code != 0 {
				t.Errorf("relay exited %d after cancel; stderr:\n%s", code, stderr.String())
			}
		case <-ctx.Done():
			t.Fatal("relay did not stop")
		}
	})
}
