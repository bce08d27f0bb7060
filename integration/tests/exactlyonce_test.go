package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/integration/internal/ledger"
	"github.com/sqloutbox/outbox/internal/failpoint"
	"github.com/sqloutbox/outbox/internal/testkit/privateserver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// The exactly-once mode (relay/kafka ExactlyOnce) under process kills
// (the failpoints on PostgreSQL and MariaDB; random kills, scale-out and
// connection cuts on one of them each, alternately, to keep CI's time):
// relay processes publish with transactions, a read_committed consumer
// must receive every row exactly once, in order per aggregate, and a
// read_uncommitted one shows what reached the log anyway (aborted
// transactions), so that the test proves the fence rather than assuming
// it.

// eosBundle is a broker with orderTopic and the state topic of e's table,
// and a consumer of orderTopic at each isolation level.
type eosBundle struct {
	broker                 *kafkatest.Broker
	committed, uncommitted *kafkatest.Consumer
	env                    string // the child's OUTBOX_CHILD_EOS_PREFIX setting
	prefix                 string
}

func startEOS(t *testing.T, ctx context.Context, e *testdb.Env) *eosBundle {
	t.Helper()
	const prefix = "eos-test."
	b, err := kafkatest.Start(kafkatest.Topics(8, orderTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	if err := kafkatest.CreateTopic(ctx, b.Addrs(), kafka.StateTopic(prefix, e.Table), 1); err != nil {
		t.Fatal(err)
	}
	eb := &eosBundle{broker: b, env: "OUTBOX_CHILD_EOS_PREFIX=" + prefix, prefix: prefix}
	if eb.committed, err = kafkatest.NewConsumer(b.Addrs(), []string{orderTopic}, kgo.FetchIsolationLevel(kgo.ReadCommitted())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eb.committed.Close)
	if eb.uncommitted, err = kafkatest.NewConsumer(b.Addrs(), []string{orderTopic}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eb.uncommitted.Close)
	return eb
}

// child starts an exactly-once relay process.
func (eb *eosBundle) child(t *testing.T, e *testdb.Env, batch int, failpoints string) *child {
	t.Helper()
	return startChildAs(t, e, eb.broker.Addrs(), batch, failpoints, "", eb.env)
}

// check waits for the read_committed consumer to deliver every row, stops
// last, and fails t unless the ledger is exact: nothing lost, no ghost,
// no duplicate, no order violation. It returns the rows.
func (eb *eosBundle) check(t *testing.T, ctx context.Context, e *testdb.Env, last *child) []ledger.Row {
	t.Helper()
	rows := ledger.Wait(t, ctx, e, eb.committed)
	last.terminate(t, ctx)
	recs := eb.committed.Records()
	if rep := ledger.Check(rows, recs); !rep.OK() || rep.Duplicates != 0 {
		ledger.Explain(t, e, rep, recs)
		t.Fatalf("read_committed ledger %+v, want every row exactly once, in order", rep)
	}
	return rows
}

// TestExactlyOnceKilledAtFailpoints kills an exactly-once relay process
// with SIGKILL at each crash point, starts another, and requires a
// read_committed ledger with no duplicate:
//   - after a claim: nothing was sent;
//   - after the broker committed a transaction, before mark-sent: the next
//     owner reads the manifest and marks those rows sent; nothing is sent
//     twice;
//   - with a transaction open (records and manifest written, no commit):
//     the next owner's InitProducerId aborts it; its records reached the
//     log (read_uncommitted receives them twice) but no read_committed
//     consumer sees them.
func TestExactlyOnceKilledAtFailpoints(t *testing.T) {
	t.Parallel()
	for _, fp := range []string{failpoint.AfterClaim, failpoint.AfterPublish, failpoint.BeforeCommit} {
		t.Run(strings.ReplaceAll(fp, "/", "-"), func(t *testing.T) {
			t.Parallel()
			serverTargets(t, func(t *testing.T, tg testdb.Target) {
				const total, batch = 600, 100
				e := testdb.New(t, tg, driver.Config{})
				ctx := testCtx(t, 3*time.Minute)
				eb := startEOS(t, ctx, e)
				ledger.WriteSerialized(t, ctx, e, 4, 30, total)
				first := eb.child(t, e, batch, fp+"=kill@3")
				if ws := first.wait(t, ctx); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
					t.Fatalf("relay child was not killed at %s: %v; output:\n%s", fp, first.err, first.out.String())
				}
				before := len(eb.committed.Records())
				rows := eb.check(t, ctx, e, eb.child(t, e, batch, ""))
				// Once the read_uncommitted consumer has every row, it has
				// read everything before them too: a partition is read in
				// offset order, and an aborted record's row was re-sent
				// later to the same partition (its key is its aggregate's).
				uncomm, err := eb.uncommitted.Wait(ctx, func(r []kafkatest.Record) bool { return ledger.Check(rows, r).Lost == 0 })
				if err != nil {
					t.Fatalf("read_uncommitted: %v", err)
				}
				raw := ledger.Check(rows, uncomm)
				switch fp {
				case failpoint.BeforeCommit:
					if raw.Duplicates == 0 {
						t.Errorf("killed with a transaction open, yet read_uncommitted has no duplicate (%+v): the test proves no fence", raw)
					}
				}
				// Other kills leave nothing aborted by themselves, but under
				// load a transaction can also be aborted for its deadline
				// and sent again (seen: 79 at read_uncommitted beside a
				// second go test): only read_committed is judged then.
				t.Logf("killed at %s after %d records; read_committed exact; read_uncommitted %+v", fp, before, raw)
			})
		})
	}
}

// TestExactlyOnceKilledAtRandomMoments: writers commit a stream while
// exactly-once relay processes are SIGKILLed at random points; the last
// one drains. read_committed: every row exactly once, in order.
func TestExactlyOnceKilledAtRandomMoments(t *testing.T) {
	t.Parallel()
	serverTarget(t, "pq", func(t *testing.T, tg testdb.Target) {
		const total, batch = 3000, 100
		e := testdb.New(t, tg, driver.Config{})
		ctx := testCtx(t, 3*time.Minute)
		eb := startEOS(t, ctx, e)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			ledger.WriteSerialized(t, ctx, e, 8, 50, total)
		}()
		last := killThrice(t, ctx, eb.committed, func() *child { return eb.child(t, e, batch, "") })
		wg.Wait()
		rows := eb.check(t, ctx, e, last)
		raw := ledger.Check(rows, eb.uncommitted.Records())
		t.Logf("3 kills; read_committed exact; read_uncommitted so far %+v", raw)
	})
}

