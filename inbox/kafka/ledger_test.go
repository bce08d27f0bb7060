package inboxkafka_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testdb"
)

// TestLedgerExactlyOnceUnderKillsAndRebalances is the inbox's proof, from
// a producer database to a consumer database through the outbox, a relay
// and Kafka: writers commit total business changes, each with its event;
// relay processes publish them; consumer processes (two at a time, so the
// group rebalances whenever one starts or dies) apply each event to a
// ledger table through the inbox. Consumers are SIGKILLed at the named
// points (after a record's outcome is stored, before its offset is
// committed; just before an offset commit) and at random moments, and
// the relay is SIGKILLed at a random moment and after a publish before
// mark-sent. At the end every event is applied exactly once (one ledger
// row per message), in order per aggregate (seq 1, 2, 3, ...), and the
// consumers together recognised duplicates: the redeliveries the kills
// caused, stopped by the inbox.
func TestLedgerExactlyOnceUnderKillsAndRebalances(t *testing.T) {
	t.Parallel()
	for _, tg := range []testdb.Target{pgx, {Name: "mysql", Dialect: driver.MySQL}} {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			ledgerProof(t, tg)
		})
	}
}

func ledgerProof(t *testing.T, tg testdb.Target) {
	const total, aggregates, writers = 2000, 40, 4
	start := time.Now()
	ctx := testCtx(t, 110*time.Second)
	b, topic := startBroker(t, 6)
	prod := testdb.New(t, tg, driver.Config{})
	cons := newConsumerDB(t, tg)
	dir := t.TempDir()
	var eventFiles []string
	group := randomName("g-")
	brokers := strings.Join(b.Addrs(), ",")

	n, consumers := 0, 0
	consumer := func(failpoints string) *child {
		n++
		// Every other consumer applies batches of 16 records
		// (Config.BatchSize): both modes share the group, the kills and
		// the proof.
		consumers++
		batch := 16 * ((consumers + 1) % 2)
		events := filepath.Join(dir, fmt.Sprintf("events-%d", n))
		eventFiles = append(eventFiles, events)
		c := startChild(t, fmt.Sprintf("consumer %d (%s, batch %d)", n, failpoints, batch), "consumer", "INBOXKAFKA_BATCH="+strconv.Itoa(batch),
			"INBOXKAFKA_DIALECT="+string(tg.Dialect), "INBOXKAFKA_DSN="+cons.env.DSN,
			"INBOXKAFKA_INBOX="+cons.itable, "INBOXKAFKA_CONSUMER="+cons.cname, "INBOXKAFKA_LEDGER="+cons.ledger,
			"INBOXKAFKA_BROKERS="+brokers, "INBOXKAFKA_GROUP="+group, "INBOXKAFKA_TOPIC="+topic,
			"INBOXKAFKA_EVENTS="+events, "OUTBOX_FAILPOINTS="+failpoints)
		c.events = events
		return c
	}
	relayChild := func(failpoints string) *child {
		n++
		return startChild(t, fmt.Sprintf("relay %d (%s)", n, failpoints), "relay",
			"INBOXKAFKA_DIALECT="+string(tg.Dialect), "INBOXKAFKA_DSN="+prod.DSN, "INBOXKAFKA_OUTBOX="+prod.Table,
			"INBOXKAFKA_BROKERS="+brokers, "INBOXKAFKA_TOPIC="+topic, "OUTBOX_FAILPOINTS="+failpoints)
	}
	applied := func() int { return countRows(t, cons.db, cons.ledger) }
	t.Cleanup(func() {
		if t.Failed() {
			var sent, all int
			_ = prod.RelayDB.QueryRow("SELECT COUNT(*), COUNT(CASE WHEN status = 1 THEN 1 END) FROM "+prod.Table).Scan(&all, &sent)
			t.Logf("at failure: %d outbox rows, %d sent; %d applied", all, sent, applied())
		}
	})
	waitApplied := func(at int) {
		t.Helper()
		testdb.Eventually(t, ctx, fmt.Sprintf("%d events applied", at), func() bool { return applied() >= at })
	}

	var wrote atomic.Bool
	var want map[string]int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer wrote.Store(true)
		want = writeLedger(t, ctx, prod, writers, aggregates, total)
	}()

	kills := map[string]int{}
	// The first relay dies after its 5th publish, before mark-sent: it
	// re-sends that batch (duplicates with new offsets).
	r1 := relayChild("relay/after-publish=kill@5")
	a1 := consumer("inboxkafka/after-store=kill@60")
	b1 := consumer("")

	r1.waitKilled(t, ctx)
	kills["relay after-publish"]++
	r2 := relayChild("")

	// Named point: killed right after storing its 60th outcome, before
	// that record's offset can be committed: that record is redelivered.
	a1.waitKilled(t, ctx)
	kills["consumer after-store"]++
	afterStore := []*child{a1}
	a2 := consumer("inboxkafka/before-commit=kill@4")

	a2.waitKilled(t, ctx)
	kills["consumer before-commit"]++
	a3 := consumer("inboxkafka/after-store=kill@15")

	// Random moments for the relay and for a consumer with partitions in
	// flight.
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	waitApplied(total/4 + rng.IntN(total/6))
	r2.kill(t)
	kills["relay random"]++
	r3 := relayChild("")
	waitApplied(total/2 + rng.IntN(total/8))
	b1.kill(t)
	kills["consumer random"]++
	b2 := consumer("")

	if a3.waitKilledOr(t, ctx, func() bool { return applied() >= total }) {
		kills["consumer after-store"]++
		afterStore = append(afterStore, a3)
	} else {
		a3.kill(t)
		kills["consumer random"]++
	}
	a4 := consumer("")

	waitApplied(3*total/4 + rng.IntN(total/8))
	b2.kill(t)
	kills["consumer random"]++
	b3 := consumer("")

	wg.Wait()
	if t.Failed() {
		return
	}
	waitApplied(total)
	// Let the last consumers finish and commit, then stop them cleanly.
	for _, c := range []*child{a4, b3} {
		c.terminate(t, ctx, "consumer child running")
	}
	r3.terminate(t, ctx, "relay child running")

	rows := readLedger(t, cons.db, cons.ledger)
	if len(rows) != total {
		t.Errorf("%d ledger rows, want %d (one per event)", len(rows), total)
	}
	if probs := checkLedger(rows, want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
	// Every consumer wrote "ok|dup topic/partition/offset" per record.
	dupOf := map[string]bool{}
	dups := 0
	for _, f := range eventFiles {
		for _, line := range eventLines(t, f) {
			if rest, ok := strings.CutPrefix(line, "dup "); ok {
				dupOf[rest] = true
				dups++
			}
		}
	}
	if dups == 0 {
		t.Fatalf("no duplicates recognised after kills %v: the kills did not cause redeliveries", kills)
	}
	// The record each after-store kill interrupted (its process's last
	// stored outcome, its offset not committed) came back to a consumer
	// and the inbox recognised it.
	for _, c := range afterStore {
		lines := eventLines(t, c.events)
		if len(lines) == 0 {
			t.Fatalf("%s was killed after storing an outcome but its events file is empty", c.name)
		}
		_, last, _ := strings.Cut(lines[len(lines)-1], " ")
		if !dupOf[last] {
			t.Errorf("%s was killed after storing %s, which no consumer got again as a duplicate", c.name, last)
		}
	}
	t.Logf("%s: %d events applied exactly once in order in %s; %d consumer processes (each start and death a rebalance), kills %v; %d duplicate deliveries recognised and skipped by the inbox (the record of each after-store kill among them)",
		tg.Name, total, time.Since(start).Round(time.Millisecond), len(eventFiles), kills, dups)
}

