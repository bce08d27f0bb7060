package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/integration/internal/ledger"
	"github.com/sqloutbox/outbox/internal/failpoint"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// TestMain lets the test binary double as a standalone relay process
// (OUTBOX_TEST_CHILD=relay), so tests can kill relays as OS processes.
func TestMain(m *testing.M) {
	if os.Getenv("OUTBOX_TEST_CHILD") == "relay" {
		os.Exit(relayChild())
	}
	os.Exit(m.Run())
}

// relayChild runs a relay configured by OUTBOX_CHILD_* variables until
// SIGTERM (exit 0) or a failpoint kills it.
func relayChild() int {
	drv := map[string]string{"postgres": "pgx", "mysql": "mysql", "sqlite": "sqlite"}[os.Getenv("OUTBOX_CHILD_DIALECT")]
	db, err := sql.Open(drv, os.Getenv("OUTBOX_CHILD_DSN"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer db.Close()
	db.SetMaxOpenConns(2)
	// sarama's own log (retries, reconnects, state changes) on stderr too:
	// the parent prints a child's output only when the test fails, and
	// then a silent in-producer retry is what a ledger report cannot show.
	sarama.Logger = log.New(os.Stderr, "[sarama] ", log.Lmicroseconds)
	kcfg := kafka.Config{Brokers: strings.Split(os.Getenv("OUTBOX_CHILD_BROKERS"), ",")}
	if prefix := os.Getenv("OUTBOX_CHILD_EOS_PREFIX"); prefix != "" {
		kcfg.ExactlyOnce = &kafka.ExactlyOnce{TransactionalIDPrefix: prefix, Table: os.Getenv("OUTBOX_CHILD_TABLE")}
	}
	pub, err := kafka.NewPublisher(kcfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pub.Close()
	batch, _ := strconv.Atoi(os.Getenv("OUTBOX_CHILD_BATCH"))
	ttl, _ := time.ParseDuration(os.Getenv("OUTBOX_CHILD_LEASE_TTL"))
	poll, err := time.ParseDuration(os.Getenv("OUTBOX_CHILD_POLL"))
	if err != nil {
		poll = 20 * time.Millisecond
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ob, err := driver.New(driver.Config{Dialect: driver.Dialect(os.Getenv("OUTBOX_CHILD_DIALECT")), Table: os.Getenv("OUTBOX_CHILD_TABLE"),
		LogOnly: os.Getenv("OUTBOX_CHILD_LOG_ONLY") != ""})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg := relay.Config{
		// Info and above (leases acquired and lost, a failed cycle) on
		// stderr: the parent reads them to tell an acknowledged batch the
		// relay failed to record in time from one it forgot, and prints
		// them when a test fails.
		Publisher: pub, PollInterval: poll, BatchSize: batch, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
		LeaseTTL: ttl, InstanceID: os.Getenv("OUTBOX_CHILD_INSTANCE"),
	}
	if slot := os.Getenv("OUTBOX_CHILD_WAL_SLOT"); slot != "" {
		cfg.Source = relay.SourceWAL
		cfg.WAL = relay.WALConfig{DSN: os.Getenv("OUTBOX_CHILD_DSN"), Slot: slot}
	}
	r, err := relay.New(ob, db, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if os.Getenv("OUTBOX_CHILD_LISTEN") != "" {
		go func() {
			_ = relay.ListenPostgres(ctx, ob, os.Getenv("OUTBOX_CHILD_DSN"), r.Notify, quietLogger())
		}()
	}
	fmt.Println("relay child running")
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// child is a relay running as its own OS process.
type child struct {
	cmd  *exec.Cmd
	out  testdb.SyncBuffer
	done chan struct{}
	err  error
}

// startChild starts a relay process on e's table, publishing to brokers;
// failpoints is the OUTBOX_FAILPOINTS value ("" for none).
func startChild(t *testing.T, e *testdb.Env, brokers []string, batch int, failpoints string) *child {
	t.Helper()
	return startChildAs(t, e, brokers, batch, failpoints, "")
}

// orderBrokenLog is in the ERROR line a relay logs when its publisher
// acknowledged a message after an earlier one of its aggregate failed in
// the same batch (relay.OrderObserver): a child that logged it fails its
// test.
const orderBrokenLog = "first delivery order may be broken"

// childLeaseTTL keeps lease takeovers after a kill quick in tests.
const childLeaseTTL = 2 * time.Second

// startChildAs is startChild with a fixed relay instance ID ("" for the default).
func startChildAs(t *testing.T, e *testdb.Env, brokers []string, batch int, failpoints, instance string, env ...string) *child {
	t.Helper()
	c := &child{cmd: exec.Command(os.Args[0], "-test.run=^$"), done: make(chan struct{})}
	c.cmd.Env = append(os.Environ(),
		"OUTBOX_TEST_CHILD=relay",
		"OUTBOX_CHILD_DIALECT="+string(e.Target.Dialect),
		"OUTBOX_CHILD_DSN="+e.DSN,
		"OUTBOX_CHILD_TABLE="+e.Table,
		"OUTBOX_CHILD_BROKERS="+strings.Join(brokers, ","),
		"OUTBOX_CHILD_BATCH="+strconv.Itoa(batch),
		"OUTBOX_FAILPOINTS="+failpoints,
		"OUTBOX_CHILD_LEASE_TTL="+childLeaseTTL.String(),
		"OUTBOX_CHILD_INSTANCE="+instance,
	)
	c.cmd.Env = append(c.cmd.Env, env...)
	c.cmd.Stdout = &c.out
	c.cmd.Stderr = &c.out
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.done
		switch out := c.out.String(); {
		case strings.Contains(out, orderBrokenLog):
			t.Errorf("relay child logged an order violation (%q); output:\n%s", orderBrokenLog, out)
		case t.Failed():
			t.Logf("relay child output:\n%s", out)
		}
	})
	return c
}

// wait waits for the child to exit and returns its wait status.
func (c *child) wait(t *testing.T, ctx context.Context) syscall.WaitStatus {
	t.Helper()
	select {
	case <-c.done:
	case <-ctx.Done():
		t.Fatalf("relay child did not exit; output:\n%s", c.out.String())
	}
	return c.cmd.ProcessState.Sys().(syscall.WaitStatus)
}

func (c *child) terminate(t *testing.T, ctx context.Context) {
	t.Helper()
	// A SIGTERM before the child installed its handler would kill it with
	// the default action (seen when the previous relay had published
	// everything and the ledger was complete at once).
	testdb.Eventually(t, ctx, "relay child running", func() bool {
		return strings.Contains(c.out.String(), "relay child running")
	})
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if ws := c.wait(t, ctx); !ws.Exited() || ws.ExitStatus() != 0 {
		t.Fatalf("relay child after SIGTERM: %v; output:\n%s", c.err, c.out.String())
	}
}

func serverTargets(t *testing.T, fn func(t *testing.T, tg testdb.Target)) {
	t.Helper()
	for _, tg := range testdb.All {
		if tg.Name == "pgx" || tg.Name == "sqlite" {
			continue // relay processes use pgx for PostgreSQL; SQLite is embedded in one process
		}
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, tg)
		})
	}
}

// TestRelayKilledAtFailpoints kills a relay process with SIGKILL at each
// named crash point, starts another, and checks the ledger: nothing lost,
// order kept, duplicates only from the killed process's in-flight work
// (at most two batches: one being marked sent, one being published).
func TestRelayKilledAtFailpoints(t *testing.T) {
	t.Parallel()
	for _, fp := range []string{failpoint.AfterClaim, failpoint.AfterPublish, failpoint.MidBatch} {
		t.Run(strings.ReplaceAll(fp, "/", "-"), func(t *testing.T) {
			t.Parallel()
			serverTargets(t, func(t *testing.T, tg testdb.Target) {
				const total, batch = 600, 100
				kb := startKafka(t, 8, orderTopic)
				e := testdb.New(t, tg, driver.Config{})
				ctx := testCtx(t, 3*time.Minute)
				ledger.WriteSerialized(t, ctx, e, 4, 30, total)
				first := startChild(t, e, kb.broker.Addrs(), batch, fp+"=kill@3")
				ws := first.wait(t, ctx)
				if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
					t.Fatalf("relay child was not killed at %s: %v; output:\n%s", fp, first.err, first.out.String())
				}
				before := len(kb.cons.Records())
				second := startChild(t, e, kb.broker.Addrs(), batch, "")
				rows := ledger.Wait(t, ctx, e, kb.cons)
				second.terminate(t, ctx)
				recs := kb.cons.Records()
				rep := ledger.Check(rows, recs)
				if rep.Ghosts != 0 || rep.OrderViolations != 0 || rep.Duplicates > 2*relay.DefaultMaxBatchFactor*batch {
					ledger.Explain(t, e, rep, recs)
					t.Fatalf("ledger %+v", rep)
				}
				if fp == failpoint.AfterClaim && rep.Duplicates > relay.DefaultMaxBatchFactor*batch {
					t.Fatalf("killed before publishing its batch, yet %d duplicates", rep.Duplicates)
				}
				t.Logf("killed at %s after %d records; ledger %+v", fp, before, rep)
			})
		})
	}
}