// TestExactlyOnceScaleOut: three exactly-once relay processes share a
// table while writers commit; one is SIGKILLed, another SIGSTOPped past
// its lease and continued, and a fourth joins. The read_committed ledger
// is exact, and, from the records' own headers, no first delivery came
// from an older lease epoch after a newer one: the frozen relay's late
// transaction, if it had one open, was fenced at the broker (in the
// default mode one late batch can go out: TestScaleOut).
func TestExactlyOnceScaleOut(t *testing.T) {
	t.Parallel()
	serverTarget(t, "mysql", func(t *testing.T, tg testdb.Target) {
		const total, aggregates, batch = 6000, 200, 100
		e := testdb.New(t, tg, driver.Config{})
		ctx := testCtx(t, 6*time.Minute)
		eb := startEOS(t, ctx, e)
		relays := map[string]*child{}
		start := func(id string) {
			relays[id] = startChildAs(t, e, eb.broker.Addrs(), batch, "", id, eb.env)
		}
		for _, id := range []string{"relay-1", "relay-2", "relay-3"} {
			start(id)
		}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			ledger.WriteSerialized(t, ctx, e, 16, aggregates, total)
		}()
		waitRecords := func(n int) {
			t.Helper()
			if _, err := eb.committed.Wait(ctx, func(r []kafkatest.Record) bool { return len(r) >= n }); err != nil {
				t.Fatal(err)
			}
		}
		testdb.Eventually(t, ctx, "three instances sharing the partitions", func() bool { return len(ownersOf(t, e)) == 3 })
		waitRecords(total / 10)
		if err := relays["relay-1"].cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		relays["relay-1"].wait(t, ctx)
		waitRecords(total * 3 / 10)
		stopped := relays["relay-2"]
		if err := stopped.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		testdb.Eventually(t, ctx, "relay-2's leases expired and taken over", func() bool { return ownersOf(t, e)["relay-2"] == 0 })
		if err := stopped.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		waitRecords(total * 6 / 10)
		start("relay-4")
		testdb.Eventually(t, ctx, "relay-4 owning partitions", func() bool { return ownersOf(t, e)["relay-4"] > 0 })
		wg.Wait()
		if t.Failed() {
			return
		}
		ledger.Wait(t, ctx, e, eb.committed) // everything delivered before the stops
		for _, id := range []string{"relay-2", "relay-3"} {
			relays[id].terminate(t, ctx)
		}
		rows := eb.check(t, ctx, e, relays["relay-4"])
		recs := eb.committed.Records()
		if regressions, _ := epochAudit(rows, recs); regressions != 0 {
			t.Errorf("%d first deliveries came from an older lease epoch after a newer one: a fenced relay's transaction committed", regressions)
		}
		raw := ledger.Check(rows, eb.uncommitted.Records())
		t.Logf("read_committed exact; read_uncommitted so far %+v", raw)
	})
}

