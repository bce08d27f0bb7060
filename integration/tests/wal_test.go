package tests

import (
	"context"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/integration/internal/ledger"
	"github.com/sqloutbox/outbox/internal/testkit/e2e"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/relay"
)

// The relay's WAL source (relay.SourceWAL) under process kills and a
// frozen slot reader, with relay processes (OUTBOX_CHILD_WAL_SLOT): the
// ledgers of the polling relay's tests hold the same.

// walChild returns the child settings for the WAL source on a slot of
// t's own, which is dropped when t ends (after the children stopped). It
// skips t, or fails it under OUTBOX_TEST_REQUIRE, if the server's
// wal_level is not logical (.ci/run sets it).
func walChild(t *testing.T, e *testdb.Env) (slot string, env []string) {
	t.Helper()
	testdb.RequireLogicalWAL(t, e.RelayDB)
	slot = strings.ToLower(testdb.RandomName("outbox_test_"))
	e2e.DropWALAtCleanup(t, e, relay.WALConfig{Slot: slot}) // after the children stopped
	// The fallback poll every 500 ms, not the children's 20 ms: what is
	// published comes from the stream, mostly.
	return slot, []string{"OUTBOX_CHILD_WAL_SLOT=" + slot, "OUTBOX_CHILD_POLL=500ms"}
}

// slotReaderOf returns the application_name of slot's reader, "" if none.
func slotReaderOf(t *testing.T, e *testdb.Env, slot string) string {
	t.Helper()
	var name *string
	if err := e.RelayDB.QueryRow(`SELECT a.application_name FROM pg_replication_slots s
		LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid WHERE s.slot_name = $1`, slot).Scan(&name); err != nil {
		return ""
	}
	if name == nil {
		return ""
	}
	return *name
}

// TestWALSourceRelayKilledAtRandomMoments: writers commit a stream while
// relay processes reading the slot are SIGKILLed at random points; the
// last one drains. Nothing lost, no ghost, in order per aggregate; the
// duplicates at most what the polling relay allows (two batches a kill).
func TestWALSourceRelayKilledAtRandomMoments(t *testing.T) {
	t.Parallel()
	serverTarget(t, "pq", func(t *testing.T, tg testdb.Target) {
		const total, batch = 3000, 100
		kb := startKafka(t, 8, orderTopic)
		e := testdb.New(t, tg, driver.Config{})
		ctx := testCtx(t, 3*time.Minute)
		_, env := walChild(t, e)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			ledger.WriteSerialized(t, ctx, e, 8, 50, total)
		}()
		last := killThrice(t, ctx, kb.cons, func() *child { return startChildAs(t, e, kb.broker.Addrs(), batch, "", "", env...) })
		wg.Wait()
		rows := ledger.Wait(t, ctx, e, kb.cons)
		last.terminate(t, ctx)
		recs := kb.cons.Records()
		rep := ledger.Check(rows, recs)
		if !rep.OK() || rep.Duplicates > 3*2*relay.DefaultMaxBatchFactor*batch {
			ledger.Explain(t, e, rep, recs)
			t.Fatalf("ledger %+v", rep)
		}
		t.Logf("3 kills; ledger %+v", rep)
	})
}

// TestWALLogOnlyRelayKilledAtRandomMoments is the test above in the
// log-only mode (driver.Config.LogOnly): the events are only in the WAL
// until a relay publishes them, so a kill between a publish and the slot's
// confirmation re-reads them (duplicates), and nothing else may be lost
// or reordered. The slot is created before the writers start (a log-only
// commit needs it); the events are listed from the writers' aggregate
// table (ledger.ReadSeq).
func TestWALLogOnlyRelayKilledAtRandomMoments(t *testing.T) {
	t.Parallel()
	serverTarget(t, "pq", func(t *testing.T, tg testdb.Target) {
		const total, batch = 3000, 100
		kb := startKafka(t, 8, orderTopic)
		e := testdb.New(t, tg, driver.Config{LogOnly: true})
		ctx := testCtx(t, 3*time.Minute)
		slot, env := walChild(t, e)
		env = append(env, "OUTBOX_CHILD_LOG_ONLY=1")
		if _, err := relay.CreateWAL(ctx, e.Outbox, e.RelayDB, relay.WALConfig{Slot: slot}); err != nil {
			t.Fatal(err)
		}
		written := writeLogOnly(t, ctx, e, 50, total)
		last := killThrice(t, ctx, kb.cons, func() *child { return startChildAs(t, e, kb.broker.Addrs(), batch, "", "", env...) })
		written()
		rows := waitLogOnly(t, ctx, e, kb.cons, total)
		last.terminate(t, ctx)
		recs := kb.cons.Records()
		rep := ledger.Check(rows, recs)
		if !rep.OK() || rep.Duplicates > 3*2*relay.DefaultMaxBatchFactor*batch {
			ledger.Explain(t, e, rep, recs)
			t.Fatalf("ledger %+v", rep)
		}
		var inTable int
		if err := e.RelayDB.QueryRow("SELECT count(*) FROM " + e.Table).Scan(&inTable); err != nil {
			t.Fatal(err)
		}
		t.Logf("3 kills; ledger %+v; %d events written to the table by the relays", rep, inTable)
	})
}

