package main

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
)

// TestStatsHidesIdlePartitions: the partition table of `outbox stats`
// lists only partitions with pending rows and says how many idle ones it
// hid; --all lists them too.
func TestStatsHidesIdlePartitions(t *testing.T) {
	t.Parallel()
	tg := serverTarget(t, driver.Postgres)
	table := randomTable()
	tg.migrate(t, table)
	base := []string{"--dsn", tg.dsn, "--table", table}

	// A running relay leases every partition; nothing is pending.
	ob, err := driver.New(driver.Config{Dialect: tg.dialect, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(ob, tg.plainDB(t), relay.Config{Publisher: outboxtest.NewPublisher(), Logger: slog.New(slog.DiscardHandler), Observer: outboxtest.WatchOrder(t, nil)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(ctx) }()
	const partitions = partition.DefaultCount
	leased := 0
	waitForRelay(t, ctx, nil, &testdb.SyncBuffer{}, "leases on every partition", func() bool {
		leased = 0
		for _, p := range readStats(t, base).Partitions {
			if p.Owner != "" {
				leased++
			}
		}
		return leased == partitions
	})

	out := expect(t, cli(t, append(base, "stats")...), 0).stdout
	if !strings.Contains(out, "no partition has pending rows (") || strings.Contains(out, "PARTITION") {
		t.Errorf("stats with idle partitions only:\n%s", out)
	}
	out = expect(t, cli(t, append(base, "stats", "--all")...), 0).stdout
	if rows := regexp.MustCompile(`(?m)^\d+\s+0\s+-\s+\S+`).FindAllString(out, -1); len(rows) != leased {
		t.Errorf("stats --all lists %d idle partitions, want %d:\n%s", len(rows), leased, out)
	}

	// One pending row: its partition is listed, the idle ones counted.
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
	db, _ := tg.wrappedDB(t, table)
	emit(t, db, "42")
	out = expect(t, cli(t, append(base, "stats")...), 0).stdout
	if rows := regexp.MustCompile(`(?m)^\d+\s+1\s+`).FindAllString(out, -1); len(rows) != 1 || !strings.Contains(out, "PARTITION") {
		t.Errorf("stats with one pending row:\n%s", out)
	}
}