// TestExactlyOnceSurvivesDatabaseConnectionCuts: an in-process
// exactly-once relay whose database connections are all cut five times
// while writers commit (a mark-sent cut after its transaction committed is
// an unknown outcome: the partition is reconciled, not re-sent). The
// read_committed ledger is exact.
func TestExactlyOnceSurvivesDatabaseConnectionCuts(t *testing.T) {
	t.Parallel()
	serverTarget(t, "pq", func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{})
		eb := startEOS(t, testCtx(t, time.Minute), e)
		pub, err := kafka.NewPublisher(kafka.Config{Brokers: eb.broker.Addrs(),
			ExactlyOnce: &kafka.ExactlyOnce{TransactionalIDPrefix: eb.prefix, Table: e.Table}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pub.Close() })
		p, drv, dsn := proxiedDSN(t, e)
		runCuts(t, e, &kafkaBundle{broker: eb.broker, pub: pub, cons: eb.committed}, p, drv, dsn, true)
	})
}

// serverTarget runs fn as one subtest, on the server target named name
// (pq or mysql: see serverTargets).
func serverTarget(t *testing.T, name string, fn func(t *testing.T, tg testdb.Target)) {
	t.Helper()
	for _, tg := range testdb.All {
		if tg.Name == name {
			t.Run(tg.Name, func(t *testing.T) {
				t.Parallel()
				fn(t, tg)
			})
			return
		}
	}
	t.Fatalf("no database target %q", name)
}

// TestExactlyOnceDatabaseCrash is the regression test for a mark-sent
// lost in a database crash while the broker kept the transaction after
// it. The mark used to commit with synchronous_commit off in every mode:
// the relay marked batch 1, claimed batch 2 and committed its transaction,
// whose manifest listed only batch 2; a crash of PostgreSQL then lost
// batch 1's unflushed mark, and the next relay, reading only batch 2's
// manifest, sent batch 1 again: duplicates at read_committed. In the
// exactly-once mode marks are now durable, and a transaction's manifest
// also lists the batch before it whose mark is still running. Here a
// private server whose WAL writer is paused (and whose background writer
// writes no page, and whose WAL buffers are large: nothing flushes an
// asynchronous commit) crashes (immediate shutdown) right after the relay
// process is killed past its third publish; a new relay must deliver
// every row exactly once. (With the asynchronous marks of before, 300
// duplicates: the rows of the first two publishes.)
func TestExactlyOnceDatabaseCrash(t *testing.T) {
	t.Parallel()
	const total, batch = 600, 100
	pg := privateserver.StartPostgres(t, map[string]string{"wal_buffers": "'16MB'", "bgwriter_lru_maxpages": "0"})
	e := testdb.NewOn(t, testdb.All[0], pg.DSN, driver.Config{})
	ctx := testCtx(t, 3*time.Minute)
	eb := startEOS(t, ctx, e)
	// Three aggregates: every batch has rows of the same relay
	// partitions, so a transaction's manifest is the only record of the
	// batches before it.
	ledger.WriteSerialized(t, ctx, e, 3, 3, total)
	pg.PauseWALWriter(t)
	first := eb.child(t, e, batch, failpoint.AfterPublish+"=kill@3")
	if ws := first.wait(t, ctx); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("relay child was not killed after its third publish: %v; output:\n%s", first.err, first.out.String())
	}
	pg.Crash(t)
	pg.Start(t)
	var lost int
	if err := e.RelayDB.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+testdb.PendingTable(e.Table)).Scan(&lost); err != nil {
		t.Fatal(err)
	}
	// Every row is in Kafka already; the new relay must only mark them.
	last := eb.child(t, e, batch, "")
	testdb.Eventually(t, ctx, "the new relay marking every row sent", func() bool {
		var n int
		err := e.RelayDB.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+testdb.PendingTable(e.Table)).Scan(&n)
		return err == nil && n == 0
	})
	t.Logf("%d rows pending after the crash", lost)
	eb.check(t, ctx, e, last)
}