// TestExactlyOnceWALSourceFrozenReader: two exactly-once relay processes
// with the WAL source share a table while writers commit. The one reading
// the slot is SIGSTOPped: its leases expire, the other takes its
// partitions, terminates its replication connection (its membership
// expired; without that the server would hold the slot for it until
// wal_sender_timeout) and reads the slot; the frozen one is continued.
// The read_committed ledger is exact, and no first delivery came from an
// older lease epoch after a newer one: whatever the frozen relay had in
// flight could not reach consumers after the new holder's first publish.
func TestExactlyOnceWALSourceFrozenReader(t *testing.T) {
	t.Parallel()
	serverTarget(t, "pq", func(t *testing.T, tg testdb.Target) {
		const total, aggregates, batch = 4000, 100, 100
		e := testdb.New(t, tg, driver.Config{})
		ctx := testCtx(t, 4*time.Minute)
		eb := startEOS(t, ctx, e)
		slot, env := walChild(t, e)
		relays := map[string]*child{}
		for _, id := range []string{"wal-1", "wal-2"} {
			relays[id] = startChildAs(t, e, eb.broker.Addrs(), batch, "", id, append([]string{eb.env}, env...)...)
		}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			ledger.WriteSerialized(t, ctx, e, 8, aggregates, total)
		}()
		holder, other := freezeTheSlotReader(t, ctx, e, relays, slot, func() {
			if _, err := eb.committed.Wait(ctx, func(r []kafkatest.Record) bool { return len(r) >= total/5 }); err != nil {
				t.Fatal(err)
			}
		})
		if !strings.Contains(relays[other].out.String(), "terminated the slot's reader") {
			t.Errorf("%s took the slot over without terminating the frozen reader (the server let it go: wal_sender_timeout?)", other)
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		ledger.Wait(t, ctx, e, eb.committed)
		relays[holder].terminate(t, ctx)
		rows := eb.check(t, ctx, e, relays[other])
		recs := eb.committed.Records()
		if regressions, _ := epochAudit(rows, recs); regressions != 0 {
			t.Errorf("%d first deliveries came from an older lease epoch after a newer one: the frozen relay's transaction committed", regressions)
		}
		raw := ledger.Check(rows, eb.uncommitted.Records())
		t.Logf("read_committed exact; read_uncommitted so far %+v", raw)
	})
}

// freezeTheSlotReader waits until one of the two relays reads the slot
// and both hold partitions, then for progressed (a share of the events
// delivered), then SIGSTOPs the slot's reader until the other holds every
// partition and reads the slot, and continues it. It returns the frozen
// relay's id and the other's.
func freezeTheSlotReader(t *testing.T, ctx context.Context, e *testdb.Env, relays map[string]*child, slot string, progressed func()) (frozen, other string) {
	t.Helper()
	testdb.Eventually(t, ctx, "a relay reads the slot", func() bool { return slotReaderOf(t, e, slot) != "" })
	testdb.Eventually(t, ctx, "two instances sharing the partitions", func() bool { return len(ownersOf(t, e)) == 2 })
	progressed()
	reader := strings.TrimPrefix(slotReaderOf(t, e, slot), "outbox-relay ")
	for id := range relays {
		if id != reader {
			other = id
		}
	}
	c, ok := relays[reader]
	if !ok || other == "" {
		t.Fatalf("the slot's reader %q is not one of the two relays", reader)
	}
	if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	testdb.Eventually(t, ctx, reader+"'s leases taken over and its slot read by "+other, func() bool {
		return ownersOf(t, e)[reader] == 0 && slotReaderOf(t, e, slot) == "outbox-relay "+other
	})
	if err := c.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	return reader, other
}