// TestRelayKilledAtRandomMoments: writers commit a stream while relay
// processes are SIGKILLed at random points; the last one drains.
func TestRelayKilledAtRandomMoments(t *testing.T) {
	t.Parallel()
	serverTargets(t, func(t *testing.T, tg testdb.Target) {
		const total, batch = 3000, 100
		kb := startKafka(t, 8, orderTopic)
		e := testdb.New(t, tg, driver.Config{})
		ctx := testCtx(t, 3*time.Minute)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			ledger.WriteSerialized(t, ctx, e, 8, 50, total)
		}()
		kills := 3
		last := killThrice(t, ctx, kb.cons, func() *child { return startChild(t, e, kb.broker.Addrs(), batch, "") })
		wg.Wait()
		rows := ledger.Wait(t, ctx, e, kb.cons)
		last.terminate(t, ctx)
		recs := kb.cons.Records()
		rep := ledger.Check(rows, recs)
		if rep.Ghosts != 0 || rep.OrderViolations != 0 || rep.Duplicates > kills*2*relay.DefaultMaxBatchFactor*batch {
			ledger.Explain(t, e, rep, recs)
			t.Fatalf("ledger %+v after %d kills", rep, kills)
		}
		t.Logf("%d kills; ledger %+v", kills, rep)
	})
}