func eventLines(t testing.TB, path string) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(raw), "\n") {
		if l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// waitKilledOr waits until the child died of SIGKILL (true) or give()
// holds while it still runs (false).
func (c *child) waitKilledOr(t testing.TB, ctx context.Context, give func() bool) bool {
	t.Helper()
	var killed bool
	testdb.Eventually(t, ctx, c.name+" killed", func() bool {
		if c.exited() {
			killed = true
			return true
		}
		return give()
	})
	if killed {
		c.waitKilled(t, ctx)
	}
	return killed
}

// writeLedger commits total business changes from writers goroutines
// over aggregates accounts, each incrementing its account's seq under a
// row lock and emitting an event carrying it; it returns the last seq of
// every aggregate.
func writeLedger(t *testing.T, ctx context.Context, e *testdb.Env, writers, aggregates, total int) map[string]int {
	t.Helper()
	acc := e.Q("account")
	if _, err := e.RelayDB.Exec("CREATE TABLE " + acc + " (id VARCHAR(64) PRIMARY KEY, seq INTEGER NOT NULL)"); err != nil {
		t.Error(err)
		return nil
	}
	for a := 0; a < aggregates; a++ {
		if _, err := e.RelayDB.Exec("INSERT INTO "+acc+" (id, seq) VALUES ("+e.Placeholder(1)+", 0)", fmt.Sprintf("agg-%03d", a)); err != nil {
			t.Error(err)
			return nil
		}
	}
	sel := "SELECT seq FROM " + acc + " WHERE id = " + e.Placeholder(1) + " FOR UPDATE"
	upd := "UPDATE " + acc + " SET seq = " + e.Placeholder(1) + " WHERE id = " + e.Placeholder(2)
	var next atomic.Int64
	var mu sync.Mutex
	want := map[string]int{}
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			for next.Add(1) <= int64(total) {
				agg := fmt.Sprintf("agg-%03d", rng.IntN(aggregates))
				var seq int
				var err error
				for try := 0; try < 20; try++ {
					err = func() error {
						ctx := outbox.NewContext(ctx)
						tx, err := e.DB.BeginTx(ctx, nil)
						if err != nil {
							return err
						}
						defer tx.Rollback()
						if err := tx.QueryRowContext(ctx, sel, agg).Scan(&seq); err != nil {
							return err
						}
						seq++
						if _, err := tx.ExecContext(ctx, upd, seq, agg); err != nil {
							return err
						}
						if err := outbox.Emit(ctx, outbox.Event{AggregateType: "account", AggregateID: agg, Type: "account.step",
							Payload: []byte(fmt.Sprintf(`{"seq":%d}`, seq))}); err != nil {
							return err
						}
						return tx.Commit()
					}()
					if err == nil || !strings.Contains(strings.ToLower(err.Error()), "deadlock") {
						break
					}
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if seq > want[agg] {
					want[agg] = seq
				}
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	return want
}