// TestWALLogOnlyFrozenReader: two relay processes in the log-only mode
// share a table while writers commit (the one reading the slot writes the
// other's partitions' events to the table, which the other claims). The
// reader is SIGSTOPped: its leases expire, the other takes its partitions,
// terminates its replication connection and reads the slot from the
// position the frozen one confirmed; the frozen one is continued. Nothing
// is lost, each aggregate's first deliveries are in order, and no first
// delivery came from an older lease epoch after a newer one.
func TestWALLogOnlyFrozenReader(t *testing.T) {
	t.Parallel()
	serverTarget(t, "pq", func(t *testing.T, tg testdb.Target) {
		const total, aggregates, batch = 4000, 100, 100
		kb := startKafka(t, 8, orderTopic)
		e := testdb.New(t, tg, driver.Config{LogOnly: true})
		ctx := testCtx(t, 4*time.Minute)
		slot, env := walChild(t, e)
		env = append(env, "OUTBOX_CHILD_LOG_ONLY=1")
		if _, err := relay.CreateWAL(ctx, e.Outbox, e.RelayDB, relay.WALConfig{Slot: slot}); err != nil {
			t.Fatal(err)
		}
		relays := map[string]*child{}
		for _, id := range []string{"log-1", "log-2"} {
			relays[id] = startChildAs(t, e, kb.broker.Addrs(), batch, "", id, env...)
		}
		written := writeLogOnly(t, ctx, e, aggregates, total)
		freezeTheSlotReader(t, ctx, e, relays, slot, func() {
			if _, err := kb.cons.Wait(ctx, func(r []kafkatest.Record) bool { return len(r) >= total/5 }); err != nil {
				t.Fatal(err)
			}
		})
		written()
		if t.Failed() {
			return
		}
		rows := waitLogOnly(t, ctx, e, kb.cons, total)
		for _, c := range relays {
			c.terminate(t, ctx)
		}
		recs := kb.cons.Records()
		rep := ledger.Check(rows, recs)
		if !rep.OK() {
			ledger.Explain(t, e, rep, recs)
			t.Fatalf("ledger %+v", rep)
		}
		if regressions, _ := epochAudit(rows, recs); regressions != 0 {
			t.Errorf("%d first deliveries came from an older lease epoch after a newer one: the frozen relay published after the new holder", regressions)
		}
		var inTable int
		if err := e.RelayDB.QueryRow("SELECT count(*) FROM " + e.Table).Scan(&inTable); err != nil {
			t.Fatal(err)
		}
		t.Logf("ledger %+v; %d events written to the table (the other relay's partitions, and around the takeover)", rep, inTable)
	})
}

// TestExactlyOnceLogOnlyKilledAtRandomMoments: the exactly-once mode with
// log-only writers (the relay reading the slot writes each event to the
// table and publishes the rows, whose ids its manifests name). Relay
// processes are SIGKILLed three times while 8 writers commit; the last
// one drains. read_committed: every event exactly once, in order per
// aggregate, the ledger read from the writers' own table.
func TestExactlyOnceLogOnlyKilledAtRandomMoments(t *testing.T) {
	t.Parallel()
	serverTarget(t, "pq", func(t *testing.T, tg testdb.Target) {
		const total, batch = 3000, 100
		e := testdb.New(t, tg, driver.Config{LogOnly: true})
		ctx := testCtx(t, 3*time.Minute)
		eb := startEOS(t, ctx, e)
		env := logOnlyChildEnv(t, ctx, e, eb)
		written := writeLogOnly(t, ctx, e, 50, total)
		last := killThrice(t, ctx, eb.committed, func() *child { return startChildAs(t, e, eb.broker.Addrs(), batch, "", "", env...) })
		written()
		if t.Failed() {
			return
		}
		rows := checkLogOnlyEOS(t, ctx, e, eb, total, last)
		raw := ledger.Check(rows, eb.uncommitted.Records())
		t.Logf("3 kills; read_committed exact; read_uncommitted so far %+v", raw)
	})
}