// TestExactlyOnceRelayWithoutStateTopic: an exactly-once relay whose state
// topic does not exist writes nothing to the log and says what to create
// (issue 36, item 10: it began a transaction per batch, whose manifest
// commit then failed, and left 360-400 aborted records for 40 messages);
// once the topic exists, every row arrives exactly once.
func TestExactlyOnceRelayWithoutStateTopic(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, time.Minute)
	e := testdb.New(t, testdb.All[0], driver.Config{})
	const prefix = "eos-missing."
	b, err := kafkatest.Start(kafkatest.Topics(8, orderTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	pub, err := kafka.NewPublisher(kafka.Config{Brokers: b.Addrs(), ExactlyOnce: &kafka.ExactlyOnce{TransactionalIDPrefix: prefix, Table: e.Table}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	committed, err := kafkatest.NewConsumer(b.Addrs(), []string{orderTopic}, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(committed.Close)
	rr := startRelay(t, e, pub, func(c *relay.Config) {
		c.RetryInitial, c.RetryMax = 20*time.Millisecond, 100*time.Millisecond
	})
	if err := inTx(ctx, e.DB, func(ctx context.Context, _ *sql.Tx) error {
		for i := 0; i < 40; i++ {
			if err := outbox.Emit(ctx, ev(fmt.Sprintf("agg-%d", i%4), i)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// A cycle has failed once readiness reports the topic.
	var ready error
	eventually(t, ctx, "readiness naming the missing state topic", func() bool {
		ready = rr.Ready()
		return errors.Is(ready, kafka.ErrStateTopicMissing) && strings.Contains(ready.Error(), kafka.StateTopic(prefix, e.Table))
	})
	if !errors.Is(ready, relay.ErrUnavailable) {
		t.Errorf("readiness %v: want it to wrap relay.ErrUnavailable too", ready)
	}
	ends, err := kafkatest.EndOffsets(ctx, b.Addrs(), orderTopic)
	if err != nil {
		t.Fatal(err)
	}
	for p, end := range ends {
		if end != 0 {
			t.Errorf("partition %d of %s holds %d records (aborted transactions) before the state topic exists, want 0", p, orderTopic, end)
		}
	}
	kcfg := kafka.Config{Brokers: b.Addrs(), ExactlyOnce: &kafka.ExactlyOnce{TransactionalIDPrefix: prefix, Table: e.Table}}
	if err := kafka.CheckStateTopic(ctx, kcfg); !errors.Is(err, kafka.ErrStateTopicMissing) {
		t.Fatalf("CheckStateTopic before it exists: %v, want kafka.ErrStateTopicMissing", err)
	}
	if created, err := kafka.CreateStateTopic(ctx, kcfg); err != nil || !created {
		t.Fatalf("CreateStateTopic: %v, %v; want true, nil", created, err)
	}
	// Twice: an existing topic is not an error.
	if created, err := kafka.CreateStateTopic(ctx, kcfg); err != nil || created {
		t.Fatalf("CreateStateTopic on an existing topic: %v, %v; want false, nil", created, err)
	}
	if err := kafka.CheckStateTopic(ctx, kcfg); err != nil {
		t.Fatalf("CheckStateTopic once it exists: %v", err)
	}
	recs, err := committed.WaitForCount(ctx, 40)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range recs {
		id := r.Headers["outbox-message-id"]
		if seen[id] {
			t.Errorf("message %s received twice", id)
		}
		seen[id] = true
	}
}