// TestRelaySIGTERMWithPublishesInFlight: SIGTERM while a batch of
// hundreds is in flight; the relay records its outcomes and exits 0;
// nothing is lost and nothing is sent twice.
func TestRelaySIGTERMWithPublishesInFlight(t *testing.T) {
	t.Parallel()
	serverTargets(t, func(t *testing.T, tg testdb.Target) {
		const total, batch = 3000, 500
		kb := startKafka(t, 8, orderTopic)
		e := testdb.New(t, tg, driver.Config{})
		ctx := testCtx(t, 3*time.Minute)
		ledger.WriteSerialized(t, ctx, e, 8, 50, total)
		// Leases of 20 s, not childLeaseTTL's 2 s: nothing here waits for
		// a takeover (a graceful stop releases its leases), and at load 44
		// a 2 s lease lapsed between heartbeats, which fences the mark-sent
		// of a batch the broker had acknowledged (500 duplicates).
		const ttl = "OUTBOX_CHILD_LEASE_TTL=20s"
		first := startChildAs(t, e, kb.broker.Addrs(), batch, "", "", ttl)
		if _, err := kb.cons.WaitForCount(ctx, 1); err != nil {
			t.Fatal(err)
		}
		first.terminate(t, ctx)
		stoppedAt := len(kb.cons.Records())
		second := startChildAs(t, e, kb.broker.Addrs(), batch, "", "", ttl)
		rows := ledger.Wait(t, ctx, e, kb.cons)
		second.terminate(t, ctx)
		rep := ledger.Check(rows, kb.cons.Records())
		if rep.Ghosts != 0 || rep.OrderViolations != 0 {
			t.Fatalf("ledger %+v", rep)
		}
		// A graceful stop records every batch the broker acknowledged
		// within the relay's bounds: no duplicates. Only a cycle that
		// failed (a Publish past PublishTimeout, a mark-sent past
		// QueryTimeout: seen at load average 20-50) or a lease that lapsed
		// (its fence rejects the mark-sent) leaves acknowledged rows
		// pending, and then the relay said so and the re-sent rows are at
		// most that one cycle's.
		if rep.Duplicates != 0 {
			out := first.out.String()
			failed := strings.Contains(out, "relay cycle failed") || strings.Contains(out, "partition lease lost")
			if !failed || rep.Duplicates > relay.DefaultMaxBatchFactor*batch {
				t.Fatalf("ledger %+v after a graceful stop (first relay's output:\n%s)", rep, first.out.String())
			}
			t.Logf("%d duplicates after a cycle that failed or a lease that lapsed at the stop:\n%s", rep.Duplicates, out)
		}
		t.Logf("SIGTERM after %d records; ledger %+v", stoppedAt, rep)
	})
}

var _ = errors.New

// killThrice starts a relay child with start, SIGKILLs it once cons has
// delivered 200, then 900, then 1,700 records (a new child each time), and
// returns a fourth child, left running to drain.
func killThrice(t *testing.T, ctx context.Context, cons *kafkatest.Consumer, start func() *child) *child {
	t.Helper()
	for _, at := range []int{200, 900, 1700} {
		c := start()
		if _, err := cons.Wait(ctx, func(r []kafkatest.Record) bool { return len(r) >= at }); err != nil {
			t.Fatal(err)
		}
		if err := c.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		c.wait(t, ctx)
	}
	return start()
}