// TestExactlyOnceLogOnlyFrozenReader: two exactly-once relay processes
// with log-only writers; the one reading the slot is SIGSTOPped until the
// other holds every partition and reads the slot, then continued. The
// read_committed ledger is exact, and no first delivery came from an
// older lease epoch after a newer one.
func TestExactlyOnceLogOnlyFrozenReader(t *testing.T) {
	t.Parallel()
	serverTarget(t, "pq", func(t *testing.T, tg testdb.Target) {
		const total, aggregates, batch = 4000, 100, 100
		e := testdb.New(t, tg, driver.Config{LogOnly: true})
		ctx := testCtx(t, 4*time.Minute)
		eb := startEOS(t, ctx, e)
		env := logOnlyChildEnv(t, ctx, e, eb)
		slot := strings.TrimPrefix(env[0], "OUTBOX_CHILD_WAL_SLOT=")
		relays := map[string]*child{}
		for _, id := range []string{"eos-log-1", "eos-log-2"} {
			relays[id] = startChildAs(t, e, eb.broker.Addrs(), batch, "", id, env...)
		}
		written := writeLogOnly(t, ctx, e, aggregates, total)
		holder, other := freezeTheSlotReader(t, ctx, e, relays, slot, func() {
			if _, err := eb.committed.Wait(ctx, func(r []kafkatest.Record) bool { return len(r) >= total/5 }); err != nil {
				t.Fatal(err)
			}
		})
		written()
		if t.Failed() {
			return
		}
		relays[holder].terminate(t, ctx)
		rows := checkLogOnlyEOS(t, ctx, e, eb, total, relays[other])
		if regressions, _ := epochAudit(rows, eb.committed.Records()); regressions != 0 {
			t.Errorf("%d first deliveries came from an older lease epoch after a newer one: the frozen relay's transaction committed", regressions)
		}
	})
}

// logOnlyChildEnv creates e's slot (a log-only commit needs one) and
// returns the environment of an exactly-once relay child reading it in
// the log-only mode; the slot's setting comes first.
func logOnlyChildEnv(t *testing.T, ctx context.Context, e *testdb.Env, eb *eosBundle) []string {
	t.Helper()
	slot, env := walChild(t, e)
	if _, err := relay.CreateWAL(ctx, e.Outbox, e.RelayDB, relay.WALConfig{Slot: slot}); err != nil {
		t.Fatal(err)
	}
	return append(env, "OUTBOX_CHILD_LOG_ONLY=1", eb.env)
}

// checkLogOnlyEOS reads the events the log-only writers committed (total),
// waits until the read_committed consumer delivered each, stops last, and
// fails t unless that ledger is exact: nothing lost, no ghost, no
// duplicate, no order violation. It returns the rows.
func checkLogOnlyEOS(t *testing.T, ctx context.Context, e *testdb.Env, eb *eosBundle, total int, last *child) []ledger.Row {
	t.Helper()
	rows := waitLogOnly(t, ctx, e, eb.committed, total)
	last.terminate(t, ctx)
	recs := eb.committed.Records()
	if rep := ledger.Check(rows, recs); !rep.OK() || rep.Duplicates != 0 {
		ledger.Explain(t, e, rep, recs)
		t.Fatalf("read_committed ledger %+v, want every event exactly once, in order", rep)
	}
	return rows
}

// writeLogOnly starts 8 log-only writers committing total events over
// aggregates aggregates to e (their sequence in the writers' own table:
// ledger.ReadSeq) and returns a function that waits for them; a writer's
// error fails t.
func writeLogOnly(t *testing.T, ctx context.Context, e *testdb.Env, aggregates, total int) (wait func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := (ledger.Writers{Writers: 8, Aggregates: aggregates, Total: total, SeqIDs: true}).Write(ctx, e); err != nil {
			t.Error(err)
		}
	}()
	return func() { <-done }
}

// waitLogOnly reads the events log-only writers committed to e (their
// sequence table: ledger.ReadSeq), fails t unless there are total, and
// waits until cons has delivered each; it returns them.
func waitLogOnly(t *testing.T, ctx context.Context, e *testdb.Env, cons *kafkatest.Consumer, total int) []ledger.Row {
	t.Helper()
	rows := ledger.ReadSeq(t, e)
	if len(rows) != total {
		t.Fatalf("%d events committed, want %d", len(rows), total)
	}
	ledger.WaitFor(t, ctx, e, cons, rows)
	return rows
}
